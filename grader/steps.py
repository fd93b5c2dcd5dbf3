"""The child process: nbgrader's steps, run in a scratch course under the sandbox's limits.

``python -m grader.steps COURSE_ROOT --assignment A --steps generate,autograde
--result FILE`` runs the steps in order with nbgrader's converters (as its ``NbGraderAPI``
runs them, see ``Steps``) and records, after each one, whether it succeeded (with nbgrader's
error) in ``FILE``.

Why one child for all steps instead of one ``nbgrader`` command per step: importing
nbgrader takes seconds, and an import per step multiplied the time a learner waits for a
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
import os
import re
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Any

STEPS = ("generate", "autograde")


def _skip_slow_optional_imports() -> None:
    """Keep ``jsonschema`` from importing ``rfc3987_syntax`` (2-3 s, a grammar built at import).

    nbformat validates notebooks with jsonschema, which loads that package only to check
    strings declared with the ``iri`` format; the notebook schema declares none, and
    jsonschema skips the check when the import fails, which this makes it do.
    """
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]


def _enter_package(name: str) -> types.ModuleType | None:
    """Put package ``name`` in ``sys.modules`` without running its ``__init__`` (its submodules
    still import as usual); None if it is already imported or not installed."""
    import importlib.util

    if name in sys.modules:
        return None
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    package.__spec__ = spec
    sys.modules[name] = package
    return package


def _lean_nbgrader() -> None:
    """Import only the part of nbgrader that grading uses (about a third less to import).

    ``import nbgrader.<anything>`` first runs the package's ``__init__``, which only registers
    nbgrader's Jupyter server extensions and imports them (``jupyter_server``, the exchange):
    none of them has a part in generating or autograding. Likewise ``nbgrader.auth``
    imports JupyterHub authentication (and ``requests``) where the gradebook only needs the
    ``Authenticator`` type. Both packages are entered without running their ``__init__``.
    ``nbgrader.utils`` also imports setuptools (and with it ``pkg_resources``), only for the
    archive unpacking of ``zip_collect``, which the grader never calls; a stand-in module that
    refuses to unpack takes its place.
    """
    package = _enter_package("nbgrader")
    if package is None:
        return
    from nbgrader._version import __version__

    package.__version__ = __version__  # type: ignore[attr-defined]
    auth = _enter_package("nbgrader.auth")
    if auth is not None:
        from nbgrader.auth.base import Authenticator

        auth.Authenticator = Authenticator  # type: ignore[attr-defined]

    def unpack(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("grader.steps: unpacking archives (nbgrader zip_collect) is not part of grading")

    archive = types.ModuleType("setuptools.archive_util")
    archive.unpack_archive = archive.unpack_tarfile = archive.unpack_zipfile = unpack  # type: ignore[attr-defined]
    sys.modules.setdefault("setuptools.archive_util", archive)


def _read_schema_version_in_process() -> None:
    """Let nbgrader learn its gradebook schema version without a subprocess.

    A new gradebook is stamped with the head revision of nbgrader's database migrations,
    which nbgrader finds by running the ``alembic heads`` command: a second Python start-up
    that re-imports nbgrader and costs seconds per check. Reading the same revision with
    alembic's ``ScriptDirectory`` here gives the same answer in a fraction of a second (and
    alembic is imported only when a gradebook is created, not when a cached one is used); if
    anything about that differs (another nbgrader version), nbgrader's own way is kept.
    """
    try:
        import nbgrader.api as nbgrader_api
    except ImportError:
        return
    original = getattr(nbgrader_api, "get_alembic_version", None)
    if original is None:
        return

    def head_revision() -> str:
        try:
            from alembic.script import ScriptDirectory
            from nbgrader.dbutil import ALEMBIC_DIR

            heads = ScriptDirectory(ALEMBIC_DIR).get_heads()
        except Exception:  # noqa: BLE001 - any trouble: fall back to nbgrader's own way
            heads = []
        return heads[0] if len(heads) == 1 else original()

    nbgrader_api.get_alembic_version = head_revision


KILL_GRACE_S = 5  # after the per-cell limit and the interrupt, how long a cell may still run


def _progress(event: dict[str, Any]) -> None:
    """Append one line of JSON to ``$LAB_PROGRESS`` (the parent shows it as the run goes on)."""
    path = os.environ.get("LAB_PROGRESS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")


def _stop_at_first_timeout() -> None:
    """Let autograde outlive a kernel that dies or hangs, keeping earlier grades, and stop early.

    nbgrader gives up on the whole notebook when the kernel dies (``os._exit`` in a cell, a
    crash, a kill for a limit): every test, even those that passed before, would score 0.
    Here a cell that kills the kernel gets that as its error, and the cells after it are
    marked "not run", so the tests that ran keep their results.

    The first cell that runs past its time limit also ends the run: its kernel is killed (so
    threads it left spinning cannot slow the tests after it) and every later cell is marked
    "not run because cell X timed out", instead of each running into the limit in turn. So
    does a test after which the guard saw the notebook's threads keep a CPU busy
    (``guard.busy_threads``): each later test would otherwise run slower and slower. A
    cell still running ``KILL_GRACE_S`` after its limit (it ignored the interrupt) is handled
    the same way. Each finished cell is reported to ``_progress``.
    """
    import signal
    import threading

    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from nbformat.notebooknode import NotebookNode
    from nbgrader.preprocessors.execute import Execute

    from grader.guard import MARK

    original = Execute.preprocess_cell

    def _text(output: Any) -> str:
        text = output.get("text", "") if output.get("output_type") == "stream" else ""
        return "".join(text) if isinstance(text, list) else str(text)

    def error(value: str, name: str = "DeadKernelError") -> NotebookNode:
        return NotebookNode(output_type="error", ename=name, evalue=value, traceback=[f"{name}: {value}"])

    def kill_kernel(preprocessor: Any) -> None:
        pid = getattr(getattr(preprocessor.km, "provisioner", None), "pid", None)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def run(self: Any, cell: Any, resources: Any, index: int, name: str) -> tuple[Any, Any]:
        limit = self._get_timeout(cell)
        timer = threading.Timer(limit + KILL_GRACE_S, kill_kernel, (self,)) if limit else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            cell, resources = original(self, cell, resources, index)
            if any(o.get("ename") == "CellTimeoutError" for o in cell.get("outputs", [])):
                kill_kernel(self)
                self._lab_stopped = f"not run: cell {name} ran past the {limit} s limit, which stopped the run"
            elif any(f"{MARK} spinning: " in _text(o) for o in cell.get("outputs", [])):
                kill_kernel(self)  # the threads die with it: they cannot slow the tests after this one
                self._lab_stopped = (f"not run: threads your code left running after {name} kept a CPU busy, "
                                     "which stopped the run")
            return cell, resources
        except DeadKernelError:
            self._lab_stopped = "not run: the kernel died in an earlier cell"
            cell.outputs = list(cell.get("outputs", [])) + [error(
                "the kernel died while running this cell (os._exit, a crash, or it ignored "
                "the interrupt at the time limit and was killed)")]
            return cell, resources
        except CellTimeoutError:  # still running after the interrupt: it ignores SIGINT
            kill_kernel(self)
            self._lab_stopped = f"not run: cell {name} ran past the {limit} s limit, which stopped the run"
            cell.outputs = list(cell.get("outputs", [])) + [error(
                f"the cell ran past the {limit} s limit and ignored the interrupt: its kernel was killed",
                "CellTimeoutError")]
            return cell, resources
        finally:
            if timer:
                timer.cancel()

    def preprocess_cell(self: Any, cell: Any, resources: Any, index: int) -> Any:
        if cell.cell_type != "code":
            return original(self, cell, resources, index)
        meta = cell.get("metadata", {}).get("nbgrader", {})
        name = meta.get("grade_id") or f"#{index}"
        stopped = getattr(self, "_lab_stopped", None)
        started = time.monotonic()
        if stopped:
            cell.outputs = [error(stopped, "NotRun")]
        else:
            cell, resources = run(self, cell, resources, index, name)
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        _progress({"cell": name, "test": bool(meta.get("grade")) and not meta.get("solution"),
                   "error": str(errors[-1].get("ename")) if errors else None,
                   "seconds": round(time.monotonic() - started, 3), "run": not stopped})
        return cell, resources

    Execute.preprocess_cell = preprocess_cell


class Steps:
    """nbgrader's three converters over one course, as ``nbgrader.apps.NbGraderAPI`` runs them.

    The same calls (a converter with the course's configuration, started under
    ``capture_log``, which turns any failure into ``{"success": False, "error", "log"}``),
    without importing the API's exchange, authenticator and every command-line app.
    """

    def __init__(self, root: Path, cell_timeout: int | None):
        from nbgrader.coursedir import CourseDirectory
        from traitlets.config import Config
        from traitlets.config.loader import PyFileConfigLoader

        config = Config()
        config.merge(PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config())
        config.CourseDirectory.root = str(root)
        # nbgrader makes what it writes read-only (mode 444) unless the course is group-shared;
        # the grader then edits the autograded notebook (grader.guard), which only root may do
        # to a read-only file. The scratch course is private to this run, so owner-writable is safe.
        config.BaseConverter.permissions = 644
        # Once the last cell has run, every output is in; the kernel is killed, not asked to
        # stop. A graceful stop runs learner atexit code after the tests, and its exit often
        # hung until jupyter_client's fallback signal (half of shutdown_wait_time, 2.5 s).
        config.Execute.shutdown_kernel = "immediate"
        if cell_timeout is not None:
            config.ExecutePreprocessor.timeout = cell_timeout
            config.Execute.timeout = cell_timeout
        self.config = config
        self.coursedir = CourseDirectory(config=config)

    def _run(self, converter: type, assignment: str, student: str | None = None, **flags: Any) -> dict[str, Any]:
        from nbgrader.utils import capture_log, temp_attrs

        ids = {"assignment_id": assignment} | ({"student_id": student} if student else {})
        with temp_attrs(self.coursedir, **ids):
            app = converter(coursedir=self.coursedir, config=self.config)
            for name, value in flags.items():
                setattr(app, name, value)
            return capture_log(app)

    def generate_assignment(self, assignment: str) -> dict[str, Any]:
        from nbgrader.converters.generate_assignment import GenerateAssignment

        return self._run(GenerateAssignment, assignment, force=True, create_assignment=True)

    def autograde(self, assignment: str, student: str) -> dict[str, Any]:
        from nbgrader.converters.autograde import Autograde

        return self._run(Autograde, assignment, student, force=True, create_student=True)


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


def _apply_guard(api: Any, root: Path, assignment: str, student: str, token: str) -> dict[str, Any]:
    """Zero every test whose cell did not print this run's ``ok`` line (see ``grader.guard``).

    The gradebook is corrected, so the scores read back agree; the guard's lines and the hidden
    tests are removed from the autograded notebooks (after the learner's own lines in the
    tracebacks have been read, ``grader.tracebacks``).
    """
    from nbgrader.api import Gradebook

    from grader.guard import conceal_hidden_tests, read_verdicts, truncate_outputs
    from grader.tracebacks import learner_lines

    verdicts: dict[str, Any] = {}
    folder = root / "autograded" / student / assignment
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        for path in sorted(folder.glob("*.ipynb")):
            content = json.loads(path.read_text(encoding="utf-8"))
            finished, refused, threads = read_verdicts(content, token)
            lines = learner_lines(content)  # before the hidden tests' tracebacks are concealed
            truncate_outputs(content)
            conceal_hidden_tests(content)
            path.write_text(json.dumps(content, indent=1), encoding="utf-8")
            submitted = gb.find_submission_notebook(path.stem, assignment, student)
            for grade in submitted.grades:
                if not finished.get(grade.name, False) and (grade.auto_score or 0) > 0:
                    grade.auto_score = 0.0
            gb.db.commit()
            verdicts[path.stem] = {"finished": finished, "refused": refused, "lines": lines, "threads": threads}
    return verdicts


def _unsynced_sqlite() -> None:
    """Open every SQLite database of this process with ``synchronous=OFF``.

    The gradebook lives in the scratch course and is deleted with it, so waiting for each of
    nbgrader's many commits to reach the disk (an fsync each) buys nothing; on a busy machine
    those waits were the larger part of building the gradebook.
    """
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _no_fsync(connection: Any, _record: Any) -> None:
        if type(connection).__module__.startswith("sqlite3"):
            cursor = connection.cursor()
            cursor.execute("PRAGMA synchronous=OFF")
            cursor.close()


def _generate(api: Any, root: Path, assignment: str, cache: Path | None, record: dict[str, Any]) -> dict[str, Any]:
    """nbgrader's ``generate_assignment``, or its cached result (``grader.generated``).

    The source's test cells hold the guard's ``TOKEN_SLOT``; this run's token (``LAB_GUARD_TOKEN``)
    replaces it in the gradebook afterwards. With a cache, the generated gradebook and release
    are kept under a hash of the source and, on a later run with the same source, copied back
    instead of generated. Runs before any learner code, so nothing a notebook does can reach
    the cache.
    """
    from grader import generated

    token = os.environ.get("LAB_GUARD_TOKEN")
    if not token:  # a release: the source is not instrumented, there is no token to put in
        return api.generate_assignment(assignment)
    key = generated.source_key(root, assignment) if cache is not None else None
    if cache is not None and key is not None and generated.restore(cache, key, root, assignment):
        record["generated"] = "from the cache"
    else:
        outcome = api.generate_assignment(assignment)
        if not outcome.get("success"):
            return outcome
        if cache is not None and key is not None:
            generated.store(cache, key, root, assignment)
        record["generated"] = "generated" + (", and stored in the cache" if cache is not None else "")
    try:
        generated.personalise(api.coursedir.db_url, api.coursedir.course_id, assignment, token)
    except generated.PersonaliseError as exc:
        return {"success": False, "error": f"PersonaliseError: {exc}", "log": ""}
    return {"success": True}


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
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep/reuse generated assignments here (see grader.generated); the source's "
                             "test cells must hold guard.TOKEN_SLOT, and LAB_GUARD_TOKEN is put in its place")
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")  # SQLAlchemy and Jupyter deprecation chatter
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown steps {unknown}; expected some of {STEPS}")
    if args.student is None and set(steps) - {"generate"}:
        parser.error("--student is needed to autograde")

    _skip_slow_optional_imports()
    _lean_nbgrader()
    _read_schema_version_in_process()
    _stop_at_first_timeout()
    _unsynced_sqlite()
    root = args.root.resolve()
    api = Steps(root, args.cell_timeout)
    record: dict[str, Any] = {"completed": [], "failed": None, "seconds": {}}

    def save() -> None:
        args.result.write_text(json.dumps(record))

    save()
    for assignment in args.assignment:
        for step in steps:
            started = time.monotonic()
            if step == "generate":
                outcome = _generate(api, root, assignment, args.cache, record)
            elif step == "autograde":
                outcome = api.autograde(assignment, args.student)
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
                token = os.environ.get("LAB_GUARD_TOKEN")
                if token:
                    record["guard"] = _apply_guard(api, root, assignment, args.student, token)
                record["grades"] = _grades(api, assignment, args.student)
            record["completed"].append(f"{assignment}:{step}")
            record["seconds"][f"{assignment}:{step}"] = round(time.monotonic() - started, 3)
            save()
    return 0


if __name__ == "__main__":
    status = main()
    # Everything is on disk (the record, the gradebook, the notebooks) and the kernel is shut
    # down; the interpreter's own teardown of nbgrader's thousand modules only costs time.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
