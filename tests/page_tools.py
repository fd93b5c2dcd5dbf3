"""What the page tests share: a page that quotes a measured figure must say what the JSON says.

Each test module that owns a benchmark lists ``(page, sentence)`` pairs, the sentences
formatted from the committed ``docs/assets/bench/*.json``; ``assert_pages_quote`` collects
every sentence a page no longer contains (whitespace-insensitive) and fails once, naming
them all, so re-running a benchmark says exactly which sentences to update.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def assert_pages_quote(quotes: Iterable[tuple[Path, str]]) -> None:
    """Every ``(page, sentence)``: the page (a path under docs/) contains the sentence."""
    bodies: dict[Path, str] = {}
    stale = []
    for page, sentence in quotes:
        if page not in bodies:
            bodies[page] = " ".join(page.read_text(encoding="utf-8").split())
        if sentence not in bodies[page]:
            stale.append(f"{page.relative_to(DOCS)} should say: {sentence}")
    assert not stale, "figures that no longer match docs/assets/bench/*.json:\n" + "\n".join(stale)
