"""The instructor's side: ``collect`` a class's submissions, ``autograde`` them in parallel,
write ``feedback`` pages and ``export`` the scores.

Everything lives in one class workspace (default ``grader-class/`` in the current folder)::

    grader-class/
      submitted/<student>/<notebook>.ipynb   collect: copies of what the students handed in
      results/<student>/<notebook>.json      autograde: one grading record per submission
      feedback/<student>.html                feedback: one page per student
      scores.csv, scores.json                export: the grade sheet

``collect DIR`` accepts two layouts, mixed freely: ``DIR/<student>.ipynb`` (one notebook
per student) and ``DIR/<student>/<anything>.ipynb`` (a folder per student, any number of
notebooks). Which assignment a notebook answers is decided at grading time, as for a
learner's ``check`` (its ``lab.assignment`` metadata, else its file name).

``autograde`` grades each submission with ``check.grade`` (so each runs in its own
sandboxed child process, with the same limits as a learner's check), ``jobs`` at a time
(default: one per core). A submission that cannot be graded (not JSON, unknown assignment,
a kernel that hangs) gets a record saying why, and the others go on.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .feedback import render_page
from .check import DEFAULT_TIMEOUT, grade
from .course import Course, InputProblem
from .sandbox import DEFAULT_MEMORY_MB

DEFAULT_WORKSPACE = Path("grader-class")
_STUDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
CSV_FIELDS = ("student", "submission", "assignment", "status", "score", "max_score", "seconds", "error")


@dataclass(frozen=True)
class Submission:
    """One notebook handed in by one student, as stored in the workspace."""

    student: str
    path: Path

    @property
    def key(self) -> str:
        return f"{self.student}/{self.path.name}"


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


def collect(folder: Path, workspace: Path = DEFAULT_WORKSPACE) -> list[Submission]:
    """Copy every submission under ``folder`` into ``workspace/submitted/<student>/``.

    A student collected again is replaced whole (their older copies removed), so collecting
    after a late hand-in is safe. Raises ``InputProblem`` for a missing folder, a folder
    with no notebooks, a student name that is not a plain file name, or two notebooks of
    one student with the same name.
    """
    if not folder.is_dir():
        raise InputProblem(f"{folder}: no such folder of submissions")
    found = _found_in(folder, workspace)
    if not found:
        raise InputProblem(
            f"{folder}: no submissions found (expected <student>.ipynb or <student>/<notebook>.ipynb)"
        )
    by_student: dict[str, dict[str, Path]] = {}
    for student, nb in found:
        if not _STUDENT.match(student):
            raise InputProblem(f"{nb}: {student!r} is not a usable student name (letters, digits, _ . @ -)")
        mine = by_student.setdefault(student, {})
        if nb.name in mine:
            raise InputProblem(f"{nb}: student {student} handed in two notebooks called {nb.name} "
                               f"({mine[nb.name]} too); keep one")
        mine[nb.name] = nb
    collected = []
    for student, notebooks in sorted(by_student.items()):
        target = workspace / "submitted" / student
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name, nb in sorted(notebooks.items()):
            shutil.copyfile(nb, target / name)
            collected.append(Submission(student, target / name))
    return collected


def submissions(workspace: Path) -> list[Submission]:
    """Every collected submission, by student then notebook name."""
    root = workspace / "submitted"
    if not root.is_dir():
        raise InputProblem(f"{workspace}: nothing collected yet (run `python -m grader collect DIR` first)")
    return [Submission(d.name, nb) for d in sorted(root.iterdir()) if d.is_dir()
            for nb in sorted(d.glob("*.ipynb"))]


# --------------------------------------------------------------------------- autograde


def grade_submission(sub: Submission, course_root: str, timeout: float,
                     cell_timeout: int | None, memory_mb: int) -> dict[str, Any]:
    """The grading record of one submission; never raises (a failure is the record's status).

    Runs in a pool worker. nbgrader's feedback HTML is not made (``feedback=False``):
    ``feedback`` writes one page per student over all of their assignments instead.
    """
    record: dict[str, Any] = {"student": sub.student, "submission": sub.path.name, "assignment": None,
                              "status": "error", "score": 0.0, "max_score": 0.0, "tests": [],
                              "error": None, "tampered": [], "cell_errors": [], "concept_page": None}
    start = time.monotonic()
    try:
        result = grade(sub.path, course=Course(Path(course_root)), feedback_dir=None,
                       timeout=timeout, cell_timeout=cell_timeout, memory_mb=memory_mb)
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


def result_path(workspace: Path, sub: Submission) -> Path:
    return workspace / "results" / sub.student / f"{sub.path.stem}.json"


def autograde(workspace: Path, course: Course, *, jobs: int | None = None,
              timeout: float = DEFAULT_TIMEOUT, cell_timeout: int | None = None,
              memory_mb: int = DEFAULT_MEMORY_MB,
              on_record: Any = None) -> list[dict[str, Any]]:
    """Grade every collected submission, ``jobs`` at a time; write and return the records.

    Each record is written to ``results/<student>/<notebook>.json`` as soon as it is known
    (``on_record(record)`` is called too), so an interrupted class keeps what was graded.
    """
    subs = submissions(workspace)
    if not subs:
        raise InputProblem(f"{workspace}/submitted: no notebooks in it")
    jobs = max(1, jobs or cores())
    results_dir = workspace / "results"
    if results_dir.exists():
        shutil.rmtree(results_dir)
    records: dict[str, dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=min(jobs, len(subs))) as pool:
        futures = {pool.submit(grade_submission, sub, str(course.root), timeout, cell_timeout, memory_mb): sub
                   for sub in subs}
        for future, sub in futures.items():
            try:
                record = future.result()
            except Exception as exc:  # noqa: BLE001 - the worker itself died (e.g. killed): still one record
                record = {"student": sub.student, "submission": sub.path.name, "assignment": None,
                          "status": "error", "score": 0.0, "max_score": 0.0, "tests": [],
                          "error": f"grading worker failed: {exc.__class__.__name__}: {exc}",
                          "tampered": [], "cell_errors": [], "seconds": None}
            path = result_path(workspace, sub)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=2), encoding="utf-8")
            records[sub.key] = record
            if on_record is not None:
                on_record(record)
    return [records[s.key] for s in subs]


def load_records(workspace: Path) -> list[dict[str, Any]]:
    """The records ``autograde`` wrote, by student then notebook."""
    root = workspace / "results"
    if not root.is_dir():
        raise InputProblem(f"{workspace}: nothing graded yet (run `python -m grader autograde` first)")
    records = []
    for path in sorted(root.glob("*/*.json")):
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
