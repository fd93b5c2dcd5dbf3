"""The guard's call watch, in process: it must catch a learner function that hands back the
reference's answer, leave an honest one alone, and put every reference function back."""
from __future__ import annotations

import pytest

import reference_impl.comm as comm
from grader import guard

REFERENCE = "from reference_impl.comm import chunk_bounds as _ref_chunk_bounds\n"
HONEST = REFERENCE + (
    "def chunk_bounds(n, p):\n"
    "    q, r = divmod(n, p)\n"
    "    starts = [i * q + min(i, r) for i in range(p + 1)]\n"
    "    return [(starts[i], starts[i + 1]) for i in range(p)]\n")
DELEGATING = REFERENCE + (
    "def chunk_bounds(n, p):\n"
    "    import reference_impl.comm as rc\n"
    "    return rc.chunk_bounds(n, p)\n")
TEST = ("import grader.guard as _g\n"
        "_g.begin('hidden', ('chunk_bounds',), {}, globals())\n"
        "for n in range(12):\n"
        "    assert list(map(tuple, chunk_bounds(n, 3))) == list(map(tuple, _ref_chunk_bounds(n, 3)))\n"
        "_g.end('hidden', 'TOKEN', globals())\n")


def run(learner: str) -> dict:
    namespace: dict = {}
    exec(compile(learner, "<learner cell>", "exec"), namespace)
    exec(compile(TEST, "<test cell>", "exec"), namespace)
    return namespace


def test_honest_solution_passes_and_everything_is_put_back(capsys):
    original = comm.chunk_bounds
    namespace = run(HONEST)
    assert "lab-guard TOKEN hidden ok" in capsys.readouterr().out
    assert comm.chunk_bounds is original and namespace["_ref_chunk_bounds"] is original
    assert guard._watch is None


def test_delegating_solution_is_refused_by_name():
    original = comm.chunk_bounds
    with pytest.raises(guard.TamperedError, match=r"chunk_bounds calls reference_impl\.comm\..*chunk_bounds"):
        run(DELEGATING)
    assert comm.chunk_bounds is original


def test_a_failed_test_leaves_no_wrapper_behind_for_the_next():
    original = comm.chunk_bounds
    namespace: dict = {}
    exec(compile(HONEST, "<learner cell>", "exec"), namespace)
    failing = TEST.replace("== list(map(tuple, _ref_chunk_bounds(n, 3)))", "== []")
    with pytest.raises(AssertionError):
        exec(compile(failing, "<failing test cell>", "exec"), namespace)
    assert comm.chunk_bounds is not original  # still watched: the cell stopped before ``end``
    exec(compile(TEST, "<next test cell>", "exec"), namespace)
    assert comm.chunk_bounds is original


def test_a_test_cell_may_rebind_its_own_reference_names(capsys):
    """Rebinding a ``_ref`` name in the notebook is the test's business, not tampering."""
    rebinding = TEST.replace("_g.end(", "_ref_chunk_bounds = len\n_g.end(")
    namespace: dict = {}
    exec(compile(HONEST, "<learner cell>", "exec"), namespace)
    exec(compile(rebinding, "<test cell>", "exec"), namespace)
    assert "lab-guard TOKEN hidden ok" in capsys.readouterr().out


def test_replacing_a_reference_module_function_during_the_test_is_refused():
    original = comm.chunk_bounds
    learner = HONEST + "import reference_impl.comm as _rc\n_saved = [_rc.chunk_bounds]  # out of the watch's sight\n"
    unpatching = TEST.replace("_g.end(", "import reference_impl.comm as _rc2\n_rc2.chunk_bounds = _saved[0]\n_g.end(")
    namespace: dict = {}
    exec(compile(learner, "<learner cell>", "exec"), namespace)
    with pytest.raises(guard.TamperedError, match="watch on the reference implementation was removed"):
        exec(compile(unpatching, "<test cell>", "exec"), namespace)
    assert comm.chunk_bounds is original
