"""Exercise 03 (recursive doubling), graded as a learner's notebook would be.

Through ``python -m grader`` (the slow runs start together, once, in the module fixture):

* the released notebook scores 0, and grading it completes;
* the released notebook with the solution cells filled in from the source scores full
  marks (so the hidden tests come from the gradebook, not from the learner's file);
* a solution without the fold (right only for powers of two) gets partial marks: exactly
  the power-of-two tests.

In process (fast): every cell of the source notebook passes; a solution that gathers
everything at rank 0 and sends the result back gets the right numbers but fails the
traffic tests; the released notebook holds no solution and no hidden test.

Every failing test of a wrong solution shows the hint written for that mistake (the test
cell's ``lab`` metadata, chosen by the failure message) and a link to its paragraph; in
process too for a ``mean`` never divided by p and a partner ``r + 2**k`` instead of
``r ^ 2**k`` (a deadlock).
"""
from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest

from notebook_tools import (
    Hints, ROOT, assert_solved, assert_unimplemented_scores_zero, by_id, edit_cell, grade_assignment,
    notebook_namespace, read_nb, replacing, run_cells, source_of,
)

ASSIGNMENT = "03_recursive_doubling"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "recursive_doubling.ipynb"
HINTS = Hints(SOURCE)
SOLUTION_CELLS = ("largest_power_of_two", "exchange", "recursive_doubling_allreduce")
MAX_SCORE = 20.0
POW2_TESTS = {  # what a solution without the fold must still pass, with its points
    "test_largest_power_of_two_examples": 1, "test_exchange_example": 1,
    "test_allreduce_pow2_examples": 1, "hidden_largest_power_of_two": 1, "hidden_exchange": 3,
    "hidden_allreduce_pow2": 4, "hidden_traffic_pow2": 2,
}
FOLD_TESTS = ("test_allreduce_fold_examples", "hidden_allreduce_any", "hidden_traffic_fold")

NO_FOLD = '''
def recursive_doubling_allreduce(comm, x, op="sum"):
    data = np.array(x, copy=True).reshape(-1)
    exchange(comm, data, op, comm.size)  # no fold: only right when comm.size is a power of two
    if op == "mean":
        data /= comm.size
    return data.reshape(np.shape(x))
'''

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
def runs(tmp_path_factory) -> dict[str, Any]:
    """Release once, then grade four notebooks at the same time."""
    wrong = {"no_fold": edit_cell(read_nb(SOURCE), "recursive_doubling_allreduce", NO_FOLD)}
    results = grade_assignment(tmp_path_factory.mktemp("exercise03"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)
    results["released_nb"] = read_nb(results["released_path"])
    return results


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=10, hidden=6)


def test_released_notebook_scores_zero_without_crashing(runs):
    result = runs["released"]
    assert_unimplemented_scores_zero(result, MAX_SCORE)
    HINTS.assert_general_hints(result)  # nothing is a known mistake yet: every test gets its general hint


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


def test_release_holds_no_solution_and_no_hidden_test(runs):
    text = json.dumps(runs["released_nb"])
    for secret in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "comm.recv(incoming, r + p2)",
                   "_expected_traffic", "_ref_allreduce", "CountingCommunicator"):
        assert secret not in text, f"{secret!r} leaked into the release"
    stubs = [source_of(c) for c in runs["released_nb"]["cells"]
             if c["metadata"].get("nbgrader", {}).get("solution")]
    assert len(stubs) == 3 and all("raise NotImplementedError()" in s for s in stubs)
    assert runs["released_nb"]["metadata"]["lab"] == {
        "assignment": ASSIGNMENT, "concept_page": "concepts/allreduce-algorithms.md"}
    assert (ROOT / "docs" / "concepts" / "allreduce-algorithms.md").is_file()


# --------------------------------------------------------------------------- in process


def test_every_cell_of_the_source_notebook_passes_in_process():
    start = time.monotonic()
    outcome = run_cells(read_nb(SOURCE))
    assert len(outcome) == 10 and all(error is None for error in outcome.values()), outcome
    assert time.monotonic() - start < 60  # the grader's per-cell limit is 60 s; stay far below


def test_gathering_at_rank_0_is_right_but_fails_the_traffic_tests():
    nb = edit_cell(read_nb(SOURCE), "recursive_doubling_allreduce", GATHER_AT_ROOT)
    outcome = run_cells(nb)
    for gid in ("test_allreduce_pow2_examples", "test_allreduce_fold_examples",
                "hidden_allreduce_pow2", "hidden_allreduce_any"):
        assert outcome[gid] is None, (gid, outcome[gid])
    for gid in ("hidden_traffic_pow2", "hidden_traffic_fold"):
        error = outcome[gid]
        assert error is not None and "expected" in error and "found" in error, (gid, error)
    assert HINTS.advice_in_process(outcome, whole=True) == {gid: HINTS.written(gid).hint for gid in ("hidden_traffic_pow2", "hidden_traffic_fold")}


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
