"""Figure of ``determinism.json`` (``python -m benchmarks determinism``).

It produces ``assets/bench/determinism-drift.svg``: ``max |w_a - w_b|`` against the training
step for each pair of configurations (log scale; a pair that stays bit-for-bit equal is
named in the legend, since 0 has no place on a log axis), and replaces
``<!-- bench:determinism:summary -->`` with the table of those differences after 1, 10 and
the last step, the arrival-order result, and the machine line.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plotkit import bad, figure, machine_line, svg

NAME = "determinism"


def _rows(path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = data.get("results")
    if not isinstance(rows, list) or not rows:
        raise bad(path, "'results' must be a non-empty list")
    for i, row in enumerate(rows):
        diffs = row.get("max_abs_diff") if isinstance(row, dict) else None
        if not isinstance(row.get("pair"), str) or not isinstance(diffs, list) or not diffs or not all(
            isinstance(d, (int, float)) and math.isfinite(d) and d >= 0 for d in diffs
        ):
            raise bad(path, f"results[{i}] needs a 'pair' name and a list of non-negative 'max_abs_diff'")
    ao = data.get("arrival_order")
    if not isinstance(ao, dict) or not all(isinstance(ao.get(k), (int, float)) for k in
                                           ("runs", "distinct_results", "distinct_orders", "ranks")):
        raise bad(path, "'arrival_order' must give runs, distinct_orders, distinct_results and ranks")
    return rows


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    rows = _rows(path, data)
    machine = machine_line(path, data)
    settings = data.get("settings", {})
    fig, ax = figure(f"Measured on {machine}")
    for k, row in enumerate(rows):
        diffs = row["max_abs_diff"]
        steps = list(range(1, len(diffs) + 1))
        if max(diffs) == 0:
            ax.plot([], [], color=f"C{k}", label=f"{row['pair']}: 0 at every step (bit-for-bit equal)")
            continue
        ax.plot([s for s, d in zip(steps, diffs) if d > 0], [d for d in diffs if d > 0], color=f"C{k}",
                linewidth=1.5, label=f"{row['pair']}: {row['a']} vs {row['b']}")
    ax.set_yscale("log")
    ax.set_xscale("log")
    top = max(max(r["max_abs_diff"]) for r in rows)
    ax.set_ylim(top=top * 10 if top > 0 else 1.0)
    ax.set_xlabel("training step (log scale)")
    ax.set_ylabel("max |w_a − w_b| over all weights")
    ax.set_title(f"How far apart two runs drift (float32 MLP {settings.get('widths', '')}, "
                 f"global batch {settings.get('global_batch', '?')})")
    ax.legend(loc="upper left", fontsize=7)
    drift = svg(fig)

    lines = ["| what differs | run a | run b | after 1 step | after 10 steps | after the last step |",
             "|---|---|---|---:|---:|---:|"]
    for row in rows:
        d = row["max_abs_diff"]
        at10 = f"{d[9]:.2g}" if len(d) >= 10 else "n/a"
        lines.append(f"| {row['pair']} | {row['a']} | {row['b']} | {d[0]:.2g} | {at10} | {d[-1]:.2g} (step {len(d)}) |")
    ao = data["arrival_order"]
    lines += ["", f"Arrival-order accumulation of {ao['ranks']} ranks' gradients, run {ao['runs']} times: "
              f"{ao['distinct_orders']} different arrival orders gave {ao['distinct_results']} different results "
              f"(largest difference from the rank-order sum: {ao.get('max_abs_diff_vs_rank_order', float('nan')):.2g}).",
              "", f"*Machine:* {machine}."]
    return {"drift": drift}, "\n".join(lines) + "\n"
