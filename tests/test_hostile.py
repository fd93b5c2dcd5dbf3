"""Hostile notebooks: the grader finishes within its limits, scores them right, and says why.

Every case is a variant of the 01_ring_allreduce source notebook (whose solutions score full
marks) with hostile code added. All grading runs start together in the module fixture and
are collected once; each test then checks one run's exact outcome. Expected scores are
computed from the source notebook's own points (the tests that run before a hostile cell
keep their credit, every later one is refused), not copied from a run.

The whole suite runs in three passes, started together: as root (the kernel behind
``grader.jail``'s private user and mount namespace, with bubblewrap on top), as root without
bubblewrap (``LAB_SANDBOX_BWRAP=off``: what a root host without it gets), and as an
unprivileged user (the kernel behind bubblewrap's user, pid and mount namespaces). Run as
root, the unprivileged pass switches to the dedicated account of ``tests/learner_account.py``
(created when missing) with the same ``setpriv`` helper; run as another user, only that pass
runs (skipped, or failed under CI, without bubblewrap). Every case must be contained in all. The ``red_team`` notebook holds attacks of a
learner who wants the hidden tests or marks without a solution; each of its cells reports
what worked, and the tests expect nothing did.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from learner_account import learner
from notebook_tools import (
    ROOT,
    Started,
    by_id,
    edit_cell,
    grade_id,
    grader_argv,
    read_nb,
    write_nb,
)

COURSE = ROOT / "exercises"
SOURCE = COURSE / "source" / "01_ring_allreduce" / "ring_allreduce.ipynb"
OTHER = COURSE / "source" / "02_alpha_beta" / "alpha_beta.ipynb"
MAX_SCORE = 25.0
IS_ROOT = os.geteuid() == 0
# root without bubblewrap: the walls a root host without bubblewrap has (LAB_SANDBOX_BWRAP=off)
MODES = ["root", "unprivileged", "root_without_bwrap"]

pytestmark = pytest.mark.timeout(300)
END_CELL_LIMIT = "15"  # seconds, the cell limit of the notebook of hostile cells at its end (``end_cells``)


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


# The red team: cells a learner could add to read the hidden tests, forge marks or get out.
# Each ends by raising RuntimeError('<what>: <list of what worked>'); contained means [].
RED_ENVIRON = """import os, glob
_seen = ['own environment'] if 'LAB_GUARD_TOKEN' in os.environ else []
for _path in glob.glob('/proc/[0-9]*/environ'):
    try:
        if b'LAB_GUARD_TOKEN' in open(_path, 'rb').read():
            _seen.append(_path)
    except OSError:
        pass
raise RuntimeError(f'token seen in: {_seen}')
"""
RED_SIGNAL = """import os, glob, signal
_done = []
for _cmd in glob.glob('/proc/[0-9]*/cmdline'):
    try:
        _line = open(_cmd, 'rb').read()
    except OSError:
        continue
    if b'grader.steps' not in _line and b'grader\\x00check' not in _line:
        continue
    _pid = int(_cmd.split('/')[2])
    try:
        os.kill(_pid, 0)  # permission probe: the same check as any signal, harmless if it passes
        _done.append(f'signal {_pid}')
    except OSError:
        pass
    for _name in ('mem', 'environ', 'cwd/.'):
        try:
            open(f'/proc/{_pid}/{_name}', 'rb').close() if _name != 'cwd/.' else os.listdir(f'/proc/{_pid}/cwd')
            _done.append(f'{_name} of {_pid}')
        except OSError:
            pass
raise RuntimeError(f'grader processes reached: {_done}')
"""
RED_HOME = """import pathlib
_done = []
for _sub in ('.cache', '.local', '.ipython', '.jupyter', '.config'):
    try:
        _dir = pathlib.Path({home!r}) / _sub
        _dir.mkdir(parents=True, exist_ok=True)
        (_dir / 'hostile-was-here').write_text('x')
        _done.append(_sub)
    except OSError:
        pass
raise RuntimeError(f'home folders written: {{_done}}')
"""
RED_PROC_LINKS = """import os, glob, pathlib
_found = []
for _link in glob.glob('/proc/[0-9]*/cwd') + glob.glob('/proc/[0-9]*/root') + glob.glob('/proc/[0-9]*/fd/*'):
    try:
        _target = pathlib.Path(_link)
        # the gradebook, a course's source notebooks (the submissions graded here hold hidden tests
        # too, being copies of the source: those are the other-submissions attack's business)
        _files = [_target] if _target.is_file() else [
            *_target.glob('gradebook.db'), *_target.glob('course/gradebook.db'), *_target.glob('source/*/*.ipynb'),
            *_target.glob('course/source/*/*.ipynb'), *_target.glob('exercises/source/*/*.ipynb')]
        if _link.endswith('/root'):
            _files.append(_target / {source!r}.lstrip('/'))
        for _file in _files:
            _data = _file.read_bytes()
            if (b'BEGIN HIDDEN TESTS' in _data and 'source' in str(_file)) or _data.startswith(b'SQLite format'):
                _found.append(f'{{_link}}: {{_file}}')
    except (OSError, RuntimeError, ValueError):
        pass
raise RuntimeError(f'hidden tests reached through /proc: {{_found}}')
"""
RED_REPO = """import pathlib, reference_impl.comm, grader.guard
_done = []
for _file in [pathlib.Path(reference_impl.comm.__file__), pathlib.Path(grader.guard.__file__)]:
    try:
        open(_file, 'r+b').close()  # opened for writing is enough: nothing is written
        _done.append(f'could rewrite {_file.name}')
    except OSError:
        pass
    try:
        (_file.parent / 'hostile_module.py').write_text('x = 1')
        _done.append(f'created a module next to {_file.name}')
    except OSError:
        pass
raise RuntimeError(f'repository writes: {_done}')
"""
RED_FORGE = """import glob, json, os, pathlib
import grader.report  # importable (the test cells need grader.guard); forging needs its files
_done = []
_fake = json.dumps({{'completed': [], 'grades': {{}}, 'forged': True}})
for _dir in [*glob.glob('/tmp/dl-lab-grader-*'), *glob.glob({tmp!r} + '/dl-lab-grader-*')]:
    for _name in ('steps.json', 'kernel-isolation.json', 'progress.jsonl'):
        try:
            (pathlib.Path(_dir) / _name).write_text(_fake)
            _done.append(_name)
        except OSError:
            pass
try:
    _fb = pathlib.Path({feedback!r})
    _fb.mkdir(parents=True, exist_ok=True)
    (_fb / 'FORGED.html').write_text('FORGED full marks')
    _done.append('feedback folder')
except OSError:
    pass
raise RuntimeError(f'forgery attempted (in its own view of the files): {{_done}}')
"""
RED_SYMLINK = """import os, pathlib
_read = []
for _n, _target in enumerate([{source!r}, {other!r}, f'/proc/{{os.getppid()}}/root{source}',
                              f'/proc/1/root{source}', f'/proc/{{os.getppid()}}/cwd']):
    try:
        os.symlink(_target, f'link{{_n}}')
        _path = pathlib.Path(f'link{{_n}}')
        _data = _path.read_bytes() if not _path.is_dir() else b''.join(p.read_bytes() for p in _path.glob('**/*.ipynb'))
        if b'BEGIN HIDDEN TESTS' in _data or b'OTHER-LEARNER' in _data:
            _read.append(_target)
    except OSError:
        pass
raise RuntimeError(f'read through links: {{_read}}')
"""
RED_SOCKETS = """import socket
_reached = []
for _family, _address in [(socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_UNIX, {unix!r}),
                          (socket.AF_UNIX, {abstract!r}), (socket.AF_INET, ('1.1.1.1', 53))]:
    _s = socket.socket(_family, socket.SOCK_STREAM)
    _s.settimeout(2)
    try:
        _s.connect(_address)
        _reached.append(repr(_address))
    except OSError:
        pass
    finally:
        _s.close()
raise RuntimeError(f'outside sockets reached: {{_reached}}')
"""
RED_OTHERS = """import glob, pathlib
_read = []
for _pattern in [{others!r} + '/*/*.ipynb', '/tmp/*/others/*/*.ipynb', '/home/*/*/*.ipynb', {home!r} + '/**/*.ipynb']:
    for _path in glob.glob(_pattern, recursive=True):
        try:
            if b'OTHER-LEARNER' in pathlib.Path(_path).read_bytes():
                _read.append(_path)
        except OSError:
            pass
raise RuntimeError(f'other submissions read: {{_read}}')
"""
RED_SURVIVOR = """import os, sys
_pid = os.fork()
if _pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(3000)', {marker!r}])
    os._exit(0)
os.waitpid(_pid, 0)
raise RuntimeError('survivor started')
"""
RED_FILL = """import os
_filled = []
for _where in [os.environ.get('TMPDIR', '/tmp'), '/tmp', '/dev/shm', '.']:
    _written = 0
    try:
        with open(os.path.join(_where, 'hostile-fill'), 'wb') as _f:
            _block = b'x' * 2**20
            while _written < 400 * 2**20:
                _f.write(_block)
                _written += 2**20
            _f.flush()
            os.fsync(_f.fileno())
        _filled.append(_where)
    except OSError:
        pass
    finally:
        try:
            os.remove(os.path.join(_where, 'hostile-fill'))
        except OSError:
            pass
raise RuntimeError(f'400 MiB written to: {_filled}')
"""
RED_THREADS = """import threading, time
_threads = []
try:
    while len(_threads) < 5_000:
        _t = threading.Thread(target=time.sleep, args=(600,), daemon=True)
        _t.start()
        _threads.append(_t)
except RuntimeError:
    pass
raise RuntimeError(f'threads refused after {len(_threads)}')
"""
RED_MESSAGES = ("token seen in: []", "grader processes reached: []", "home folders written: []",
                "hidden tests reached through /proc: []", "repository writes: []",
                "read through links: []", "outside sockets reached: []", "other submissions read: []",
                "400 MiB written to: []")


def _listeners(work: Path) -> tuple[list[socket.socket], int, str, str]:
    """A TCP, a unix and an abstract unix socket outside the sandbox, listening (no one answers)."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(work / "outside.sock"))
    (work / "outside.sock").chmod(0o777)
    abstract = socket.socket(socket.AF_UNIX)
    name = f"\0dl-lab-hostile-{work.name}"
    abstract.bind(name)
    for s in (tcp, unix, abstract):
        s.listen(64)
    return [tcp, unix, abstract], tcp.getsockname()[1], str(work / "outside.sock"), name


# Cases that check the grader's scoring (tampering caught, odd files refused), not the walls
# around the kernel: the same in every mode, so graded in the first mode only (``scored``).
SCORING_CASES = ("numpy_patch", "helper_patch", "hidden_helper_patch", "traceback_patch", "reference_patch",
                 "calls_reference", "metadata_forged", "tests_relabelled", "invalid_json", "other_assignment")


def start_mode(mode: str, scoring: bool = True) -> dict[str, Any]:
    """Start grading every hostile notebook as root or as an unprivileged user (all at once);
    ``collect`` waits for them. ``scoring=False`` leaves out ``SCORING_CASES``."""
    who = learner() if mode == "unprivileged" and IS_ROOT else None
    work = Path(tempfile.mkdtemp(prefix="dl-lab-hostile-", dir="/tmp"))
    work.chmod(0o755)  # as an instructor's folder usually is: others may enter and read
    kernel_tmp = work / "tmp"
    kernel_tmp.mkdir()
    home = who.home if who else Path.home()
    for sub in (".cache", ".local", ".ipython", ".jupyter", ".config"):
        (home / sub / "hostile-was-here").unlink(missing_ok=True)
    others = work / "others"
    (others / "bob").mkdir(parents=True)
    (others / "bob" / "ring_allreduce.ipynb").write_text('{"OTHER-LEARNER": 1}')
    canary = home / f"dl-lab-hostile-canary-{mode}"  # the grader user's own file: its kernel must not change it
    canary.write_text("canary")
    if who is not None:
        os.chown(canary, who.uid, who.gid)
    sockets, port, unix, abstract = _listeners(work)
    marker = f"dl-lab-hostile-survivor-{os.getpid()}-{mode}"
    source = read_nb(SOURCE)
    wrong = "def chunk_bounds(n_elements, n_ranks):\n    step = -(-n_elements // n_ranks)\n" \
            "    return [(min(r * step, n_elements), min((r + 1) * step, n_elements)) for r in range(n_ranks)]\n"
    reference_answer = ("def chunk_bounds(n_elements, n_ranks):\n"
                        "    from reference_impl.comm import chunk_bounds as _theirs\n"
                        "    return _theirs(n_elements, n_ranks)\n")
    forged = edit_cell(source, "chunk_bounds", reference_answer)
    relabelled = json.loads(json.dumps(forged))
    for nb in (forged, relabelled):  # every test cell shows it passed; the notebook claims full marks
        nb["metadata"]["lab"] = {**nb["metadata"].get("lab", {}), "passed": True, "score": MAX_SCORE}
        for cell in nb["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("grade") and not meta.get("solution"):
                cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "passed\n"}]
                cell["execution_count"] = 1
                if nb is relabelled:  # and claims to be worth nothing, or no test at all
                    meta.update(grade=False, locked=False, points=0)

    notebooks: dict[str, tuple[dict[str, Any] | str, tuple[str, ...]]] = {
        # After every test: the tests keep their marks, the hostile cells are stopped.
        # The endless loop comes last: the first cell past its limit stops the run.
        "end_cells": (appended(source, MEMORY_BOMB, SYS_EXIT, HUGE_OUTPUT,
                               ESCAPE.format(canary=str(canary), repo=str(ROOT)),
                               SNOOP.format(source=str(SOURCE), tmp=str(kernel_tmp)), INFINITE_LOOP),
                      ("--cell-timeout", END_CELL_LIMIT, "--memory-mb", "3072")),
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
        "calls_reference": (edit_cell(source, "chunk_bounds", reference_answer), ()),
        "metadata_forged": (forged, ()),
        "tests_relabelled": (relabelled, ()),
        "red_team": (appended(source, RED_ENVIRON, RED_SIGNAL, RED_HOME.format(home=str(home)),
                              RED_PROC_LINKS.format(source=str(SOURCE)), RED_REPO,
                              RED_FORGE.format(tmp=str(kernel_tmp), feedback=str(work / "fb-red_team")),
                              RED_SYMLINK.format(source=str(SOURCE), other=str(others / "bob" / "ring_allreduce.ipynb")),
                              RED_SOCKETS.format(port=port, unix=unix, abstract=abstract),
                              RED_OTHERS.format(others=str(others), home=str(home)),
                              RED_FILL, RED_SURVIVOR.format(marker=marker), RED_THREADS),
                     ("--cell-timeout", "20")),
        # Odd files.
        "invalid_json": ('{"cells": [', ()),
        "other_assignment": ({**read_nb(OTHER), "metadata": {**read_nb(OTHER)["metadata"],
                                                              "lab": {"assignment": "01_ring_allreduce"}}}, ()),
        "minor_version": ({**source, "nbformat_minor": 4,
                           "cells": [{k: v for k, v in c.items() if k != "id"} for c in source["cells"]]}, ()),
    }
    if not scoring:
        notebooks = {name: case for name, case in notebooks.items() if name not in SCORING_CASES}
    paths = {}
    for name, (nb, _extra) in notebooks.items():
        path = work / name / "ring_allreduce.ipynb"
        if isinstance(nb, str):
            path.parent.mkdir(parents=True)
            path.write_text(nb)
        else:
            write_nb(path, nb)
        paths[name] = path
    if who is not None:  # the unprivileged pass: the grader's user owns the folder, as an instructor would
        for folder, dirs, names in os.walk(work):
            for entry in [*dirs, *names]:
                os.lchown(os.path.join(folder, entry), who.uid, who.gid)
        os.chown(work, who.uid, who.gid)
    hashes = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ROOT / "reference_impl").glob("*.py")}
    started = {}
    for name, path in paths.items():
        extra = notebooks[name][1]
        # one device: containment is the same on each (tests/test_grader_device.py grades both)
        args = ("check", str(path), "--json", "--feedback-dir", str(work / f"fb-{name}"), "--device", "cpu", *extra)
        if who is None:
            env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(kernel_tmp))
            if mode == "root_without_bwrap":
                env["LAB_SANDBOX_BWRAP"] = "off"
            started[name] = Started(*args, cwd=work, env=env)
        else:
            run = started[name] = Started.__new__(Started)
            run.argv, run.start = who.argv(grader_argv(*args)), time.monotonic()
            run.proc = subprocess.Popen(run.argv, cwd=work, env=who.env(PYTHONPATH=str(ROOT), TMPDIR=str(kernel_tmp)),
                                        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return dict(started=started, sockets=sockets, mode=mode, canary=canary, source=source, home=home,
                marker=marker, work=work, others=others, hashes=hashes)


def collect(context: dict[str, Any]) -> dict[str, Any]:
    """The finished runs of ``start_mode`` by case, and what the test saw on disk afterwards."""
    if "results" in context:
        return context["results"]
    results: dict[str, Any] = {name: run.wait(timeout=240) for name, run in context["started"].items()}
    for s in context["sockets"]:
        s.close()
    canary, home, hashes = context["canary"], context["home"], context["hashes"]
    results.update({k: context[k] for k in ("mode", "source", "home", "marker", "work", "others")})
    results.update(canary_text=canary.read_text() if canary.exists() else None,
                   isolation_of_red_team=results["red_team"].json().get("isolation", {}),
                   reference_changed=[p.name for p, h in hashes.items()
                                      if not p.exists() or hashlib.sha256(p.read_bytes()).hexdigest() != h],
                   home_written=[sub for sub in (".cache", ".local", ".ipython", ".jupyter", ".config")
                                 if (home / sub / "hostile-was-here").exists()])
    canary.unlink(missing_ok=True)
    context["results"] = results
    return results


@pytest.fixture(scope="module")
def started_modes() -> dict[str, dict[str, Any]]:
    """Every mode started at once (their cell limits then overlap, which keeps the suite short);
    the first also grades the scoring cases."""
    modes: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        if (not mode.startswith("root") or IS_ROOT) and (mode != "unprivileged" or shutil.which("bwrap")):
            try:
                modes[mode] = start_mode(mode, scoring=not modes)
            except BaseException:
                for context in modes.values():
                    for run in context["started"].values():
                        run.proc.kill()
                    shutil.rmtree(context["work"], ignore_errors=True)
                raise
    yield modes
    for context in modes.values():
        if "results" not in context:
            for run in context["started"].values():
                run.proc.kill()
                run.proc.communicate()
        shutil.rmtree(context["work"], ignore_errors=True)


@pytest.fixture(scope="module")
def scored(started_modes) -> dict[str, Any]:
    """The runs of the first mode started, the one that also grades ``SCORING_CASES``."""
    if not started_modes:
        pytest.skip("neither root nor bubblewrap: no mode of the hostile suite can run here")
    return collect(next(iter(started_modes.values())))


@pytest.fixture(scope="module", params=MODES)
def runs(request, started_modes) -> dict[str, Any]:
    """Every hostile notebook graded as root or as an unprivileged user; results by case."""
    if request.param not in started_modes:
        if request.param.startswith("root"):
            pytest.skip("the root pass needs root (the unprivileged pass runs as this user)")
        why = "bubblewrap (bwrap) is not installed: the unprivileged pass needs it (apt-get install bubblewrap)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return collect(started_modes[request.param])


# --------------------------------------------------------------------------- runaway code


def test_infinite_loop_is_stopped_by_the_cell_limit(runs):
    """A cell that never ends is interrupted after --cell-timeout; every test keeps its marks.
    (The limit is END_CELL_LIMIT, not 3 s, because the hostile cells before it must each finish
    within it while a dozen gradings in three modes share two cores: at 10 s the escape cell
    once ran past it.)"""
    result = runs["end_cells"].result()
    assert result["score"] == MAX_SCORE and result["error"] is None
    assert any("stopped" in e and f"{END_CELL_LIMIT} s" in e for e in cell_errors(result)), result["cell_errors"]


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


def _left_in(kernel_cwd: str) -> list[int]:
    """Processes still running in a finished run's kernel folder (its kernel and their children)."""
    psutil = pytest.importorskip("psutil")
    left = []
    for proc in psutil.process_iter():
        try:
            if proc.cwd() == kernel_cwd:
                left.append(proc.pid)
        except psutil.Error:
            continue
    return left


def test_fork_bomb_is_bounded_and_nothing_outlives_the_run(runs):
    """Forking stops at the process limit, and no process of the kernel is left: as root none of
    its private user, unprivileged none in its folder (its pid namespace died with it)."""
    psutil = pytest.importorskip("psutil")
    result = runs["fork_bomb"].result()
    assert result["score"] == MAX_SCORE
    limit = int(re.search(r"at most (\d+)", result["isolation"]["processes"]).group(1))
    refused = [e for e in cell_errors(result) if "fork refused after" in e]
    assert refused and int(re.search(r"after (\d+)", refused[0]).group(1)) < limit, result["cell_errors"]
    if runs["mode"].startswith("root"):
        uid = int(re.search(r"user (\d+)", result["isolation"]["processes"]).group(1))
        assert [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid] == []
    assert _left_in(result["isolation"]["kernel_cwd"]) == []


# --------------------------------------------------------------------------- files and secrets


def test_cells_cannot_touch_files_outside_their_folder(runs):
    """Rewriting or deleting a canary file or the repository's README fails: nothing worked."""
    result = runs["end_cells"].result()
    assert "escape attempts that worked: []" in " ".join(cell_errors(result)), " / ".join(cell_errors(result))
    assert runs["canary_text"] == "canary"
    assert not (ROOT / "hostile-was-here").exists()
    assert (ROOT / "README.md").read_text() != "overwritten by a notebook"


def test_cells_cannot_read_hidden_tests_or_gradebook(runs):
    """The source notebook, the scratch gradebook and the grader's environment are all out of reach."""
    result = runs["end_cells"].result()
    assert "secrets read: []" in " ".join(cell_errors(result)), result["cell_errors"]


# --------------------------------------------------------------------------- tampering


def test_patched_numpy_check_gets_no_credit(scored):
    """After np.array_equal is replaced, every later test is refused and says why."""
    result = scored["numpy_patch"].result()
    assert result["score"] == points_before(scored["source"], "allgather")
    refused = [t for t in result["tests"] if not t["passed"]]
    assert refused and all("replaced numpy function array_equal" in t["hint"] for t in refused)


def test_redefined_test_helper_gets_no_credit(scored):
    """Redefining the locked helper on_ranks refuses every later test."""
    result = scored["helper_patch"].result()
    assert result["score"] == points_before(scored["source"], "allgather")
    refused = [t for t in result["tests"] if not t["passed"]]
    assert refused and all("redefined the test helper on_ranks" in t["hint"] for t in refused)


def test_redefined_hidden_helper_gets_no_credit(scored):
    """A helper the hidden tests define once (in the first hidden test that needs it) and use in
    later ones is protected too: redefining it in a later solution cell refuses every later test."""
    result = scored["hidden_helper_patch"].result()
    assert result["score"] == points_before(scored["source"], "allgather")
    refused = [t for t in result["tests"] if not t["passed"]]
    assert refused and all("redefined the test helper _smallest_first" in t["hint"] for t in refused)


def test_hidden_traceback_display_gets_no_credit(scored):
    """Silencing IPython's error display (to hide failing asserts) scores zero everywhere."""
    result = scored["traceback_patch"].result()
    assert result["score"] == 0
    assert all("_showtraceback" in t["hint"] for t in result["tests"]), [t["hint"] for t in result["tests"]]


def test_patched_reference_gets_no_credit(scored):
    """Replacing reference_impl.comm.chunk_bounds with a wrong one (so tests compare it with itself)."""
    result = scored["reference_patch"].result()
    assert result["score"] == 0
    assert all("replaced reference_impl.comm.chunk_bounds" in t["hint"] for t in result["tests"])


def test_calling_the_reference_scores_zero_for_that_test(scored):
    """chunk_bounds that returns reference_impl's answer loses hidden_chunk_bounds, and only it."""
    result = scored["calls_reference"].result()
    tests = by_id(result)
    points = float(next(c["metadata"]["nbgrader"]["points"] for c in scored["source"]["cells"]
                        if grade_id(c) == "hidden_chunk_bounds"))
    assert result["score"] == MAX_SCORE - points
    hint = tests["hidden_chunk_bounds"]["hint"]
    assert "chunk_bounds calls" in hint and "reference implementation" in hint, hint


# --------------------------------------------------------------------------- odd files


def test_invalid_json_is_one_line_exit_2(scored):
    """A file that is not JSON is refused before any kernel starts."""
    run = scored["invalid_json"]
    assert run.returncode == 2 and "invalid JSON" in run.stderr and run.stderr.count("\n") == 1


def test_notebook_of_another_assignment_is_refused_by_name(scored):
    """02's notebook handed in as 01 is refused before grading, naming the assignment it belongs to."""
    run = scored["other_assignment"]
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
    assert isolation["network"].startswith("off") and isolation["processes"].startswith("at most")
    expected = {"root": "root: private user and mount namespace, plus bubblewrap", "unprivileged": "bubblewrap",
                "root_without_bwrap": "root: private user and mount namespace (bubblewrap not available)"}
    assert isolation["sandbox"].startswith(expected[runs["mode"]]), isolation
    assert isolation["memory_cap"].startswith(("RLIMIT_AS", "cgroup MemoryMax=")), isolation


# --------------------------------------------------------------------------- the red team


def red_errors(runs) -> str:
    result = runs["red_team"].result()
    assert result["score"] == MAX_SCORE and result["error"] is None, result
    return " ".join(cell_errors(result))


@pytest.mark.parametrize("message", RED_MESSAGES)
def test_red_team_attack_is_contained(runs, message):
    """Each red-team cell reports what worked (grader's environment and token, signals and memory
    of the grader's processes, the grader user's home and caches, hidden tests through
    /proc/<pid>/cwd, root and fd links, writes to reference_impl and grader, forged grading
    files, symlinks, sockets outside, other learners' submissions, filling disks): nothing."""
    errors = red_errors(runs)
    assert message in errors, errors


def test_red_team_left_no_trace_outside(runs):
    """On disk too: the home's caches, reference_impl, the feedback folder and other submissions
    are as they were, and the canary is intact."""
    red_errors(runs)
    assert runs["home_written"] == [] and runs["reference_changed"] == []
    assert runs["canary_text"] == "canary"


def test_forged_grading_files_change_nothing(runs):
    """The red team wrote a fake steps record, isolation report, progress log and feedback page
    wherever it could see the grader's scratch and feedback folders: what it saw were copies in
    its own tmpfs. The grade, the isolation report and the real feedback folder are the grader's."""
    errors = red_errors(runs)
    assert "forgery attempted" in errors, errors
    isolation = runs["isolation_of_red_team"]
    assert isolation["processes"].startswith("at most") and "sandbox" in isolation, isolation
    assert not (runs["work"] / "fb-red_team" / "FORGED.html").exists()
    assert (runs["work"] / "fb-red_team" / "01_ring_allreduce" / "ring_allreduce.html").is_file()


def test_threads_are_bounded(runs):
    """Starting threads stops at the process limit (threads count as processes)."""
    result = runs["red_team"].result()
    limit = int(re.search(r"at most (\d+)", result["isolation"]["processes"]).group(1))
    refused = [e for e in cell_errors(result) if "threads refused after" in e]
    assert refused and int(re.search(r"after (\d+)", refused[0]).group(1)) < limit, result["cell_errors"]


def test_double_forked_setsid_survivor_is_killed(runs):
    """A process that leaves the kernel's tree (double fork and setsid) does not outlive the run."""
    psutil = pytest.importorskip("psutil")
    red_errors(runs)
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] and runs["marker"] in proc.info["cmdline"]:
            left.append(proc.pid)
    assert any("survivor started" in e for e in cell_errors(runs["red_team"].result()))
    assert left == []


def test_forged_outputs_and_metadata_get_no_marks(scored):
    """Test cells showing "passed" outputs and notebook metadata claiming full marks: the tests run
    anyway, and the answer that calls the reference implementation loses hidden_chunk_bounds
    exactly as without the forgery."""
    result = scored["metadata_forged"].result()
    points = float(next(c["metadata"]["nbgrader"]["points"] for c in scored["source"]["cells"]
                        if grade_id(c) == "hidden_chunk_bounds"))
    assert result["score"] == MAX_SCORE - points, result


def test_relabelled_test_cells_are_refused(scored):
    """Test cells re-labelled as ungraded, unlocked and worth 0: nbgrader's checksums catch the
    change, and grading stops with no marks and says why (exit 3)."""
    run = scored["tests_relabelled"]
    result = run.json()
    assert run.returncode == 3 and result["score"] == 0, result
    assert "Inconsistent checksums" in result["error"], result["error"]


# --------------------------------------------------------------------------- no sandbox here


@pytest.fixture(scope="module")
def without_bwrap():
    """``grader check`` of the solved source notebook by an ordinary user whose PATH has no
    bubblewrap: (without --trusted, with --trusted)."""
    who = learner() if IS_ROOT else None
    work = Path(tempfile.mkdtemp(prefix="dl-lab-untrusted-", dir="/tmp"))
    notebook = work / "ring_allreduce.ipynb"
    shutil.copyfile(SOURCE, notebook)
    if who is not None:
        for path in (work, notebook):
            os.chown(path, who.uid, who.gid)
    runs = []
    try:
        for extra in ((), ("--trusted",)):
            argv = ["/usr/bin/env", "PATH=/nonexistent", *grader_argv(  # no bwrap on this PATH
                "check", str(notebook), "--json", "--device", "cpu", "--feedback-dir", str(work / "fb"), *extra)]
            env = dict(PYTHONPATH=str(ROOT), TMPDIR=str(work))
            if who is None:
                run = subprocess.run(argv, cwd=work, env={**os.environ, **env}, capture_output=True, text=True,
                                     timeout=240)
            else:
                run = who.run(argv, cwd=work, timeout=240, **env)
            runs.append(run)
        yield runs
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_no_sandbox_refuses_untrusted_notebooks(without_bwrap):
    """Without root and without bubblewrap, grading refuses (exit 2), says why plainly, and
    names the way out."""
    run = without_bwrap[0]
    assert run.returncode == 2 and run.stdout == "", run.stderr
    assert "refusing to run notebooks without a sandbox" in run.stderr and "bubblewrap" in run.stderr
    assert "--trusted" in run.stderr and run.stderr.count("\n") == 1, run.stderr


def test_trusted_runs_and_the_report_says_nothing_was_isolated(without_bwrap):
    """With --trusted it grades, and the report says plainly that the kernel was not isolated."""
    run = without_bwrap[1]
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["score"] == MAX_SCORE
    assert result["isolation"]["sandbox"] == "none (trusted run)"
    assert result["isolation"]["files"].startswith("NOT isolated"), result["isolation"]
