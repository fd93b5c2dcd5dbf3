"""Every concept page and every question page ends with its primary sources.

A claim about a real system or a published result is only as good as the source behind it,
so each page of docs/concepts/ and docs/questions/ has a final ``## Sources`` section with
at least one entry (a paper with its venue or arXiv id, a file in a named repository at a
tag or commit, or a standard's section).
"""
from __future__ import annotations

import re

import pytest
from conftest import ROOT

QUESTIONS = ROOT / "docs" / "questions"
PAGES = sorted((ROOT / "docs" / "concepts").glob("*.md")) + sorted(QUESTIONS.glob("n*.md")) + sorted(QUESTIONS.glob("l*.md"))


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_ends_with_its_sources(page):
    text = page.read_text(encoding="utf-8")
    heads = [m.start() for m in re.finditer(r"^## ", text, re.MULTILINE)]
    sources = [m.start() for m in re.finditer(r"^## Sources\s*$", text, re.MULTILINE)]
    assert len(sources) == 1, f"{page.name}: expected one '## Sources' section, found {len(sources)}"
    assert sources[0] == heads[-1], f"{page.name}: '## Sources' must be the last section"
    entries = re.findall(r"^[*-] \S.{20,}", text[sources[0]:], re.MULTILINE)
    assert entries, f"{page.name}: its Sources section lists nothing"
