"""Exercise 12 (pipeline schedules and the bubble), graded end to end with ``python -m grader``.

Checked, with the grader runs started together once: the source notebook scores full marks;
the released notebook scores 0 and grading it completes; the released notebook with the
solution cells filled in from the source scores full marks; a wrong bubble formula plus an
off-by-one 1F1B warm-up get partial marks, failing exactly their own tests, each with the hint
written for that mistake and a link to the concept paragraph; in process (no grader), more
plausible mistakes (no ValueError, GPipe's backwards reversed, a warm-up not cut at m, a
deadlock not detected or not named, the equal-stage bubble, a start time that ignores the
stage) fail exactly their tests with their hints; and,
in process, the source's functions equal the reference on random inputs.
"""
from __future__ import annotations

import numpy as np
import pytest

from notebook_tools import (
    Hints, ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero,
    edit_cell, grade_assignment, notebook_namespace, read_nb, replacing,
)
from reference_impl.train import pipeline

ASSIGNMENT = "12_pipeline_schedule"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "pipeline_schedule.ipynb"
HINTS = Hints(SOURCE)
MAX_SCORE = 13.0
SOLUTION_CELLS = ("bubble", "schedules", "simulate")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    source = read_nb(SOURCE)
    # Two plausible mistakes in one notebook (one grading run fewer): a bubble over m instead of
    # m + p - 1, and a 1F1B warm-up one forward too long.
    both = edit_cell(source, "bubble", replacing("return (p - 1) / (m + p - 1)", "return (p - 1) / m"))
    both = edit_cell(both, "schedules", replacing("w = min(p - s - 1, m)", "w = min(p - s, m)"))
    wrong = {"wrong": both}
    results = grade_assignment(tmp_path_factory.mktemp("grader12"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)
    return results


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=8, hidden=4)


def test_released_notebook_scores_zero_without_crashing(runs):
    assert_unimplemented_scores_zero(runs["released"], MAX_SCORE)
    assert_nothing_leaked(runs["released_text"], "_shuffled_schedule", "w = min(p - s - 1, m)")


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
