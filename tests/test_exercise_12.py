"""Exercise 12 (pipeline schedules and the bubble): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a wrong bubble formula plus an off-by-one 1F1B warm-up (in
  one notebook) get partial marks, failing exactly their own tests, each with the hint written
  for that mistake and a link to the concept paragraph;
* in process (no grader): more plausible mistakes (no ValueError, GPipe's backwards reversed, a
  warm-up not cut at m, a deadlock not detected or not named, the equal-stage bubble, a start
  time that ignores the stage) fail exactly their tests with their hints;
* in process: the source's functions equal ``reference_impl.train.pipeline_parallel`` on random inputs.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing
from reference_impl.train import pipeline_parallel as pipeline

SPEC = EXERCISES["12_pipeline_schedule"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_plausible_wrong_solutions_get_partial_marks_failing_exactly_their_tests(runs):
    failing = {"test_bubble_example", "hidden_bubble", "test_1f1b_example", "hidden_1f1b"}
    hints = assert_partial_marks(runs["wrong"], MAX_SCORE, failing=failing, score=MAX_SCORE - 6)
    assert "bubble_fraction(4, 8): expected 0.272727" in hints["test_bubble_example"]["hint"]
    assert "stage 0, op 3: expected ('B', 0), found ('F', 3)" in hints["test_1f1b_example"]["hint"]
    assert "smallest failing input: bubble_fraction(2, 1): expected 0.5, found 1.0" in hints["hidden_bubble"]["hint"]
    HINTS.assert_advice(hints, {"test_bubble_example": "idle share of the step", "hidden_bubble": "idle share of the step",
                          "test_1f1b_example": "warm-up forwards: the last stage none",
                          "hidden_1f1b": "warm-up forwards: the last stage none"})


F0, F1, B0, B1 = ("F", 0), ("F", 1), ("B", 0), ("B", 1)


@pytest.mark.parametrize("cell, old, new, advice", [
    ("bubble", "raise ValueError", "pass  #", {"hidden_bubble": "must refuse a pipeline"}),
    ("schedules", '[("B", i) for i in range(m)] for _ in range(p)]',
     '[("B", i) for i in reversed(range(m))] for _ in range(p)]',
     {"test_gpipe_example": "GPipe runs, on every stage", "hidden_gpipe": "GPipe is the same list"}),
    ("schedules", "w = min(p - s - 1, m)", "w = p - s - 1", {"hidden_1f1b": "right while m >= p"}),
    ("simulate", 'raise ValueError("the schedule deadlocks")', 'raise ValueError("stuck")',
     {"hidden_simulate": "must contain the word 'deadlock'"}),
    ("simulate", '        if not moved:\n            raise ValueError("the schedule deadlocks")',
     "        if not moved:\n            break", {"hidden_simulate": "simulate returned instead of raising"}),
    ("simulate", 'return {"makespan": makespan, "bubble": 1.0 - busy / (p * makespan)}',
     'return {"makespan": makespan, "bubble": (p - 1) / (len(schedule[0]) // 2 + p - 1)}',
     {"hidden_simulate": "The makespan is right and the bubble is not"}),
    ("simulate", "start = max(free[s], end[need] if need else 0.0)", "start = end[need] if need else free[s]",
     {"hidden_simulate": "The makespan differs"}),
], ids=["no_value_error", "gpipe_backwards_reversed", "warm_up_not_cut_at_m", "deadlock_not_named",
        "deadlock_not_detected", "equal_stage_bubble", "start_ignores_the_stage"])
def test_plausible_wrong_solutions_fail_their_tests_with_their_hints_in_process(cell, old, new, advice):
    tests = HINTS.graded_in_process(edit_cell(read_nb(SOURCE), cell, replacing(old, new)))
    HINTS.assert_advice(tests, advice)
    if "hidden_simulate" in advice:  # the smallest failing schedule, as a call to rerun
        assert f"simulate([[{F0}, " in tests["hidden_simulate"]["hint"]


def test_source_functions_match_the_reference_in_process():
    ns = notebook_namespace(read_nb(SOURCE), upto="simulate")
    rng = np.random.default_rng(12)
    for _ in range(30):
        p, m = int(rng.integers(1, 9)), int(rng.integers(1, 20))
        assert ns["bubble_fraction"](p, m) == pipeline.bubble_fraction(p, m)
        assert ns["gpipe_schedule"](p, m) == pipeline.gpipe_schedule(p, m)
        sched = ns["one_f_one_b_schedule"](p, m)
        assert sched == pipeline.one_f_one_b_schedule(p, m)
        tf, tb = list(rng.uniform(0.5, 2, p)), list(rng.uniform(0.5, 4, p))
        mine, ref = ns["simulate"](sched, tf, tb), pipeline.simulate(sched, tf, tb)
        assert mine["makespan"] == pytest.approx(ref["makespan"]) and mine["bubble"] == pytest.approx(ref["bubble"])
