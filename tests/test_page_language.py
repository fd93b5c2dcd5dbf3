"""Pages speak about their subject, never about how the site was built.

A page that says "the issue behind this page set a target", "target met" or "a review found"
is talking about the tracker, the work session or the review that produced it, which means
nothing to a reader preparing for an interview. This test fails on such phrases anywhere in
``docs/**/*.md`` and names the file and line of each one.

The phrases are matched case-insensitively as whole words, so "issue" in its other senses
("the client issues a request", "issued", "reissue") passes.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"

#: phrases about the making of a page rather than its subject
TRACKER_PHRASES = (
    "the issue",
    "this issue",
    "an issue asked",
    "target met",
    "this session",
    "a review found",
)

_PATTERN = re.compile(r"\b(?:" + "|".join(re.escape(p).replace(r"\ ", r"\s+") for p in TRACKER_PHRASES) + r")\b",
                      re.IGNORECASE)


def tracker_phrases(text: str) -> list[tuple[int, str]]:
    """(line number, phrase) for every tracker phrase in ``text``; a phrase may span a line break."""
    return [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split())) for m in _PATTERN.finditer(text)]


@pytest.mark.parametrize("text, found", [
    ("The issue behind this page set a target.", ["The issue"]),
    ("what met the issue's target", ["the issue"]),
    ("It was raised in this\nissue.", ["this issue"]),
    ("An issue asked for a faster kernel.", ["An issue asked"]),
    ("Target met: 1.2x.", ["Target met"]),
    ("In this session we measured it.", ["this session"]),
    ("A review found the figure stale.", ["A review found"]),
    ("The client issues a request; the server issued a reply.", []),
    ("Reissue the call; tissue; the issuer.", []),
    ("Each Session.run call; a TensorFlow session runs the graph.", []),
])
def test_the_matcher_finds_tracker_phrases_and_only_them(text: str, found: list[str]) -> None:
    assert [phrase for _, phrase in tracker_phrases(text)] == found


def test_no_page_talks_about_how_it_was_built() -> None:
    pages = sorted(DOCS.rglob("*.md"))
    assert pages, f"no Markdown pages under {DOCS}"
    hits = [f"{page.relative_to(DOCS)}:{line}: {phrase!r}"
            for page in pages
            for line, phrase in tracker_phrases(page.read_text(encoding="utf-8"))]
    assert not hits, ("pages should speak about the subject, not about the tracker or the work "
                      "behind them; rewrite:\n" + "\n".join(hits))
