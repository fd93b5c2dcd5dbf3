"""Exercise 02 (fitting α and β): what is specific to it. The checks every exercise shares
(full marks with the solutions, zero for the stubs with the general hints, nothing secret in
the release, every source cell passing in process, within 30 s here) are tests/test_exercises.py's.

* graded with ``python -m grader`` (the session's one grading, ``graded``): a plausible wrong
  solution of tests/exercise_specs.py scores partial marks, failing the tests meant to catch
  it: ordinary least squares on the seconds (α drowned by the large messages) together with a
  ring formula that forgets the 2(p−1)/p factor; every failing test shows the hint written
  for that mistake (the test cell's ``lab`` metadata, chosen by the failure message) and a
  link to its paragraph;
* in process (quick): a fit against log(size) fails exactly the fit tests; a ping-pong that
  averages, one that returns whole round trips, and a recursive-doubling formula that pays
  the bandwidth term once get their hints.
"""
from __future__ import annotations

from typing import Any

import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, by_id, edit_cell, read_nb, replacing, run_cells

SPEC = EXERCISES["02_alpha_beta"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score

pytestmark = pytest.mark.timeout(300)


LOG_SIZE = ("design = np.stack([1 / t, m / t], axis=1)", "design = np.stack([1 / t, np.log2(np.maximum(m, 1)) / t], axis=1)")
MEAN = ("statistics.median(halves)", "statistics.mean(halves)")
ROUND_TRIP = ("halves.append((clock() - t0) / 2)", "halves.append(clock() - t0)")
RD_BANDWIDTH_ONCE = ("int(np.log2(p)) * (alpha + n_bytes * beta)", "int(np.log2(p)) * alpha + n_bytes * beta")
FACTOR_CASE = r"leaves 1 x N\*beta"


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


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
