"""Figure of ``graph.json`` (``python -m benchmarks graph``).

It produces ``assets/bench/graph-step.svg``: the distribution of one MLP training step's time
in hand-written NumPy, graph mode and eager mode (box plots of every timed repeat), and
replaces ``<!-- bench:graph:summary -->`` with the table of medians, ratios to NumPy, the
per-op dispatch overhead and the machine line.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from plotkit import bad, figure, machine_line, svg

NAME = "graph"
MODES = ("numpy", "graph", "eager")


def _check(path: Path, data: dict[str, Any]) -> None:
    steps = data.get("step_seconds")
    if not isinstance(steps, dict) or any(
            not isinstance(steps.get(m), list) or not steps[m] or not all(
                isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in steps[m]) for m in MODES):
        raise bad(path, "'step_seconds' must give a non-empty list of positive times for numpy, graph and eager")
    over = data.get("dispatch_overhead_us_per_op")
    if not isinstance(over, dict) or not all(isinstance(over.get(m), (int, float)) for m in ("graph", "eager")):
        raise bad(path, "'dispatch_overhead_us_per_op' must give numbers for graph and eager")
    if not isinstance(data.get("numpy_us_per_op"), (int, float)):
        raise bad(path, "'numpy_us_per_op' must be a number")


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    s = data.get("settings", {})
    steps = data["step_seconds"]
    fig, ax = figure(f"Measured on {machine}")
    ax.boxplot([[t * 1e3 for t in steps[m]] for m in MODES])
    ax.set_xticks([1, 2, 3], ["hand-written NumPy", "graph (Session.run)", "eager (GradientTape)"])
    ax.set_ylabel("milliseconds per training step")
    ax.set_ylim(bottom=0)
    ax.set_title(f"One SGD step of an MLP {s.get('widths', '')}, batch {s.get('batch', '?')}, "
                 f"{s.get('dtype', '')} ({len(steps['numpy'])} repeats each, interleaved)")
    step = svg(fig)

    med = {m: statistics.median(steps[m]) for m in MODES}
    lines = ["| mode | median step | vs hand-written NumPy |", "|---|---:|---:|"]
    for m in MODES:
        lines.append(f"| {m} | {med[m] * 1e3:.2f} ms | {med[m] / med['numpy']:.3f}× |")
    over = data["dispatch_overhead_us_per_op"]
    overhead = (f"Per-op dispatch overhead (a chain of {s.get('chain_ops', '?')} scalar additions): "
                f"graph mode adds {over['graph']:.2f} µs per op and eager mode {over['eager']:.2f} µs per op "
                f"over a plain NumPy call ({data['numpy_us_per_op']:.2f} µs). BLAS threads: "
                f"{s.get('blas_threads', '?')}.")
    lines += ["", overhead, "", f"*Machine:* {machine}."]
    return {"step": step}, "\n".join(lines) + "\n"
