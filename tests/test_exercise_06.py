"""Exercise 06 (pruning and partitioning with Send/Recv): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a ``partition`` that makes one Send/Recv pair per
  *consumer* instead of per (edge, destination device) gets partial marks: the pruning tests
  pass, every partition test fails, each with the hint written for that mistake (the test
  cell's ``lab`` metadata, chosen by the failure message) and a link to its paragraph;
* in process: a ``prune`` that walks past fed ops fails exactly the feed-sensitive tests; a
  ``prune`` that ignores control inputs and a ``partition`` that drops the pairs of
  cross-device control edges get their hints; the source notebook's functions equal the
  reference on random placed graphs.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import (
    Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing, run_cells,
)

SPEC = EXERCISES["06_partitioning"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
PARTITION_TESTS = {"test_partition_example", "hidden_partition", "hidden_control_edges"}
FEED_TESTS = {"test_prune_example", "hidden_prune"}

pytestmark = pytest.mark.timeout(300)

IGNORES_FEEDS = replacing("        if op.name not in fed:\n", "        if True:\n")
IGNORES_CONTROL = replacing("            stack.extend(op.control_inputs)\n", "")
NO_CONTROL_PAIRS = replacing('''        controls = [copies[c] if c.device == op.device else recv_for("^" + c.name, c, op.device, None)
                    for c in op.control_inputs]''', "        controls = [copies[c] for c in op.control_inputs if c.device == op.device]")


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_one_pair_per_consumer_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["per_consumer"], MAX_SCORE, failing=PARTITION_TESTS)
    assert "one per distinct edge and destination device" in tests["test_partition_example"]["hint"]
    assert "extra [('x:0', 'worker:0 -> worker:1')], missing []" in tests["test_partition_example"]["hint"]
    HINTS.assert_advised(tests, {gid: HINTS.case(gid, r"sent more than once to the same device") for gid in PARTITION_TESTS})


def test_walking_past_feeds_fails_the_feed_sensitive_tests_in_process():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "prune", IGNORES_FEEDS), skip=("demo",))
    assert {gid for gid, error in outcome.items() if error} == FEED_TESTS, outcome
    assert "(h is fed, so x is not needed)" in outcome["test_prune_example"]
    assert HINTS.advice_in_process(outcome) == {"test_prune_example": HINTS.case("test_prune_example", r"found \{[^}]*'x'"),
                                          "hidden_prune": HINTS.case("hidden_prune", r"reached only through fed ops")}


def test_control_inputs_left_out_get_their_hints_in_process():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "prune", IGNORES_CONTROL), skip=("demo",))
    assert HINTS.advice_in_process(outcome) == {
        "hidden_prune": HINTS.case("hidden_prune", r"reached only through control inputs")}, outcome
    outcome = run_cells(edit_cell(read_nb(SOURCE), "partition", NO_CONTROL_PAIRS), skip=("demo",))
    assert "missing [('^a', 'worker:0 -> worker:1'), ('^b', 'worker:0 -> worker:1')]" in outcome["hidden_control_edges"]
    assert HINTS.advice_in_process(outcome) == {
        gid: HINTS.case(gid, r"missing \[\('\^") for gid in ("hidden_partition", "hidden_control_edges")}, outcome


def test_source_functions_match_the_reference_in_process():
    import reference_impl.graph as G

    ns = notebook_namespace(read_nb(SOURCE), upto="partition")
    rng = np.random.default_rng(12)
    devices = [G.canonical(f"/job:worker/task:{k}") for k in range(3)]
    for _ in range(10):
        g = G.Graph()
        with g.as_default():
            pool = [G.constant(rng.normal(size=(2, 2))) for _ in range(2)]
            for _ in range(8):
                a, b = pool[rng.integers(len(pool))], pool[rng.integers(len(pool))]
                pool.append(G.matmul(a, b) if rng.random() < 0.5 else G.tanh(a) + b)
        for op in g.operations:
            op.device = devices[rng.integers(3)]
        fetch = [pool[-1].name]
        assert ns["prune"](g, fetch) == {op.name for op in G.prune(g, fetch).operations}
        mine, ref = ns["partition"](G.prune(g, fetch)), G.partition(G.prune(g, fetch))
        assert G.count_send_recv(mine) == G.count_send_recv(ref)
        assert ns["contents"](mine) == ns["contents"](ref)
