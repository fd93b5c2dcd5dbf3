"""The instructor's side: ``collect`` a class's submissions, ``autograde`` them in parallel,
write ``feedback`` pages and ``export`` the scores.

The class workspace (default ``grader-class/`` in the current folder) is an nbgrader course
directory (the folder names are ``nbgrader.coursedir.CourseDirectory``'s), so nbgrader's own
tools work on it: the formgrader for manual grading and comments, ``nbgrader export`` for a
CSV an LMS imports::

    grader-class/
      nbgrader_config.py                            the course's configuration (written once, never replaced)
      source/<assignment>/, release/<assignment>/   the course's notebooks, generated as `release` does
      gradebook.db                                  nbgrader's gradebook: students, assignments, grade cells,
                                                    one submission per student and assignment with its scores
      submitted/<student>/<assignment>/<notebook>.ipynb, timestamp.txt   collect: what was handed in
      results/<student>/<assignment>/<notebook>.json                      autograde: one record per submission
      feedback/<student>.html                       feedback: one page per student
      scores.csv, scores.json                       export: the grade sheet

``collect DIR`` accepts three layouts, mixed freely: ``DIR/<student>.ipynb``,
``DIR/<student>/<anything>.ipynb`` and nbgrader's ``DIR/<student>/<assignment>/<notebook>.ipynb``.
Which assignment a notebook answers is decided when it is collected: the folder, if it is
named after an assignment, else as for a learner's ``check`` (its ``lab.assignment``
metadata, else its file name); one that says neither is reported and left out.

``autograde`` grades each submission with ``check.grade`` (so each runs in its own
sandboxed child process, with the same limits as a learner's check), ``jobs`` at a time
(default: one per core), each in a worker process of its own (``python -m grader.instructor``):
a submission that cannot be graded (not JSON, a kernel that hangs, a worker that crashes or
is killed) gets a record saying why, and the others go on. Each record is written to
``results/`` and to the gradebook as soon as it is known.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .check import DEFAULT_TIMEOUT, grade
from .course import CONFIG_FILE, SOURCE_DIR, Course, InputProblem, load_notebook
from .feedback import render_page
from .sandbox import DEFAULT_MEMORY_MB, child_environment, run_limited

DEFAULT_WORKSPACE = Path("grader-class")
_STUDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
CSV_FIELDS = ("student", "submission", "assignment", "status", "score", "max_score", "seconds", "error")
# nbgrader's own format for submission times (``ExchangeSubmit.timestamp_format``), read by ``utils.parse_utc``
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"
GENERATE_TIMEOUT = 300.0


@dataclass(frozen=True)
class Submission:
    """One notebook handed in by one student for one assignment, as stored in the workspace."""

    student: str
    assignment: str
    path: Path

    @property
    def key(self) -> str:
        return f"{self.student}/{self.assignment}/{self.path.name}"


def cores() -> int:
    """The cores this process may run on (what 'one process per core' means here)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------------- collect


def _found_in(folder: Path, workspace: Path) -> list[tuple[str, Path]]:
    """(student, notebook) pairs under ``folder``, skipping hidden entries and the workspace itself."""
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or entry.resolve() == workspace.resolve():
            continue
        if entry.is_file() and entry.suffix == ".ipynb":
            found.append((entry.stem, entry))
        elif entry.is_dir():
            for nb in sorted(entry.rglob("*.ipynb")):
                if not any(part.startswith(".") for part in nb.relative_to(entry).parts):
                    found.append((entry.name, nb))
    return found


def _which_assignment(course: Course, folder: Path, student: str, nb: Path) -> tuple[str, str]:
    """(assignment, notebook name) that ``nb``, handed in by ``student``, answers.

    A folder named after an assignment decides (nbgrader's ``<student>/<assignment>/`` layout);
    otherwise the notebook's metadata or file name, as ``Course.identify`` decides for
    ``check``; a notebook that cannot be read is placed by its file name alone, so that
    ``autograde`` records why it cannot be graded. Raises ``InputProblem`` when none says.
    """
    student_dir = folder / student
    parents = nb.relative_to(student_dir).parts[:-1] if nb.is_relative_to(student_dir) else ()
    named = [a for a in course.assignments if a.name in parents]
    if named:
        names = [p.name for p in named[-1].notebooks]
        if nb.name in names:
            return named[-1].name, nb.name
        if len(names) == 1:
            return named[-1].name, names[0]
        raise InputProblem(f"{nb}: assignment {named[-1].name} has no notebook called {nb.name} "
                           f"(it has {', '.join(names)})")
    try:
        content = load_notebook(nb)
    except InputProblem as exc:
        content, unreadable = {}, str(exc)
    else:
        unreadable = None
    try:
        assignment, name = course.identify(nb, content)
    except InputProblem as exc:
        raise InputProblem(unreadable or str(exc)) from None
    return assignment.name, name


def _submitted_at(path: Path) -> str:
    """When ``path`` was handed in (its modification time), in nbgrader's timestamp format."""
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime(TIMESTAMP_FORMAT)


def collect(folder: Path, course: Course,
            workspace: Path = DEFAULT_WORKSPACE) -> tuple[list[Submission], list[tuple[Path, str]]]:
    """Copy every submission under ``folder`` to ``workspace/submitted/<student>/<assignment>/``.

    Each copy is named after the source notebook it answers (nbgrader's autograde looks for
    that name), beside nbgrader's ``timestamp.txt`` (the file's modification time). A
    student's assignment collected again is replaced whole, so collecting after a late
    hand-in is safe; their other assignments stay. Returns the submissions collected and the
    notebooks left out with why (no assignment can be told). Raises ``InputProblem`` for a
    missing folder, a folder with no notebooks, a student name that is not a plain file name,
    or two notebooks of one student answering the same notebook.
    """
    if not folder.is_dir():
        raise InputProblem(f"{folder}: no such folder of submissions")
    found = _found_in(folder, workspace)
    if not found:
        raise InputProblem(
            f"{folder}: no submissions found (expected <student>.ipynb or <student>/<notebook>.ipynb)"
        )
    placed: dict[tuple[str, str], dict[str, Path]] = {}
    skipped: list[tuple[Path, str]] = []
    for student, nb in found:
        if not _STUDENT.match(student):
            raise InputProblem(f"{nb}: {student!r} is not a usable student name (letters, digits, _ . @ -)")
        try:
            assignment, name = _which_assignment(course, folder, student, nb)
        except InputProblem as exc:
            skipped.append((nb, str(exc)))
            continue
        mine = placed.setdefault((student, assignment), {})
        if name in mine:
            raise InputProblem(f"{nb}: student {student} handed in two notebooks for {assignment}/{name} "
                               f"({mine[name]} too); keep one")
        mine[name] = nb
    collected = []
    for (student, assignment), notebooks in sorted(placed.items()):
        target = workspace / "submitted" / student / assignment
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        latest = max(notebooks.values(), key=lambda p: p.stat().st_mtime)
        (target / "timestamp.txt").write_text(_submitted_at(latest) + "\n", encoding="utf-8")
        for name, nb in sorted(notebooks.items()):
            shutil.copyfile(nb, target / name)
            collected.append(Submission(student, assignment, target / name))
    return collected, skipped


def submissions(workspace: Path) -> list[Submission]:
    """Every collected submission, by student, assignment, then notebook name."""
    root = workspace / "submitted"
    if not root.is_dir():
        raise InputProblem(f"{workspace}: nothing collected yet (run `python -m grader collect DIR` first)")
    return [Submission(nb.parent.parent.name, nb.parent.name, nb)
            for nb in sorted(root.glob("*/*/*.ipynb"))]


# --------------------------------------------------------------------------- the workspace as an nbgrader course


def course_settings(workspace: Path) -> tuple[str, str]:
    """(gradebook URL, course id) of the workspace, from its ``nbgrader_config.py`` as nbgrader reads it."""
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    root = workspace.resolve()
    config = Config()
    config.merge(PyFileConfigLoader(CONFIG_FILE, path=str(root)).load_config())
    config.CourseDirectory.root = str(root)
    coursedir = CourseDirectory(config=config)
    return coursedir.db_url, coursedir.course_id


def prepare_course(workspace: Path, course: Course, assignments: list[str], *,
                   timeout: float = GENERATE_TIMEOUT) -> None:
    """Make ``workspace`` an nbgrader course holding ``assignments``, each in its gradebook.

    Its ``nbgrader_config.py`` is the course's (written only when there is none: an
    instructor's own settings, such as a late penalty, are kept), ``source/<assignment>/``
    a copy of the course's, and ``release/`` plus the gradebook's assignment, notebooks and
    grade cells come from nbgrader's ``generate_assignment``, run by ``grader.steps`` under
    the sandbox's limits, as ``release`` runs it (the plain source: no guard token).
    """
    workspace.mkdir(parents=True, exist_ok=True)
    config = workspace / CONFIG_FILE
    if not config.exists():
        shutil.copyfile(course.root / CONFIG_FILE, config)
    for name in assignments:
        assignment = course.assignment(name)
        if assignment is None:
            raise InputProblem(f"{workspace}/submitted: assignment {name} is not in the course {course.root}")
        target = workspace / SOURCE_DIR / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(assignment.source_dir, target,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    with tempfile.TemporaryDirectory(prefix="dl-lab-grader-") as scratch:
        record_file = Path(scratch) / "steps.json"
        argv = [sys.executable, "-m", "grader.steps", str(workspace.resolve()), "--steps", "generate",
                "--result", str(record_file)]
        for name in assignments:
            argv += ["--assignment", name]
        env = child_environment(Path(scratch))
        env.pop("LAB_GUARD_TOKEN", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(_package_parent()), env.get("PYTHONPATH"))))
        child = run_limited(argv, cwd=workspace.resolve(), env=env, timeout=timeout)
        try:
            record = json.loads(record_file.read_text())
        except (OSError, json.JSONDecodeError):
            record = {}
    if child.timed_out or child.returncode != 0 or record.get("failed"):
        failed = record.get("failed") or {}
        tail = [line for line in child.stderr.splitlines() if line.strip()]
        why = ("it ran past the limit" if child.timed_out else failed.get("message")
               or (tail[-1] if tail else f"exit status {child.returncode}"))
        raise InputProblem(f"{workspace}: nbgrader generate_assignment failed for "
                           f"{failed.get('assignment', ', '.join(assignments))}: {why}")


def _package_parent() -> Path:
    """The folder holding the ``grader`` package (so that a child finds it from any folder)."""
    return Path(__file__).resolve().parent.parent


class GradebookWriter:
    """Writes grading records into the workspace's nbgrader gradebook, one submission at a time.

    As nbgrader's own autograde does: the student and the submission are created if new
    (``update_or_create_submission``), the submission's time comes from ``timestamp.txt``, and
    each test cell's ``auto_score`` is set. Manual scores and comments given in the
    formgrader are not touched, so grading again keeps them. A test cell the record has no
    score for (the notebook could not be graded) gets 0; a cell graded by hand only (a
    written answer) is left to the instructor. A submission that was not graded to the end
    is ``flagged``, so the formgrader lists it for a look; its reason is in the record.
    """

    def __init__(self, workspace: Path):
        from nbgrader.api import Gradebook

        db_url, course_id = course_settings(workspace)
        self.gradebook = Gradebook(db_url, course_id)

    def write(self, record: dict[str, Any], sub: Submission) -> None:
        gb = self.gradebook
        gb.update_or_create_student(sub.student)
        timestamp = (sub.path.parent / "timestamp.txt")
        stamp = timestamp.read_text(encoding="utf-8").strip() if timestamp.is_file() else None
        submission = gb.update_or_create_submission(sub.assignment, sub.student,
                                                    **({"timestamp": stamp} if stamp else {}))
        scores = {t["id"]: float(t["score"]) for t in record.get("tests", [])}
        for notebook in submission.notebooks:
            if notebook.name != sub.path.stem:
                continue
            by_hand = {c.name for c in notebook.notebook.solution_cells}
            for cell_grade in notebook.grades:
                if cell_grade.name in scores:
                    cell_grade.auto_score = scores[cell_grade.name]
                elif cell_grade.cell.cell_type == "code" and cell_grade.name not in by_hand:
                    cell_grade.auto_score = 0.0
            notebook.flagged = record["status"] != "graded"
        gb.db.commit()

    def close(self) -> None:
        self.gradebook.close()


# --------------------------------------------------------------------------- autograde


def grade_submission(sub: Submission, course_root: str, timeout: float,
                     cell_timeout: int | None, memory_mb: int) -> dict[str, Any]:
    """The grading record of one submission; never raises (a failure is the record's status).

    Runs in a worker process (``python -m grader.instructor``). nbgrader's feedback HTML is
    not made (``feedback=False``): ``feedback`` writes one page per student over all of
    their assignments instead.
    """
    record = _empty_record(sub)
    start = time.monotonic()
    try:
        # nbgrader's place for the graded copy, which the formgrader opens for grading by hand:
        # <workspace>/autograded/<student>/<assignment>/, beside submitted/<student>/<assignment>/
        kept = sub.path.parents[3] / "autograded" / sub.student / sub.assignment / sub.path.name
        kept.unlink(missing_ok=True)  # a copy from an earlier run must not stand for this one
        result = grade(sub.path, course=Course(Path(course_root)), feedback_dir=None,
                       assignment_name=sub.assignment, timeout=timeout, cell_timeout=cell_timeout,
                       memory_mb=memory_mb, keep_autograded=kept)
        stamp = sub.path.parent / "timestamp.txt"
        if kept.is_file() and stamp.is_file():
            shutil.copyfile(stamp, kept.parent / "timestamp.txt")
        data = json.loads(result.to_json())
        for key in ("assignment", "score", "max_score", "tests", "error", "tampered", "cell_errors",
                    "concept_page"):
            record[key] = data.get(key, record[key])
        record["status"] = "graded" if result.completed else "incomplete"
    except InputProblem as exc:
        record.update(status="invalid", error=str(exc).replace(str(sub.path), sub.key))
    except Exception as exc:  # noqa: BLE001 - a grader bug must not stop the class: record it and go on
        record["error"] = f"{exc.__class__.__name__}: {exc}"
    record["seconds"] = round(time.monotonic() - start, 3)
    return record


def _empty_record(sub: Submission) -> dict[str, Any]:
    """The record of a submission nothing is known of yet: status error, no score."""
    return {"student": sub.student, "submission": sub.path.name, "assignment": sub.assignment,
            "status": "error", "score": 0.0, "max_score": 0.0, "tests": [], "error": None,
            "tampered": [], "cell_errors": [], "concept_page": None, "seconds": None}


def result_path(workspace: Path, sub: Submission) -> Path:
    return workspace / "results" / sub.student / sub.assignment / f"{sub.path.stem}.json"


PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> bool:
    """Adopt the orphans of this process's descendants (Linux ``prctl``); whether it worked."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class _Workers:
    """The worker processes running now, so that an interrupted class stops them all."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.stopping = False
        # A worker that is killed leaves its grading child, the kernel's jail and the kernel
        # behind; each is set to die with its parent (sandbox.die_with_parent), and as a last
        # wall this process becomes their "subreaper": what a dead worker leaves is adopted
        # here, not by init, and ``reap_orphans`` stops it.
        self.subreaper = _become_subreaper()

    def reap_orphans(self) -> None:
        """Kill what dead workers left: every child of this process that is not a running worker
        (adopted as subreaper), with all below it."""
        if not self.subreaper:
            return
        import psutil

        with self.lock:
            live = {proc.pid for proc in self.running}
            orphans = [child for child in psutil.Process().children() if child.pid not in live]
            doomed = []
            for orphan in orphans:
                try:
                    doomed += [*orphan.children(recursive=True), orphan]
                except psutil.Error:
                    continue
            for process in doomed:
                try:
                    process.kill()
                except psutil.Error:
                    pass
        psutil.wait_procs(doomed, timeout=5)

    def run(self, sub: Submission, course_root: Path, timeout: float, cell_timeout: int | None,
            memory_mb: int) -> dict[str, Any]:
        """Grade ``sub`` in a worker process of its own; its record, whatever became of the worker.

        A worker that dies (killed, out of memory, a crash of the interpreter) or outlives its
        budget by a minute gives a record with status ``error`` saying so.
        """
        with tempfile.TemporaryDirectory(prefix="dl-lab-grader-worker-") as tmp:
            out = Path(tmp) / "record.json"
            argv = [sys.executable, "-m", "grader.instructor", str(sub.path), "--student", sub.student,
                    "--assignment", sub.assignment, "--course", str(course_root), "--record", str(out),
                    "--timeout", str(timeout), "--memory-mb", str(memory_mb)]
            if cell_timeout is not None:
                argv += ["--cell-timeout", str(cell_timeout)]
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(_package_parent()), env.get("PYTHONPATH"))))
            start = time.monotonic()
            with self.lock:
                if self.stopping:
                    raise KeyboardInterrupt
                proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
                self.running.add(proc)
            try:
                _, err = proc.communicate(timeout=timeout + 60)
                overtime = False
            except subprocess.TimeoutExpired:
                proc.terminate()  # SIGTERM: the worker stops its grading child on the way out
                try:
                    _, err = proc.communicate(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                overtime = True
            finally:
                with self.lock:
                    self.running.discard(proc)
                if proc.returncode != 0:
                    self.reap_orphans()
            if proc.returncode == 0 and out.is_file():
                try:
                    return json.loads(out.read_text(encoding="utf-8"))
                except json.JSONDecodeError:
                    pass
        record = _empty_record(sub)
        record["seconds"] = round(time.monotonic() - start, 3)
        if overtime:
            why = f"ran over its {timeout:g} s budget by a minute and was stopped"
        elif proc.returncode is not None and proc.returncode < 0:
            try:
                name = signal.Signals(-proc.returncode).name
            except ValueError:
                name = f"signal {-proc.returncode}"
            why = f"was killed by {name}"
        else:
            tail = [line.strip() for line in (err or "").splitlines() if line.strip()]
            why = f"exited with status {proc.returncode}" + (f": {tail[-1]}" if tail else "")
        record["error"] = f"the grading worker {why}; nothing of this submission was graded"
        return record

    def stop(self) -> None:
        """Ask every running worker to stop (each stops its own grading child), and start no more."""
        with self.lock:
            self.stopping = True
            for proc in self.running:
                proc.terminate()


def autograde(workspace: Path, course: Course, *, jobs: int | None = None,
              timeout: float = DEFAULT_TIMEOUT, cell_timeout: int | None = None,
              memory_mb: int = DEFAULT_MEMORY_MB,
              on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Grade every collected submission, ``jobs`` at a time; write and return the records.

    First the workspace is made an nbgrader course with every assignment handed in
    (``prepare_course``). Each record is written to ``results/<student>/<assignment>/<notebook>.json``
    and into the gradebook as soon as it is known (``on_record(record)`` is called too), so an
    interrupted class keeps what was graded. Records are returned in submission order.
    """
    subs = submissions(workspace)
    if not subs:
        raise InputProblem(f"{workspace}/submitted: no notebooks in it")
    prepare_course(workspace, course, sorted({s.assignment for s in subs}))
    jobs = max(1, jobs or cores())
    results_dir = workspace / "results"
    if results_dir.exists():
        shutil.rmtree(results_dir)
    records: dict[str, dict[str, Any]] = {}
    workers = _Workers()
    book = GradebookWriter(workspace)
    pool = ThreadPoolExecutor(max_workers=min(jobs, len(subs)))
    try:
        futures = {pool.submit(workers.run, sub, course.root, timeout, cell_timeout, memory_mb): sub
                   for sub in subs}
        for future in as_completed(futures):
            sub = futures[future]
            record = future.result()
            path = result_path(workspace, sub)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=2), encoding="utf-8")
            book.write(record, sub)
            records[sub.key] = record
            if on_record is not None:
                on_record(record)
    except BaseException:
        workers.stop()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        book.close()
    return [records[s.key] for s in subs]


def load_records(workspace: Path) -> list[dict[str, Any]]:
    """The records ``autograde`` wrote, by student, assignment, then notebook."""
    root = workspace / "results"
    if not root.is_dir():
        raise InputProblem(f"{workspace}: nothing graded yet (run `python -m grader autograde` first)")
    records = []
    for path in sorted(root.glob("*/*/*.json")):
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            raise InputProblem(f"{path}: not a grading record ({exc}); run autograde again") from None
    return records


# --------------------------------------------------------------------------- feedback


def write_feedback(workspace: Path) -> list[Path]:
    """``feedback/<student>.html`` for every student with records; returns the pages written."""
    by_student: dict[str, list[dict[str, Any]]] = {}
    for r in load_records(workspace):
        by_student.setdefault(r["student"], []).append(r)
    out = workspace / "feedback"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for student, records in sorted(by_student.items()):
        page = out / f"{student}.html"
        page.write_text(render_page(f"Feedback for {student}", records), encoding="utf-8")
        written.append(page)
    return written


# --------------------------------------------------------------------------- export


def scores_csv(records: list[dict[str, Any]]) -> str:
    """One row per submission: student, submission, assignment, status, score, max, seconds, error."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in records:
        writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})
    return buffer.getvalue()


def export(workspace: Path) -> tuple[Path, Path]:
    """Write ``scores.csv`` (one row per submission) and ``scores.json`` (records with their tests)."""
    records = load_records(workspace)
    csv_path, json_path = workspace / "scores.csv", workspace / "scores.json"
    csv_path.write_text(scores_csv(records), encoding="utf-8")
    totals: dict[str, dict[str, float]] = {}
    for r in records:
        t = totals.setdefault(r["student"], {"score": 0.0, "max_score": 0.0})
        t["score"] += r["score"]
        t["max_score"] += r["max_score"]
    json_path.write_text(json.dumps({"students": totals, "submissions": records}, indent=2), encoding="utf-8")
    return csv_path, json_path


# --------------------------------------------------------------------------- the worker


def worker_main(argv: list[str] | None = None) -> int:
    """``python -m grader.instructor NOTEBOOK ...``: grade one submission, write its record to ``--record``.

    What ``autograde`` runs per submission, so that a crash while grading one (the worker
    killed, the interpreter dying) costs that submission only.
    """
    parser = argparse.ArgumentParser(prog="python -m grader.instructor", description=worker_main.__doc__)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--student", required=True)
    parser.add_argument("--assignment", required=True)
    parser.add_argument("--course", type=Path, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    parser.add_argument("--cell-timeout", type=int, default=None)
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB)
    args = parser.parse_args(argv)
    # SIGTERM (autograde stopping its workers) unwinds like Ctrl-C: the sandbox then kills the grading child.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sub = Submission(args.student, args.assignment, args.notebook)
    record = grade_submission(sub, str(args.course), args.timeout, args.cell_timeout, args.memory_mb)
    args.record.write_text(json.dumps(record), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
