"""What every exercise must do, checked once for all 16 (parametrised over tests/exercise_specs.py,
ids = assignment names); what is specific to one exercise is in tests/test_exercise_NN.py.

Through ``python -m grader`` (``graded(assignment)``: the release, the release with solutions and
the exercise's wrong solutions graded at once, once a session, shared with test_exercise_NN.py):

* the released notebook with its solution cells filled in from the source scores full marks,
  with the exercise's number of tests and hidden tests, no tampered cell and no cell error: the
  release holds every test cell (the hidden ones emptied), so its hidden tests came back from
  the gradebook, not from the learner's file;
* the released notebook as handed out scores 0 without crashing, every test failing with a
  NotImplementedError, each with its general written hint (or the case the spec's
  ``stub_advice`` names) and a link to its paragraph, and a feedback page is written;
* the release holds no solution and no hidden test (the delimiters and the exercise's secrets,
  each of which the source does hold), one ``raise NotImplementedError()`` stub per solution
  cell, and ``lab`` metadata naming the assignment and a concept page that exists.

In process (fast): every cell of the source notebook passes, all its tests run, quickly.
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import pytest

from exercise_specs import EXERCISES, Exercise
from notebook_tools import (
    Hints, ROOT, assert_nothing_leaked, assert_solved, assert_unimplemented_scores_zero, grade_id, read_nb,
    run_cells, source_of,
)

pytestmark = pytest.mark.timeout(300)

SPECS = list(EXERCISES.values())
each_exercise = pytest.mark.parametrize("spec", SPECS, ids=[s.assignment for s in SPECS])


@functools.cache
def hints(assignment: str) -> Hints:
    return Hints(EXERCISES[assignment].source)


def skip_without_what_it_needs(spec: Exercise) -> None:
    if spec.needs_c_compiler:
        from reference_impl.toolchain import ToolchainError, find_c_compiler

        try:
            find_c_compiler()
        except ToolchainError:
            pytest.skip("no C compiler on this machine")


@each_exercise
def test_released_notebook_with_solutions_scores_full_marks(spec, graded):
    skip_without_what_it_needs(spec)
    runs = graded(spec.assignment)
    result = runs["released_solved"]
    assert_solved(result, spec.assignment, spec.max_score, tests=spec.tests, hidden=spec.hidden)
    # the released file holds every test cell, the hidden ones emptied: they came from the gradebook
    missing = [t["id"] for t in result["tests"] if t["id"] not in runs["released_text"]]
    assert not missing, f"test cells missing from the release: {missing}"


@each_exercise
def test_released_notebook_scores_zero_with_the_general_hints(spec, graded):
    skip_without_what_it_needs(spec)
    result = graded(spec.assignment)["released"]
    assert_unimplemented_scores_zero(result, spec.max_score)
    hints(spec.assignment).assert_general_hints(result, spec.stub_advice)  # nothing is a known mistake yet
    assert Path(result["feedback_html"]).is_file()


@each_exercise
def test_release_holds_no_solution_and_no_hidden_test(spec, graded):
    skip_without_what_it_needs(spec)
    runs = graded(spec.assignment)
    source = "\n".join(source_of(c) for c in read_nb(spec.source)["cells"])
    assert [s for s in spec.secrets if s not in source] == [], "a secret the source does not hold checks nothing"
    released = read_nb(runs["released_path"])
    assert_nothing_leaked(runs["released_text"], *spec.secrets)
    assert_nothing_leaked(json.dumps(released), *spec.secrets)
    stubs = {grade_id(c): source_of(c) for c in released["cells"] if c["metadata"].get("nbgrader", {}).get("solution")}
    assert tuple(stubs) == spec.solution_cells, list(stubs)
    assert all("raise NotImplementedError()" in stub for stub in stubs.values()), stubs
    lab = {"assignment": spec.assignment, "concept_page": spec.concept_page}
    if spec.devices is not None:
        lab["devices"] = list(spec.devices)
    assert released["metadata"]["lab"] == lab
    assert (ROOT / "docs" / spec.concept_page).is_file()


@each_exercise
def test_every_cell_of_the_source_notebook_passes_in_process(spec):
    """The fast version of the full-marks test: run every code cell in one namespace."""
    skip_without_what_it_needs(spec)
    start = time.monotonic()
    outcome = run_cells(read_nb(spec.source))
    failed = {gid: error for gid, error in outcome.items() if error is not None}
    assert not failed, failed
    assert len(outcome) == spec.tests, sorted(outcome)
    assert time.monotonic() - start < spec.in_process_seconds, "the notebook must stay quick to grade"
