"""Figure of ``autodiff.json`` (``python -m benchmarks autodiff``).

``assets/bench/autodiff-cost.svg``: the time of a whole gradient divided by the time of one
forward pass, against the parameter count n (log-log): reverse mode (``gradients`` run by a
Session: forward + backward) stays a small constant, central finite differences (2n forward
passes) grow with n. ``<!-- bench:autodiff:summary -->`` becomes the table of those numbers,
with each gradient's agreement with finite differences and the machine line.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plotkit import bad, check_rows, figure, human_time, machine_line, svg

NAME = "autodiff"
_NUMBERS = ("forward_median_s", "gradient_median_s", "fd_median_s", "gradient_over_forward",
            "fd_over_forward", "max_rel_error")


def _check(path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = check_rows(path, data, {"params": int, "hidden": int, "fd_evaluations": int,
                                   **{k: (int, float) for k in _NUMBERS}})
    for i, row in enumerate(rows):
        if not all(math.isfinite(row[k]) and row[k] >= 0 for k in _NUMBERS) or row["forward_median_s"] <= 0:
            raise bad(path, f"results[{i}] has a negative, zero or non-finite time or ratio")
    return sorted(rows, key=lambda r: r["params"])


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    rows = _check(path, data)
    machine = machine_line(path, data)
    s = data.get("settings", {})
    ns = [r["params"] for r in rows]

    fig, ax = figure(f"Measured on {machine}")
    ax.plot(ns, [r["fd_over_forward"] for r in rows], "s-", color="tab:red",
            label="central finite differences (2n forward runs)")
    ax.plot(ns, [2 * n for n in ns], ":", color="0.5", label="2n forward passes")
    ax.plot(ns, [r["gradient_over_forward"] for r in rows], "o-", color="tab:blue",
            label="reverse mode: gradients() + Session.run (forward and backward)")
    ax.axhline(1, color="0.3", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters n (log scale)")
    ax.set_ylabel("time of the whole gradient / time of one forward pass")
    ax.set_title(f"Gradient of a {s.get('model', 'model')} loss, batch {s.get('batch', '?')}, "
                 f"{s.get('dtype', '')}")
    ax.legend(fontsize=7, loc="upper left")
    cost = svg(fig)

    lines = [("| n (hidden width) | forward pass | reverse-mode gradient | ÷ forward | finite differences "
              "| ÷ forward | max relative difference |"), "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['params']} ({r['hidden']}) | {human_time(r['forward_median_s'])} | "
                     f"{human_time(r['gradient_median_s'])} | {r['gradient_over_forward']:.2f}× | "
                     f"{human_time(r['fd_median_s'])} | {r['fd_over_forward']:.0f}× | {r['max_rel_error']:.1e} |")
    note = (f"CPU time of the process; medians of {s.get('repeats', '?')} interleaved runs (the finite-difference gradient: "
            "its whole loop of 2n runs, timed once or, below 1000 parameters, three times). "
            "Max relative difference: the largest |reverse − finite difference| over the largest "
            f"|finite difference|, step ε = {s.get('fd_eps', '?')}. BLAS threads: {s.get('blas_threads', '?')}.")
    lines += ["", note, "", f"*Machine:* {machine}."]
    return {"cost": cost}, "\n".join(lines) + "\n"
