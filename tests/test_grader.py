"""The grader, end to end: ``python -m grader check|release`` run as a learner would run them.

Grading starts a Jupyter kernel and takes seconds, so the slow runs start together, once,
in the module fixture ``runs`` (release, then every ``check`` as a parallel child process),
and each test reads its run's result. What is checked:

* the source notebook (with its solutions) scores full marks (the released notebook, empty
  and solved, is graded in tests/test_exercises.py);
* an off-by-one in ``chunk_bounds`` (only uneven splits break) gets partial marks, and a
  locked test cell the learner rewrote is reported and graded with its original text;
* a cell that never ends is stopped by the per-cell limit (grading completes) or by the
  wall-clock limit (reported, exit 3, no process left behind), within a bounded time;
* bad input (missing file, not a notebook, unknown assignment): exit 2 and one line;
* released notebooks hold no hidden test and no solution code;
* the notebook's own solutions and tests agree with ``reference_impl`` (fast, in process).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from notebook_tools import (
    ROOT, by_id, edit_cell, grader_argv, grader_env, notebook_namespace, read_nb, source_of, start_check,
    start_release, write_nb,
)

COURSE = ROOT / "exercises"
ASSIGNMENT = "01_ring_allreduce"
SOURCE = COURSE / "source" / ASSIGNMENT / "ring_allreduce.ipynb"
MAX_SCORE = 25.0
CELL_TIMEOUT = 3
WALL_TIMEOUT = 15

pytestmark = pytest.mark.timeout(300)


def snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


# --------------------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """Every slow grader run of this module, started together and collected."""
    work = tmp_path_factory.mktemp("grader")
    course_before = snapshot(COURSE)
    source = read_nb(SOURCE)

    # (c) an off-by-one in the remainder handling, plus a locked test the learner "fixed".
    off_by_one = edit_cell(source, "chunk_bounds", lambda s: s.replace("r < extra", "r < extra - 1"))
    off_by_one = edit_cell(off_by_one, "test_chunk_bounds_examples", "pass  # tests are for others\n")
    # (d) a solution cell that never ends.
    hanging = edit_cell(source, "reduce_scatter", lambda s: "while True:\n    pass\n\n" + s)
    off_by_one_path = write_nb(work / "off_by_one" / "ring_allreduce.ipynb", off_by_one)
    hanging_path = write_nb(work / "hanging" / "ring_allreduce.ipynb", hanging)

    release_out = work / "release"
    release = start_release(work, release_out)
    kernel_tmp = work / "wall-tmp"  # the wall-clock run's scratch folders live here
    kernel_tmp.mkdir()

    started = {
        "source": start_check(work, "source", SOURCE),
        "off_by_one": start_check(work, "off_by_one", off_by_one_path),
        "hang_cell": start_check(work, "hang_cell", hanging_path, "--cell-timeout", str(CELL_TIMEOUT)),
        "hang_wall": start_check(work, "hang_wall", hanging_path, "--timeout", str(WALL_TIMEOUT),
                                 env=grader_env(TMPDIR=str(kernel_tmp))),
    }
    results: dict[str, Any] = {"release": release.wait().ok(), "release_out": release_out, "work": work}
    for name, run in started.items():
        results[name] = run.wait()
    results["kernel_tmp"] = kernel_tmp
    results["course_after"] = snapshot(COURSE)
    results["course_before"] = course_before
    return results


# --------------------------------------------------------------------------- check


def test_source_notebook_scores_full_marks(runs):
    run = runs["source"]
    assert run.returncode == 0, run.stderr
    result = run.json()
    assert result["assignment"] == ASSIGNMENT
    assert result["max_score"] == MAX_SCORE
    failed = [(t["id"], t["hint"]) for t in result["tests"] if not t["passed"]]
    assert result["score"] == MAX_SCORE, f"failed tests: {failed}"
    assert len(result["tests"]) == 11 and all(t["hint"] is None for t in result["tests"])
    assert {"id", "score", "max_score", "passed", "hint", "seconds"} <= set(result["tests"][0])
    assert all(isinstance(t["seconds"], float) and 0 <= t["seconds"] < 60 for t in result["tests"])
    assert result["tampered"] == [] and result["cell_errors"] == []
    html = Path(result["feedback_html"])
    assert html.is_file() and html.parent.parent == runs["work"] / "fb-source"
    assert "hidden_allreduce_any" in html.read_text(encoding="utf-8")


def test_feedback_shows_every_test_but_no_hidden_test_code(runs):
    """The feedback page is rendered from the grading record: every test by name, the failure
    of each failed one, and nothing of the hidden tests, the guard or nbgrader's notebook."""
    for name in ("source", "off_by_one"):
        page = Path(runs[name].json()["feedback_html"]).read_text(encoding="utf-8")
        assert all(t["id"] in page for t in runs[name].json()["tests"]), name
        for secret in ("CountingCommunicator", "_ref_chunk_bounds", "default_rng(101)", "_lab_guard",
                       "lab-guard", "guard.py", "Cell In[", "<script", "http://cdn", "https://"):
            assert secret not in page, (name, secret)
    assert "AssertionError" in Path(runs["off_by_one"].json()["feedback_html"]).read_text(encoding="utf-8")


def test_table_has_a_time_column():
    from grader.report import GradingResult, TestResult, render_table

    result = GradingResult("a", "a.ipynb", tests=[TestResult("t1", 1, 1, True, None, 0.25),
                                                   TestResult("t2", 0, 2, False, "boom", None)])
    table = render_table(result).splitlines()
    assert "time" in table[2].split()
    assert "0.25 s" in table[4] and table[5].split()[3] == "-"


def test_off_by_one_chunk_bounds_gets_partial_marks(runs):
    run = runs["off_by_one"]
    assert run.returncode == 0, run.stderr
    result = run.json()
    assert 0 < result["score"] < result["max_score"], result
    tests = by_id(result)
    # Even splits still work; uneven ones do not.
    for passing in ("hidden_reduce_scatter", "hidden_allgather", "hidden_allreduce_even",
                    "hidden_traffic_per_rank"):
        assert tests[passing]["passed"], tests[passing]
    for failing in ("hidden_chunk_bounds", "hidden_allreduce_any", "hidden_traffic_total"):
        assert not tests[failing]["passed"] and tests[failing]["score"] == 0
    hint = tests["hidden_chunk_bounds"]["hint"]
    assert "expected" in hint and "found" in hint, hint
    # The rewritten locked test was graded with its original text, and reported.
    assert not tests["test_chunk_bounds_examples"]["passed"]
    assert "chunk_bounds(10, 3)" in tests["test_chunk_bounds_examples"]["hint"]
    assert result["tampered"] == ["test_chunk_bounds_examples"]


def test_hanging_cell_is_stopped_by_the_cell_limit(runs):
    run = runs["hang_cell"]
    assert run.returncode == 0, run.stderr
    result = run.json()
    assert result["error"] is None and not result["timed_out"]
    assert 0 < result["score"] < result["max_score"]  # chunk_bounds and allgather still count
    stopped = [e for e in result["cell_errors"] if e["cell"] == "reduce_scatter"]
    assert stopped and "stopped" in stopped[0]["error"], result["cell_errors"]
    # The first cell past its limit stops the run: every test after it says so, none runs into
    # the limit again (before, each cell after a hang waited out its own limit in turn).
    after = [t for t in result["tests"] if t["id"] not in ("test_chunk_bounds_examples",)]
    assert all(t["hint"] == f"not run: cell reduce_scatter ran past the {CELL_TIMEOUT} s limit, which stopped "
               "the run" and t["seconds"] is None for t in after), [(t["id"], t["hint"]) for t in after]
    from grader.report import GradingResult, TestResult, render_table

    table = render_table(GradingResult(ASSIGNMENT, "nb.ipynb", tests=[TestResult(**t) for t in result["tests"]]))
    assert " ".join(table.split()).count("which stopped the run") == 1, table  # once for all of them
    assert result["isolation"]["device"] == "cpu (NumPy)"  # a stopped run is not run again on strict
    assert run.seconds < 60


def test_hanging_cell_is_stopped_by_the_wall_clock_limit(runs):
    run = runs["hang_wall"]
    assert run.returncode == 3, (run.returncode, run.stderr)
    result = run.json()
    assert result["timed_out"] and "wall-clock" in result["error"]
    assert result["score"] == 0
    assert "did not complete" in Path(result["feedback_html"]).read_text(encoding="utf-8")
    assert all("wall-clock" in t["hint"] for t in result["tests"])
    # stderr: the progress of the tests that ran, then one line saying why the run stopped
    *progress, last = run.stderr.strip().splitlines()
    assert "wall-clock" in last and all(line.startswith(("  ", "on ")) for line in progress), run.stderr
    # Stopped near the limit, not at the 120 s default; the margin covers a loaded 2-core CI.
    assert run.seconds < WALL_TIMEOUT + 60
    # Nothing of that run survives: no kernel or nbgrader process under its scratch folder.
    psutil = pytest.importorskip("psutil")
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        if str(runs["kernel_tmp"]) in " ".join(proc.info["cmdline"] or []):
            left.append(proc.pid)
    assert not left, f"processes left behind by the killed run: {left}"


def test_grading_writes_nothing_into_the_course(runs):
    assert runs["course_after"] == runs["course_before"]


# --------------------------------------------------------------------------- bad input


def _bad_input(tmp_path: Path, notebook: Path) -> subprocess.CompletedProcess:
    return subprocess.run(grader_argv("check", str(notebook)), cwd=tmp_path, env=grader_env(),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("missing.ipynb", None, "no such file"),
        ("broken.ipynb", "{not json", "not a Jupyter notebook"),
        ("plain.ipynb", json.dumps({"hello": "world"}), "not a Jupyter notebook"),
        ("old.ipynb", json.dumps({"nbformat": 3, "worksheets": []}), "not a Jupyter notebook"),
        ("ring_allreduce.ipynb",
         json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": [],
                     "metadata": {"lab": {"assignment": "99_nope"}}}),
         "unknown assignment '99_nope'"),
        ("mystery.ipynb", json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": [], "metadata": {}}),
         "name it with --assignment"),
        # 05's notebook saved under 01's file name: its metadata says which it is
        ("ring_allreduce.ipynb", (COURSE / "source/05_autodiff/autodiff.ipynb").read_text(encoding="utf-8"),
         "this notebook is 05_autodiff, not 01_ring_allreduce as its file name says"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, name, content, expected):
    notebook = tmp_path / name
    if content is not None:
        notebook.write_text(content)
    run = _bad_input(tmp_path, notebook)
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert expected in lines[0] and name in lines[0], lines[0]
    assert "Traceback" not in run.stderr and run.stdout == ""


# --------------------------------------------------------------------------- release


def test_release_has_no_hidden_tests_and_no_solutions(runs):
    out = runs["release_out"]
    # Exactly one learner notebook per source notebook, and nothing else (no gradebook) but
    # the hashes of what was released, by which a later release knows an edited notebook.
    sources = sorted(str(p.relative_to(COURSE / "source")) for p in (COURSE / "source").glob("*/*.ipynb"))
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [".released.json", *sources]
    assert sorted(json.loads((out / ".released.json").read_text())) == sources
    for path in out.rglob("*.ipynb"):
        text = path.read_text(encoding="utf-8")
        for marker in ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "BEGIN SOLUTION", "END SOLUTION"):
            assert marker not in text, f"{marker} in {path}"
    released = read_nb(out / ASSIGNMENT / "ring_allreduce.ipynb")
    text = json.dumps(released)
    for marker in ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "BEGIN SOLUTION", "END SOLUTION"):
        assert marker not in text
    for secret in ("divmod(n_elements, n_ranks)", "xp.empty_like(chunks[recv_i])",
                   "_ref_chunk_bounds", "_ref_allreduce", "CountingCommunicator"):
        assert secret not in text, f"{secret!r} leaked into the release"
    stubs = [source_of(c) for c in released["cells"]
             if c["metadata"].get("nbgrader", {}).get("solution")]
    assert len(stubs) == 3 and all("raise NotImplementedError()" in s for s in stubs)
    assert released["metadata"]["lab"]["assignment"] == ASSIGNMENT
    assert all(c.get("outputs", []) == [] for c in released["cells"] if c["cell_type"] == "code")


def test_release_leak_check_catches_solution_code():
    from grader.release import ReleaseLeak, check_no_leaks, secret_lines

    source = read_nb(SOURCE)
    secrets = secret_lines(source)
    assert "base, extra = divmod(n_elements, n_ranks)" in secrets
    assert "return bounds" in secrets  # only ever written inside the solution
    assert "n, r = comm.size, comm.rank" in secrets
    leaky = edit_cell(source, "chunk_bounds",
                      lambda s: s.replace("### BEGIN SOLUTION\n", "").replace("    ### END SOLUTION", ""))
    with pytest.raises(ReleaseLeak, match="solution or hidden-test code"):
        check_no_leaks(source, leaky, "leaky")
    with pytest.raises(ReleaseLeak, match="BEGIN SOLUTION"):
        check_no_leaks(source, source, "source")


# --------------------------------------------------------------------------- the notebook itself


def test_notebook_solutions_agree_with_reference_impl():
    from reference_impl.comm import allreduce, chunk_bounds, run_threads

    ns = notebook_namespace(read_nb(SOURCE), upto="ring_allreduce")
    rng = np.random.default_rng(7)
    for n in range(1, 6):
        for N in (0, 1, n - 1, n + 1, 3 * n, int(rng.integers(0, 100))):
            assert ns["chunk_bounds"](N, n) == chunk_bounds(N, n)
            inputs = [rng.integers(-9, 9, size=N).astype(np.int64) for _ in range(n)]
            mine = run_threads(n, lambda c: ns["ring_allreduce"](c, inputs[c.rank]), timeout=10)
            ref = run_threads(n, lambda c: allreduce(c, inputs[c.rank]), timeout=10)
            for a, b in zip(mine, ref):
                assert a.dtype == b.dtype and np.array_equal(a, b), (n, N)


def test_every_cell_of_the_source_notebook_passes_in_process():
    """All visible and hidden tests pass against the solutions (the fast version of test (a))."""
    notebook_namespace(read_nb(SOURCE))
