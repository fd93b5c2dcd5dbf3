"""The grader's learner and instructor commands (grader/scores.py, watch.py, instructor.py, cli.py).

The grading itself is check.check_notebook's job (tests/test_grader.py); these tests use a
tiny course of their own (one assignment, a function ``add`` and a ``mul`` with one visible
and two hidden tests, 1 + 2 + 3 points) so that a grading run costs a few seconds, and check
what the commands around grading do: the learner's score book and ``list``, the concept
page line, ``--watch``, a ``--device`` the assignment does not list, and a class of submissions
(correct, partial, broken JSON, hanging) through collect, autograde, feedback and export.
"""
from __future__ import annotations

import csv
import io
import json
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT
from notebook_tools import Started, edit_cell, replacing, write_nb

from grader import watch as watch_mod
from grader.course import Course
from grader.report import GradingResult, TestResult
from grader.scores import read_scores, record_result, render_list

ASSIGNMENT = "01_tiny"


def _code(grade_id: str, source: str, *, grade: bool = False, solution: bool = False,
          points: int = 0) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if grade:
        meta["points"] = points
    return {"cell_type": "code", "execution_count": None, "metadata": {"nbgrader": meta},
            "outputs": [], "source": source}


SOLUTION = '''def add(a, b):
    ### BEGIN SOLUTION
    return a + b
    ### END SOLUTION


def mul(a, b):
    ### BEGIN SOLUTION
    return a * b
    ### END SOLUTION
'''


def tiny_notebook() -> dict:
    """The source notebook of the tiny course (what a correct submission looks like too)."""
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                     "language_info": {"name": "python"},
                     "lab": {"assignment": ASSIGNMENT, "concept_page": "concepts/allreduce-vs-parameter-servers.md"}},
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": "# Tiny exercise"},
            _code("solution", SOLUTION, solution=True),
            _code("test_add_visible", "assert add(2, 3) == 5, f'add(2, 3) should be 5, got {add(2, 3)}'",
                  grade=True, points=1),
            _code("hidden_add", "### BEGIN HIDDEN TESTS\nfor a in range(-3, 4):\n    assert add(a, 7) == a + 7, "
                  "f'add({a}, 7) should be {a + 7}, got {add(a, 7)}'\n### END HIDDEN TESTS\n", grade=True, points=2),
            _code("hidden_mul", "### BEGIN HIDDEN TESTS\nassert mul(6, 7) == 42, f'mul(6, 7) should be 42, "
                  "got {mul(6, 7)}'\n### END HIDDEN TESTS\n", grade=True, points=3),
        ],
    }


def with_written_hint(nb: dict) -> dict:
    """``nb`` with the instructor's hint on hidden_mul (test cell metadata ``lab.hint``)."""
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == "hidden_mul":
            cell["metadata"]["lab"] = {"hint": "mul multiplies:   reread   section 2."}
    return nb


@pytest.fixture(scope="module")
def tiny_course(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny-course")
    (root / "nbgrader_config.py").write_text((ROOT / "exercises" / "nbgrader_config.py").read_text())
    write_nb(root / "source" / ASSIGNMENT / "tiny.ipynb", with_written_hint(tiny_notebook()))
    return root


def partial_notebook() -> dict:
    """add is right, mul adds: 3 of 6 points, and the hint names mul(6, 7)."""
    return edit_cell(tiny_notebook(), "solution", replacing("return a * b", "return a + b"))


def hanging_notebook() -> dict:
    """A solution cell that never finishes (before it defines anything): every test fails."""
    return edit_cell(tiny_notebook(), "solution", lambda s: "while True:\n    pass\n\n" + s)


def start(*args: str, cwd: Path, course: Path) -> Started:
    return Started("--course", str(course), *args, cwd=cwd)


# --------------------------------------------------------------------------- learner: check, list


def test_check_records_scores_and_names_the_concept_page(tiny_course, tmp_path):
    partial = write_nb(tmp_path / "tiny.ipynb", partial_notebook())
    run = start("check", str(partial), "--feedback-dir", "fb", cwd=tmp_path, course=tiny_course).wait().ok()
    assert "Read more: http://127.0.0.1:8000/concepts/allreduce-vs-parameter-servers/\n" in run.stdout
    assert "mul(6, 7) should be 42, got 13" in run.stdout  # the failing hidden test's hint
    assert "hint: mul multiplies: reread section 2.\n" in run.stdout  # the instructor's, one line
    assert "Sandbox:" not in run.stdout  # quiet by default: the walls are behind --verbose
    book = json.loads((tmp_path / "fb" / "scores.json").read_text())
    assert set(book) == {ASSIGNMENT}
    entry = book[ASSIGNMENT]
    assert (entry["score"], entry["max_score"], entry["passed"], entry["tests"]) == (3, 6, 2, 3)
    assert entry["completed"] is True and entry["notebook"] == str(partial.resolve())

    listing = start("list", "--feedback-dir", "fb", cwd=tmp_path, course=tiny_course).wait().ok().stdout
    row = next(line for line in listing.splitlines() if line.startswith(ASSIGNMENT))
    assert row.split()[1:4] == ["3/6", "3/6", "2/3"]
    assert "1 of 1 assignments checked; best scores add up to 3/6 points" in listing


def test_list_shows_best_and_latest_of_every_assignment(tmp_path):
    """A worse later attempt (or one that did not complete) never hides the best score."""
    course = Course.at(ROOT / "exercises")
    first = GradingResult("02_alpha_beta", "a.ipynb", tests=[TestResult("t1", 0, 2, False, "no"),
                                                            TestResult("t2", 1, 1, True)])
    record_result(tmp_path, first, when=1_000_000)
    better = GradingResult("02_alpha_beta", "a.ipynb", tests=[TestResult("t1", 2, 2, True),
                                                             TestResult("t2", 1, 1, True)])
    record_result(tmp_path, better, when=2_000_000)
    worse = GradingResult("02_alpha_beta", "a.ipynb", tests=[TestResult("t1", 0, 2, False, "no"),
                                                            TestResult("t2", 0, 1, False, "no")])
    record_result(tmp_path, worse, when=3_000_000)
    stopped = GradingResult("01_ring_allreduce", "r.ipynb", tests=[TestResult("t", 0, 4, False)],
                            error="stopped after 5 s")
    record_result(tmp_path, stopped)
    book = read_scores(tmp_path)
    assert book["02_alpha_beta"]["score"] == 0 and book["02_alpha_beta"]["best"]["score"] == 3
    assert "best" not in book["01_ring_allreduce"]  # a run that did not complete is no best
    text = render_list(course, book)
    rows = {line.split()[0]: line for line in text.splitlines()[2:-2]}
    assert set(rows) == {a.name for a in course.assignments}
    assert rows["02_alpha_beta"].split()[1:4] == ["3/3", "0/3", "0/2"]
    assert rows["01_ring_allreduce"].split()[1:3] == ["-", "0/4"]
    assert "grading did not complete" in rows["01_ring_allreduce"]
    assert rows["03_recursive_doubling"].endswith("not checked yet")
    assert f"2 of {len(rows)} assignments checked; best scores add up to 3/7 points" in text


def test_checks_finishing_together_lose_no_score(tmp_path):
    """Each check reads, updates and replaces the book; two at once must not drop either entry."""
    from concurrent.futures import ThreadPoolExecutor

    names = [f"{i:02d}_a" for i in range(24)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: record_result(tmp_path, GradingResult(n, "a.ipynb", tests=[TestResult("t", 1, 1, True)])),
                      names))
    assert sorted(read_scores(tmp_path)) == names


def test_a_corrupt_score_book_is_reported_not_overwritten(tiny_course, tmp_path):
    (tmp_path / "scores.json").write_text("{not json")
    run = start("list", "--feedback-dir", str(tmp_path), cwd=tmp_path, course=tiny_course).wait()
    assert run.returncode == 2
    assert "scores.json: the score book cannot be read" in run.stderr
    assert (tmp_path / "scores.json").read_text() == "{not json"


def test_device_the_assignment_does_not_list_is_refused(tiny_course, tmp_path):
    nb = write_nb(tmp_path / "tiny.ipynb", tiny_notebook())  # no lab.devices: cpu only
    run = start("check", str(nb), "--device", "gpu", cwd=tmp_path, course=tiny_course).wait()
    assert run.returncode == 2
    assert run.stderr == ("grader: --device gpu: assignment 01_tiny supports only cpu "
                          "(its source notebook's lab.devices); grade it with --device cpu\n")
    assert not (tmp_path / "grader-feedback").exists()  # nothing graded


def test_max_runs_needs_watch(tiny_course, tmp_path):
    nb = write_nb(tmp_path / "tiny.ipynb", tiny_notebook())
    run = start("check", str(nb), "--max-runs", "2", cwd=tmp_path, course=tiny_course).wait()
    assert run.returncode == 2 and "--max-runs only makes sense with --watch" in run.stderr


# --------------------------------------------------------------------------- learner: --watch


def test_watch_regrades_after_each_save_and_stops_at_max_runs(tmp_path):
    path = tmp_path / "nb.ipynb"
    path.write_text("v0")
    runs, announced = [], []

    def grade():
        runs.append(path.read_text())
        if len(runs) < 3:
            version = len(runs)

            def save():
                time.sleep(0.1)
                path.write_text(f"v{version} saved")  # a different size too: mtime granularity cannot hide it
            threading.Thread(target=save).start()

    count = watch_mod.watch(path, grade, max_runs=3, poll=0.02, announce=announced.append)
    assert count == 3
    assert runs == ["v0", "v1 saved", "v2 saved"]
    assert announced == [f"watching {path} for changes (Ctrl-C to stop)"] * 2


def test_wait_for_change_ignores_an_unchanged_file_and_a_file_mid_save(tmp_path):
    path = tmp_path / "nb.ipynb"
    path.write_text("same")
    polls = []

    def sleep(_):
        polls.append(len(polls))
        if len(polls) == 3:
            path.unlink()  # an editor replacing the file: missing for a moment
        if len(polls) == 5:
            path.write_text("new content")

    watch_mod.wait_for_change(path, poll=0, sleep=sleep)
    # polls 1-2: unchanged; 3-4: missing; 5: changed; 6: still the same, so it returns
    assert len(polls) == 6


def test_watch_via_the_command_line_survives_a_half_saved_file(tiny_course, tmp_path):
    nb = write_nb(tmp_path / "tiny.ipynb", partial_notebook())
    run = start("check", str(nb), "--watch", "--max-runs", "3", "--poll", "0.1", "--json",
                cwd=tmp_path, course=tiny_course)
    deadline = time.monotonic() + 120
    book = tmp_path / "grader-feedback" / "scores.json"
    while not book.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.3)
    nb.write_text('{"cells": [')  # saved half-way: reported, and the watch goes on
    time.sleep(2.0)
    write_nb(nb, tiny_notebook())  # the learner fixes mul and saves
    done = run.wait(timeout=120).ok()
    decoder, text, results = json.JSONDecoder(), done.stdout.strip(), []
    while text:
        obj, end = decoder.raw_decode(text)
        results.append(obj)
        text = text[end:].strip()
    assert [r["score"] for r in results] == [3, 6]
    assert done.stderr.count("watching") == 2
    assert "tiny.ipynb: not a Jupyter notebook (invalid JSON" in done.stderr
    assert json.loads(book.read_text())[ASSIGNMENT]["score"] == 6


# --------------------------------------------------------------------------- instructor


def test_a_class_through_collect_autograde_feedback_export(tiny_course, tmp_path):
    handed_in = tmp_path / "handed-in"
    write_nb(handed_in / "alice.ipynb", tiny_notebook())
    write_nb(handed_in / "bob" / "tiny.ipynb", partial_notebook())
    (handed_in / "carol").mkdir()
    (handed_in / "carol" / "tiny.ipynb").write_text('{"cells": [')  # broken JSON, placed by its name
    (handed_in / "erin.ipynb").write_text('{"cells": [')  # broken JSON naming no assignment: left out
    write_nb(handed_in / "dave" / "my attempt.ipynb", hanging_notebook())
    work = tmp_path / "work"
    work.mkdir()

    collected = start("collect", str(handed_in), cwd=work, course=tiny_course).wait().ok()
    assert "collected 4 notebooks of 4 students" in collected.stdout and "1 left out" in collected.stdout
    assert "erin.ipynb: not a Jupyter notebook" in collected.stderr
    assert sorted(p.relative_to(work / "grader-class" / "submitted").as_posix()
                  for p in (work / "grader-class" / "submitted").rglob("*.ipynb")) == [
        f"{s}/{ASSIGNMENT}/tiny.ipynb" for s in ("alice", "bob", "carol", "dave")]

    t0 = time.monotonic()
    graded = start("autograde", "--jobs", "2", "--cell-timeout", "3", "--timeout", "40",
                   cwd=work, course=tiny_course).wait(timeout=240).ok()
    assert time.monotonic() - t0 < 200
    assert "graded 3 of 4 submissions completely" in graded.stdout  # carol's cannot be graded
    assert start("feedback", cwd=work, course=tiny_course).wait().ok().stdout.count(".html") == 4
    assert start("export", cwd=work, course=tiny_course).wait().ok().stdout.count("scores.") == 2

    rows = {r["student"]: r for r in csv.DictReader(io.StringIO((work / "grader-class" / "scores.csv").read_text()))}
    assert set(rows) == {"alice", "bob", "carol", "dave"}
    assert (rows["alice"]["status"], float(rows["alice"]["score"]), float(rows["alice"]["max_score"])) == ("graded", 6, 6)
    assert (rows["bob"]["status"], float(rows["bob"]["score"])) == ("graded", 3)
    assert rows["carol"]["status"] == "invalid"
    assert f"carol/{ASSIGNMENT}/tiny.ipynb: not a Jupyter notebook (invalid JSON" in rows["carol"]["error"]
    assert float(rows["carol"]["score"]) == 0 and rows["carol"]["assignment"] == ASSIGNMENT
    assert float(rows["dave"]["score"]) == 0 and rows["dave"]["assignment"] == ASSIGNMENT
    dave = json.loads((work / "grader-class" / "results" / "dave" / ASSIGNMENT / "tiny.json").read_text())
    assert any("ran longer than 3 s" in e["error"] for e in dave["cell_errors"]), dave["cell_errors"]

    data = json.loads((work / "grader-class" / "scores.json").read_text())
    assert data["students"] == {"alice": {"score": 6, "max_score": 6}, "bob": {"score": 3, "max_score": 6},
                                "carol": {"score": 0, "max_score": 0}, "dave": {"score": 0, "max_score": 6}}
    bob = next(r for r in data["submissions"] if r["student"] == "bob")
    assert [(t["id"], t["score"], t["passed"]) for t in bob["tests"]] == [
        ("test_add_visible", 1, True), ("hidden_add", 2, True), ("hidden_mul", 0, False)]
    assert "mul(6, 7) should be 42, got 13" in bob["tests"][2]["hint"]
    assert [t["advice"] for t in bob["tests"]] == [None, None, "mul multiplies: reread section 2."]
    alice = next(r for r in data["submissions"] if r["student"] == "alice")
    assert all(t["advice"] is None for t in alice["tests"])  # shown for failed tests only

    page = (work / "grader-class" / "feedback" / "bob.html").read_text()
    assert "3 / 6" in page and "hidden_mul" in page and "mul(6, 7) should be 42, got 13" in page
    assert "<strong>Hint:</strong> mul multiplies: reread section 2." in page
    assert "BEGIN HIDDEN TESTS" not in page and "for a in range(-3, 4)" not in page
    carol = (work / "grader-class" / "feedback" / "carol.html").read_text()
    assert "invalid JSON" in carol


# --------------------------------------------------------------------------- the learner's loop


def syntax_error_notebook() -> dict:
    """``add`` cannot be parsed: every test that needs it fails with a NameError."""
    return edit_cell(tiny_notebook(), "solution", replacing("def add(a, b):", "def add(a, b)"))


def test_a_syntax_error_is_reported_first_with_the_learners_line(tiny_course, tmp_path):
    broken = write_nb(tmp_path / "tiny.ipynb", syntax_error_notebook())
    run = start("check", str(broken), "--feedback-dir", "fb", cwd=tmp_path, course=tiny_course).wait().ok()
    lines = run.stdout.splitlines()
    first = lines.index("Fix these first (errors in cells that are not tests):")
    assert first < next(i for i, line in enumerate(lines) if line.startswith("test "))  # before the table
    assert "cell solution: SyntaxError: expected ':' (cell solution, line 1: def add(a, b))" in run.stdout
    # the tests do not each repeat a bare NameError: they point at the cell to fix
    assert "name 'add' is not defined" not in run.stdout
    assert run.stdout.count("add is not defined because cell solution failed with SyntaxError") == 2
    assert "hint: mul multiplies" not in run.stdout  # no hint for a mistake the test never got to see


def test_a_hang_stops_the_run_within_its_cell_limit_and_progress_streams(tiny_course, tmp_path):
    """A cell that never ends (``add`` loops for a < 0, which only the hidden test tries) costs
    one cell limit (plus the grace to kill it), and what ran before it is shown on stderr
    while the run is still going."""
    nb = edit_cell(tiny_notebook(), "solution", replacing("    return a + b", "    while a < 0:\n        pass\n    return a + b"))
    slow = write_nb(tmp_path / "tiny.ipynb", nb)
    argv = ["--course", str(tiny_course), "check", str(slow), "--cell-timeout", "4", "--feedback-dir", "fb"]
    proc = Started(*argv, cwd=tmp_path).proc
    began = time.monotonic()
    first = proc.stderr.readline()
    assert first.startswith("  test test_add_visible: ran") and proc.poll() is None, first
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert time.monotonic() - began < 4 + 5 + 20
    assert "not run: cell hidden_add ran past the 4 s limit, which stopped the run" in out
    assert " ".join(out.split()).count("which stopped the run") == 1


def with_thread(body: str, name: str) -> dict:
    """The tiny notebook whose solution cell first starts a daemon thread running ``body``."""
    return edit_cell(tiny_notebook(), "solution", lambda s: f"import threading, time\n\ndef _run():\n    {body}\n\n"
                     f"threading.Thread(target=_run, name={name!r}, daemon=True).start()\n\n" + s)


def test_an_idle_thread_left_running_is_reported(tiny_course, tmp_path):
    """A thread that waits costs the tests nothing: the run goes on, and the report names it."""
    idle = write_nb(tmp_path / "tiny.ipynb", with_thread("threading.Event().wait()", "waiter"))
    result = start("check", str(idle), "--json", "--feedback-dir", "fb", cwd=tmp_path,
                   course=tiny_course).wait().result()
    assert result["score"] == 6
    assert result["threads"] == {t["id"]: "1 (waiter)" for t in result["tests"]}
    assert "waiter" in Path(result["feedback_html"]).read_text(encoding="utf-8")


def test_a_spinning_thread_left_running_stops_the_run(tiny_course, tmp_path):
    """A thread that keeps a CPU busy would slow every later test more and more: the first test
    that sees it is refused and the run stops there, naming the thread."""
    spinning = write_nb(tmp_path / "tiny.ipynb", with_thread("while True: pass", "spinner"))
    began = time.monotonic()
    result = start("check", str(spinning), "--json", "--feedback-dir", "fb", cwd=tmp_path,
                   course=tiny_course).wait().result()
    assert time.monotonic() - began < 60
    tests = {t["id"]: t for t in result["tests"]}
    assert result["score"] == 0 and "keep a CPU busy" in tests["test_add_visible"]["hint"]
    assert all(tests[t]["hint"] == "not run: threads your code left running after test_add_visible kept a CPU "
               "busy, which stopped the run" for t in ("hidden_add", "hidden_mul"))
    assert result["threads"] == {"test_add_visible": "1 (spinner), keeping a CPU busy"}


def test_assignment_option_names_a_notebook_without_metadata(tiny_course, tmp_path):
    nb = tiny_notebook()
    del nb["metadata"]["lab"]
    anonymous = write_nb(tmp_path / "my attempt.ipynb", nb)
    refused = start("check", str(anonymous), cwd=tmp_path, course=tiny_course).wait()
    assert refused.returncode == 2 and "name it with --assignment" in refused.stderr
    assert refused.stderr.count("\n") == 1
    named = start("check", str(anonymous), "--assignment", ASSIGNMENT, "--json", "--feedback-dir", "fb",
                  cwd=tmp_path, course=tiny_course).wait().result()
    assert named["assignment"] == ASSIGNMENT and named["score"] == 6


def test_verbose_shows_the_sandbox(tiny_course, tmp_path):
    notebook = write_nb(tmp_path / "tiny.ipynb", tiny_notebook())
    run = start("check", str(notebook), "--verbose", "--feedback-dir", "fb", cwd=tmp_path, course=tiny_course)
    out = run.wait().ok().stdout
    assert "Sandbox: wall clock: 120 s" in out and "per cell: 60 s" in out  # the course's limit, by value


def test_every_option_has_help_with_its_default_and_the_exit_codes():
    import argparse

    from grader.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in [("", parser), *commands.choices.items()]:
        text = sub.format_help()
        assert "exit status:" in text and "130  interrupted" in text, name
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, (name, action.dest)
            if action.default not in (None, False):
                assert "default" in sub._get_formatter()._get_help_string(action), (name, action.dest)


def test_collect_rejects_bad_input(tiny_course, tmp_path):
    missing = start("collect", str(tmp_path / "nope"), cwd=tmp_path, course=tiny_course).wait()
    assert missing.returncode == 2 and "no such folder of submissions" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = start("collect", str(tmp_path / "empty"), cwd=tmp_path, course=tiny_course).wait()
    assert empty.returncode == 2 and "no submissions found" in empty.stderr
    write_nb(tmp_path / "odd" / "-rf.ipynb", tiny_notebook())
    odd = start("collect", str(tmp_path / "odd"), cwd=tmp_path, course=tiny_course).wait()
    assert odd.returncode == 2 and "'-rf' is not a usable student name" in odd.stderr
    nothing = start("autograde", cwd=tmp_path, course=tiny_course).wait()
    assert nothing.returncode == 2 and "nothing collected yet" in nothing.stderr


# --------------------------------------------------------------------------- the benchmark's plotter


def test_grading_plot_summarises_overhead_and_speedup(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import plot_grading
        from mkdocs.exceptions import PluginError
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    data = {"benchmark": "grading",
            "machine": {"cpu": "test cpu", "cores": 2, "mpi_library": "not used", "date": "2026-11-22T00:00:00+00:00"},
            "settings": {"target_overhead_s": 5.0},
            "overhead": [{"assignment": "01_a", "notebook_s": 4.0, "check_s": 7.5, "score": 25, "max_score": 25},
                         {"assignment": "02_b", "notebook_s": 2.0, "check_s": 9.0, "score": 13, "max_score": 16}],
            "throughput": {"submissions": 50, "runs": [{"jobs": 1, "seconds": 300.0, "notebooks_per_minute": 10.0},
                                                       {"jobs": 2, "seconds": 200.0, "notebooks_per_minute": 15.0}]}}
    svgs, summary = plot_grading.plot(tmp_path / "grading.json", data)
    assert set(svgs) == {"overhead"} and svgs["overhead"].lstrip().startswith(b"<?xml")
    assert "| 01_a | 25/25 | 4.00 s | 7.50 s | 3.50 s | yes |" in summary
    assert "| 02_b | 13/16 | 2.00 s | 9.00 s | 7.00 s | no |" in summary
    assert "| 2 | 200.0 s | 15.0 | 1.50× |" in summary and "| 1 | 300.0 s | 10.0 | 1.00× |" in summary
    assert "first check" not in summary  # no first_check_s in the data: nothing said about it
    data["overhead"][0]["first_check_s"], data["overhead"][1]["first_check_s"] = 8.0, 10.5
    _, summary = plot_grading.plot(tmp_path / "grading.json", data)
    assert "took 0.50 to 1.50 s more than a later one (median +1.00 s), over 2 assignments" in summary
    data["overhead"][0]["first_check_s"] = 7.0  # faster than the later checks: said so, not hidden
    _, summary = plot_grading.plot(tmp_path / "grading.json", data)
    assert "took from 0.50 s less to 1.50 s more than a later one (median +0.50 s), over 2 assignments (where" in summary
    broken = {**data, "throughput": {"submissions": 50, "runs": [{"jobs": 1, "seconds": 0}]}}
    with pytest.raises(PluginError, match="throughput"):
        plot_grading.plot(tmp_path / "grading.json", broken)


def test_collect_layouts_and_recollect(tiny_course, tmp_path):
    from grader.course import InputProblem
    from grader.instructor import collect, submissions

    course = Course.at(tiny_course)
    hand = tmp_path / "hand"
    write_nb(hand / "erin.ipynb", tiny_notebook())
    write_nb(hand / "frank" / "sub" / "b.ipynb", tiny_notebook())  # found at any depth, named by its metadata
    write_nb(hand / "frank" / ".ipynb_checkpoints" / "a-checkpoint.ipynb", tiny_notebook())
    write_nb(hand / ".hidden.ipynb", tiny_notebook())
    workspace = hand / "grader-class"  # the workspace inside the folder is not a student
    got, skipped = collect(hand, course, workspace)
    assert sorted(s.key for s in got) == [f"erin/{ASSIGNMENT}/tiny.ipynb", f"frank/{ASSIGNMENT}/tiny.ipynb"]
    assert skipped == []
    assert collect(hand, course, workspace)[0] == got  # collecting again: same, nothing nested
    (hand / "frank" / "sub" / "b.ipynb").unlink()
    write_nb(hand / "frank" / "other.ipynb", {**tiny_notebook(), "metadata": {}})  # no metadata, no known name
    got, skipped = collect(hand, course, workspace)
    assert [s.key for s in got] == [f"erin/{ASSIGNMENT}/tiny.ipynb"]
    assert [p.name for p, _ in skipped] == ["other.ipynb"] and "which assignment is this?" in skipped[0][1]
    # frank handed in nothing usable this time: his earlier copy stays (only what is collected is replaced)
    assert sorted(s.key for s in submissions(workspace)) == [f"erin/{ASSIGNMENT}/tiny.ipynb",
                                                             f"frank/{ASSIGNMENT}/tiny.ipynb"]
    write_nb(hand / "frank" / "a.ipynb", tiny_notebook())
    write_nb(hand / "frank" / "sub" / "a.ipynb", tiny_notebook())
    with pytest.raises(InputProblem, match=f"student frank handed in two notebooks for {ASSIGNMENT}/tiny.ipynb"):
        collect(hand, course, workspace)


def test_memory_is_capped_by_a_cgroup_where_systemd_can_give_one(tiny_course, tmp_path):
    """Where ``systemd-run --scope`` works, the grading run is started through it with
    ``MemoryMax`` set to the memory limit, and the report says the cap is a cgroup; where it does
    not (this machine has no systemd manager), the report says the cap is RLIMIT_AS only and why.
    The systemd here is a stand-in on PATH that records its arguments and runs the command."""
    from notebook_tools import grader_env

    log = tmp_path / "systemd-run.log"
    fake = tmp_path / "bin" / "systemd-run"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n"
                    f'echo "$@" >> {log}\n'
                    'while [ $# -gt 0 ] && [ "$1" != "--" ] && [ "$1" != true ]; do shift; done\n'
                    '[ "$1" = true ] && exit 0\n'
                    'shift\nexec "$@"\n')
    fake.chmod(0o755)
    solved = write_nb(tmp_path / "tiny.ipynb", tiny_notebook())
    env = grader_env()
    env["PATH"] = f"{fake.parent}:{env.get('PATH', '/usr/bin:/bin')}"
    capped = Started("--course", str(tiny_course), "check", str(solved), "--json", "--memory-mb", "3000",
                     "--feedback-dir", "fb", cwd=tmp_path, env=env).wait().result()
    assert capped["score"] == 6, capped
    assert capped["isolation"]["memory_cap"].startswith("cgroup MemoryMax=3000M"), capped["isolation"]
    calls = log.read_text().splitlines()
    assert calls[0].endswith("-p MemoryMax=64M true"), calls  # the probe
    assert any("--scope" in c and "-p MemoryMax=3000M -p MemorySwapMax=0 --" in c and "grader.steps" in c
               for c in calls[1:]), calls

    plain = start("check", str(solved), "--json", "--feedback-dir", "fb", cwd=tmp_path,
                  course=tiny_course).wait().result()
    assert plain["score"] == 6
    cap = plain["isolation"]["memory_cap"]  # this machine's own systemd-run, working or not
    assert cap.startswith(("cgroup MemoryMax=", "RLIMIT_AS (address space) only: ")), cap
