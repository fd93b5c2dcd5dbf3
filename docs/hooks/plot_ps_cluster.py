"""Figures of ``ps_cluster.json`` (``python -m benchmarks ps_cluster``).

* ``assets/bench/ps_cluster-curves.svg``: test log-loss against wall-clock seconds for
  every rule with one straggler, and straggler-free BSP, on real thread ranks (first repeat);
* ``assets/bench/ps_cluster-times.svg``: median wall-clock time to the target per rule.

``<!-- bench:ps_cluster:summary -->`` becomes the table of times to target.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from plotkit import bad, figure, machine_line, svg

NAME = "ps_cluster"


def _check(path: Path, data: dict[str, Any]) -> None:
    for key in ("settings", "reference", "rows", "target_logloss_per_repeat"):
        if key not in data:
            raise bad(path, f"missing '{key}'")
    for row in [data["reference"], *data["rows"]]:
        if len(row.get("curve_time", [])) != len(row.get("curve_logloss", [])) or not row.get("curve_time"):
            raise bad(path, f"{row.get('rule')}: curve missing or of unequal lengths")
        if "median_time_to_target" not in row:
            raise bad(path, f"{row.get('rule')}: no median_time_to_target")


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _seconds(value: Any) -> str:
    return "not reached" if value is None else f"{value:.2f}"


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    st, ref, rows = data["settings"], data["reference"], data["rows"]
    who = f"{st['workers']} workers + 1 server, {st['step_time_s'] * 1e3:g} ms steps, worker 0 {st['slowdown']:g}x slower"
    figs: dict[str, bytes] = {}

    fig, ax = figure(f"Measured on {machine}")
    ax.set_title(who, fontsize=9)
    ax.plot(ref["curve_time"], ref["curve_logloss"], color="black", linestyle="--", label="bsp, no straggler")
    for row in rows:
        ax.plot(row["curve_time"], row["curve_logloss"], label=row["rule"])
    ax.axhline(data["target_logloss_per_repeat"][0], color="grey", linestyle=":", label="target (this repeat)")
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("test log-loss of the servers' model")
    ax.legend(fontsize=7, ncol=2)
    figs["curves"] = svg(fig)

    fig, ax = figure(f"Measured on {machine}")
    ax.set_title(f"Median of {st['repeats']} repeats; {who}", fontsize=9)
    labels = ["bsp, no straggler", *[row["rule"] for row in rows]]
    values = [ref["median_time_to_target"], *[row["median_time_to_target"] for row in rows]]
    ax.bar(range(len(labels)), [0 if v is None else v for v in values], color=["0.4", *[f"C{i}" for i in range(len(rows))]])
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel("wall-clock seconds to the target log-loss")
    figs["times"] = svg(fig)

    header = ("| rule (one straggler) | median seconds to target | vs straggler-free BSP | whole run (s, median) "
              "| gradients dropped (median) |")
    lines = [header, "|---|---|---|---|---|",
             f"| bsp, no straggler | {_seconds(ref['median_time_to_target'])} | 1 | {_median(ref['seconds']):.2f} | 0 |"]
    for row in rows:
        ratio = row["ratio_to_straggler_free_bsp"]
        lines.append(f"| {row['rule']} | {_seconds(row['median_time_to_target'])} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'} | {_median(row['seconds']):.2f} | "
                     f"{_median(row['dropped']):g} |")
    summary = "\n".join(lines) + f"\n\n*{st['repeats']} repeats, {st['steps']} steps per worker; measured on {machine}.*\n"
    return figs, summary
