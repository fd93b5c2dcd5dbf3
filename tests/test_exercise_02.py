"""Exercise 02 (fitting α and β), graded end to end with ``python -m grader`` as a learner would.

The grader runs are slow (a Jupyter kernel each), so they start together, once, in the
module fixture ``runs``, and each test reads its result. What is checked:

* the released notebook scores 0, every test failing with a NotImplementedError hint, and
  grading still completes;
* the released notebook with its solution cells filled from the source scores full marks
  (so the hidden tests come from the gradebook, not from the learner's file);
* a plausible wrong solution scores partial marks, failing the tests meant to catch it:
  ordinary least squares on the seconds (α drowned by the large messages) together with a
  ring formula that forgets the 2(p−1)/p factor; a fit against log(size) fails exactly the
  fit tests (checked in process, which is quick);
* every failing test of a wrong solution shows the hint written for that mistake (the test
  cell's ``lab`` metadata, chosen by the failure message) and a link to its paragraph; in
  process, the same for a ping-pong that averages, one that returns whole round trips, and a
  recursive-doubling formula that pays the bandwidth term once;
* released notebooks hold no solution and no hidden test;
* in process (fast): every cell of the source notebook passes.
"""
from __future__ import annotations

import json
import time
from typing import Any

import pytest

from notebook_tools import (
    Hints, ROOT, assert_solved, assert_unimplemented_scores_zero, by_id, edit_cell, grade_assignment, read_nb,
    replacing, run_cells, source_of,
)

ASSIGNMENT = "02_alpha_beta"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "alpha_beta.ipynb"
HINTS = Hints(SOURCE)
MAX_SCORE = 20.0
SOLUTION_CELLS = ("pingpong", "fit_alpha_beta", "ring_allreduce_time", "recursive_doubling_time")

pytestmark = pytest.mark.timeout(300)


OLS = ("design = np.stack([1 / t, m / t], axis=1)\n    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)",
       "design = np.stack([np.ones_like(m), m], axis=1)\n    (alpha, beta), *_ = np.linalg.lstsq(design, t, rcond=None)")
NO_FACTOR = ("2 * (p - 1) / p * n_bytes * beta", "n_bytes * beta")
LOG_SIZE = ("design = np.stack([1 / t, m / t], axis=1)", "design = np.stack([1 / t, np.log2(np.maximum(m, 1)) / t], axis=1)")
MEAN = ("statistics.median(halves)", "statistics.mean(halves)")
ROUND_TRIP = ("halves.append((clock() - t0) / 2)", "halves.append(clock() - t0)")
RD_BANDWIDTH_ONCE = ("int(np.log2(p)) * (alpha + n_bytes * beta)", "int(np.log2(p)) * alpha + n_bytes * beta")
FACTOR_CASE = r"leaves 1 x N\*beta"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    source = read_nb(SOURCE)
    wrong = {"wrong_ols_no_factor": edit_cell(edit_cell(source, "fit_alpha_beta", replacing(*OLS)),
                                              "ring_allreduce_time", replacing(*NO_FACTOR))}
    return grade_assignment(tmp_path_factory.mktemp("exercise02"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=10, hidden=6)


def test_released_notebook_scores_zero_without_crashing(runs):
    result = runs["released"]
    assert_unimplemented_scores_zero(result, MAX_SCORE)
    HINTS.assert_general_hints(result)  # nothing is a known mistake yet: every test gets its general hint


def test_least_squares_on_seconds_and_a_forgotten_factor_get_partial_marks(runs):
    result = runs["wrong_ols_no_factor"]
    tests = by_id(result)
    assert 0 < result["score"] < MAX_SCORE, result
    for failing in ("hidden_fit_noisy", "test_ring_example", "hidden_ring", "hidden_end_to_end"):
        assert not tests[failing]["passed"] and tests[failing]["score"] == 0, tests[failing]
    for passing in ("test_fit_example", "hidden_fit_exact", "hidden_pingpong", "hidden_recursive_doubling"):
        assert tests[passing]["passed"], tests[passing]
    hint = tests["hidden_fit_noisy"]["hint"]
    assert "expected alpha within 10 %" in hint and "found" in hint, hint
    assert "Without the noise your fit is right." in hint, hint
    assert "expected 0.01407 s, found 0.00807" in tests["test_ring_example"]["hint"]
    assert "that leaves 1 x N*beta where 1.75 x is expected" in tests["test_ring_example"]["hint"]
    assert "reproduce: ring_allreduce_time(" in tests["hidden_ring"]["hint"]
    HINTS.assert_advised(tests, {
        "hidden_fit_noisy": HINTS.written("hidden_fit_noisy").hint,  # least squares in seconds: the general hint
        "test_ring_example": HINTS.case("test_ring_example", FACTOR_CASE),
        "hidden_ring": HINTS.case("hidden_ring", FACTOR_CASE),
        "hidden_end_to_end": HINTS.case("hidden_end_to_end", r"\) recovers the link"),
    })


def test_fitting_against_log_size_fails_the_fit_tests_only():
    """In process (the graded runs above show in-process outcomes are what the grader scores)."""
    outcome = run_cells(edit_cell(read_nb(SOURCE), "fit_alpha_beta", replacing(*LOG_SIZE)))
    for failing in ("test_fit_example", "hidden_fit_exact", "hidden_fit_noisy", "hidden_end_to_end"):
        assert outcome[failing] is not None and "expected" in outcome[failing], (failing, outcome[failing])
    for passing in ("test_pingpong_example", "hidden_pingpong", "hidden_ring", "hidden_recursive_doubling"):
        assert outcome[passing] is None, (passing, outcome[passing])
    assert HINTS.advice_in_process(outcome, whole=True) == {
        "test_fit_example": HINTS.written("test_fit_example").hint,
        "hidden_fit_exact": HINTS.written("hidden_fit_exact").hint,
        "hidden_fit_noisy": HINTS.case("hidden_fit_noisy", r"Without the noise your fit is off too"),
        "hidden_end_to_end": HINTS.case("hidden_end_to_end", r"\) misses the link"),
    }


@pytest.mark.parametrize("cell, edit, expected", [
    ("pingpong", MEAN, {"hidden_pingpong": r"averaged over 5 round trips"}),
    ("pingpong", ROUND_TRIP, {"test_pingpong_example": r"2\.00 x the one-way time",
                              "hidden_pingpong": r"2\.00 x the one-way time",
                              "hidden_end_to_end": r"\) misses the link"}),
    ("recursive_doubling_time", RD_BANDWIDTH_ONCE, {"test_recursive_doubling_example": FACTOR_CASE,
                                                    "hidden_recursive_doubling": FACTOR_CASE}),
], ids=["mean_of_round_trips", "whole_round_trips", "bandwidth_term_once"])
def test_other_plausible_mistakes_get_their_hints_in_process(cell, edit, expected):
    outcome = run_cells(edit_cell(read_nb(SOURCE), cell, replacing(*edit)), skip=("demo",))
    assert HINTS.advice_in_process(outcome, whole=True) == {gid: HINTS.case(gid, pattern) for gid, pattern in expected.items()}, outcome


def test_release_has_no_solutions_and_no_hidden_tests(runs):
    released = read_nb(runs["released_path"])
    text = json.dumps(released)
    for secret in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "np.linalg.lstsq(design", "statistics.median(halves)",
                   "_ref_fit", "2 * (p - 1) / p * n_bytes * beta"):
        assert secret not in text, f"{secret!r} leaked into the release"
    stubs = [source_of(c) for c in released["cells"] if c["metadata"].get("nbgrader", {}).get("solution")]
    assert len(stubs) == len(SOLUTION_CELLS) and all("raise NotImplementedError()" in s for s in stubs)
    assert released["metadata"]["lab"] == {"assignment": ASSIGNMENT, "concept_page": "concepts/latency-vs-throughput.md"}


def test_every_cell_of_the_source_notebook_passes_in_process():
    """The fast version of the full-marks test: run every code cell in one namespace."""
    start = time.monotonic()
    failed = {gid: err for gid, err in run_cells(read_nb(SOURCE)).items() if err is not None}
    assert not failed, failed
    assert time.monotonic() - start < 30, "the notebook must stay quick to grade"
