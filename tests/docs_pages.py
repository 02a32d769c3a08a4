"""The documentation site's pages (docs/), read by the tests that run their code as it
stands: a page's section under a heading, and the fenced code blocks in it."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def page(name: str) -> str:
    """The Markdown of docs/<name>."""
    return (DOCS / name).read_text()


def section(name: str, heading: str) -> str:
    """The text under `heading` (without its #s) in docs/<name>, up to the next heading
    of the same or a higher level; an AssertionError names the page and heading."""
    text = page(name)
    match = re.search(rf"^(#+) {re.escape(heading)}[ \t]*$", text, re.M)
    assert match, f"docs/{name} lost its section {heading!r}"
    level = len(match.group(1))
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", _blank_fences(rest), re.M)
    return rest[: end.start()] if end else rest


def code_blocks(text: str, lang: str) -> list[str]:
    """The bodies of the ```lang fenced blocks in `text`, in order."""
    return re.findall(rf"^```{re.escape(lang)}\n(.*?)^```", text, re.S | re.M)


def _blank_fences(text: str) -> str:
    """`text` with fenced code replaced by spaces of the same length, so that a `#`
    comment line inside a block is never taken for a heading."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    return re.sub(r"^```.*?^```", blank, text, flags=re.S | re.M)
