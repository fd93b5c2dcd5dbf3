"""Exercise 10 (Adam as a graph optimiser), graded end to end with ``python -m grader``.

What is checked, with the grader runs started together once:

* the released notebook scores 0, and grading it completes;
* the released notebook with the solution cells filled in from the source scores full marks
  (so the hidden tests come from the gradebook, not from the learner's file);
* an ``Adam.update`` that returns the old slots instead of the new ones (the state never
  moves) gets partial marks: the ``adam_update`` tests pass, every optimiser test fails, each
  with the hint written for that mistake and a link to the concept paragraph;
* in process (no grader): more plausible mistakes (no bias correction, epsilon inside the square
  root, bias-corrected moments returned as the slots, hyper-parameters not passed on) fail
  exactly their tests with their hints;
* in process: the source notebook's ``Adam`` follows the reference ``Adam`` step by step.
"""
from __future__ import annotations

import numpy as np
import pytest

from notebook_tools import (
    Hints, ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero,
    edit_cell, grade_assignment, notebook_namespace, read_nb, replacing,
)

ASSIGNMENT = "10_adam"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "adam.ipynb"
HINTS = Hints(SOURCE)
MAX_SCORE = 10.0
SOLUTION_CELLS = ("adam_update", "adam_class")
STATE_TESTS = {"test_adam_example", "hidden_adam_steps", "hidden_adam_sparse"}

pytestmark = pytest.mark.timeout(300)


STALE_SLOTS = replacing('return new_var, {"m": m, "v": v}', 'return new_var, {"m": slots["m"], "v": slots["v"]}')


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    source = read_nb(SOURCE)
    wrong = {"stale_slots": edit_cell(source, "adam_class", STALE_SLOTS)}
    results = grade_assignment(tmp_path_factory.mktemp("grader10"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)
    return results


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=5, hidden=3)


def test_released_notebook_scores_zero_without_crashing(runs):
    assert_unimplemented_scores_zero(runs["released"], MAX_SCORE)
    assert_nothing_leaked(runs["released_text"], "_RefAdam", "m_hat = m / (1 - G.pow(beta1, t))")


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
