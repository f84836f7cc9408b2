#!/usr/bin/env python3
"""Checks that every ```cpp block of README.md and of the documentation site's
pages (docs/**/*.md) appears, line for line, in one file under examples/
(which the test build compiles), so no page shows code that does not build.
A section that says its blocks "are [`examples/NAME`]" (a link or a plain
path) must have them in that very file (the quickstart, which the tests also
run). Leading whitespace, blank lines and #include lines are ignored.
Usage: readme_snippets.py EXAMPLES_DIR PAGE_OR_FOLDER...  (a folder: its **/*.md)"""
import pathlib, re, sys

examples = pathlib.Path(sys.argv[1])
pages = []
for arg in map(pathlib.Path, sys.argv[2:]):
    pages += sorted(arg.rglob("*.md")) if arg.is_dir() else [arg]

def normalize(text):
    return [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#include")]

def contains(haystack, needle):
    return any(haystack[i:i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))

sources = {p.name: normalize(p.read_text()) for p in sorted(examples.iterdir()) if p.suffix in (".cpp", ".hpp")}
total = missing = 0
for page in pages:
    text = page.read_text()
    blocks = [(m.group(1), m.end()) for m in re.finditer(r"^[ \t]*```cpp\n(.*?)^[ \t]*```", text, flags=re.S | re.M)]
    total += len(blocks)
    for number, (block, end) in enumerate(blocks, 1):
        lines = normalize(block)
        # The section's own words, up to the next heading, may name the file.
        rest = text[end:]
        section = rest[:rest.find("\n#")] if "\n#" in rest else rest
        named = re.search(r"are \[?`examples/([\w.]+)`\]?", section)
        if named:
            if not contains(sources.get(named.group(1), []), lines):
                missing += 1
                print(f"{page}: cpp block {number} is not in examples/{named.group(1)}, which the page names:\n" + block)
        elif not any(contains(src, lines) for src in sources.values()):
            missing += 1
            print(f"{page}: cpp block {number} is in no file of {examples}/:\n" + block)
print(f"{total - missing} of {total} cpp blocks of {len(pages)} pages found in examples/")
sys.exit(1 if missing or not total else 0)
