"""MkDocs hook (mkdocs.yml `hooks:`): a pipe inside a code span of a table row is written `\\|`
in the Markdown (GitHub's tables split on every unescaped pipe, code spans included), while
Python-Markdown keeps the backslash there; it already leaves pipes inside code spans alone,
so the escape is dropped for it before the page is rendered."""

from __future__ import annotations

import re

_CODE = re.compile(r"`[^`\n]*`")


def on_page_markdown(markdown: str, **_) -> str:
    return "\n".join(
        _CODE.sub(lambda m: m.group(0).replace("\\|", "|"), line) if line.startswith("|")
        else line
        for line in markdown.split("\n"))
