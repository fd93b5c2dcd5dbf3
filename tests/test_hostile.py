"""Hostile notebooks: the grader finishes within its limits, scores them right, and says why.

Every case is a variant of the 01_ring_allreduce source notebook (whose solutions score full
marks) with hostile code added. All grading runs start together in the module fixture and
are collected once; each test then checks one run's exact outcome. Expected scores are
computed from the source notebook's own points (the tests that run before a hostile cell
keep their credit, every later one is refused), not copied from a run.

Several cases need the kernel walls that only root can put up (a private user, a private
mount namespace); they are skipped, with the reason, when the tests do not run as root.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from notebook_tools import (
    ROOT,
    by_id,
    edit_cell,
    grade_id,
    read_nb,
    start_check,
    write_nb,
)

COURSE = ROOT / "exercises"
SOURCE = COURSE / "source" / "01_ring_allreduce" / "ring_allreduce.ipynb"
OTHER = COURSE / "source" / "02_alpha_beta" / "alpha_beta.ipynb"
MAX_SCORE = 25.0
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="the kernel's private user and mounts need root")

pytestmark = pytest.mark.timeout(300)


def code_cell(source: str) -> dict[str, Any]:
    """A plain (not nbgrader) code cell, as a learner adds one."""
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}


def appended(nb: dict[str, Any], *sources: str) -> dict[str, Any]:
    """A copy of ``nb`` with learner cells added after all its cells (after every test)."""
    nb = json.loads(json.dumps(nb))
    nb["cells"] += [code_cell(s) for s in sources]
    return nb


def points_before(nb: dict[str, Any], gid: str) -> float:
    """Points of the test cells that come before cell ``gid`` (they run before it, untouched)."""
    total = 0.0
    for cell in nb["cells"]:
        if grade_id(cell) == gid:
            return total
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            total += float(meta["points"])
    raise AssertionError(f"no cell {gid}")


def cell_errors(result: dict[str, Any]) -> list[str]:
    return [e["error"] for e in result["cell_errors"]]


# Hostile cells appended after every test: each leaves a one-line error on its own cell.
INFINITE_LOOP = "while True:\n    pass\n"
MEMORY_BOMB = "_hog = []\nwhile True:\n    _hog.append(np.empty(2**27))  # 1 GiB of address space each\n"
SYS_EXIT = "import sys\nsys.exit(3)\n"
HUGE_OUTPUT = "print('x' * 30_000_000)\n"
ESCAPE = """import os, pathlib
_done = []
for _target in [pathlib.Path({canary!r}), pathlib.Path({repo!r}) / 'README.md']:
    try:
        _target.write_text('overwritten by a notebook')
        _done.append(f'rewrote {{_target}}')
    except OSError as exc:
        pass
    try:
        os.remove(_target)
        _done.append(f'deleted {{_target}}')
    except OSError:
        pass
try:
    (pathlib.Path({repo!r}) / 'hostile-was-here').write_text('x')
    _done.append('created a file in the repository')
except OSError:
    pass
raise RuntimeError(f'escape attempts that worked: {{_done}}')
"""
SNOOP = """import glob, os, pathlib
_read = []
_candidates = [{source!r}, *glob.glob('/tmp/dl-lab-grader-*/course/gradebook.db'),
               *glob.glob('/tmp/dl-lab-grader-*/course/source/*/*.ipynb'),
               *glob.glob({tmp!r} + '/dl-lab-grader-*/course/gradebook.db'),
               *glob.glob({tmp!r} + '/dl-lab-grader-*/course/source/*/*.ipynb'),
               *glob.glob({tmp!r} + '/dl-lab-grader-*/kernel-plan.json'),
               f'/proc/{{os.getppid()}}/environ']
for _path in _candidates:
    try:
        _text = pathlib.Path(_path).read_bytes()
        if b'HIDDEN' in _text or b'SQLite' in _text or b'LAB_GUARD_TOKEN' in _text or b'hide' in _text:
            _read.append(_path)
    except OSError:
        pass
raise RuntimeError(f'secrets read: {{_read}}')
"""
FORK_BOMB = """import os, time
_children = []
try:
    while len(_children) < 10_000:
        _pid = os.fork()
        if _pid == 0:
            time.sleep(600)
            os._exit(0)
        _children.append(_pid)
except OSError:
    pass
raise RuntimeError(f'fork refused after {len(_children)} children')
"""
SIGINT_LOOP = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """Every hostile notebook, graded in parallel; results by case name."""
    work = tmp_path_factory.mktemp("hostile")
    kernel_tmp = work / "tmp"
    kernel_tmp.mkdir()
    canary = Path(tempfile.mkstemp(prefix="hostile-canary-", dir="/tmp")[1])  # visible to the kernel
    canary.write_text("canary")
    canary.chmod(0o644)
    source = read_nb(SOURCE)
    wrong = "def chunk_bounds(n_elements, n_ranks):\n    step = -(-n_elements // n_ranks)\n" \
            "    return [(min(r * step, n_elements), min((r + 1) * step, n_elements)) for r in range(n_ranks)]\n"

    notebooks: dict[str, tuple[dict[str, Any] | str, tuple[str, ...]]] = {
        # After every test: the tests keep their marks, the hostile cells are stopped.
        # The endless loop comes last: the first cell past its limit stops the run.
        "end_cells": (appended(source, MEMORY_BOMB, SYS_EXIT, HUGE_OUTPUT,
                               ESCAPE.format(canary=str(canary), repo=str(ROOT)),
                               SNOOP.format(source=str(SOURCE), tmp=str(kernel_tmp)), INFINITE_LOOP),
                      ("--cell-timeout", "10", "--memory-mb", "3072")),
        "fork_bomb": (appended(source, FORK_BOMB), ()),
        "sigint_loop": (appended(source, SIGINT_LOOP), ("--cell-timeout", "3", "--timeout", "120")),
        "os_exit": (appended(source, "import os\nos._exit(0)\n"), ()),
        # Tampering inside the solutions.
        "numpy_patch": (edit_cell(source, "allgather", lambda s: "np.array_equal = lambda *a, **k: True\n" + s), ()),
        "helper_patch": (edit_cell(source, "allgather", lambda s: s + "\n\ndef on_ranks(*args, **kwargs):\n"
                                   "    return []\n"), ()),
        "hidden_helper_patch": (edit_cell(source, "allgather", lambda s: s + "\n\ndef _smallest_first(*args, **kwargs):\n"
                                          "    return None\n"), ()),
        "traceback_patch": (edit_cell(source, "chunk_bounds", "get_ipython()._showtraceback = "
                                      "lambda *a, **k: None\n\n" + wrong), ()),
        "reference_patch": (edit_cell(source, "chunk_bounds", wrong + "\nimport reference_impl.comm as _rc\n"
                                      "_rc.chunk_bounds = chunk_bounds\n"), ()),
        "calls_reference": (edit_cell(source, "chunk_bounds", "def chunk_bounds(n_elements, n_ranks):\n"
                                      "    from reference_impl.comm import chunk_bounds as _theirs\n"
                                      "    return _theirs(n_elements, n_ranks)\n"), ()),
        # Odd files.
        "invalid_json": ('{"cells": [', ()),
        "other_assignment": ({**read_nb(OTHER), "metadata": {**read_nb(OTHER)["metadata"],
                                                              "lab": {"assignment": "01_ring_allreduce"}}}, ()),
        "minor_version": ({**source, "nbformat_minor": 4,
                           "cells": [{k: v for k, v in c.items() if k != "id"} for c in source["cells"]]}, ()),
    }
    started = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(kernel_tmp))
    for name, (nb, extra) in notebooks.items():
        path = work / name / "ring_allreduce.ipynb"
        if isinstance(nb, str):
            path.parent.mkdir(parents=True)
            path.write_text(nb)
        else:
            write_nb(path, nb)
        # one device: containment is the same on each (tests/test_grader_device.py grades both)
        started[name] = start_check(work, name, path, "--device", "cpu", *extra, env=env)
    results = {name: run.wait(timeout=240) for name, run in started.items()}
    results["canary"] = canary
    results["canary_text"] = canary.read_text() if canary.exists() else None
    results["source"] = source
    canary.unlink(missing_ok=True)
    return results


# --------------------------------------------------------------------------- runaway code


def test_infinite_loop_is_stopped_by_the_cell_limit(runs):
    """A cell that never ends is interrupted after --cell-timeout; every test keeps its marks.
    (The limit is 10 s, not 3, because the hostile cells before it must each finish within it
    while a dozen gradings share two cores.)"""
    result = runs["end_cells"].result()
    assert result["score"] == MAX_SCORE and result["error"] is None
    assert any("stopped" in e and "10 s" in e for e in cell_errors(result)), result["cell_errors"]


def test_memory_bomb_fails_in_its_cell(runs):
    """Allocation past --memory-mb raises MemoryError in the learner's cell, not in the grader."""
    result = runs["end_cells"].result()
    assert any("MemoryError: Unable to allocate 1.00 GiB" in e for e in cell_errors(result)), result["cell_errors"]


def test_sys_exit_in_a_cell_is_an_error_of_that_cell(runs):
    """sys.exit() inside a cell is caught by the kernel and shown as that cell's error."""
    result = runs["end_cells"].result()
    assert any(e.startswith("SystemExit") for e in cell_errors(result)), result["cell_errors"]


def test_huge_output_stays_out_of_the_feedback(runs):
    """30 MB of print neither slows the report nor reaches the feedback page, which is made
    from the grading record (the autograded notebook's outputs are cut to a few kB as well)."""
    result = runs["end_cells"].result()
    html = Path(result["feedback_html"]).read_text(encoding="utf-8")
    assert "xxxxxxxxxx" not in html and len(html) < 200_000


def test_sigint_ignoring_loop_is_stopped(runs):
    """A loop that ignores the interrupt is stopped like any other (its kernel is killed at the
    limit); the tests before it keep their marks."""
    result = runs["sigint_loop"].result()
    assert result["score"] == MAX_SCORE and result["error"] is None, result
    assert cell_errors(result) == ["stopped: the cell ran longer than 3 s (an endless loop, or a rank waiting "
                                   "forever?); the run stopped here"]


def test_os_exit_kills_only_the_kernel(runs):
    """os._exit() kills the kernel at the last cell; the tests that ran before keep their marks."""
    result = runs["os_exit"].result()
    assert result["score"] == MAX_SCORE and result["error"] is None, result
    assert len(cell_errors(result)) == 1 and "the kernel died while running this cell" in cell_errors(result)[0]


@needs_root
def test_fork_bomb_is_bounded_and_nothing_outlives_the_run(runs):
    """Forking stops at the process limit, and no process of the kernel's user is left."""
    psutil = pytest.importorskip("psutil")
    result = runs["fork_bomb"].result()
    assert result["score"] == MAX_SCORE
    limit = int(re.search(r"at most (\d+)", result["isolation"]["processes"]).group(1))
    uid = int(re.search(r"user (\d+)", result["isolation"]["processes"]).group(1))
    refused = [e for e in cell_errors(result) if "fork refused after" in e]
    assert refused and int(re.search(r"after (\d+)", refused[0]).group(1)) < limit, result["cell_errors"]
    left = [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    assert left == []


# --------------------------------------------------------------------------- files and secrets


@needs_root
def test_cells_cannot_touch_files_outside_their_folder(runs):
    """Rewriting or deleting a canary file or the repository's README fails: nothing worked."""
    result = runs["end_cells"].result()
    assert "escape attempts that worked: []" in " ".join(cell_errors(result)), result["cell_errors"]
    assert runs["canary_text"] == "canary"
    assert not (ROOT / "hostile-was-here").exists()
    assert (ROOT / "README.md").read_text() != "overwritten by a notebook"


@needs_root
def test_cells_cannot_read_hidden_tests_or_gradebook(runs):
    """The source notebook, the scratch gradebook and the grader's environment are all out of reach."""
    result = runs["end_cells"].result()
    assert "secrets read: []" in " ".join(cell_errors(result)), result["cell_errors"]


# --------------------------------------------------------------------------- tampering


def test_patched_numpy_check_gets_no_credit(runs):
    """After np.array_equal is replaced, every later test is refused and says why."""
    result = runs["numpy_patch"].result()
    assert result["score"] == points_before(runs["source"], "allgather")
    refused = [t for t in result["tests"] if not t["passed"]]
    assert refused and all("replaced numpy function array_equal" in t["hint"] for t in refused)


def test_redefined_test_helper_gets_no_credit(runs):
    """Redefining the locked helper on_ranks refuses every later test."""
    result = runs["helper_patch"].result()
    assert result["score"] == points_before(runs["source"], "allgather")
    refused = [t for t in result["tests"] if not t["passed"]]
    assert refused and all("redefined the test helper on_ranks" in t["hint"] for t in refused)


def test_redefined_hidden_helper_gets_no_credit(runs):
    """A helper the hidden tests define once (in the first hidden test that needs it) and use in
    later ones is protected too: redefining it in a later solution cell refuses every later test."""
    result = runs["hidden_helper_patch"].result()
    assert result["score"] == points_before(runs["source"], "allgather")
    refused = [t for t in result["tests"] if not t["passed"]]
    assert refused and all("redefined the test helper _smallest_first" in t["hint"] for t in refused)


def test_hidden_traceback_display_gets_no_credit(runs):
    """Silencing IPython's error display (to hide failing asserts) scores zero everywhere."""
    result = runs["traceback_patch"].result()
    assert result["score"] == 0
    assert all("_showtraceback" in t["hint"] for t in result["tests"]), [t["hint"] for t in result["tests"]]


def test_patched_reference_gets_no_credit(runs):
    """Replacing reference_impl.comm.chunk_bounds with a wrong one (so tests compare it with itself)."""
    result = runs["reference_patch"].result()
    assert result["score"] == 0
    assert all("replaced reference_impl.comm.chunk_bounds" in t["hint"] for t in result["tests"])


def test_calling_the_reference_scores_zero_for_that_test(runs):
    """chunk_bounds that returns reference_impl's answer loses hidden_chunk_bounds, and only it."""
    result = runs["calls_reference"].result()
    tests = by_id(result)
    points = float(next(c["metadata"]["nbgrader"]["points"] for c in runs["source"]["cells"]
                        if grade_id(c) == "hidden_chunk_bounds"))
    assert result["score"] == MAX_SCORE - points
    hint = tests["hidden_chunk_bounds"]["hint"]
    assert "chunk_bounds calls" in hint and "reference implementation" in hint, hint


# --------------------------------------------------------------------------- odd files


def test_invalid_json_is_one_line_exit_2(runs):
    """A file that is not JSON is refused before any kernel starts."""
    run = runs["invalid_json"]
    assert run.returncode == 2 and "invalid JSON" in run.stderr and run.stderr.count("\n") == 1


def test_notebook_of_another_assignment_is_refused_by_name(runs):
    """02's notebook handed in as 01 is refused before grading, naming the assignment it belongs to."""
    run = runs["other_assignment"]
    assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
    assert "this notebook is 02_alpha_beta" in run.stderr and "not 01_ring_allreduce" in run.stderr


def test_other_nbformat_minor_version_grades_normally(runs):
    """A notebook saved as nbformat 4.4 (no cell ids) is graded like 4.5."""
    result = runs["minor_version"].result()
    assert result["score"] == MAX_SCORE and result["error"] is None


def test_isolation_is_reported(runs):
    """The report says which walls were up: network, processes, files, CPU, memory."""
    isolation = runs["minor_version"].result()["isolation"]
    assert {"network", "processes", "files", "cpu", "memory", "wall_clock"} <= set(isolation)
    if IS_ROOT:
        assert isolation["network"].startswith("off") and isolation["processes"].startswith("at most")
