"""Figures of ``passes.json`` (``python -m benchmarks passes``).

``assets/bench/passes-ops.svg``: for the training graph and the inference graph, the number
of ops as built and after each pass. ``assets/bench/passes-time.svg``: the graph
interpreter's best time per step for each set of passes, relative to pruning only, per graph
and batch size. ``<!-- bench:passes:summary -->`` becomes tables of both, with the machine line.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from plotkit import bad, check_rows, figure, machine_line, svg

NAME = "passes"
BASELINE = "prune only"


def _check(path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = check_rows(path, data, {"graph": str, "ops_built": int, "passes": list, "timings": list})
    for i, row in enumerate(rows):
        if not row["passes"] or not all(isinstance(p, list) and len(p) == 3 and isinstance(p[0], str)
                                        and all(isinstance(n, int) for n in p[1:]) for p in row["passes"]):
            raise bad(path, f"results[{i}].passes must be a non-empty list of [name, ops before, ops after]")
        for t in row["timings"]:
            best = t.get("best_s") if isinstance(t, dict) else None
            if (not isinstance(best, dict) or BASELINE not in best or not isinstance(t.get("batch"), int)
                    or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in best.values())):
                raise bad(path, f"results[{i}].timings needs a batch and positive best_s times including "
                                f"'{BASELINE}'")
        if not row["timings"]:
            raise bad(path, f"results[{i}].timings is empty")
    return rows


def _ops_figure(rows: list[dict[str, Any]], machine: str) -> bytes:
    fig = Figure(figsize=(7.6, 4.4), layout="constrained")
    fig.supxlabel(f"Measured on {machine}", fontsize=7, color="0.35")
    axes = fig.subplots(1, len(rows), squeeze=False)[0]
    for ax, row in zip(axes, rows):
        names = ["as built"] + [p[0].replace("_", " ") for p in row["passes"]]
        counts = [row["ops_built"]] + [p[2] for p in row["passes"]]
        bars = ax.bar(range(len(counts)), counts, color=["0.6"] + ["tab:blue"] * (len(counts) - 1))
        ax.bar_label(bars, fontsize=7)
        ax.set_xticks(range(len(counts)), names, rotation=35, ha="right", fontsize=7)
        ax.set_ylabel("ops in the graph")
        ax.set_title(f"{row['graph']}\n{row.get('description', '')}", fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    return svg(fig)


def _time_figure(rows: list[dict[str, Any]], machine: str) -> bytes:
    fig, ax = figure(f"Measured on {machine}")
    groups = [(row, t) for row in rows for t in row["timings"]]
    configs = list(dict.fromkeys(k for _, t in groups for k in t["best_s"]))
    labelled: set[str] = set()
    for i, (_, t) in enumerate(groups):
        width = 0.8 / len(t["best_s"])
        for j, (config, best) in enumerate(t["best_s"].items()):
            bars = ax.bar([i + (j - (len(t["best_s"]) - 1) / 2) * width], [best / t["best_s"][BASELINE]], width,
                          color=f"C{configs.index(config)}", label=None if config in labelled else config)
            labelled.add(config)
            ax.bar_label(bars, fmt="%.2f", rotation=90, padding=2)
    ax.axhline(1, color="0.3", linewidth=0.8)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.25)  # room for the values printed above the bars
    ax.set_xticks(range(len(groups)), [f"{row['graph']}\nbatch {t['batch']}\npruning only:\n{t['best_s'][BASELINE] * 1e3:.2f} ms"
                                       for row, t in groups])
    ax.set_ylabel("interpreter time per step / pruning only (best run)")
    ax.set_title("Session.run time per step after each set of passes (lower is faster)")
    ax.legend(fontsize=7)
    return svg(fig)


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    rows = _check(path, data)
    machine = machine_line(path, data)
    s = data.get("settings", {})
    lines = []
    for row in rows:
        lines += [f"**{row['graph']}** ({row.get('description', '')}): {row['ops_built']} ops as built.", "",
                  "| pass | ops before | ops after |", "|---|---:|---:|"]
        lines += [f"| {name.replace('_', ' ')} | {before} | {after} |" for name, before, after in row["passes"]]
        lines += ["", "| batch | passes | best time per step | ÷ pruning only | median |", "|---:|---|---:|---:|---:|"]
        for t in row["timings"]:
            base = t["best_s"][BASELINE]
            for config, best in t["best_s"].items():
                median = t.get("median_s", {}).get(config)
                lines.append(f"| {t['batch']} | {config} | {best * 1e3:.3f} ms | {best / base:.2f}× | "
                             + (f"{median * 1e3:.3f} ms |" if isinstance(median, (int, float)) else "– |"))
        lines.append("")
    note = (f"Best and median of {s.get('repeats', '?')} interleaved runs per configuration; "
            f"BLAS threads: {s.get('blas_threads', '?')}.")
    lines += [note, "", f"*Machine:* {machine}."]
    return {"ops": _ops_figure(rows, machine), "time": _time_figure(rows, machine)}, "\n".join(lines) + "\n"
