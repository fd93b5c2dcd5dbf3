"""Command line. Learners: ``start NN`` (their own copy of an assignment), ``check NOTEBOOK``,
``list``, and ``progress --export FILE`` (best scores for the site's practice page).
Instructors: ``release``, ``collect DIR``, ``autograde``, ``feedback`` and ``export``
(grader/instructor.py).

Exit status (also in every command's ``--help``):

* 0: done: the notebook was graded (whatever the score), the copy or the release was written;
* 2: the input cannot be graded (missing file, not a notebook, unknown or wrong assignment)
  or the command line is wrong; one line on stderr says which;
* 3: grading or releasing did not complete (time budget reached, nbgrader failed, or a
  release would leak solutions); the report (if any) still shows what is known;
* 130: interrupted (Ctrl-C or SIGTERM); nothing of the run is left running.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .check import DEFAULT_TIMEOUT, grade
from .course import Course, InputProblem
from .instructor import (
    DEFAULT_WORKSPACE,
    autograde,
    collect,
    cores,
    submissions,
    export,
    write_feedback,
)
from .release import DEFAULT_TIMEOUT as RELEASE_TIMEOUT
from .release import ReleaseFailed, ReleaseLeak, release_all, start
from .report import render_table
from .sandbox import DEFAULT_MEMORY_MB, sandbox_problem
from .scores import read_scores, record_result, render_list, write_progress_export
from .watch import DEFAULT_POLL, watch

EXIT_OK, EXIT_INPUT, EXIT_INCOMPLETE = 0, 2, 3


EXIT_CODES = """exit status:
  0    done (a notebook graded, whatever its score; a copy or a release written)
  2    bad input or command line: one line on stderr says what (file, assignment, option)
  3    did not complete (time budget reached, nbgrader failed, a release would leak solutions)
  130  interrupted (Ctrl-C or SIGTERM)"""


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default in its help (unless the help already says it), and the exit codes
    kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


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
        help="time budget of the whole check, in seconds (over all its devices); past it the run stops and "
             "the tests not reached score 0",
    )
    command.add_argument(
        "--cell-timeout", type=_count, default=None, metavar="SECONDS",
        help="limit on each cell, in seconds; the first cell past it stops the run "
             "(default: the course's, 60 s, in exercises/nbgrader_config.py)",
    )
    command.add_argument(
        "--memory-mb", type=int, default=DEFAULT_MEMORY_MB, metavar="MIB",
        help="address-space limit of the grading process in MiB (0: none)",
    )
    command.add_argument(
        "--trusted", action="store_true",
        help="run the notebooks even where the learner's code cannot be sandboxed (not root, and no "
             "bubblewrap or user namespaces): the code then runs as you and may read and change your "
             "files. Only for notebooks you trust, such as your own",
    )


def _prog() -> str:
    """The command as the user typed it, for usage lines: the ``dl-lab-grader`` console script
    (pyproject.toml) or ``python -m grader``."""
    return "dl-lab-grader" if Path(sys.argv[0]).name == "dl-lab-grader" else "python -m grader"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_prog(), formatter_class=_Help, epilog=EXIT_CODES,
        description="Grade lab notebooks against their hidden tests, and release learner versions.\n\n"
                    "A learner: `start 01` copies exercise 01 into work/, `check NOTEBOOK` grades it, "
                    "`list` shows your scores.",
    )
    parser.add_argument(
        "--course", type=Path, default=None, metavar="DIR",
        help="the nbgrader course root (default: exercises/ of this checkout)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=summary, description=description, epilog=EXIT_CODES,
                                   formatter_class=_Help)

    start = command("start", "copy an assignment's learner notebook into your work folder",
                    "Copy the learner version of each ASSIGNMENT to WORK/<assignment>/<notebook>.ipynb. "
                    "A notebook already there is never overwritten: it is your work.")
    start.add_argument("assignments", nargs="+", metavar="ASSIGNMENT",
                       help="which ones: 01, 1, 01_ring_allreduce or ring_allreduce (several may be given)")
    start.add_argument("--dir", type=Path, default=Path("work"), metavar="WORK",
                       help="your work folder (relative to the current directory)")

    check = command("check", "grade a notebook: score table, per-test hints, feedback page",
                    "Grade NOTEBOOK against its assignment's visible and hidden tests. Progress is shown "
                    "on stderr as each test runs; the report goes to stdout.")
    check.add_argument("notebook", type=Path, metavar="NOTEBOOK", help="the .ipynb file to grade")
    check.add_argument("--assignment", default=None, metavar="NAME",
                       help="the assignment the notebook answers, for a notebook without lab.assignment "
                            "metadata (default: from its metadata, else its file name)")
    check.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    check.add_argument("--verbose", action="store_true",
                       help="also show what the sandbox enforced (limits, network, processes, files)")
    check.add_argument(
        "--feedback-dir", type=Path, default=Path("grader-feedback"), metavar="DIR",
        help="where the feedback page and the score book go (relative to the current directory)",
    )
    _limits(check)
    check.add_argument("--watch", action="store_true", help="grade again every time NOTEBOOK is saved")
    check.add_argument("--max-runs", type=_count, default=None, metavar="N",
                       help="with --watch: stop after N grading runs (default: until Ctrl-C)")
    check.add_argument("--poll", type=_positive, default=DEFAULT_POLL, metavar="SECONDS",
                       help="with --watch: how often to look for a save, in seconds")
    check.add_argument("--device", choices=("cpu", "gpu", "torch", "strict"), default=None,
                       help="the array namespace the tests run on: cpu (NumPy), gpu (CuPy, else PyTorch on "
                            "CUDA; needs a GPU), torch (PyTorch tensors on the CPU) or strict (array_api_strict: "
                            "only the array API standard); the assignment must list "
                            "it in its lab.devices (default: cpu, and strict as well for an assignment whose "
                            "code must be array-API code)")

    listing = command("list", "every assignment with your best and latest score",
                      "Show every assignment of the course with the best and the latest score of `check`.")
    listing.add_argument("--feedback-dir", type=Path, default=Path("grader-feedback"), metavar="DIR",
                         help="where `check` recorded the scores")
    progress = command("progress", "export your best scores for the site's practice page",
                       "Write FILE: the best score of every assignment you have checked, as JSON (format "
                       "dl-lab-grader-scores, version 1) that the practice page's dashboard imports.")
    progress.add_argument("--export", type=Path, required=True, metavar="FILE", help="the JSON file to write")
    progress.add_argument("--feedback-dir", type=Path, default=Path("grader-feedback"), metavar="DIR",
                          help="where `check` recorded the scores")

    def workspace(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE, metavar="DIR",
                         help="the class workspace (relative to the current directory)")

    collect_cmd = command("collect", "copy a folder of submissions into the class workspace",
                          "Collect DIR/<student>.ipynb, DIR/<student>/<notebook>.ipynb and nbgrader's "
                          "DIR/<student>/<assignment>/<notebook>.ipynb into the workspace (an nbgrader course "
                          "directory), as submitted/<student>/<assignment>/<notebook>.ipynb. A notebook whose "
                          "assignment cannot be told is left out and reported.")
    collect_cmd.add_argument("folder", type=Path, metavar="DIR", help="the folder of submissions")
    workspace(collect_cmd)
    autograde_cmd = command("autograde", "grade every collected submission, one process per core",
                            "Grade the collected submissions in parallel, each in a worker process of its own; "
                            "a bad one (or a worker that crashes) never stops the rest. Scores go to "
                            "results/ and to nbgrader's gradebook (gradebook.db), where nbgrader's formgrader "
                            "and `nbgrader export` find them. Shows a progress bar with the time left.")
    workspace(autograde_cmd)
    autograde_cmd.add_argument("--jobs", type=_count, default=None, metavar="N",
                               help=f"submissions graded at once (default: one per core, here {cores()})")
    _limits(autograde_cmd)
    feedback_cmd = command("feedback", "write an HTML feedback page per student",
                           "Write workspace/feedback/<student>.html from the grading records.")
    workspace(feedback_cmd)
    export_cmd = command("export", "write the scores as CSV and JSON",
                         "Write workspace/scores.csv and scores.json from the grading records.")
    workspace(export_cmd)

    release = command("release", "write the learner version of every assignment (instructors)",
                      "Generate the learner notebooks (no solutions, no hidden tests). A notebook in OUT that "
                      "was edited since it was released is kept as it is and reported, never overwritten.")
    release.add_argument("--out", type=Path, default=None, metavar="DIR",
                         help="output folder (default: exercises/release/ of the course)")
    release.add_argument("--timeout", type=_positive, default=RELEASE_TIMEOUT, metavar="SECONDS",
                         help="limit on nbgrader's generate step, in seconds")
    return parser


def _fail(message: str, status: int) -> int:
    print(f"grader: {message}", file=sys.stderr)
    return status


def _show_progress(event: dict) -> None:
    """One line on stderr per test (and per failing cell of the learner's) as soon as it has run."""
    if "device" in event:
        print(f"on {event['device']}:", file=sys.stderr, flush=True)
    elif not event.get("run"):  # an earlier cell stopped the run: its report says so, once
        return
    elif event.get("test") or event.get("error"):
        word = f"error ({event['error']})" if event.get("error") else "ran"
        kind = "test" if event.get("test") else "cell"
        print(f"  {kind} {event['cell']}: {word}, {event['seconds']:.2f} s", file=sys.stderr, flush=True)


def _untrusted_refused(args: argparse.Namespace) -> str | None:
    """Why learners' code may not run here, unless ``--trusted`` (None: it may)."""
    problem = sandbox_problem()
    if problem is None or args.trusted:
        return None
    return (f"refusing to run notebooks without a sandbox: {problem}. Pass --trusted to run them anyway "
            "(their code then runs as you, with your files)")


def _check(args: argparse.Namespace) -> int:
    if args.max_runs is not None and not args.watch:
        return _fail("--max-runs only makes sense with --watch", EXIT_INPUT)
    if refused := _untrusted_refused(args):
        return _fail(refused, EXIT_INPUT)
    course = Course.at(args.course)
    status = EXIT_OK

    def grade_once() -> None:
        nonlocal status
        result = grade(
            args.notebook,
            course=course,
            feedback_dir=args.feedback_dir,
            devices=[args.device] if args.device else None,
            assignment_name=args.assignment,
            timeout=args.timeout,
            cell_timeout=args.cell_timeout,
            memory_mb=args.memory_mb,
            progress=_show_progress,
        )
        record_result(args.feedback_dir, result)
        if args.json:
            print(result.to_json(), flush=True)
        else:
            print(render_table(result, verbose=args.verbose))
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


def _start(args: argparse.Namespace) -> int:
    course = Course.at(args.course)
    try:
        done = start(course, args.assignments, args.dir)
    except ReleaseLeak as exc:
        return _fail(f"refused, the learner version would leak: {exc}", EXIT_INCOMPLETE)
    except ReleaseFailed as exc:
        return _fail(f"could not make the learner version: {exc}", EXIT_INCOMPLETE)
    for path in done.written:
        print(f"{path}: your copy; open it with: .venv/bin/jupyter lab {path}")
    for path in done.kept:
        print(f"{path}: already there, kept as it is (your work is never overwritten)")
    notebook = (done.written or done.kept)[0]
    print(f"grade your work with: .venv/bin/python -m grader check {notebook}")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    print(render_list(Course.at(args.course), read_scores(args.feedback_dir)))
    return EXIT_OK


def _progress(args: argparse.Namespace) -> int:
    path, count = write_progress_export(args.feedback_dir, args.export)
    print(f"{path}: best scores of {count} assignments; import it on the practice page (Your progress)")
    return EXIT_OK


def _collect(args: argparse.Namespace) -> int:
    collected, skipped = collect(args.folder, Course.at(args.course), args.workspace)
    for path, why in skipped:
        print(f"left out: {why}", file=sys.stderr)
    students = {s.student for s in collected}
    print(f"collected {len(collected)} notebooks of {len(students)} students into {args.workspace / 'submitted'}"
          + (f"; {len(skipped)} left out (above)" if skipped else ""))
    return EXIT_OK


class _Progress:
    """What ``autograde`` shows as each submission is graded: its line and how far the class is.

    On a terminal, tqdm's bar (done, total, elapsed and the estimated time left) on stderr,
    with each submission's line printed above it; otherwise (a log, a pipe) no bar is
    redrawn: each submission's line starts with the same counts, ``[3/10, 0:42 elapsed, ETA 1:38]``.
    """

    def __init__(self, total: int, stream: Any = None):
        from tqdm import tqdm

        self.total, self.done, self.start = total, 0, time.monotonic()
        self.format_interval = tqdm.format_interval
        stream = stream or sys.stderr
        self.bar = tqdm(total=total, unit="notebook", desc="autograde", file=stream) if stream.isatty() else None

    def __call__(self, r: dict) -> None:
        self.done += 1
        why = f"  ({r['error']})" if r.get("error") else ""
        line = (f"{r['student']}/{r['assignment'] or '?'}/{r['submission']}: {r['status']} "
                f"{r['score']:g}/{r['max_score']:g}{why}")
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
            self.bar.update()
            return
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * (self.total - self.done)
        print(f"[{self.done}/{self.total}, {self.format_interval(elapsed)} elapsed, "
              f"ETA {self.format_interval(left)}] {line}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _autograde(args: argparse.Namespace) -> int:
    if args.cell_timeout is not None and args.cell_timeout <= 0:
        return _fail(f"--cell-timeout must be a positive number of seconds, got {args.cell_timeout}", EXIT_INPUT)
    if refused := _untrusted_refused(args):
        return _fail(refused, EXIT_INPUT)
    course = Course.at(args.course)
    progress = _Progress(len(submissions(args.workspace)))
    try:
        records = autograde(args.workspace, course, jobs=args.jobs, timeout=args.timeout,
                            cell_timeout=args.cell_timeout, memory_mb=args.memory_mb, on_record=progress)
    finally:
        progress.close()
    graded = sum(1 for r in records if r["status"] == "graded")
    print(f"graded {graded} of {len(records)} submissions completely; records in {args.workspace / 'results'}, "
          f"scores in the gradebook {args.workspace / 'gradebook.db'}")
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
        done = release_all(course, out, timeout=args.timeout)
    except ReleaseLeak as exc:
        return _fail(f"release refused, it would leak: {exc}", EXIT_INCOMPLETE)
    except ReleaseFailed as exc:
        return _fail(f"release failed: {exc}", EXIT_INCOMPLETE)
    for path in done.written:
        print(path)
    for path in done.kept:
        print(f"{path}: kept as it is: edited since it was released (move it away to get the new version)",
              file=sys.stderr)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (a closed terminal, `kill`, a CI timeout) unwinds like Ctrl-C, so the sandbox
    # kills the grading child on the way out instead of leaving it running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        commands = {"start": _start, "check": _check, "release": _release, "list": _list, "progress": _progress,
                    "collect": _collect,
                    "autograde": _autograde, "feedback": _feedback, "export": _export}
        return commands[args.command](args)
    except InputProblem as exc:
        return _fail(str(exc), EXIT_INPUT)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
