"""Exercise 11 (dynamic loss scaling): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a state machine that keeps its good-step count after an
  overflow gets partial marks: the unscaling tests pass, both state-machine tests fail, each
  with the hint written for that mistake and a link to the concept paragraph;
* in process (no grader): more plausible mistakes (dividing in float16, a NumPy bool, checking
  one gradient only, no min_scale, growing one step late) fail exactly their tests with their
  hints;
* in process: the source notebook's functions equal the reference on random inputs;
* in process on PyTorch tensors (``LAB_DEVICE=torch``, what ``--device torch`` sets): the source
  notebook passes every test, and an unscale through NumPy (``np.asarray``) loses the unscaling
  tests: its gradients leave the device.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["11_loss_scaling"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
STATE_TESTS = {"test_state_example", "hidden_state_machine"}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_keeping_the_count_after_an_overflow_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["keep_count"], MAX_SCORE, failing=STATE_TESTS)
    assert "T T F T T T F F F F" in tests["test_state_example"]["hint"]
    assert ("smallest failing input: update_loss_scale(8.0, 1, False, growth_interval=2, factor=2.0, min_scale=1.0)"
            in tests["hidden_state_machine"]["hint"])
    HINTS.assert_advice(tests, {test: "good_steps must restart at 0" for test in STATE_TESTS})


@pytest.mark.parametrize("cell, old, new, advice", [
    ("unscale", "xp.astype(g, xp.float32) / scale", "xp.astype(g / scale, xp.float32)",
     {"test_unscale_example": "the division by the scale ran in float16",
      "hidden_unscale": "the division by the scale ran in float16"}),
    ("unscale", "finite = all(bool(xp.all(xp.isfinite(g))) for g in grads)",
     "finite = np.all([np.isfinite(g).all() for g in grads])", {"test_unscale_example": "must be a Python bool"}),
    ("unscale", "finite = all(bool(xp.all(xp.isfinite(g))) for g in grads)", "finite = bool(xp.all(xp.isfinite(grads[0])))",
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


def test_the_tests_run_on_pytorch_tensors_in_process(monkeypatch):
    from notebook_tools import run_cells

    monkeypatch.setenv("LAB_DEVICE", "torch")
    assert all(error is None for error in run_cells(read_nb(SOURCE), skip=("demo",)).values())
    through_numpy = edit_cell(read_nb(SOURCE), "unscale", replacing(
        "grads = [xp.astype(g, xp.float32) / scale for g in scaled_grads]",
        "grads = [np.asarray(g, dtype=np.float32) / np.float32(scale) for g in scaled_grads]"))
    failed = {k: v for k, v in run_cells(through_numpy, skip=("demo",)).items() if v is not None}
    assert set(failed) == {"test_unscale_example", "hidden_unscale"}, failed
    for test_id, error in failed.items():
        assert "(device torch)" in error and "ndarray" in error, (test_id, error)
