#!/usr/bin/env python3
"""Builds the documentation site with `mkdocs build --strict` (a link to a page
that does not exist fails it), then checks what MkDocs 1.4 does not: that every
link into a page's #anchor names a heading that is there, and that every
relative link of README.md names a file of the repository.
The API reference (Doxygen's HTML, when built) is copied in as SITE_DIR/api/html.
Usage: docs_site.py MKDOCS SOURCE_ROOT SITE_DIR [API_HTML_DIR]"""
import html, pathlib, re, shutil, subprocess, sys, urllib.parse

mkdocs, root, site = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
api_html = pathlib.Path(sys.argv[4]) if len(sys.argv) > 4 else None
# cwd: the snippets extension includes BENCHMARKS.md relative to the source root.
built = subprocess.run([mkdocs, "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)], cwd=root)
if built.returncode != 0:
    print("mkdocs build --strict failed")
    sys.exit(1)

broken = []
pages = {p: p.read_text() for p in site.rglob("*.html")}
ids = {p: set(re.findall(r'\bid="([^"]+)"', text)) for p, text in pages.items()}
for page, text in pages.items():
    for href in re.findall(r'\bhref="([^"]+)"', text):
        href = html.unescape(href)
        if re.match(r"^[a-z]+:", href) or "#" not in href:
            continue
        path, fragment = href.split("#", 1)
        target = (page.parent / urllib.parse.unquote(path)).resolve() if path else page
        if target.is_dir():
            target = target / "index.html"
        if target in ids and fragment and urllib.parse.unquote(fragment) not in ids[target]:
            broken.append(f"{page.relative_to(site)}: {href}")

readme = (root / "README.md").read_text()
for target in re.findall(r"\]\(([^)\s]+)\)", readme):
    if re.match(r"^[a-z]+:", target) or target.startswith("#"):
        continue
    if not (root / target.split("#", 1)[0]).exists():
        broken.append(f"README.md: {target}")

# Doxygen's pages come in after the check: their anchors are Doxygen's business.
if api_html is not None and (api_html / "index.html").exists():
    shutil.copytree(api_html, site / "api" / "html", dirs_exist_ok=True)

for link in broken:
    print("broken link:", link)
print(f"site built; {len(broken)} broken anchor or README links")
sys.exit(1 if broken else 0)
