"""Exercise 12 (pipeline schedules and the bubble), graded end to end with ``python -m grader``.

Checked, with the grader runs started together once: the source notebook scores full marks;
the released notebook scores 0 and grading it completes; the released notebook with the
solution cells filled in from the source scores full marks; a wrong bubble formula plus an
off-by-one 1F1B warm-up get partial marks, failing exactly their own tests; and, in
process, the source's functions equal the reference on random inputs.
"""
from __future__ import annotations

import numpy as np
import pytest

from notebook_tools import (
    ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero, edit_cell,
    grade_assignment, notebook_namespace, read_nb, replacing,
)
from reference_impl.train import pipeline

ASSIGNMENT = "12_pipeline_schedule"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "pipeline_schedule.ipynb"
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
