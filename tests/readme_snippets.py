#!/usr/bin/env python3
"""Checks that every ```cpp block of README.md appears, line for line, in one
file under examples/ (which the test build compiles), so the README never
shows code that does not build. A section that says its blocks "are
[`examples/NAME`]" must have them in that very file (the quickstart, which the
tests also run). Leading whitespace, blank lines and #include lines are
ignored. Usage: readme_snippets.py README.md EXAMPLES_DIR"""
import pathlib, re, sys

readme, examples = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])

def normalize(text):
    return [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#include")]

def contains(haystack, needle):
    return any(haystack[i:i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))

sources = {p.name: normalize(p.read_text()) for p in sorted(examples.iterdir()) if p.suffix in (".cpp", ".hpp")}
text = readme.read_text()
blocks = [(m.group(1), m.end()) for m in re.finditer(r"^```cpp\n(.*?)^```", text, flags=re.S | re.M)]
missing = 0
for number, (block, end) in enumerate(blocks, 1):
    lines = normalize(block)
    # The section's own words, up to the next heading, may name the file.
    rest = text[end:]
    section = rest[:rest.find("\n#")] if "\n#" in rest else rest
    named = re.search(r"are \[`examples/([\w.]+)`\]", section)
    if named:
        if not contains(sources.get(named.group(1), []), lines):
            missing += 1
            print(f"README cpp block {number} is not in examples/{named.group(1)}, which the README names:\n" + block)
    elif not any(contains(src, lines) for src in sources.values()):
        missing += 1
        print(f"README cpp block {number} is in no file of {examples}/:\n" + block)
print(f"{len(blocks) - missing} of {len(blocks)} README cpp blocks found in examples/")
sys.exit(1 if missing or not blocks else 0)
