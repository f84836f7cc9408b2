// Catch2's main(), in a translation unit of its own (tests/meson.build:
// catch2_main): compiled once, linked into each Catch2 test program.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
