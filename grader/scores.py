"""The learner's score book: the best and the latest ``check`` result of every assignment, and ``list``.

Every ``python -m grader check`` run records its outcome in ``scores.json`` inside the
feedback folder (default ``grader-feedback/``, a folder the learner owns), keyed by
assignment name, so that ``python -m grader list`` can show the whole course at a glance:
which assignments have been attempted, their best score (of the runs that completed), their
latest, and whether that run completed. A worse attempt never hides a better one.

The file is small JSON written atomically (temporary file + rename); a file that is
missing starts an empty book, and one that is not valid JSON is reported by name instead
of being silently overwritten.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from .course import Course, InputProblem
from .report import GradingResult

SCORES_FILE = "scores.json"


def scores_path(feedback_dir: Path) -> Path:
    """Where the score book of ``feedback_dir`` lives."""
    return feedback_dir / SCORES_FILE


def read_scores(feedback_dir: Path) -> dict[str, dict[str, Any]]:
    """The recorded results by assignment ({} when nothing was recorded yet)."""
    path = scores_path(feedback_dir)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputProblem(f"{path}: the score book cannot be read ({exc}); delete it to start afresh") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise InputProblem(f"{path}: the score book is not a JSON object of assignments; delete it to start afresh")
    return data


def record_result(feedback_dir: Path, result: GradingResult, *, when: float | None = None) -> Path:
    """Store ``result`` as the latest of its assignment, and as its best if it completed with a
    higher score than any before; returns the score book's path."""
    path = scores_path(feedback_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".scores.lock", "a") as lock:  # two checks at once must not lose a score
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _record(path, result, when)


def _record(path: Path, result: GradingResult, when: float | None) -> Path:
    """``record_result``'s read, update and atomic replace of the book, under its lock."""
    book = read_scores(path.parent)
    previous = book.get(result.assignment, {})
    latest = {
        "notebook": str(Path(result.notebook).resolve()),
        "score": result.score,
        "max_score": result.max_score,
        "completed": result.completed,
        "passed": sum(1 for t in result.tests if t.passed),
        "tests": len(result.tests),
        "checked_at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when or time.time())),
    }
    best = previous.get("best")
    if result.completed and (best is None or result.score > best["score"]):
        best = {k: latest[k] for k in ("score", "max_score", "passed", "tests", "checked_at", "notebook")}
    book[result.assignment] = latest | ({"best": best} if best else {})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".scores-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(book, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def render_list(course: Course, book: dict[str, dict[str, Any]]) -> str:
    """One row per assignment of the course: best score, latest score and tests passed, when
    checked last, or 'not checked yet'; the total counts each assignment's best."""
    names = [a.name for a in course.assignments]
    width = max([len("assignment")] + [len(n) for n in names])
    head = f"{'assignment':<{width}}  {'best':>7}  {'latest':>7}  {'tests passed':>12}  last check"
    lines = [head, "-" * len(head)]
    for name in names:
        entry = book.get(name)
        if entry is None:
            lines.append(f"{name:<{width}}  {'-':>7}  {'-':>7}  {'-':>12}  not checked yet")
            continue
        best = entry.get("best")
        best_text = f"{best['score']:g}/{best['max_score']:g}" if best else "-"
        score = f"{entry['score']:g}/{entry['max_score']:g}"
        passed = f"{entry['passed']}/{entry['tests']}"
        note = "" if entry.get("completed", True) else "  (grading did not complete)"
        lines.append(f"{name:<{width}}  {best_text:>7}  {score:>7}  {passed:>12}  {entry['checked_at']}{note}")
    done = [book[n] for n in names if n in book]
    total = sum(e["best"]["score"] for e in done if e.get("best"))
    possible = sum(e["max_score"] for e in done)
    lines.append("-" * len(head))
    lines.append(f"{len(done)} of {len(names)} assignments checked; best scores add up to {total:g}/{possible:g} points")
    return "\n".join(lines)


PROGRESS_FORMAT = "dl-lab-grader-scores"
PROGRESS_VERSION = 1


def progress_export(book: dict[str, dict[str, Any]], *, when: float | None = None) -> dict[str, Any]:
    """The learner's best score of every assignment, for the site's practice page to import.

    Format ``dl-lab-grader-scores``, version 1 (documented on docs/practice/index.md)::

        {"format": "dl-lab-grader-scores", "version": 1, "exported_at": "2026-11-24T18:30:00Z",
         "assignments": {"01_ring_allreduce": {"best_score": 8, "max_score": 10, "passed": 4,
                                               "tests": 5, "checked_at": "2026-11-20 14:02:11"}}}

    Only assignments with a completed check (a ``best`` entry of the score book) appear."""
    assignments = {}
    for name, entry in sorted(book.items()):
        best = entry.get("best")
        if not best:
            continue
        assignments[name] = {"best_score": best["score"], "max_score": best["max_score"],
                             "passed": best["passed"], "tests": best["tests"], "checked_at": best["checked_at"]}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when or time.time()))
    return {"format": PROGRESS_FORMAT, "version": PROGRESS_VERSION, "exported_at": stamp, "assignments": assignments}


def write_progress_export(feedback_dir: Path, out: Path) -> tuple[Path, int]:
    """Write ``progress_export`` of ``feedback_dir``'s score book to ``out``; (path, assignments)."""
    data = progress_export(read_scores(feedback_dir))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return out, len(data["assignments"])
