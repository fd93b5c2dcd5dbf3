"""Figure of ``grading.json`` (``python -m benchmarks grading``).

It produces ``assets/bench/grading-overhead.svg``: per assignment, the time to run the
solution notebook alone (nbclient) and through ``python -m grader check``, stacked so that
the overhead of grading is the upper part of each bar, with the 5 s target marked; and
replaces ``<!-- bench:grading:summary -->`` with the overhead table, what the first check of
an assignment (which fills the cache of generated assignments) costs on top, the class
throughput (one job against one job per core) and the machine line.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from plotkit import bad, figure, machine_line, svg

NAME = "grading"


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _checked(path: Path, data: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = data.get("overhead")
    if not isinstance(rows, list) or not rows:
        raise bad(path, "'overhead' must be a non-empty list")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("assignment"), str) or not all(
            _number(row.get(k)) and row[k] >= 0 for k in ("notebook_s", "check_s", "score", "max_score")
        ):
            raise bad(path, f"overhead[{i}] needs 'assignment' and non-negative notebook_s, check_s, score, max_score")
    tp = data.get("throughput")
    runs = tp.get("runs") if isinstance(tp, dict) else None
    if not isinstance(runs, list) or not runs or not _number(tp.get("submissions")) or not all(
        isinstance(r, dict) and isinstance(r.get("jobs"), int) and _number(r.get("seconds")) and r["seconds"] > 0
        and _number(r.get("notebooks_per_minute")) for r in runs
    ):
        raise bad(path, "'throughput' needs 'submissions' and 'runs' of {jobs, seconds > 0, notebooks_per_minute}")
    return rows, tp


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    rows, tp = _checked(path, data)
    machine = machine_line(path, data)
    target = data.get("settings", {}).get("target_overhead_s", 5.0)
    fig, ax = figure(f"Measured on {machine}")
    names = [r["assignment"] for r in rows]
    alone = [r["notebook_s"] for r in rows]
    extra = [max(r["check_s"] - r["notebook_s"], 0.0) for r in rows]
    # Horizontal bars: twenty assignment names read along the bars, not crowded under them.
    fig.set_size_inches(fig.get_size_inches()[0], 1.8 + 0.28 * len(rows))
    ys = range(len(names))
    ax.barh(ys, alone, color="C0", label="the notebook alone (nbclient, fresh kernel)")
    ax.barh(ys, extra, left=alone, color="C1", hatch="//", edgecolor="white",
            label="grading overhead (grader check − alone)")
    for y, (a, e) in enumerate(zip(alone, extra)):
        ax.text(a + e, y, f" +{e:.1f} s", ha="left", va="center")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median of the repeats)")
    ax.set_title(f"What grading adds to a notebook's own run time (target: at most {target:g} s)")
    ax.set_xlim(right=max(a + e for a, e in zip(alone, extra)) * 1.3)
    ax.grid(True, axis="x", alpha=0.3)
    ax.grid(False, axis="y")
    ax.legend()
    overhead = svg(fig)

    lines = ["| assignment | score of its solution | notebook alone | `grader check` | overhead | within the target |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        over = r["check_s"] - r["notebook_s"]
        lines.append(f"| {r['assignment']} | {r['score']:g}/{r['max_score']:g} | {r['notebook_s']:.2f} s | "
                     f"{r['check_s']:.2f} s | {over:.2f} s | {'yes' if over <= target else 'no'} |")
    firsts = [(r["first_check_s"], r["check_s"]) for r in rows if _number(r.get("first_check_s"))]
    if firsts:
        extra_first = sorted(f - c for f, c in firsts)
        low, high = min(extra_first), max(extra_first)
        spread = f"{low:.2f} to {high:.2f} s more" if low >= 0 else f"from {-low:.2f} s less to {high:.2f} s more"
        why = "" if low >= 0 else " (where it was faster, the load on the machine varied more than the cache saves)"
        lines += ["", (f"The first check of each assignment also generates it (nbgrader's `generate_assignment`) "
                       f"and stores it in the cache of generated assignments; the table's checks found it there. "
                       f"That first check took {spread} than a later one (median "
                       f"{statistics.median(extra_first):+.2f} s), over {len(firsts)} assignments{why}.")]
    lines += ["", (f"Class of {tp['submissions']:g} submissions (the solutions, round-robin over the "
                   "assignments) through `python -m grader autograde`:"), "",
              "| jobs | wall time | notebooks per minute | speed-up over 1 job |", "|---:|---:|---:|---:|"]
    base = next((r["seconds"] for r in tp["runs"] if r["jobs"] == 1), None)
    for r in tp["runs"]:
        speedup = f"{base / r['seconds']:.2f}×" if base else "n/a"
        lines.append(f"| {r['jobs']} | {r['seconds']:.1f} s | {r['notebooks_per_minute']:.1f} | {speedup} |")
    load = data.get("settings", {}).get("load_average_1min")
    if isinstance(load, dict) and _number(load.get("before")) and _number(load.get("after")):
        lines += ["", (f"One-minute load average when the benchmark started: {load['before']:.1f}; when it ended: "
                  f"{load['after']:.1f} (other work on the machine slows both sides and skews the speed-up).")]
    lines += ["", f"*Machine:* {machine}."]
    return {"overhead": overhead}, "\n".join(lines) + "\n"
