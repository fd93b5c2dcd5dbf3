"""Exercise 11 (dynamic loss scaling), graded end to end with ``python -m grader``.

What is checked, with the grader runs started together once:

* the released notebook scores 0, and grading it completes;
* the released notebook with the solution cells filled in from the source scores full marks
  (so the hidden tests come from the gradebook, not from the learner's file);
* a state machine that keeps its good-step count after an overflow gets partial marks: the
  unscaling tests pass, both state-machine tests fail (one wrong variant only, to keep the
  number of parallel gradings, and the suite's time, down);
* in process: the source notebook's functions equal the reference on random inputs.
"""
from __future__ import annotations

import numpy as np
import pytest

from notebook_tools import (
    ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero, edit_cell,
    grade_assignment, notebook_namespace, read_nb, replacing,
)

ASSIGNMENT = "11_loss_scaling"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "loss_scaling.ipynb"
MAX_SCORE = 8.0
SOLUTION_CELLS = ("unscale", "update_loss_scale")
STATE_TESTS = {"test_state_example", "hidden_state_machine"}

pytestmark = pytest.mark.timeout(300)

KEEP_COUNT = replacing("return max(scale / factor, min_scale), 0, False",
                       "return max(scale / factor, min_scale), good_steps, False")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    source = read_nb(SOURCE)
    wrong = {"keep_count": edit_cell(source, "update_loss_scale", KEEP_COUNT)}
    results = grade_assignment(tmp_path_factory.mktemp("grader11"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)
    return results


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=4, hidden=2)


def test_released_notebook_scores_zero_without_crashing(runs):
    assert_unimplemented_scores_zero(runs["released"], MAX_SCORE)
    assert_nothing_leaked(runs["released_text"], "_ref_update_loss_scale", "good_steps += 1")


def test_keeping_the_count_after_an_overflow_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["keep_count"], MAX_SCORE, failing=STATE_TESTS)
    assert "T T F T T T F F F F" in tests["test_state_example"]["hint"]


def test_source_functions_equal_the_reference_in_process():
    from reference_impl.train import mixed_precision as mp

    ns = notebook_namespace(read_nb(SOURCE), upto="update_loss_scale")
    rng = np.random.default_rng(3)
    mine, ref = (8.0, 0), (8.0, 0)
    for _ in range(200):
        finite = bool(rng.uniform() > 0.3)
        a = ns["update_loss_scale"](*mine, finite, growth_interval=4)
        b = mp.update_loss_scale(*ref, finite, growth_interval=4)
        assert a == b
        mine, ref = a[:2], b[:2]
    grads = [rng.normal(size=(3, 2)).astype(np.float16)]
    (g1,), f1 = ns["unscale_gradients"](grads, 1024.0)
    (g2,), f2 = mp.unscale_gradients(grads, 1024.0)
    assert f1 == f2 and np.array_equal(g1, g2)
