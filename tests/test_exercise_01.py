"""Exercise 01 (ring allreduce): the hints a learner reads when a test fails.

tests/test_grader.py grades this notebook for the grader's own behaviour (tampering, hangs,
bad input); this module checks what a learner is told. The grader runs start together, once,
in the module fixture ``runs``; what is checked:

* the released notebook scores 0, and every test gets its general written hint and a link;
* the released notebook with the solution cells filled in scores full marks;
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

from pathlib import Path
from typing import Any

import pytest

from notebook_tools import (
    Hints, ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero,
    edit_cell, grade_assignment, notebook_namespace, read_nb, replacing, run_cells,
)

ASSIGNMENT = "01_ring_allreduce"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "ring_allreduce.ipynb"
HINTS = Hints(SOURCE)
MAX_SCORE = 25.0
SOLUTION_CELLS = ("chunk_bounds", "reduce_scatter", "allgather")

pytestmark = pytest.mark.timeout(300)

OFF_BY_ONE = replacing("r < extra", "r < extra - 1")
RS_OVERWRITES = replacing("""        incoming = xp.empty_like(chunks[recv_i])
        comm.sendrecv(chunks[send_i], right, incoming, left)
        chunks[recv_i] += incoming""", "        comm.sendrecv(chunks[send_i], right, chunks[recv_i], left)")
AG_WITH_RS_INDICES = replacing("send_i, recv_i = (r + 1 - s) % n, (r - s) % n",
                               "send_i, recv_i = (r - s) % n, (r - s - 1) % n")
RS_ONE_STEP_SHORT = replacing("for s in range(n - 1):", "for s in range(n - 2):")
RS_NUMPY_ONLY = replacing("comm.sendrecv(chunks[send_i], right, incoming, left)",
                          "comm.sendrecv(chunks[send_i].copy(), right, incoming, left)")

CHUNK_TESTS = {"test_chunk_bounds_examples", "hidden_chunk_bounds"}
RING_TESTS = {"test_allreduce_examples", "hidden_allreduce_even", "hidden_allreduce_any"}
RS_TESTS = {"test_reduce_scatter_example", "hidden_reduce_scatter"}
AG_TESTS = {"test_allgather_example", "hidden_allgather"}
USES_REDUCE_SCATTER = RS_TESTS | RING_TESTS | {"hidden_traffic_per_rank", "hidden_traffic_total"}


# --------------------------------------------------------------------------- the written hints


# --------------------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    source = read_nb(SOURCE)
    wrong = {
        "off_by_one": edit_cell(source, "chunk_bounds", OFF_BY_ONE),
        "rs_overwrites": edit_cell(source, "reduce_scatter", RS_OVERWRITES),
        "ag_rs_indices": edit_cell(source, "allgather", AG_WITH_RS_INDICES),
    }
    return grade_assignment(tmp_path_factory.mktemp("exercise01"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The released file holds no hidden test code, only the emptied test cells, yet all 11
    tests (7 hidden) are graded: the hidden tests come back from the gradebook."""
    assert "hidden_allreduce_any" in runs["released_text"]
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=11, hidden=7)


def test_released_notebook_scores_zero_with_the_general_hints(runs):
    result = runs["released"]
    assert_unimplemented_scores_zero(result, MAX_SCORE)
    assert_nothing_leaked(runs["released_text"], "_ref_allreduce", "def _smallest_first", "CountingCommunicator")
    HINTS.assert_general_hints(result)
    assert Path(result["feedback_html"]).is_file()
    # nothing passed on NumPy, so array_api_strict (01's second device) could change no verdict
    assert result["isolation"]["device"] == "cpu (NumPy)"


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
    wrong = edit_cell(read_nb(SOURCE), "reduce_scatter", RS_OVERWRITES)
    error = run_cells(wrong, skip=("demo",))["hidden_allreduce_any"]
    assert "rank 0 expected [-22.], found [18.]" in error, error
    namespace = notebook_namespace(wrong, skip=("test_chunk", "test_reduce", "test_allgather", "test_allreduce",
                                                "hidden_", "demo"))
    found = eval(error.split("reproduce: ")[1], namespace)
    assert [r.tolist() for r in found] == [[18.0], [18.0]]
