"""The instructor's workflow on nbgrader's own gradebook (grader/instructor.py, cli.py).

One class of generated submissions over two assignments of a tiny course, collected and
autograded once (module fixture ``graded_class``): full marks from the source's solutions
(one handed in nbgrader's ``<student>/<assignment>/`` layout), a wrong solution, the
released notebook unchanged, a notebook that is not JSON, one whose grading worker is
killed while it runs, and one that names no assignment (left out at collect). The tests
then hold the grader's records against the gradebook, opened with ``nbgrader.api``, and
against the CSV that ``nbgrader export`` writes, run as an ordinary user in the workspace.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest
from learner_account import learner
from notebook_tools import Started, edit_cell, read_nb, replacing, write_nb
from test_grader_cli import ASSIGNMENT, _code, partial_notebook, tiny_notebook

from conftest import ROOT

SECOND = "02_sub"
SUB_SOLUTION = "def sub(a, b):\n    ### BEGIN SOLUTION\n    return a - b\n    ### END SOLUTION\n"


def sub_notebook() -> dict:
    """The source of the second assignment: ``sub``, one visible test (1 point), one hidden (2)."""
    nb = tiny_notebook()
    nb["metadata"]["lab"] = {"assignment": SECOND}
    nb["cells"] = [
        {"cell_type": "markdown", "metadata": {}, "source": "# Subtract"},
        _code("solution", SUB_SOLUTION, solution=True),
        _code("test_sub_visible", "assert sub(5, 3) == 2", grade=True, points=1),
        _code("hidden_sub", "### BEGIN HIDDEN TESTS\nassert sub(1, 9) == -8, f'got {sub(1, 9)}'\n"
              "### END HIDDEN TESTS\n", grade=True, points=2),
    ]
    return nb


def start(*args: str, cwd: Path, course: Path) -> Started:
    return Started("--course", str(course), *args, cwd=cwd)


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _worker_of(student: str) -> int | None:
    """The pid of the grading worker (``python -m grader.instructor``) of ``student``'s submission."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"grader.instructor" in argv and any(f"/submitted/{student}/".encode() in a for a in argv):
            return int(entry.name)
    return None


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """(course, workspace, collect run, autograde run, records by (student, assignment), the learner)."""
    course = tmp_path_factory.mktemp("course")
    (course / "nbgrader_config.py").write_text((ROOT / "exercises" / "nbgrader_config.py").read_text())
    write_nb(course / "source" / ASSIGNMENT / "tiny.ipynb", tiny_notebook())
    write_nb(course / "source" / SECOND / "sub.ipynb", sub_notebook())
    work = tmp_path_factory.mktemp("work")
    start("release", "--out", str(work / "release"), cwd=work, course=course).wait().ok()
    released = read_nb(work / "release" / ASSIGNMENT / "tiny.ipynb")

    hand = work / "handed-in"
    write_nb(hand / "ann" / "tiny.ipynb", tiny_notebook())
    write_nb(hand / "ann" / SECOND / "sub.ipynb", sub_notebook())  # nbgrader's layout
    write_nb(hand / "ben.ipynb", partial_notebook())  # its assignment from its metadata
    write_nb(hand / "cai" / "tiny.ipynb", released)  # handed in as it was handed out
    (hand / "dan").mkdir()
    (hand / "dan" / "tiny.ipynb").write_text('{"cells": [')  # not JSON: placed by its name
    write_nb(hand / "eve" / SECOND / "sub.ipynb",
             edit_cell(sub_notebook(), "solution", replacing("return a - b", "import time\n    time.sleep(40)")))
    (hand / "zed.ipynb").write_text("not a notebook")  # no assignment can be told
    os.utime(hand / "ben.ipynb", (1_700_000_000, 1_700_000_000))

    workspace = Path(tempfile.mkdtemp(prefix="dl-lab-class-")) / "class"
    collected = start("collect", str(hand), "--workspace", str(workspace), cwd=work, course=course).wait().ok()
    grading = start("autograde", "--workspace", str(workspace), "--jobs", "2", "--cell-timeout", "20",
                    "--timeout", "60", cwd=work, course=course)
    killed, below, deadline = None, [], time.monotonic() + 120
    while killed is None and time.monotonic() < deadline and grading.proc.poll() is None:
        pid = _worker_of("eve")
        # killed once its kernel runs the sleeping cell: worker, grading child, jail and kernel all exist
        below = psutil.Process(pid).children(recursive=True) if pid is not None else []
        if any("ipykernel" in " ".join(_cmdline(p)) for p in below):
            os.kill(pid, signal.SIGKILL)
            killed = pid
        time.sleep(0.05)
    graded = grading.wait(timeout=240).ok()
    assert killed is not None, "eve's grading worker never showed up"
    # its grading child and kernel die with it, long before the kernel's 40 s sleep or the 20 s cell limit
    gone, alive = psutil.wait_procs(below, timeout=5)
    assert not alive, f"left running after their grading worker was killed: {[_cmdline(p) for p in alive]}"
    records = {(r["student"], r["assignment"]): r
               for r in map(json.loads, map(Path.read_text, (workspace / "results").rglob("*.json")))}
    who = learner()
    if who.switch:  # the instructor owns the workspace, as they would
        for folder, dirs, names in os.walk(workspace.parent):
            for name in [*dirs, *names]:
                os.lchown(os.path.join(folder, name), who.uid, who.gid)
        os.chown(workspace.parent, who.uid, who.gid)
    yield course, workspace, collected, graded, records, who
    shutil.rmtree(workspace.parent, ignore_errors=True)


def test_collect_places_each_notebook_in_nbgrader_layout(graded_class):
    _, workspace, collected, _, _, _ = graded_class
    assert sorted(p.relative_to(workspace / "submitted").as_posix()
                  for p in (workspace / "submitted").rglob("*") if p.is_file()) == [
        f"ann/{ASSIGNMENT}/timestamp.txt", f"ann/{ASSIGNMENT}/tiny.ipynb", f"ann/{SECOND}/sub.ipynb",
        f"ann/{SECOND}/timestamp.txt", f"ben/{ASSIGNMENT}/timestamp.txt", f"ben/{ASSIGNMENT}/tiny.ipynb",
        f"cai/{ASSIGNMENT}/timestamp.txt", f"cai/{ASSIGNMENT}/tiny.ipynb", f"dan/{ASSIGNMENT}/timestamp.txt",
        f"dan/{ASSIGNMENT}/tiny.ipynb", f"eve/{SECOND}/sub.ipynb", f"eve/{SECOND}/timestamp.txt"]
    assert "collected 6 notebooks of 5 students" in collected.stdout and "1 left out" in collected.stdout
    assert "left out: " in collected.stderr and "zed.ipynb: not a Jupyter notebook" in collected.stderr


def test_records_scores_and_failures(graded_class):
    _, _, _, graded, records, _ = graded_class
    got = {key: (r["status"], r["score"], r["max_score"]) for key, r in records.items()}
    assert got == {("ann", ASSIGNMENT): ("graded", 6, 6), ("ann", SECOND): ("graded", 3, 3),
                   ("ben", ASSIGNMENT): ("graded", 3, 6), ("cai", ASSIGNMENT): ("graded", 0, 6),
                   ("dan", ASSIGNMENT): ("invalid", 0, 0), ("eve", SECOND): ("error", 0, 0)}
    assert "not a Jupyter notebook (invalid JSON" in records["dan", ASSIGNMENT]["error"]
    assert records["eve", SECOND]["error"] == ("the grading worker was killed by SIGKILL; "
                                               "nothing of this submission was graded")
    # not a terminal: one line per submission, with the count, the time so far and the estimate
    lines = [line for line in graded.stdout.splitlines() if line.startswith("[")]
    assert [line.split(",")[0] for line in lines] == [f"[{i}/6" for i in range(1, 7)]
    assert all(" elapsed, ETA " in line for line in lines)
    assert any("eve/02_sub/sub.ipynb: error 0/0  (the grading worker was killed by SIGKILL" in line for line in lines)
    assert "graded 4 of 6 submissions completely" in graded.stdout


def test_gradebook_holds_the_records(graded_class):
    from nbgrader.api import Gradebook

    _, workspace, _, _, records, _ = graded_class
    with Gradebook(f"sqlite:///{workspace / 'gradebook.db'}", "dl-systems-lab") as gb:
        assert sorted(s.id for s in gb.students) == ["ann", "ben", "cai", "dan", "eve"]
        assert sorted(a.name for a in gb.assignments) == [ASSIGNMENT, SECOND]
        assert {a.name: a.max_score for a in gb.assignments} == {ASSIGNMENT: 6, SECOND: 3}
        for (student, assignment), record in records.items():
            submission = gb.find_submission(assignment, student)
            assert submission.score == record["score"], (student, assignment)
            tests = {t["id"]: t["score"] for t in record["tests"]}
            for grade in submission.notebooks[0].grades:
                assert grade.auto_score == tests.get(grade.name, 0.0), (student, grade.name)
            assert submission.notebooks[0].flagged == (record["status"] != "graded")
            stamp = (workspace / "submitted" / student / assignment / "timestamp.txt").read_text().strip()
            assert submission.timestamp.strftime("%Y-%m-%d %H:%M:%S") == stamp[:19]
        ben = gb.find_submission(ASSIGNMENT, "ben")
        assert ben.timestamp.replace(tzinfo=timezone.utc) == datetime.fromtimestamp(1_700_000_000, timezone.utc)
        assert {g.name: g.auto_score for g in ben.notebooks[0].grades} == {
            "test_add_visible": 1, "hidden_add": 2, "hidden_mul": 0}


def test_nbgrader_export_as_an_ordinary_user(graded_class):
    _, workspace, _, _, records, who = graded_class
    run = who.run([sys.executable, "-m", "nbgrader", "export"], cwd=workspace, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = list(csv.DictReader((workspace / "grades.csv").open()))
    got = {(r["student_id"], r["assignment"]): (float(r["score"]), float(r["max_score"])) for r in rows}
    expected = {key: (float(r["score"]), {ASSIGNMENT: 6.0, SECOND: 3.0}[key[1]]) for key, r in records.items()}
    # nbgrader lists every student for every assignment: no submission scores 0
    for student in ("ben", "cai", "dan"):
        expected[student, SECOND] = (0.0, 3.0)
    expected["eve", ASSIGNMENT] = (0.0, 6.0)
    assert got == expected


def test_nbgraders_own_feedback_reads_the_autograded_copies(graded_class):
    """The graded copy of each graded submission is kept where nbgrader keeps it
    (``autograded/<student>/<assignment>/``, without the guard's lines), and nbgrader's own
    ``generate_feedback``, run by an ordinary user, turns it and the gradebook into feedback
    pages showing the grader's scores: the formgrader reads the same two."""
    _, workspace, _, _, records, who = graded_class
    graded = {key: r for key, r in records.items() if r["status"] == "graded"}
    assert graded, "no submission was graded"
    for (student, assignment), record in graded.items():
        kept = workspace / "autograded" / student / assignment / Path(record["submission"]).name
        assert kept.is_file(), f"no autograded copy of {student}/{assignment}"
        assert (kept.parent / "timestamp.txt").is_file(), kept.parent
        sources = "".join("".join(c["source"]) for c in json.loads(kept.read_text(encoding="utf-8"))["cells"])
        assert "_lab_guard" not in sources, f"{kept}: the guard's lines were kept in the test cells"
    for assignment in sorted({a for _, a in graded}):
        run = who.run([sys.executable, "-m", "nbgrader", "generate_feedback", "--assignment", assignment, "--force"],
                      cwd=workspace, timeout=180)
        assert run.returncode == 0, run.stderr[-2000:]
    for (student, assignment), record in graded.items():
        page = workspace / "feedback" / student / assignment / (Path(record["submission"]).stem + ".html")
        assert page.is_file(), f"nbgrader wrote no feedback for {student}/{assignment}"
        # the notebook's total, as nbgrader's template prints it (score | float | round(2))
        total = f"(Score: {round(float(record['score']), 2)} / {round(float(record['max_score']), 2)})</h4>"
        assert total in page.read_text(encoding="utf-8"), f"{page}: nbgrader's page does not show {total}"


# --------------------------------------------------------------------------- Jupyter


def _plain(text: str) -> str:
    """``text`` without terminal colours."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_the_venvs_jupyter_turns_off_nbgraders_student_extensions():
    """``make venv`` turns off the Assignment List and Courses (they need nbgrader's exchange
    folder, which this lab does not use) in the venv's own configuration; the formgrader stays.
    Listed as an ordinary user, whose home holds no Jupyter configuration of ours."""
    who = learner()
    jupyter = str(Path(sys.prefix) / "bin" / "jupyter")
    server = who.run([jupyter, "server", "extension", "list"], cwd=Path("/"), timeout=120)
    listed = _plain(server.stdout + server.stderr)
    for name, state in [("assignment_list", "disabled"), ("course_list", "disabled"),
                        ("formgrader", "enabled"), ("validate_assignment", "enabled")]:
        assert f"nbgrader.server_extensions.{name} {state}" in listed, listed
    lab = who.run([jupyter, "labextension", "list"], cwd=Path("/"), timeout=120)
    disabled = _plain(lab.stdout + lab.stderr).split("Disabled extensions:")[-1]
    assert "@jupyter/nbgrader:assignment-list" in disabled and "@jupyter/nbgrader:course-list" in disabled
    assert "@jupyter/nbgrader:formgrader" not in disabled
    assert not (who.home / ".jupyter").exists() or not any((who.home / ".jupyter").rglob("*nbgrader*"))


@pytest.mark.parametrize("which", ["tiny", "01"])
def test_a_started_notebook_is_already_what_jupyter_saves(which, tmp_path):
    """Opening a notebook from ``grader start`` and saving it as Jupyter does (nbformat read,
    then write with NO_CONVERT) gives back the same bytes: nothing to mark it modified. The
    tiny course's source is compact JSON without cell ids, the lab's first exercise as it is."""
    import nbformat

    args: tuple[str, ...] = ()
    if which == "tiny":
        course = tmp_path / "course"
        (course / "nbgrader_config.py").parent.mkdir()
        (course / "nbgrader_config.py").write_text((ROOT / "exercises" / "nbgrader_config.py").read_text())
        write_nb(course / "source" / ASSIGNMENT / "tiny.ipynb", tiny_notebook())
        args = ("--course", str(course))
    Started(*args, "start", "01", "--dir", "work", cwd=tmp_path).wait().ok()
    started = next((tmp_path / "work").rglob("*.ipynb"))
    before = started.read_bytes()
    nbformat.write(nbformat.read(started, as_version=4), tmp_path / "saved.ipynb", version=nbformat.NO_CONVERT)
    assert (tmp_path / "saved.ipynb").read_bytes() == before
    assert all("id" in cell for cell in json.loads(before)["cells"])
