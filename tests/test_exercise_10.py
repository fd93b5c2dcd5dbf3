"""Exercise 10 (Adam as a graph optimiser): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: an ``Adam.update`` that returns the old slots instead of
  the new ones (the state never moves) gets partial marks: the ``adam_update`` tests pass,
  every optimiser test fails, each with the hint written for that mistake and a link to the
  concept paragraph;
* in process (no grader): more plausible mistakes (no bias correction, epsilon inside the square
  root, bias-corrected moments returned as the slots, hyper-parameters not passed on) fail
  exactly their tests with their hints;
* in process: the source notebook's ``Adam`` follows the reference ``Adam`` step by step;
* in process on PyTorch tensors (``LAB_DEVICE=torch``, what ``--device torch`` sets): the
  tests' sessions run there and the source notebook passes all of them.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["10_adam"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
STATE_TESTS = {"test_adam_example", "hidden_adam_steps", "hidden_adam_sparse"}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_slots_that_never_move_get_partial_marks(runs):
    tests = assert_partial_marks(runs["stale_slots"], MAX_SCORE, failing=STATE_TESTS)
    assert "after step 1" in tests["test_adam_example"]["hint"]
    assert "smallest failing input: adam_trace(lambda: Adam(0.1), [0.0], [1.0], 1)" in (
        tests["hidden_adam_steps"]["hint"])
    HINTS.assert_advice(tests, {test: "the slots stay where they were" for test in STATE_TESTS})


STEP_WRONG = "The variable is off while its slots are right"


@pytest.mark.parametrize("cell, old, new, advice", [
    ("adam_update", "m_hat = m / (1 - G.pow(beta1, t))\n    v_hat = v / (1 - G.pow(beta2, t))",
     "m_hat = m\n    v_hat = v",
     {"test_adam_update_example": "Only the new variable is off",
      "hidden_adam_update": "Only the new variable is off",
      "test_adam_example": STEP_WRONG, "hidden_adam_steps": STEP_WRONG, "hidden_adam_sparse": STEP_WRONG}),
    ("adam_update", "(G.sqrt(v_hat) + epsilon)", "G.sqrt(v_hat + epsilon)",
     {"test_adam_update_example": "Only the new variable is off",
      "hidden_adam_update": "right with the default epsilon",
      "test_adam_example": STEP_WRONG, "hidden_adam_steps": STEP_WRONG, "hidden_adam_sparse": STEP_WRONG}),
    ("adam_update", "return var - lr * m_hat / (G.sqrt(v_hat) + epsilon), m, v",
     "return var - lr * m_hat / (G.sqrt(v_hat) + epsilon), m_hat, v_hat",
     {"test_adam_update_example": "The moments you return differ",
      "hidden_adam_update": "The moments you return differ",
      "test_adam_example": "The slots hold wrong values", "hidden_adam_steps": "The slots hold wrong values",
      "hidden_adam_sparse": "The slots hold wrong values"}),
    ("adam_update", "m = beta1 * m + (1 - beta1) * grad", "m = 0.9 * m + 0.1 * grad",
     {"hidden_adam_update": "right with the default hyper-parameters and wrong",
      "hidden_adam_steps": "Adam with its default hyper-parameters is right"}),
    ("adam_class", 'slots["v"], lr, t, self.beta1, self.beta2, self.epsilon)', 'slots["v"], lr, t)',
     {"hidden_adam_steps": "Adam with its default hyper-parameters is right"}),
], ids=["no_bias_correction", "epsilon_inside_sqrt", "corrected_moments_as_slots", "constant_beta1",
        "hyper_parameters_not_passed"])
def test_plausible_wrong_solutions_fail_their_tests_with_their_hints_in_process(cell, old, new, advice):
    HINTS.assert_advice(HINTS.graded_in_process(edit_cell(read_nb(SOURCE), cell, replacing(old, new))), advice)


def test_source_adam_follows_the_reference_in_process():
    import reference_impl.graph as G
    from reference_impl.train.optimizers import Adam as RefAdam

    ns = notebook_namespace(read_nb(SOURCE), upto="adam_class")
    rng = np.random.default_rng(5)
    w0 = rng.normal(size=(3, 2))
    traces = []
    for make in (lambda: ns["Adam"](0.03, beta2=0.99), lambda: RefAdam(0.03, beta2=0.99)):
        graph = G.Graph()
        with graph.as_default():
            w = G.Variable(w0, name="w")
            train = make().minimize(G.reduce_sum(G.square(G.tanh(w) - 0.25)))
            with G.Session(graph) as sess:
                sess.run(G.global_variables_initializer())
                traces.append([sess.run([train, w])[1] for _ in range(10)])
    np.testing.assert_allclose(traces[0], traces[1], rtol=1e-12)


def test_the_tests_run_on_pytorch_tensors_in_process(monkeypatch):
    from notebook_tools import run_cells

    monkeypatch.setenv("LAB_DEVICE", "torch")
    ns = notebook_namespace(read_nb(SOURCE), upto="adam_class")
    graph = ns["G"].Graph()
    with graph.as_default():
        found = ns["adam_update"](*[ns["G"].constant(np.ones(2)) for _ in range(4)],
                                  ns["G"].constant(0.1, dtype="float64"), ns["G"].constant(1.0, dtype="float64"))
    with ns["G"].Session(graph, device=ns["DEVICE"]) as sess:  # as the tests' sessions are made
        assert type(sess.run(found[0])).__module__ == "torch"
    outcome = run_cells(read_nb(SOURCE), skip=("demo",))
    assert outcome and all(error is None for error in outcome.values()), outcome
