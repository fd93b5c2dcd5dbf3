"""Hints the instructor wrote for a test, and where on the site the idea is explained.

The grader's own message for a failed test is the first line of its failure (the assertion
message: the smallest failing input, what was expected, what was found, and a line that
reproduces it). The instructor adds a second kind, written in advance for that test from
running the plausible wrong solutions: what the usual mistake is and which paragraph of
the concept page explains it. It sits in the source notebook's test cell metadata::

    "metadata": {"nbgrader": {...}, "lab": {
        "hint": "Chunk r of n covers [r*ceil(N/n), (r+1)*ceil(N/n)) ...",
        "hints": [{"match": "expected shape", "hint": "a gradient must have its input's shape ..."}],
        "read": "concepts/allreduce-algorithms.md#ring-allreduce"}}

``hint`` is the test's hint for its likely mistakes; each entry of ``hints`` is a hint for
one mistake, chosen when its ``match`` (a regular expression) is found in the failure
message, before the general ``hint``. ``read`` is a page of ``docs/`` with the anchor of the
paragraph that explains the concept; ``site_link`` turns it into the page's address on the
built site.

Hints are read from the course's source notebook, never from the learner's copy (a learner
cannot write their own hints into the report), and shown only for tests that failed.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .course import Course

SITE_URL = "http://127.0.0.1:8000/"  # where `make serve` serves the site; LAB_SITE_URL overrides


@dataclass(frozen=True)
class WrittenHint:
    """What the instructor wrote for one test cell."""

    hint: str
    read: str | None = None  # "concepts/page.md#anchor"
    cases: tuple[tuple[str, str], ...] = field(default=())  # (regular expression, hint)

    def advice(self, failure: str | None) -> str:
        """The hint for a failure with message ``failure``: the first case it matches, else the general one."""
        for pattern, hint in self.cases:
            if failure and re.search(pattern, failure):
                return hint
        return self.hint


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def read_hint(metadata: dict) -> WrittenHint | None:
    """The ``WrittenHint`` of a cell's metadata, or None when it has no ``lab.hint``."""
    lab = metadata.get("lab")
    if not isinstance(lab, dict) or not isinstance(lab.get("hint"), str) or not lab["hint"].strip():
        return None
    cases = tuple((str(c["match"]), _one_line(c["hint"])) for c in lab.get("hints", [])
                  if isinstance(c, dict) and c.get("match") and c.get("hint"))
    read = lab.get("read") if isinstance(lab.get("read"), str) and lab.get("read") else None
    return WrittenHint(_one_line(lab["hint"]), read, cases)


def written_hints(course: Course, assignment: str) -> dict[str, WrittenHint]:
    """``{grade_id: WrittenHint}`` of every test cell of ``assignment`` that has a written hint."""
    found = course.assignment(assignment)
    if found is None:
        return {}
    hints = {}
    for notebook in found.notebooks:
        content = json.loads(Path(notebook).read_text(encoding="utf-8"))
        for cell in content.get("cells", []):
            meta = cell.get("metadata", {})
            grade_id = meta.get("nbgrader", {}).get("grade_id")
            hint = read_hint(meta)
            if grade_id and hint is not None:
                hints[grade_id] = hint
    return hints


def site_url() -> str:
    """The base address of the site the links point to (``LAB_SITE_URL``, else ``make serve``'s)."""
    base = os.environ.get("LAB_SITE_URL") or SITE_URL
    return base if base.endswith("/") else base + "/"


def site_link(read: str | None) -> str | None:
    """``concepts/page.md#anchor`` as the address of that paragraph on the site."""
    if not read:
        return None
    page, _, anchor = read.partition("#")
    if page.endswith("index.md"):
        path = page[: -len("index.md")]
    elif page.endswith(".md"):
        path = page[:-3] + "/"
    else:
        path = page
    return site_url() + path + (f"#{anchor}" if anchor else "")
