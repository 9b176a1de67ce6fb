"""The docs' home page lists every page of the site, as the MkDocs navigation does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[2] / "docs"
SECTIONS = ("tutorial", "how-to", "reference", "explanation")


def _pages(section):
    return sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / section).glob("*.md"))


@pytest.mark.parametrize("section", SECTIONS)
def test_index_lists_every_page(section):
    linked = set(re.findall(r"\]\(([^)#\s]+\.md)", (DOCS / "index.md").read_text(encoding="utf-8")))
    missing = [page for page in _pages(section) if page not in linked]
    assert not missing, f"docs/index.md does not list {missing}"


@pytest.mark.parametrize("section", SECTIONS)
def test_navigation_lists_every_page(section):
    nav = (DOCS.parent / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [page for page in _pages(section) if page not in nav]
    assert not missing, f"mkdocs.yml's nav does not list {missing}"


def _user_pages():
    return [DOCS.parent / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", _user_pages(), ids=lambda p: p.name)
def test_user_pages_mention_no_issue_numbers(page):
    """Readers of the docs never saw the tracker: a page says what holds, not which issue asked."""
    # "issue 13", "issues #4", "#17" (not a heading's "## 1." nor a link's "#1-a-strategy")
    found = re.findall(r"\bissues?\s*#?\d+\b|(?<![#\w])#\d+\b(?!-)", page.read_text(encoding="utf-8"), re.I)
    assert not found, f"{page.name} mentions {found}"
