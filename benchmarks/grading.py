"""Measured figures for the "How grading works" page: what grading costs on top of a notebook.

``python -m benchmarks grading`` measures two things, both with the solution
notebooks of the course (every test passes, so every cell runs to the end):

* **overhead per notebook**: for each assignment, the time to execute its notebook alone
  with ``nbclient`` (a fresh kernel, every cell, nothing else) against the time of
  ``python -m grader check`` on the same notebook (a fresh process: the sandbox, a scratch
  course, nbgrader's generate/autograde/feedback steps, the hidden tests and the report).
  The two are timed in turn, repeat by repeat, so both see the same machine state; the
  overhead is the difference of the medians. The benchmark uses a cache of generated
  assignments of its own (``grader.generated``, empty at the start): the first check of each
  assignment generates and stores it, and is timed on its own (``first_check_s``, what the
  first check after a change to the source costs); the repeats then find it, as a learner's
  later checks do.
* **class throughput**: a class of ``--submissions`` notebooks (the solutions, round-robin
  over the assignments) graded by ``grader.instructor.autograde`` with one job, then with
  one job per core, in notebooks per minute; every record must be completely graded with
  the score ``grader check`` gave the same notebook, or the benchmark fails (a fast grader
  that grades differently in parallel measures nothing). The scores are recorded too: a
  solution notebook below full marks shows on the page rather than being hidden.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import bench_parser, write_json
from .machine import machine_info

ROOT = Path(__file__).resolve().parents[1]  # benchmarks/ -> the repository


def course_notebooks() -> list[tuple[str, Path]]:
    """(assignment, solution notebook) for every assignment of the course."""
    from grader.course import Course

    course = Course.at(ROOT / "exercises")
    return [(a.name, a.notebooks[0]) for a in course.assignments]


def run_alone(notebook: Path) -> float:
    """Seconds to execute ``notebook`` with nbclient in a fresh kernel (kernel start included)."""
    import nbclient
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    return time.perf_counter() - t0


def run_check(notebook: Path, scratch: Path) -> tuple[float, float, float, dict[str, Any]]:
    """(seconds, score, max score, nbgrader steps) of ``python -m grader check NOTEBOOK --json``
    (a new process), on NumPy only: the notebook run alone it is compared with is one run too
    (an array-API assignment's default check runs it a second time, on array_api_strict)."""
    import json

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(notebook), "--json", "--device", "cpu",
                           "--feedback-dir", str(scratch / "feedback")],
                          cwd=scratch, capture_output=True, text=True, timeout=900, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"grader check {notebook} exited {proc.returncode}: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    return seconds, result["score"], result["max_score"], result.get("steps", {})


def overhead(repeats: int, scratch: Path) -> list[dict[str, Any]]:
    """Per assignment: the first check (it fills the cache), then the median seconds alone and
    through ``grader check``, timed in turn."""
    rows = []
    for assignment, notebook in course_notebooks():
        first_s, score, max_score, steps = run_check(notebook, scratch)
        alone, checked, scores = [], [], {(score, max_score)}
        for _ in range(repeats):
            alone.append(run_alone(notebook))
            seconds, score, max_score, steps = run_check(notebook, scratch)
            checked.append(seconds)
            scores.add((score, max_score))
        if len(scores) != 1:
            raise RuntimeError(f"grader check {notebook}: different scores on repeats: {sorted(scores)}")
        (score, max_score), = scores
        row = {"assignment": assignment, "repeats": repeats, "score": score, "max_score": max_score,
               "notebook_s": statistics.median(alone), "check_s": statistics.median(checked),
               "notebook_all_s": alone, "check_all_s": checked, "first_check_s": first_s,
               "generated": steps.get("generated"), "steps_s": steps.get("seconds", {})}
        row["overhead_s"] = row["check_s"] - row["notebook_s"]
        rows.append(row)
        print(f"{assignment}: notebook alone {row['notebook_s']:.2f} s, grader check {row['check_s']:.2f} s, "
              f"overhead {row['overhead_s']:.2f} s (first check {first_s:.2f} s; assignment {row['generated']})",
              flush=True)
    return rows


def throughput(n_submissions: int, jobs: list[int], scratch: Path,
               expected: dict[str, float]) -> list[dict[str, Any]]:
    """Seconds and notebooks per minute of ``autograde`` for each job count in ``jobs``."""
    from grader.course import Course
    from grader.instructor import autograde, collect

    notebooks = course_notebooks()
    handed_in = scratch / "class"
    for i in range(n_submissions):
        _, notebook = notebooks[i % len(notebooks)]
        target = handed_in / f"student{i:03d}" / notebook.name
        target.parent.mkdir(parents=True)
        shutil.copyfile(notebook, target)
    workspace = scratch / "workspace"
    course = Course.at(ROOT / "exercises")
    collect(handed_in, course, workspace)
    runs = []
    for n_jobs in jobs:
        t0 = time.perf_counter()
        records = autograde(workspace, course, jobs=n_jobs)
        seconds = time.perf_counter() - t0
        wrong = [f"{r['student']}: {r['status']} {r['score']}/{r['max_score']} {r.get('error') or ''}"
                 for r in records if r["status"] != "graded" or r["score"] != expected.get(r["assignment"])]
        if wrong:
            raise RuntimeError(f"autograde --jobs {n_jobs}: scores differ from grader check's: " + "; ".join(wrong[:5]))
        runs.append({"jobs": n_jobs, "seconds": seconds, "notebooks_per_minute": 60 * n_submissions / seconds})
        print(f"autograde --jobs {n_jobs}: {n_submissions} notebooks in {seconds:.1f} s "
              f"({runs[-1]['notebooks_per_minute']:.1f} per minute)", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    from grader.instructor import cores

    parser = bench_parser("grading", __doc__)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per notebook for the overhead (default 3)")
    parser.add_argument("--submissions", type=int, default=50, help="size of the class (default 50)")
    parser.add_argument("--jobs", type=int, default=cores(), help="parallel jobs to compare with 1 (default: the cores)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.submissions < 1 or args.jobs < 1:
        parser.error("need --repeats, --submissions and --jobs >= 1")
    load_before = os.getloadavg()
    cache_before = os.environ.get("LAB_GRADER_CACHE")
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        scratch = Path(tmp)
        # a cache of generated assignments of the benchmark's own, empty at the start; the
        # checks (child processes) and autograde (in this process) both read this variable
        os.environ["LAB_GRADER_CACHE"] = str(scratch / "generated-cache")
        rows = overhead(args.repeats, scratch)
        expected = {row["assignment"]: row["score"] for row in rows}
        runs = throughput(args.submissions, sorted({1, args.jobs}), scratch, expected)
    if cache_before is None:
        os.environ.pop("LAB_GRADER_CACHE", None)
    else:
        os.environ["LAB_GRADER_CACHE"] = cache_before
    document = {
        "benchmark": "grading",
        "machine": machine_info(mpi_library="not used", cores_available=cores()),
        "settings": {"repeats": args.repeats, "submissions": args.submissions, "target_overhead_s": 5.0,
                     # other work on the machine slows both sides and caps the parallel speed-up
                     "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]}},
        "overhead": rows,
        "throughput": {"submissions": args.submissions, "runs": runs},
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
