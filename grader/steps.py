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
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

STEPS = ("generate", "autograde", "feedback")


def _skip_slow_optional_imports() -> None:
    """Keep ``jsonschema`` from importing ``rfc3987_syntax`` (2-3 s, a grammar built at import).

    nbformat validates notebooks with jsonschema, which loads that package only to check
    strings declared with the ``iri`` format; the notebook schema declares none, and
    jsonschema skips the check when the import fails, which this makes it do.
    """
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]


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


KILL_GRACE_S = 5  # after the per-cell limit and the interrupt, how long a cell may still run


def _survive_kernel_death() -> None:
    """Let autograde outlive a kernel that dies or ignores interrupts, keeping earlier grades.

    nbgrader gives up on the whole notebook when the kernel dies (``os._exit`` in a cell, a
    crash, a kill for a limit): every test, even those that passed before, would score 0.
    Here a cell that kills the kernel gets that as its error, and the cells after it are
    marked "not run", so the tests that ran keep their results. A cell still running
    ``KILL_GRACE_S`` after its time limit (it ignored the interrupt) has its kernel killed,
    and is then handled the same way.
    """
    import signal
    import threading

    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from nbformat.notebooknode import NotebookNode
    from nbgrader.preprocessors.execute import Execute

    original = Execute.preprocess_cell

    def error(value: str) -> NotebookNode:
        return NotebookNode(output_type="error", ename="DeadKernelError", evalue=value,
                            traceback=[f"DeadKernelError: {value}"])

    def kill_kernel(preprocessor: Any) -> None:
        pid = getattr(getattr(preprocessor.km, "provisioner", None), "pid", None)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def preprocess_cell(self: Any, cell: Any, resources: Any, index: int) -> Any:
        if cell.cell_type != "code":
            return original(self, cell, resources, index)
        if getattr(self, "_lab_dead", False):
            cell.outputs = [error("not run: the kernel died in an earlier cell")]
            return cell, resources
        limit = self._get_timeout(cell)
        timer = threading.Timer(limit + KILL_GRACE_S, kill_kernel, (self,)) if limit else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            return original(self, cell, resources, index)
        except DeadKernelError:
            self._lab_dead = True
            cell.outputs = list(cell.get("outputs", [])) + [error(
                "the kernel died while running this cell (os._exit, a crash, or it ignored "
                "the interrupt at the time limit and was killed)")]
            return cell, resources
        except CellTimeoutError:  # still running after the interrupt: it ignores SIGINT
            kill_kernel(self)
            self._lab_dead = True
            cell.outputs = list(cell.get("outputs", [])) + [error(
                f"the cell ran past the {limit} s limit and ignored the interrupt: its kernel was killed")]
            return cell, resources
        finally:
            if timer:
                timer.cancel()

    Execute.preprocess_cell = preprocess_cell


def _feedback_exporter() -> type:
    """nbconvert's HTML exporter without its last pass, for the feedback pages.

    After templating, nbconvert re-parses the whole page (~280 kB, bootstrap inlined) with
    BeautifulSoup only to add alt texts to images and tab stops to cells: about a second
    per notebook, the largest single cost of a check after the notebook itself. The page
    is the same without it (the feedback shows no images of its own).
    """
    from nbconvert.exporters import HTMLExporter
    from nbconvert.exporters.templateexporter import TemplateExporter
    from nbconvert.filters.highlight import Highlight2HTML
    from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

    class FeedbackExporter(HTMLExporter):
        def from_notebook_node(self, nb: Any, resources: Any = None, **kw: Any) -> Any:
            language = nb.metadata.get("language_info", {})
            lexer = language.get("pygments_lexer", language.get("name"))
            resources = self._init_resources(resources)
            self.register_filter("highlight_code", self.filters.get(
                "highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self)))
            self.register_filter("filter_data_type", WidgetsDataTypeFilter(
                notebook_metadata=self._nb_metadata, parent=self, resources=resources))
            return TemplateExporter.from_notebook_node(self, nb, resources, **kw)

    return FeedbackExporter


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
    config.GenerateFeedback.exporter_class = _feedback_exporter()
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


def _apply_guard(api: Any, root: Path, assignment: str, student: str, token: str) -> dict[str, Any]:
    """Zero every test whose cell did not print this run's ``ok`` line (see ``grader.guard``).

    The gradebook is corrected, so the scores read back and the feedback agree; the guard's
    lines and the hidden tests are removed from the autograded notebooks the feedback is made
    from.
    """
    from nbgrader.api import Gradebook

    from grader.guard import conceal_hidden_tests, read_verdicts, truncate_outputs

    verdicts: dict[str, Any] = {}
    folder = root / "autograded" / student / assignment
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        for path in sorted(folder.glob("*.ipynb")):
            content = json.loads(path.read_text(encoding="utf-8"))
            finished, refused = read_verdicts(content, token)
            truncate_outputs(content)
            conceal_hidden_tests(content)
            path.write_text(json.dumps(content, indent=1), encoding="utf-8")
            submitted = gb.find_submission_notebook(path.stem, assignment, student)
            for grade in submitted.grades:
                if not finished.get(grade.name, False) and (grade.auto_score or 0) > 0:
                    grade.auto_score = 0.0
            gb.db.commit()
            verdicts[path.stem] = {"finished": finished, "refused": refused}
    return verdicts


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

    _skip_slow_optional_imports()
    _read_schema_version_in_process()
    _survive_kernel_death()
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
                token = os.environ.get("LAB_GUARD_TOKEN")
                if token:
                    record["guard"] = _apply_guard(api, args.root.resolve(), assignment, args.student, token)
                record["grades"] = _grades(api, assignment, args.student)
            record["completed"].append(f"{assignment}:{step}")
            record["seconds"][f"{assignment}:{step}"] = round(time.monotonic() - started, 3)
            save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
