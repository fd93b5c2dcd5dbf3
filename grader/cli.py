"""Command line: ``python -m grader check NOTEBOOK`` and ``list`` for learners; ``release``,
``collect DIR``, ``autograde``, ``feedback`` and ``export`` for instructors (grader/instructor.py).

Exit status:

* 0: the notebook was graded (whatever the score), or the release was written;
* 2: the input cannot be graded (missing file, not a notebook, unknown assignment) or the
  command line is wrong; one line on stderr says which;
* 3: grading or releasing did not complete (wall-clock limit reached, nbgrader failed, or a
  release would leak solutions); the report (if any) still shows what is known.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from .check import DEFAULT_TIMEOUT, check_notebook
from .course import Course, InputProblem, load_notebook, repo_root
from .hints import failed_with_hints, written_hints
from .instructor import (
    DEFAULT_WORKSPACE,
    autograde,
    collect,
    cores,
    export,
    write_feedback,
)
from .release import DEFAULT_TIMEOUT as RELEASE_TIMEOUT
from .release import ReleaseFailed, ReleaseLeak, release_all
from .sandbox import DEFAULT_MEMORY_MB
from .scores import read_scores, record_result, render_list
from .watch import DEFAULT_POLL, watch

EXIT_OK, EXIT_INPUT, EXIT_INCOMPLETE = 0, 2, 3


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text}")
    return value


def _limits(command: argparse.ArgumentParser) -> None:
    """The sandbox limits shared by ``check`` and ``autograde``."""
    command.add_argument(
        "--timeout", type=_positive, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"wall-clock limit on the whole grading run (default: {DEFAULT_TIMEOUT:g})",
    )
    command.add_argument(
        "--cell-timeout", type=int, default=None, metavar="SECONDS",
        help="limit on each cell of the notebook (default: the course's, 60 s)",
    )
    command.add_argument(
        "--memory-mb", type=int, default=DEFAULT_MEMORY_MB, metavar="MIB",
        help=f"address-space limit of the grading process (default: {DEFAULT_MEMORY_MB}; 0: none)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m grader",
        description="Grade lab notebooks against their hidden tests, and release learner versions.",
    )
    parser.add_argument(
        "--course", type=Path, default=None,
        help="the nbgrader course root (default: exercises/ of this checkout)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check", help="grade a notebook: score table, per-test hints, feedback HTML",
        description="Grade NOTEBOOK against its assignment's visible and hidden tests.",
    )
    check.add_argument("notebook", type=Path, metavar="NOTEBOOK")
    check.add_argument("--json", action="store_true", help="print the result as JSON")
    check.add_argument(
        "--feedback-dir", type=Path, default=Path("grader-feedback"),
        help="where the feedback HTML goes (default: grader-feedback/ in the current directory)",
    )
    _limits(check)
    check.add_argument("--watch", action="store_true", help="grade again every time NOTEBOOK is saved")
    check.add_argument("--max-runs", type=_count, default=None, metavar="N",
                       help="with --watch: stop after N grading runs (default: until Ctrl-C)")
    check.add_argument("--poll", type=_positive, default=DEFAULT_POLL, metavar="SECONDS",
                       help=f"with --watch: how often to look for a save (default: {DEFAULT_POLL:g})")
    check.add_argument("--device", choices=("cpu", "gpu", "strict"), default="cpu",
                       help="the array namespace the tests run on: cpu (NumPy), gpu (CuPy, needs a GPU) "
                            "or strict (array_api_strict: only the array API standard); the assignment "
                            "must list it in its lab.devices (default: cpu)")

    listing = commands.add_parser(
        "list", help="every assignment with your latest score",
        description="Show every assignment of the course with the latest score of `check`.",
    )
    listing.add_argument("--feedback-dir", type=Path, default=Path("grader-feedback"),
                         help="where `check` recorded the scores (default: grader-feedback/)")

    def workspace(command: argparse.ArgumentParser) -> None:
        command.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE,
                             help=f"the class workspace (default: {DEFAULT_WORKSPACE}/ in the current directory)")

    collect_cmd = commands.add_parser(
        "collect", help="copy a folder of submissions into the class workspace",
        description="Collect DIR/<student>.ipynb and DIR/<student>/<notebook>.ipynb into the workspace.",
    )
    collect_cmd.add_argument("folder", type=Path, metavar="DIR")
    workspace(collect_cmd)
    autograde_cmd = commands.add_parser(
        "autograde", help="grade every collected submission, one process per core",
        description="Grade the collected submissions in parallel; a bad one never stops the rest.",
    )
    workspace(autograde_cmd)
    autograde_cmd.add_argument("--jobs", type=_count, default=None, metavar="N",
                               help=f"submissions graded at once (default: one per core, here {cores()})")
    _limits(autograde_cmd)
    feedback_cmd = commands.add_parser("feedback", help="write an HTML feedback page per student")
    workspace(feedback_cmd)
    export_cmd = commands.add_parser("export", help="write the scores as CSV and JSON")
    workspace(export_cmd)

    release = commands.add_parser(
        "release", help="write the learner version of every assignment",
        description="Generate the learner notebooks (no solutions, no hidden tests).",
    )
    release.add_argument(
        "--out", type=Path, default=None,
        help="output folder (default: exercises/release/)",
    )
    release.add_argument("--timeout", type=_positive, default=RELEASE_TIMEOUT, metavar="SECONDS")
    return parser


def _fail(message: str, status: int) -> int:
    print(f"grader: {message}", file=sys.stderr)
    return status


def _check(args: argparse.Namespace) -> int:
    if args.cell_timeout is not None and args.cell_timeout <= 0:
        return _fail(f"--cell-timeout must be a positive number of seconds, got {args.cell_timeout}", EXIT_INPUT)
    if args.max_runs is not None and not args.watch:
        return _fail("--max-runs only makes sense with --watch", EXIT_INPUT)
    course = Course.at(args.course)
    status = EXIT_OK

    def grade_once() -> None:
        nonlocal status
        result = check_notebook(
            args.notebook,
            course=course,
            feedback_dir=args.feedback_dir,
            timeout=args.timeout,
            cell_timeout=args.cell_timeout,
            memory_mb=args.memory_mb,
            device=args.device,
        )
        record_result(args.feedback_dir, result)
        concept = _concept_page(args.notebook)
        data = json.loads(result.to_json())
        hints = failed_with_hints(data["tests"], written_hints(course, result.assignment))
        if args.json:
            data["concept_page"] = concept
            data["written_hints"] = hints
            print(json.dumps(data, indent=2), flush=True)
        else:
            print(result.to_table())
            if hints:
                print("Hints from the instructor:")
                for test_id, hint in hints.items():
                    print(f"  - {test_id}: {hint}")
            if concept:
                print(f"Read more: {concept}")
            print(flush=True)
        status = EXIT_OK
        if not result.completed:
            status = _fail(f"{args.notebook}: grading did not complete: {result.error}", EXIT_INCOMPLETE)

    def grade_while_watching() -> None:
        nonlocal status
        try:
            grade_once()
        except InputProblem as exc:  # e.g. saved half-way: say so and wait for the next save
            status = _fail(str(exc), EXIT_INPUT)

    if args.watch:
        watch(args.notebook, grade_while_watching, max_runs=args.max_runs, poll=args.poll,
              announce=lambda line: print(line, file=sys.stderr, flush=True))
    else:
        grade_once()
    return status


def _concept_page(notebook: Path) -> str | None:
    """Where to read about the assignment: its ``lab.concept_page`` (a page of docs/), or None."""
    try:
        lab = load_notebook(notebook).get("metadata", {}).get("lab", {})
    except InputProblem:
        return None
    page = lab.get("concept_page") if isinstance(lab, dict) else None
    if not isinstance(page, str) or not page:
        return None
    local = repo_root() / "docs" / page
    site = page[:-3] + "/" if page.endswith(".md") else page
    return f"{local} (on the site: {site})" if local.is_file() else f"the site's page {site}"


def _list(args: argparse.Namespace) -> int:
    print(render_list(Course.at(args.course), read_scores(args.feedback_dir)))
    return EXIT_OK


def _collect(args: argparse.Namespace) -> int:
    collected = collect(args.folder, args.workspace)
    students = {s.student for s in collected}
    print(f"collected {len(collected)} notebooks of {len(students)} students into {args.workspace / 'submitted'}")
    return EXIT_OK


def _autograde(args: argparse.Namespace) -> int:
    if args.cell_timeout is not None and args.cell_timeout <= 0:
        return _fail(f"--cell-timeout must be a positive number of seconds, got {args.cell_timeout}", EXIT_INPUT)
    course = Course.at(args.course)

    def show(r: dict) -> None:
        why = f"  ({r['error']})" if r.get("error") else ""
        print(f"{r['student']}/{r['submission']}: {r['status']} {r['score']:g}/{r['max_score']:g}{why}", flush=True)

    records = autograde(args.workspace, course, jobs=args.jobs, timeout=args.timeout,
                        cell_timeout=args.cell_timeout, memory_mb=args.memory_mb, on_record=show)
    graded = sum(1 for r in records if r["status"] == "graded")
    print(f"graded {graded} of {len(records)} submissions completely; records in {args.workspace / 'results'}")
    return EXIT_OK


def _feedback(args: argparse.Namespace) -> int:
    for page in write_feedback(args.workspace):
        print(page)
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    for path in export(args.workspace):
        print(path)
    return EXIT_OK


def _release(args: argparse.Namespace) -> int:
    course = Course.at(args.course)
    out = args.out if args.out is not None else course.root / "release"
    try:
        written = release_all(course, out, timeout=args.timeout)
    except ReleaseLeak as exc:
        return _fail(f"release refused, it would leak: {exc}", EXIT_INCOMPLETE)
    except ReleaseFailed as exc:
        return _fail(f"release failed: {exc}", EXIT_INCOMPLETE)
    for path in written:
        print(path)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (a closed terminal, `kill`, a CI timeout) unwinds like Ctrl-C, so the sandbox
    # kills the grading child on the way out instead of leaving it running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        commands = {"check": _check, "release": _release, "list": _list, "collect": _collect,
                    "autograde": _autograde, "feedback": _feedback, "export": _export}
        return commands[args.command](args)
    except InputProblem as exc:
        return _fail(str(exc), EXIT_INPUT)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
