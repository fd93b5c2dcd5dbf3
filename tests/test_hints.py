"""Written hints (grader/hints.py): every test of every assignment has one, with a link that
works; the hint chosen for a failure is the one written for that mistake.

That each exercise's plausible wrong solutions get the hint written for them is checked
where they are graded, in tests/test_exercise_NN.py; that every ``read`` link lands on an
existing anchor of the built site is checked in tests/test_site.py.
"""
from __future__ import annotations

import re

import pytest
from conftest import ROOT
from notebook_tools import read_nb

from grader.hints import WrittenHint, read_hint, site_link

SOURCES = sorted((ROOT / "exercises" / "source").glob("*/*.ipynb"))


def test_cells(path):
    for cell in read_nb(path)["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] == "code" and meta.get("grade") and not meta.get("solution"):
            yield meta["grade_id"], cell


test_cells.__test__ = False  # a helper, not a test


@pytest.mark.parametrize("path", SOURCES, ids=[p.parent.name for p in SOURCES])
def test_every_test_has_a_hint_and_a_page_to_read(path):
    missing = []
    for grade_id, cell in test_cells(path):
        hint = read_hint(cell["metadata"])
        if hint is None or not hint.read:
            missing.append(grade_id)
            continue
        page, _, anchor = hint.read.partition("#")
        assert (ROOT / "docs" / page).is_file() and anchor, (grade_id, hint.read)
        assert 40 <= len(hint.hint) <= 600, (grade_id, len(hint.hint))
        for pattern, text in hint.cases:
            re.compile(pattern)
            assert text and text != hint.hint, (grade_id, pattern)
    assert not missing, f"tests without a written hint and a page to read: {missing}"


def test_the_hint_for_a_failure_is_the_first_case_it_matches():
    hint = WrittenHint("general", "concepts/autodiff.md#x", (("expected shape", "unbroadcast"), ("shape", "other")))
    assert hint.advice("AssertionError: expected shape (4,), found (3, 4)") == "unbroadcast"
    assert hint.advice("AssertionError: wrong shape") == "other"
    assert hint.advice("AssertionError: 3 != 4") == "general"
    assert hint.advice(None) == "general"


def test_site_links(monkeypatch):
    monkeypatch.delenv("LAB_SITE_URL", raising=False)
    assert site_link("concepts/autodiff.md#the-chain-rule") == "http://127.0.0.1:8000/concepts/autodiff/#the-chain-rule"
    assert site_link("index.md") == "http://127.0.0.1:8000/"
    monkeypatch.setenv("LAB_SITE_URL", "https://lab.example/docs")
    assert site_link("grading.md#devices") == "https://lab.example/docs/grading/#devices"
    assert site_link(None) is None
