#!/usr/bin/env python3
"""Checks that every table the descriptions make (tools/describe_tables) is on
README.md or a page of the documentation site (docs/**/*.md), between
<!-- describe:NAME:begin --> and <!-- describe:NAME:end -->, exactly as the
program prints it, wherever it appears; fails with a diff where one drifts,
and when a table appears on no page.
Usage: readme_tables.py DESCRIBE_TABLES PAGE_OR_FOLDER... [--update]  (a folder: its **/*.md)"""
import difflib, pathlib, re, subprocess, sys

program = sys.argv[1]
update = "--update" in sys.argv[2:]
pages = []
for arg in (pathlib.Path(a) for a in sys.argv[2:] if a != "--update"):
    pages += sorted(arg.rglob("*.md")) if arg.is_dir() else [arg]
texts = {page: page.read_text() for page in pages}
names = subprocess.run([program, "--list"], check=True, capture_output=True, text=True).stdout.split()
failed = 0
for name in names:
    want = subprocess.run([program, name], check=True, capture_output=True, text=True).stdout
    pattern = re.compile(r"(<!-- describe:%s:begin -->\n)(.*?)(<!-- describe:%s:end -->)" % (re.escape(name), re.escape(name)), re.S)
    found = 0
    for page, text in texts.items():
        for match in reversed(list(pattern.finditer(text))):
            found += 1
            if match.group(2) == want:
                continue
            if update:
                text = text[:match.start(2)] + want + text[match.end(2):]
                continue
            failed += 1
            print(f"{page}: table '{name}' drifted from its description; the difference (- page, + description):")
            sys.stdout.writelines(difflib.unified_diff(match.group(2).splitlines(True), want.splitlines(True), str(page), "description"))
        texts[page] = text
    if not found:
        print(f"no page has a <!-- describe:{name}:begin --> ... <!-- describe:{name}:end --> block")
        failed += 1
if update:
    for page, text in texts.items():
        if text != page.read_text():
            page.write_text(text)
print(f"{len(names) - failed} of {len(names)} described tables match their pages")
sys.exit(1 if failed or not names else 0)
