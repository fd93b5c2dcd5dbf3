"""Hints the instructor wrote for a test: ``lab.hint`` in the test cell's metadata.

The grader's own hint for a failed test is the first line of its failure (the assertion
message: what was expected, what was found). An instructor can add a second kind, written
for that test in advance: where the usual mistake lies, which part of the concept page to
reread. It sits in the source notebook's test cell metadata::

    "metadata": {"nbgrader": {...}, "lab": {"hint": "Chunk r starts at r * ceil(N / n) ..."}}

It is read from the course's source notebook, never from the learner's copy (a learner
cannot write their own hints into the report), and shown only for tests that failed.
"""
from __future__ import annotations

import json
from pathlib import Path

from .course import Course


def written_hints(course: Course, assignment: str) -> dict[str, str]:
    """``{grade_id: hint}`` of every test cell of ``assignment`` that has a written hint."""
    found = course.assignment(assignment)
    if found is None:
        return {}
    hints = {}
    for notebook in found.notebooks:
        content = json.loads(Path(notebook).read_text(encoding="utf-8"))
        for cell in content.get("cells", []):
            meta = cell.get("metadata", {})
            grade_id = meta.get("nbgrader", {}).get("grade_id")
            hint = meta.get("lab", {}).get("hint") if isinstance(meta.get("lab"), dict) else None
            if grade_id and isinstance(hint, str) and hint.strip():
                hints[grade_id] = " ".join(hint.split())
    return hints


def failed_with_hints(tests: list[dict], hints: dict[str, str]) -> dict[str, str]:
    """The written hints of the failed tests among ``tests`` (dicts with ``id`` and ``passed``)."""
    return {t["id"]: hints[t["id"]] for t in tests if not t["passed"] and t["id"] in hints}
