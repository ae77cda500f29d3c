"""The README stays short enough to read to the end, and it and the pages under docs/ that hold
the full tables never point at a file or a heading that is not there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """The fragments a Markdown renderer makes of a file's headings (GitHub's rule)."""
    headings = re.findall(r"^#{1,6} (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def links(path: Path) -> list[str]:
    prose = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_at_most_300_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_the_readme_links_every_docs_page():
    readme = README.read_text(encoding="utf-8")
    assert PAGES, "docs/ holds the full tables"
    assert [p.name for p in PAGES if f"(docs/{p.name}" not in readme] == []


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.name)
def test_every_relative_link_and_anchor_exists(path):
    broken = []
    for target in links(path):
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists() or (
            fragment
            and dest.suffix == ".md"
            and fragment not in anchors(dest.read_text(encoding="utf-8"))
        ):
            broken.append(target)
    assert broken == []
