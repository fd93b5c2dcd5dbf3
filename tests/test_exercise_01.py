"""Exercise 01 (ring allreduce): the hints a learner reads when a test fails.

tests/test_grader.py grades this notebook for the grader's own behaviour (tampering, hangs,
bad input); tests/test_exercises.py checks what every exercise shares (full marks with the
solutions, zero for the stubs with the general hints, nothing secret in the release, every
source cell passing in process). This module checks what is specific to 01, reading the
session's one grading of it (``graded``, with the wrong solutions of tests/exercise_specs.py):

* grading the stubs on NumPy reports the device ``cpu (NumPy)`` (nothing passed, so
  array_api_strict, 01's second device, could change no verdict);
* three plausible wrong solutions get partial marks, failing exactly the tests meant to catch
  them, each failure with a readable message (the smallest failing input, a line that
  reproduces it) and the written hint for that mistake:
  an off-by-one in ``chunk_bounds`` (pieces that lose an element on uneven splits), a
  ``reduce_scatter`` that stores what arrives instead of adding it, and an ``allgather`` that
  uses reduce-scatter's indices (it forwards chunks it never completed);
* in process (fast): a ``reduce_scatter`` that stops a step early, and one that calls a
  NumPy-only method graded on the ``strict`` device, get their own hints; the reproduce line
  of a failure runs in the learner's notebook and gives the reported value.
"""
from __future__ import annotations

from typing import Any

import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing, run_cells

SPEC = EXERCISES["01_ring_allreduce"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score

pytestmark = pytest.mark.timeout(300)

RS_ONE_STEP_SHORT = replacing("for s in range(n - 1):", "for s in range(n - 2):")
RS_NUMPY_ONLY = replacing("comm.sendrecv(chunks[send_i], right, incoming, left)",
                          "comm.sendrecv(chunks[send_i].copy(), right, incoming, left)")

CHUNK_TESTS = {"test_chunk_bounds_examples", "hidden_chunk_bounds"}
RING_TESTS = {"test_allreduce_examples", "hidden_allreduce_even", "hidden_allreduce_any"}
RS_TESTS = {"test_reduce_scatter_example", "hidden_reduce_scatter"}
AG_TESTS = {"test_allgather_example", "hidden_allgather"}
USES_REDUCE_SCATTER = RS_TESTS | RING_TESTS | {"hidden_traffic_per_rank", "hidden_traffic_total"}


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_the_stubs_are_graded_on_numpy(runs):
    # nothing passed on NumPy, so array_api_strict (01's second device) could change no verdict
    assert runs["released"]["isolation"]["device"] == "cpu (NumPy)"


def test_an_off_by_one_in_chunk_bounds_gets_the_hint_on_uneven_splits(runs):
    tests = assert_partial_marks(runs["off_by_one"], MAX_SCORE,
                                 failing=CHUNK_TESTS | {"test_allreduce_examples", "hidden_allreduce_any",
                                                        "hidden_traffic_total"})
    assert "(piece sizes [3, 3, 3]: 9 elements, not 10)" in tests["test_chunk_bounds_examples"]["hint"]
    assert tests["hidden_chunk_bounds"]["hint"].startswith("AssertionError: chunk_bounds(1, 5): expected")
    ring = r"does not cut|cover every index|chunk_bounds\(\d+, \d+\) raises|cannot reshape"
    HINTS.assert_advised(tests, {
        **{gid: HINTS.case(gid, r"elements, not \d+") for gid in CHUNK_TESTS},
        "test_allreduce_examples": HINTS.case("test_allreduce_examples", ring),
        "hidden_allreduce_any": HINTS.case("hidden_allreduce_any", ring),
        "hidden_traffic_total": HINTS.case("hidden_traffic_total", r"cannot reshape"),
    }, whole=True)
    assert "reproduce: run_threads(3, lambda comm: ring_allreduce(comm, np.arange(7) + 10 * comm.rank))" in (
        tests["test_allreduce_examples"]["hint"])


def test_storing_instead_of_adding_in_reduce_scatter_gets_its_hint(runs):
    tests = assert_partial_marks(runs["rs_overwrites"], MAX_SCORE, failing=RS_TESTS | RING_TESTS)
    assert "(rank 1's input only)" in tests["test_reduce_scatter_example"]["hint"]
    hidden = tests["hidden_reduce_scatter"]["hint"]
    assert "n=2 ranks, N=1 elements" in hidden and "reproduce: x = rank_inputs(2, 1, np.float32" in hidden
    assert "alone, reduce_scatter leaves rank" in tests["hidden_allreduce_any"]["hint"]
    HINTS.assert_advised(tests, {
        **{gid: HINTS.case(gid, r"rank \d+'s input only") for gid in RS_TESTS},
        **{gid: HINTS.case(gid, r"alone, reduce_scatter .*rank \d+'s input only") for gid in RING_TESTS},
    }, whole=True)


def test_allgather_with_reduce_scatter_indices_gets_its_hint(runs):
    tests = assert_partial_marks(runs["ag_rs_indices"], MAX_SCORE, failing=AG_TESTS | RING_TESTS)
    assert "(chunks [0, 1, 2] hold -1, the stale starting value)" in tests["test_allgather_example"]["hint"]
    HINTS.assert_advised(tests, {
        **{gid: HINTS.case(gid, r"stale starting value") for gid in AG_TESTS},
        **{gid: HINTS.case(gid, r"alone, allgather .*stale starting value") for gid in RING_TESTS},
    }, whole=True)


# --------------------------------------------------------------------------- in process


def test_a_reduce_scatter_one_step_short_gets_its_hint_in_process():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "reduce_scatter", RS_ONE_STEP_SHORT), skip=("demo",))
    advice = HINTS.advice_in_process(outcome)
    traffic = {"hidden_traffic_per_rank", "hidden_traffic_total"}
    assert set(advice) == RS_TESTS | RING_TESTS | traffic, outcome
    assert advice == {
        **{gid: HINTS.case(gid, r"own input only") for gid in RS_TESTS},
        **{gid: HINTS.case(gid, r"alone, reduce_scatter .*own input only") for gid in RING_TESTS},
        **{gid: HINTS.written(gid).hint for gid in traffic},
    }


def test_a_numpy_only_call_on_the_strict_device_gets_the_device_hint_in_process(monkeypatch):
    pytest.importorskip("array_api_strict")
    monkeypatch.setenv("LAB_DEVICE", "strict")
    outcome = run_cells(edit_cell(read_nb(SOURCE), "reduce_scatter", RS_NUMPY_ONLY), skip=("demo",))
    advice = HINTS.advice_in_process(outcome)
    assert set(advice) == USES_REDUCE_SCATTER, outcome
    device = r"\(device (strict|gpu)\): expected a result, found (AttributeError|TypeError)"
    assert advice == {gid: HINTS.case(gid, device) for gid in USES_REDUCE_SCATTER}


def test_the_reproduce_line_gives_the_reported_value_in_the_learners_notebook():
    wrong = SPEC.wrong_notebook("rs_overwrites")
    error = run_cells(wrong, skip=("demo",))["hidden_allreduce_any"]
    assert "rank 0 expected [-22.], found [18.]" in error, error
    namespace = notebook_namespace(wrong, skip=("test_chunk", "test_reduce", "test_allgather", "test_allreduce",
                                                "hidden_", "demo"))
    found = eval(error.split("reproduce: ")[1], namespace)
    assert [r.tolist() for r in found] == [[18.0], [18.0]]
