"""The documentation: docs/configuration.md's reference is the current rendering of the pydantic
models, the README is a landing page that links every page, and the site builds strictly."""

import os
import re
import subprocess
import sys
from pathlib import Path

from worker.configdoc import BEGIN, END, PAGE, render

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 200


def test_config_reference_is_current():
    text = (REPO / PAGE).read_text()
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()
    assert block == render().strip(), f"run: python -m worker.configdoc --update {PAGE}"


def test_readme_quick_start_commands_exist():
    text = README.read_text()
    makefile = (REPO / "Makefile").read_text()
    assert "make demo" in text and "make test" in text
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_readme_is_a_landing_page_that_links_every_docs_page():
    text = README.read_text()
    lines = text.count("\n") + (not text.endswith("\n"))
    assert lines <= README_MAX_LINES, f"README.md: {lines} lines, at most {README_MAX_LINES}"
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)\s]*)?\)", text))
    pages = {p.relative_to(REPO).as_posix() for p in DOCS.rglob("*.md")}
    assert pages, "no pages under docs/"
    assert not pages - linked, f"README.md links none of {sorted(pages - linked)}"
    assert not linked - pages, f"README.md links pages that do not exist: {sorted(linked - pages)}"
    assert "make docs" in text and "\ndocs:" in (REPO / "Makefile").read_text()


def test_the_site_builds_strictly_without_warnings(tmp_path):
    # strict (mkdocs.yml): a broken link or anchor, or a page left out of the nav, fails it
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                        str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True,
                       env=env, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "WARNING" not in out, out
    assert (tmp_path / "site" / "index.html").is_file()
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert (tmp_path / "site" / page.stem / "index.html").is_file(), page.name
