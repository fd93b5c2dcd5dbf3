"""Command line: ``python -m grader check NOTEBOOK`` for learners, ``release`` for instructors.

Exit status:

* 0: the notebook was graded (whatever the score), or the release was written;
* 2: the input cannot be graded (missing file, not a notebook, unknown assignment) or the
  command line is wrong; one line on stderr says which;
* 3: grading or releasing did not complete (wall-clock limit reached, nbgrader failed, or a
  release would leak solutions); the report (if any) still shows what is known.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .check import DEFAULT_TIMEOUT, check_notebook
from .course import Course, InputProblem
from .release import DEFAULT_TIMEOUT as RELEASE_TIMEOUT
from .release import ReleaseFailed, ReleaseLeak, release_all
from .sandbox import DEFAULT_MEMORY_MB

EXIT_OK, EXIT_INPUT, EXIT_INCOMPLETE = 0, 2, 3


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


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
    check.add_argument(
        "--timeout", type=_positive, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"wall-clock limit on the whole grading run (default: {DEFAULT_TIMEOUT:g})",
    )
    check.add_argument(
        "--cell-timeout", type=int, default=None, metavar="SECONDS",
        help="limit on each cell of the notebook (default: the course's, 60 s)",
    )
    check.add_argument(
        "--memory-mb", type=int, default=DEFAULT_MEMORY_MB, metavar="MIB",
        help=f"address-space limit of the grading process (default: {DEFAULT_MEMORY_MB}; 0: none)",
    )

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
    course = Course.at(args.course)
    result = check_notebook(
        args.notebook,
        course=course,
        feedback_dir=args.feedback_dir,
        timeout=args.timeout,
        cell_timeout=args.cell_timeout,
        memory_mb=args.memory_mb,
    )
    print(result.to_json() if args.json else result.to_table())
    if not result.completed:
        return _fail(f"{args.notebook}: grading did not complete: {result.error}", EXIT_INCOMPLETE)
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
    try:
        if args.command == "check":
            return _check(args)
        return _release(args)
    except InputProblem as exc:
        return _fail(str(exc), EXIT_INPUT)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
