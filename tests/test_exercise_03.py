"""Exercise 03 (recursive doubling): what is specific to it. The checks every exercise shares
(full marks with the solutions, zero for the stubs with the general hints, nothing secret in
the release, every source cell passing in process) are tests/test_exercises.py's.

Graded with ``python -m grader`` (the session's one grading, ``graded``): a solution without
the fold (right only for powers of two, tests/exercise_specs.py) gets partial marks: exactly
the power-of-two tests, each fold test failing with the hint written for that mistake (the
test cell's ``lab`` metadata, chosen by the failure message) and a link to its paragraph.

In process (fast): a solution that gathers everything at rank 0 and sends the result back
gets the right numbers but fails the traffic tests; a ``mean`` never divided by p and a
partner ``r + 2**k`` instead of ``r ^ 2**k`` (a deadlock) get their hints; the notebook's
solution agrees with ``reference_impl.comm.allreduce`` on random inputs; on PyTorch tensors
(``LAB_DEVICE=torch``, what ``--device torch`` sets) it passes every test, and a receive buffer
made with NumPy's ``np.empty_like`` loses every test that exchanges, naming the device.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, by_id, edit_cell, notebook_namespace, read_nb, replacing, run_cells

SPEC = EXERCISES["03_recursive_doubling"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score

POW2_TESTS = {  # what a solution without the fold must still pass, with its points
    "test_largest_power_of_two_examples": 1, "test_exchange_example": 1,
    "test_allreduce_pow2_examples": 1, "hidden_largest_power_of_two": 1, "hidden_exchange": 3,
    "hidden_allreduce_pow2": 4, "hidden_traffic_pow2": 2,
}
FOLD_TESTS = ("test_allreduce_fold_examples", "hidden_allreduce_any", "hidden_traffic_fold")

GATHER_AT_ROOT = '''
def recursive_doubling_allreduce(comm, x, op="sum"):
    data = np.array(x, copy=True).reshape(-1)
    if comm.rank == 0:  # right answer, wrong algorithm: rank 0 receives and sends p - 1 arrays
        incoming = np.empty_like(data)
        for source in range(1, comm.size):
            comm.recv(incoming, source)
            combine(op, data, incoming)
        for dest in range(1, comm.size):
            comm.send(data, dest)
    else:
        comm.send(data, 0)
        comm.recv(data, 0)
    if op == "mean":
        data /= comm.size
    return data.reshape(np.shape(x))
'''

NO_MEAN_DIVISION = replacing('''    if op == "mean":
        data /= p
''', "")
PARTNER_PLUS = replacing("partner = comm.rank ^ distance", "partner = (comm.rank + distance) % p2")
NO_FOLD_CASE = r"destination rank \d+ is outside"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_a_solution_without_the_fold_gets_the_power_of_two_marks_only(runs):
    result = runs["no_fold"]
    tests = by_id(result)
    assert result["score"] == sum(POW2_TESTS.values()) and 0 < result["score"] < MAX_SCORE, result
    for gid in POW2_TESTS:
        assert tests[gid]["passed"], tests[gid]
    for gid in FOLD_TESTS:
        assert not tests[gid]["passed"] and tests[gid]["score"] == 0
        assert "expected" in tests[gid]["hint"] and "found" in tests[gid]["hint"], tests[gid]["hint"]
    assert "reproduce: run_threads(3, lambda comm: recursive_doubling_allreduce(comm, rank_inputs(3, 0, " in (
        tests["hidden_allreduce_any"]["hint"])
    HINTS.assert_advised(tests, {gid: HINTS.case(gid, NO_FOLD_CASE) for gid in FOLD_TESTS})


# --------------------------------------------------------------------------- in process


def test_gathering_at_rank_0_is_right_but_fails_the_traffic_tests():
    nb = edit_cell(read_nb(SOURCE), "recursive_doubling_allreduce", GATHER_AT_ROOT)
    outcome = run_cells(nb)
    for gid in ("test_allreduce_pow2_examples", "test_allreduce_fold_examples",
                "hidden_allreduce_pow2", "hidden_allreduce_any"):
        assert outcome[gid] is None, (gid, outcome[gid])
    for gid in ("hidden_traffic_pow2", "hidden_traffic_fold"):
        error = outcome[gid]
        assert error is not None and "expected" in error and "found" in error, (gid, error)
    assert HINTS.advice_in_process(outcome, whole=True) == {
        gid: HINTS.written(gid).hint for gid in ("hidden_traffic_pow2", "hidden_traffic_fold")}


def test_a_mean_never_divided_gets_its_hint_in_process():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "recursive_doubling_allreduce", NO_MEAN_DIVISION))
    assert "(exactly p = 2 times the expected)" in outcome["hidden_allreduce_pow2"], outcome
    assert HINTS.advice_in_process(outcome, whole=True) == {
        gid: HINTS.case(gid, r"exactly p = \d+ times the expected") for gid in ("hidden_allreduce_pow2", "hidden_allreduce_any")}


def test_a_partner_that_is_not_symmetric_deadlocks_and_gets_its_hint_in_process():
    """r + 2**k pairs rank 0 with 1 but rank 1 with 2: every exchange waits for ever (5 s here). Only the
    exchange tests run, to keep the waiting short."""
    outcome = run_cells(edit_cell(read_nb(SOURCE), "exchange", PARTNER_PLUS),
                        skip=("test_allreduce", "hidden_allreduce", "hidden_traffic"))
    assert "reproduce: x = rank_inputs(4, 0, np.float32, seed=0, high=100)" in outcome["hidden_exchange"], outcome
    assert HINTS.advice_in_process(outcome, whole=True) == {
        gid: HINTS.case(gid, r"no message from rank") for gid in ("test_exchange_example", "hidden_exchange")}


def test_the_notebook_solution_agrees_with_reference_impl():
    from reference_impl.comm import allreduce, run_threads

    ns = notebook_namespace(read_nb(SOURCE), skip=("test_", "hidden_"))
    rng = np.random.default_rng(3)
    for p in range(1, 9):
        for op in ("sum", "prod", "max", "min"):
            length = int(rng.integers(0, 40))
            inputs = [rng.integers(-3, 4, size=length).astype(np.int64) for _ in range(p)]
            mine = run_threads(p, lambda c: ns["recursive_doubling_allreduce"](c, inputs[c.rank], op), timeout=10)
            ref = run_threads(p, lambda c: allreduce(c, inputs[c.rank], algorithm="recursive_doubling", op=op),
                              timeout=10)
            for a, b in zip(mine, ref):
                assert a.dtype == b.dtype and np.array_equal(a, b), (p, op)


def test_the_tests_run_on_pytorch_tensors_in_process(monkeypatch):
    monkeypatch.setenv("LAB_DEVICE", "torch")
    assert all(error is None for error in run_cells(read_nb(SOURCE), skip=("demo",)).values())
    numpy_buffer = edit_cell(read_nb(SOURCE), "exchange", replacing(
        "incoming = namespace_of(data).empty_like(data)", "incoming = np.empty_like(data)"))
    failed = {k: v for k, v in run_cells(numpy_buffer, skip=("demo",)).items() if v is not None}
    assert set(failed) == set(POW2_TESTS) - {"test_largest_power_of_two_examples", "hidden_largest_power_of_two"} | set(
        FOLD_TESTS), failed
    for test_id, error in failed.items():
        assert "(device torch): expected a result, found CommError" in error, (test_id, error)
