// The async forms complete with boost::system::error_code: it carries our
// std::error_code unchanged (pgmutex::error_category(), compared with Errc as
// before), and it is what makes use_future and use_awaitable throw on error
// and hand back the value alone.
#pragma once

#include <system_error>

#include <boost/system/error_code.hpp>

#include "pgmutex/error.hpp"

namespace pgmutex::asio_detail {

inline boost::system::error_code to_error_code(const Error& e) noexcept { return boost::system::error_code(e.code); }

template <class T>
boost::system::error_code error_of(const Result<T>& r) noexcept {
  return r ? boost::system::error_code() : to_error_code(r.error());
}

}  // namespace pgmutex::asio_detail
