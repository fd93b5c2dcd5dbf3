"""The child process: nbgrader's steps, run in a scratch course under the sandbox's limits.

``python -m grader.steps COURSE_ROOT --assignment A --steps generate,autograde,feedback
--result FILE`` runs the steps in order through nbgrader's Python API (``NbGraderAPI``)
and records, after each one, whether it succeeded (with nbgrader's error) in ``FILE``.

Why one child for all steps instead of one ``nbgrader`` command per step: importing
nbgrader takes seconds, and three imports per check tripled the time a learner waits for a
grade. The isolation is the same (a single child process in its own session, killed as a
whole when it runs past the limit), and the parent learns how far the run got from the
result file even when it had to kill it.

Only the course's own ``nbgrader_config.py`` is loaded, so a user's personal nbgrader
configuration cannot change how the lab's notebooks are graded.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

STEPS = ("generate", "autograde", "feedback")


def _read_schema_version_in_process() -> None:
    """Let nbgrader learn its gradebook schema version without a subprocess.

    A new gradebook is stamped with the head revision of nbgrader's database migrations,
    which nbgrader finds by running the ``alembic heads`` command: a second Python start-up
    that re-imports nbgrader and costs seconds per check. Reading the same revision with
    alembic's ``ScriptDirectory`` here gives the same answer in a fraction of a second; if
    anything about that differs (another nbgrader version), nbgrader's own way is kept.
    """
    try:
        import nbgrader.api as nbgrader_api
        from alembic.script import ScriptDirectory
        from nbgrader.dbutil import ALEMBIC_DIR
    except ImportError:
        return
    original = getattr(nbgrader_api, "get_alembic_version", None)
    if original is None:
        return

    def head_revision() -> str:
        try:
            heads = ScriptDirectory(ALEMBIC_DIR).get_heads()
        except Exception:  # noqa: BLE001 - any trouble: fall back to nbgrader's own way
            heads = []
        return heads[0] if len(heads) == 1 else original()

    nbgrader_api.get_alembic_version = head_revision


def _api(root: Path, cell_timeout: int | None) -> Any:
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = Config()
    config.merge(PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config())
    config.CourseDirectory.root = str(root)
    exchange = root / "exchange"  # never used; keeps nbgrader away from /usr/local/share
    exchange.mkdir(exist_ok=True)
    config.Exchange.root = str(exchange)
    if cell_timeout is not None:
        config.ExecutePreprocessor.timeout = cell_timeout
        config.Execute.timeout = cell_timeout
    return NbGraderAPI(CourseDirectory(config=config), config=config)


def _grades(api: Any, assignment: str, student: str) -> dict[str, list[dict[str, Any]]]:
    """Per-test scores nbgrader saved in the gradebook, by notebook (ids in gradebook order)."""
    from nbgrader.api import Gradebook

    found: dict[str, list[dict[str, Any]]] = {}
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        for notebook in gb.find_assignment(assignment).notebooks:
            submitted = gb.find_submission_notebook(notebook.name, assignment, student)
            found[notebook.name] = [
                {"id": g.name, "score": float(g.score), "max_score": float(g.max_score)}
                for g in submitted.grades
            ]
    return found


def _error_summary(text: str) -> str:
    """The most telling line of an nbgrader failure.

    nbgrader wraps the real cause (say, ``SchemaTooNewError: ...``) in a generic
    ``NbGraderException``; the first exception line that is not that wrapper names the cause.
    """
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    exception = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$")
    for line in lines:
        match = exception.match(line)
        if match and not match.group(1).endswith("NbGraderException"):
            return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2)}"
    errors = [line.removeprefix("[ERROR]").strip() for line in lines if line.startswith("[ERROR]")]
    if errors:
        return errors[0]
    return lines[-1] if lines else "no error message"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.steps", description=__doc__)
    parser.add_argument("root", type=Path, help="the scratch course root")
    parser.add_argument("--assignment", action="append", required=True)
    parser.add_argument("--student", default=None)
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--cell-timeout", type=int, default=None)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")  # SQLAlchemy and Jupyter deprecation chatter
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown steps {unknown}; expected some of {STEPS}")
    if args.student is None and set(steps) - {"generate"}:
        parser.error("--student is needed to autograde or to generate feedback")

    _read_schema_version_in_process()
    api = _api(args.root.resolve(), args.cell_timeout)
    record: dict[str, Any] = {"completed": [], "failed": None, "seconds": {}}

    def save() -> None:
        args.result.write_text(json.dumps(record))

    save()
    for assignment in args.assignment:
        for step in steps:
            started = time.monotonic()
            if step == "generate":
                outcome = api.generate_assignment(assignment, force=True, create=True)
            elif step == "autograde":
                outcome = api.autograde(assignment, args.student, force=True, create=True)
            else:
                outcome = api.generate_feedback(assignment, args.student, force=True)
            if not outcome.get("success"):
                log = (outcome.get("log") or "") + "\n" + (outcome.get("error") or "")
                record["failed"] = {
                    "assignment": assignment,
                    "step": step,
                    "message": _error_summary(log),
                    "log": log[-4000:],
                }
                save()
                print(log, file=sys.stderr)
                return 1
            if step == "autograde":
                record["grades"] = _grades(api, assignment, args.student)
            record["completed"].append(f"{assignment}:{step}")
            record["seconds"][f"{assignment}:{step}"] = round(time.monotonic() - started, 3)
            save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
