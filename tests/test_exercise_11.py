"""Exercise 11 (dynamic loss scaling), graded end to end with ``python -m grader``.

What is checked, with the grader runs started together once:

* the released notebook scores 0, and grading it completes;
* the released notebook with the solution cells filled in from the source scores full marks
  (so the hidden tests come from the gradebook, not from the learner's file);
* a state machine that keeps its good-step count after an overflow gets partial marks: the
  unscaling tests pass, both state-machine tests fail, each with the hint written for that
  mistake and a link to the concept paragraph (one graded wrong variant only, to keep the
  number of parallel gradings, and the suite's time, down);
* in process (no grader): more plausible mistakes (dividing in float16, a NumPy bool, checking
  one gradient only, no min_scale, growing one step late) fail exactly their tests with their
  hints;
* in process: the source notebook's functions equal the reference on random inputs.
"""
from __future__ import annotations

import numpy as np
import pytest

from notebook_tools import (
    Hints, ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero,
    edit_cell, grade_assignment, notebook_namespace, read_nb, replacing,
)

ASSIGNMENT = "11_loss_scaling"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "loss_scaling.ipynb"
HINTS = Hints(SOURCE)
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
    assert ("smallest failing input: update_loss_scale(8.0, 1, False, growth_interval=2, factor=2.0, min_scale=1.0)"
            in tests["hidden_state_machine"]["hint"])
    HINTS.assert_advice(tests, {test: "good_steps must restart at 0" for test in STATE_TESTS})


@pytest.mark.parametrize("cell, old, new, advice", [
    ("unscale", "np.asarray(g, dtype=np.float32) / np.float32(scale)",
     "(np.asarray(g) / np.float16(scale)).astype(np.float32)",
     {"test_unscale_example": "the division by the scale ran in float16",
      "hidden_unscale": "the division by the scale ran in float16"}),
    ("unscale", "finite = all(bool(np.isfinite(g).all()) for g in grads)",
     "finite = np.all([np.isfinite(g).all() for g in grads])", {"test_unscale_example": "must be a Python bool"}),
    ("unscale", "finite = all(bool(np.isfinite(g).all()) for g in grads)", "finite = bool(np.isfinite(grads[0]).all())",
     {"test_unscale_example": "The overflow check is wrong", "hidden_unscale": "The overflow check is wrong"}),
    ("update_loss_scale", "return max(scale / factor, min_scale), 0, False", "return scale / factor, 0, False",
     {"test_state_example": "only your new scale is wrong", "hidden_state_machine": "only your new scale is wrong"}),
    ("update_loss_scale", "if good_steps >= growth_interval:", "if good_steps > growth_interval:",
     {"test_state_example": "growth_interval-th finite step",
      "hidden_state_machine": "growth_interval-th finite step"}),
], ids=["divide_in_float16", "numpy_bool", "first_gradient_only", "no_min_scale", "grow_one_step_late"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # float16 overflows in the wrong unscaling
def test_plausible_wrong_solutions_fail_their_tests_with_their_hints_in_process(cell, old, new, advice):
    HINTS.assert_advice(HINTS.graded_in_process(edit_cell(read_nb(SOURCE), cell, replacing(old, new))), advice)


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
