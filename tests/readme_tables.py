#!/usr/bin/env python3
"""Checks that every table the descriptions make (tools/describe_tables) is in
README.md, between <!-- describe:NAME:begin --> and <!-- describe:NAME:end -->,
exactly as the program prints it; fails with a diff where they drift.
Usage: readme_tables.py README.md DESCRIBE_TABLES [--update]"""
import difflib, re, subprocess, sys

readme_path, program = sys.argv[1], sys.argv[2]
update = "--update" in sys.argv[3:]
text = open(readme_path).read()
names = subprocess.run([program, "--list"], check=True, capture_output=True, text=True).stdout.split()
failed = 0
for name in names:
    want = subprocess.run([program, name], check=True, capture_output=True, text=True).stdout
    pattern = re.compile(r"(<!-- describe:%s:begin -->\n)(.*?)(<!-- describe:%s:end -->)" % (re.escape(name), re.escape(name)), re.S)
    match = pattern.search(text)
    if not match:
        print(f"README has no <!-- describe:{name}:begin --> ... <!-- describe:{name}:end --> block")
        failed += 1
        continue
    if match.group(2) != want:
        if update:
            text = text[:match.start(2)] + want + text[match.end(2):]
            continue
        failed += 1
        print(f"README table '{name}' drifted from its description; the difference (- README, + description):")
        sys.stdout.writelines(difflib.unified_diff(match.group(2).splitlines(True), want.splitlines(True), "README.md", "description"))
if update:
    open(readme_path, "w").write(text)
print(f"{len(names) - failed} of {len(names)} described tables match README.md")
sys.exit(1 if failed or not names else 0)
