"""Exercise 04 (gradient bucketing with overlap): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a solution that reduces every bucket only in ``wait()``
  (right numbers, right messages, no overlap) gets partial marks: exactly the overlap tests
  fail, each with the hint written for that mistake (the test cell's ``lab`` metadata, chosen
  by the failure message) and a link to its paragraph;
* in process: a plan that keeps a full bucket open (``>`` for ``>=``) and a bucketer that sums
  without dividing by the number of ranks get their hints; the source notebook's bucket plan
  equals the reference's on random sizes.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import (
    Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing, run_cells,
)

SPEC = EXERCISES["04_gradient_bucketing"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
OVERLAP_TESTS = {"test_overlap_example", "hidden_bucket_ships_when_full"}

pytestmark = pytest.mark.timeout(300)

FULL_BUCKET_STAYS_OPEN = replacing("if filled >= bucket_bytes:", "if filled > bucket_bytes:")
NO_AVERAGE = replacing('''                bucket["avg"] /= self.comm.size
''', "")
TIMING_TESTS = ("test_overlap", "hidden_bucket_ships")  # timed on a shared machine: not run in process


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_reducing_everything_at_the_end_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["at_end"], MAX_SCORE, failing=OVERLAP_TESTS)
    assert "as soon as that bucket was full" in tests["hidden_bucket_ships_when_full"]["hint"]
    assert "expected communication to start before backward ended" in tests["test_overlap_example"]["hint"]
    HINTS.assert_advised(tests, {gid: HINTS.written(gid).hint for gid in OVERLAP_TESTS})


def test_a_full_bucket_left_open_gets_its_hint_in_process():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "plan_buckets", FULL_BUCKET_STAYS_OPEN), skip=TIMING_TESTS)
    assert "(bucket 0 stayed open after holding 8 bytes, bucket_bytes = 8)" in outcome["test_plan_buckets_examples"]
    assert HINTS.advice_in_process(outcome, whole=True) == {
        "test_plan_buckets_examples": HINTS.case("test_plan_buckets_examples", r"stayed open after holding")}


def test_summing_without_averaging_gets_its_hint_in_process():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "GradientBucketer", NO_AVERAGE), skip=TIMING_TESTS)
    assert "(exactly 2 x the average, with 2 ranks)" in outcome["hidden_averaged_gradients"], outcome
    assert "reproduce: w = (7, 9, 4); p = init_mlp(w, seed=2)" in outcome["hidden_averaged_gradients"]
    assert HINTS.advice_in_process(outcome, whole=True) == {
        gid: HINTS.case(gid, r"exactly \d+ x the average")
        for gid in ("test_averaged_gradients_example", "hidden_averaged_gradients")}


def test_source_bucket_plan_matches_the_reference_in_process():
    from reference_impl.comm.bucketing import plan_buckets

    namespace = notebook_namespace(read_nb(SOURCE), upto="plan_buckets")
    rng = np.random.default_rng(3)
    for _ in range(100):
        sizes = [int(s) for s in rng.integers(0, 900, size=int(rng.integers(0, 12)))]
        cap = int(rng.integers(0, 3000))
        assert namespace["plan_buckets"](sizes, cap) == plan_buckets(sizes, cap)
