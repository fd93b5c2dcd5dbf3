"""Exercise 05 (reverse-mode autodiff): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a ``gradients`` that keeps only the last contribution to a
  tensor instead of summing them gets partial marks (the rules and the no-rule error pass,
  every walk over a reused tensor fails), and so does a ``grad_add``/``grad_mul`` without
  unbroadcasting; every failing test shows the hint written for that mistake (the test cell's
  ``lab`` metadata, chosen by the failure message, which says whether each rule alone agrees
  with the reference on the failing graph) and a link to its paragraph;
* in process: the same for a MatMul rule with its factors in the wrong order, a Tanh rule
  computed from the input, and a walk that skips ops without a rule instead of raising; the
  source's gradients equal the reference on random graphs.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import (
    Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing, run_cells,
)

SPEC = EXERCISES["05_autodiff"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
REUSE_TESTS = {"test_gradients_example", "hidden_random_graphs", "hidden_weight_sharing"}
BROADCAST_TESTS = {"test_rules_example", "hidden_rules", "hidden_random_graphs"}

pytestmark = pytest.mark.timeout(300)

MATMUL_ORDER = replacing("return [G.matmul(g, G.transpose(b)), G.matmul(G.transpose(a), g)]",
                         "return [G.matmul(G.transpose(b), g), G.matmul(g, G.transpose(a))]")
TANH_OF_INPUT = replacing("z = op.outputs[0]\n    return [g * (1.0 - z * z)]", "z = op.inputs[0]\n    return [g * (1.0 - z * z)]")
SKIPS_NO_RULE = replacing('raise LookupError(f"no gradient rule for op type {op.type!r} (op {op.name!r})")', "continue")
WALK_CASE = r"each rule alone agrees"
GRAPH_TESTS = ("hidden_random_graphs", "hidden_weight_sharing")


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_overwriting_instead_of_summing_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["no_sum"], MAX_SCORE, failing=REUSE_TESTS)
    assert "gradients of x * x + x at x = [1, 2, -3]" in tests["test_gradients_example"]["hint"]
    graph = tests["hidden_random_graphs"]["hint"]
    assert "each rule alone agrees" in graph and "The graph: x0 (4, 4), x1 (4,), x2 (4, 4) placeholders; t0 = " in graph
    HINTS.assert_advised(tests, {"test_gradients_example": HINTS.written("test_gradients_example").hint,
                           **{gid: HINTS.case(gid, WALK_CASE) for gid in GRAPH_TESTS}})


def test_no_unbroadcast_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["no_bc"], MAX_SCORE, failing=BROADCAST_TESTS)
    assert "expected shape (4,), found (3, 4)" in tests["test_rules_example"]["hint"]
    HINTS.assert_advised(tests, {
        "test_rules_example": HINTS.case("test_rules_example", r"expected shape"),
        "hidden_rules": HINTS.case("hidden_rules", r"grad rule for (Add|Mul) .*expected shape"),
        "hidden_random_graphs": HINTS.case("hidden_random_graphs", r"your rule for (Add|Mul) gives shape"),
    })


@pytest.mark.parametrize("edit, rules_case, graphs_case", [
    (MATMUL_ORDER, r"grad rule for MatMul(?!.*NotImplementedError)", r"your rule for MatMul|ShapeError: MatMul"),
    (TANH_OF_INPUT, r"grad rule for Tanh(?!.*NotImplementedError)", r"your rule for Tanh"),
], ids=["matmul_factor_order", "tanh_from_the_input"])
def test_a_wrong_rule_gets_the_hint_for_that_rule_in_process(edit, rules_case, graphs_case):
    outcome = run_cells(edit_cell(read_nb(SOURCE), "grad_rules", edit), skip=("demo",))
    assert HINTS.advice_in_process(outcome) == {"hidden_rules": HINTS.case("hidden_rules", rules_case),
                                          **{gid: HINTS.case(gid, graphs_case) for gid in GRAPH_TESTS}}, outcome


def test_a_walk_that_skips_ops_without_a_rule_gets_its_hint_in_process():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "gradients", SKIPS_NO_RULE), skip=("demo",))
    assert HINTS.advice_in_process(outcome) == {"hidden_no_rule": HINTS.written("hidden_no_rule").hint}, outcome


def test_source_gradients_match_reference_in_process():
    import reference_impl.graph as G

    ns = notebook_namespace(read_nb(SOURCE), upto="gradients")
    rng = np.random.default_rng(11)
    for _ in range(20):
        g = G.Graph()
        with g.as_default():
            a, b = G.placeholder("float64", [3, 3]), G.placeholder("float64", [3])
            h = G.tanh(G.matmul(a, a) * b + a)
            y = G.reduce_sum(h * a, axis=int(rng.integers(2)))
            mine, ref = ns["gradients"]([y], [a, b]), G.gradients([y], [a, b])
        feed = {a: rng.normal(size=(3, 3)), b: rng.normal(size=3)}
        with G.Session(g) as s:
            for m, r in zip(s.run(mine, feed), s.run(ref, feed)):
                np.testing.assert_allclose(m, r, rtol=1e-12)
