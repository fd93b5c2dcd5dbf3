"""Exercise 14 (a constant-folding pass): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: deciding foldability on the *old* graph's inputs (so chains
  do not fold in one sweep) gets partial marks: the rules test passes, the example and
  random-graph tests fail, each with the hint written for that mistake and a link to the
  concept paragraph;
* in process (no grader): more plausible mistakes (folding an op with a control input, a value
  of the wrong dtype, input values read from the old graph) fail exactly their tests with their
  hints;
* in process: the source's pass agrees with ``reference_impl.graph.constant_folding``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["14_constant_folding"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
CHAIN_TESTS = {"test_fold_example", "hidden_random_graphs"}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_folding_on_old_inputs_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["old_inputs"], MAX_SCORE, failing=CHAIN_TESTS)
    assert "expected six and seven folded" in tests["test_fold_example"]["hint"]
    assert "y is Add (expected Const)" in tests["hidden_random_graphs"]["hint"]
    HINTS.assert_advice(tests, {test: "must fold in one sweep" for test in CHAIN_TESTS})


@pytest.mark.parametrize("old, new, advice", [
    (" and not op.control_inputs", "", {"hidden_rules": "ctrl has only Const inputs"}),
    ("value = np.asarray(value, dtype=op.outputs[0].dtype)", "value = np.asarray(value, dtype=np.float64)",
     {"test_fold_example": "must have the op's output dtype", "hidden_rules": "int_sum folded, but"}),
    ('opdef.kernel([t.op.attrs["value"] for t in inputs]', 'opdef.kernel([t.op.attrs["value"] for t in op.inputs]',
     {"test_fold_example": "Take the input values from the new graph",
      "hidden_random_graphs": "Take the input values from the new graph"}),
], ids=["folds_under_a_control_input", "value_of_the_wrong_dtype", "values_from_the_old_graph"])
def test_plausible_wrong_passes_fail_their_tests_with_their_hints_in_process(old, new, advice):
    HINTS.assert_advice(HINTS.graded_in_process(edit_cell(read_nb(SOURCE), "fold_constants", replacing(old, new))), advice)


def test_source_pass_matches_reference_in_process():
    import reference_impl.graph as G

    ns = notebook_namespace(read_nb(SOURCE), upto="fold_constants")
    rng = np.random.default_rng(14)
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", [None, 3], name="x")
        w = G.transpose(G.constant(rng.normal(size=(3, 3)).astype(np.float32)) * 2.0) + 1.0
        y = G.tanh(G.matmul(x, w) * G.constant(np.float32(0.5)), name="y")
    mine, ref = ns["fold_constants"](g, ["y"]), G.constant_folding(g, ["y"])
    assert [(op.name, op.type) for op in mine.operations] == [(op.name, op.type) for op in ref.operations]
    xv = rng.normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_allclose(G.Session(mine).run(mine.get_tensor_by_name("y:0"), {"x:0": xv}),
                               G.Session(g).run(y, {x: xv}), rtol=1e-6)
