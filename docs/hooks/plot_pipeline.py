"""Figures of ``pipeline.json`` (``python -m benchmarks pipeline``).

``assets/bench/pipeline-bubble.svg``: the bubble fraction against the number of micro-batches
for each pipeline depth: the formula (p-1)/(m+p-1) as lines, the executed schedule with unit
op costs and with measured op costs as markers. ``assets/bench/pipeline-memory.svg``: peak
activation bytes held per rank, GPipe against 1F1B against one data-parallel rank.
``assets/bench/pipeline-checkpoint.svg``: checkpoint save and load throughput per checkpoint
size, ``save_checkpoint``/``load_checkpoint`` beside ``np.savez``/``np.load`` of the same arrays.
``<!-- bench:pipeline:summary -->`` becomes tables of those numbers and of checkpoint
save/load throughput against ``np.savez``/``np.load`` measured in the same run.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from plotkit import bad, figure, human_bytes, machine_line, svg

NAME = "pipeline"


def _check(path: Path, data: dict[str, Any]) -> None:
    for key in ("bubble", "memory", "checkpoint"):
        if not isinstance(data.get(key), list) or not data[key]:
            raise bad(path, f"'{key}' must be a non-empty list")
    for row in data["bubble"]:
        if not all(k in row for k in ("p", "m", "schedule", "predicted", "unit_cost", "measured_median_cost")):
            raise bad(path, "each 'bubble' row needs p, m, schedule, predicted, unit_cost, measured_median_cost")
        if not row["measured_median_cost"] or not all(isinstance(v, (int, float)) and math.isfinite(v)
                                                      for v in row["measured_median_cost"]):
            raise bad(path, "'measured_median_cost' must be a non-empty list of numbers")
    for row in data["memory"]:
        if not all(k in row for k in ("m", "gpipe", "1f1b", "data_parallel")):
            raise bad(path, "each 'memory' row needs m, gpipe, 1f1b and data_parallel")
    for row in data["checkpoint"]:
        if not all(k in row.get("mb_per_s", {}) for k in ("save", "load", "savez", "npload")):
            raise bad(path, "each 'checkpoint' row needs mb_per_s for save, load, savez and npload")
        if not isinstance(row.get("bytes"), int) or row["bytes"] <= 0 or not all(
                isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in row["mb_per_s"].values()):
            raise bad(path, "each 'checkpoint' row needs a positive size in 'bytes' and positive finite mb_per_s")


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    s = data.get("settings", {})
    rows = data["bubble"]
    depths = sorted({r["p"] for r in rows if r["p"] > 1})

    fig, ax = figure(f"Measured on {machine}")
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for colour, p in zip(colours, depths):
        ms = sorted({r["m"] for r in rows if r["p"] == p})
        ax.plot(ms, [(p - 1) / (m + p - 1) for m in ms], "-", color=colour, label=f"p={p}: (p-1)/(m+p-1)")
        for schedule, marker in (("gpipe", "o"), ("1f1b", "^")):
            pts = sorted((r["m"], statistics.median(r["measured_median_cost"]), r["unit_cost"])
                         for r in rows if r["p"] == p and r["schedule"] == schedule)
            ax.plot([a for a, _, _ in pts], [b for _, b, _ in pts], marker, color=colour, fillstyle="none",
                    label=f"p={p} {schedule}, measured op times")
            if schedule == "1f1b":
                ax.plot([a for a, _, _ in pts], [c for _, _, c in pts], "x", color=colour, markersize=4,
                        label=f"p={p} executed, unit op costs")
    all_ms = sorted({r["m"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(all_ms, [str(m) for m in all_ms], minor=False)
    ax.minorticks_off()
    ax.set_xlabel("micro-batches m (log scale)")
    ax.set_ylabel("bubble: idle share of p x step time")
    ax.set_ylim(0, 1)
    ax.set_title(f"{s.get('layers', '?')}-layer MLP, width {s.get('width', '?')}, micro-batch "
                 f"{s.get('micro_batch', '?')} rows, split over p thread ranks")
    ax.legend(fontsize=6, ncol=3)
    bubble_svg = svg(fig)

    mem = sorted(data["memory"], key=lambda r: r["m"])
    fig, ax = figure(f"Measured on {machine}")
    ms = [r["m"] for r in mem]
    ax.plot(ms, [max(r["gpipe"]["peak_stash_bytes"]) / 2**20 for r in mem], "o-", linewidth=5, alpha=0.4,
            label="GPipe, busiest stage (wide line)")
    ax.plot(ms, [max(r["1f1b"]["peak_stash_bytes"]) / 2**20 for r in mem], "^-", label="1F1B, busiest stage")
    ax.plot(ms, [r["data_parallel"]["activation_bytes"] / 2**20 for r in mem], "s--",
            label="data parallel, one rank (same global batch)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms], minor=False)
    ax.minorticks_off()
    ax.set_xlabel("micro-batches m (global batch = m x micro-batch)")
    ax.set_ylabel("activations held for backward (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Peak activation memory per rank, p = {mem[0]['p']}")
    ax.legend(fontsize=7)
    memory_svg = svg(fig)

    ckpt = sorted(data["checkpoint"], key=lambda r: r["bytes"])
    fig, ax = figure(f"Measured on {machine}")
    kinds = (("save", "save_checkpoint (shards, CRC-32, fsync, rename)", "tab:blue", ""),
             ("savez", "np.savez (one file, no fsync)", "tab:blue", "//"),
             ("load", "load_checkpoint (checksums verified)", "tab:green", ""),
             ("npload", "np.load", "tab:green", "//"))
    for j, (key, label, colour, hatch) in enumerate(kinds):
        xs = [i + (j - 1.5) * 0.2 for i in range(len(ckpt))]
        bars = ax.bar(xs, [r["mb_per_s"][key] for r in ckpt], 0.2, label=label, color=colour,
                      alpha=0.5 if hatch else 0.9, hatch=hatch, edgecolor="0.3")
        ax.bar_label(bars, fmt="%.0f", fontsize=6)
    ax.set_xticks(range(len(ckpt)), [human_bytes(r["bytes"], 3) for r in ckpt])
    ax.set_xlabel("checkpoint size (8 float32 tensors)")
    ax.set_ylabel("MB/s (median of the repeats)")
    ax.set_title(f"Checkpoint throughput, {human_bytes(s.get('checkpoint_shard_bytes', 0), 3)} shards "
                 f"({s.get('repeats', '?')} repeats, interleaved)")
    ax.set_ylim(0, 1.4 * max(v for r in ckpt for v in r["mb_per_s"].values()))  # room for the legend
    ax.legend(fontsize=7, ncol=2, loc="upper center")
    checkpoint_svg = svg(fig)

    lines = [("| p | m | predicted (p-1)/(m+p-1) | executed, unit costs | GPipe, measured op times (raw) | "
             "1F1B, measured op times (raw) |"), "|---:|---:|---:|---:|---:|---:|"]
    by = {(r["p"], r["m"], r["schedule"]): r for r in rows}
    for p, m in sorted({(r["p"], r["m"]) for r in rows}):
        g, f = by[(p, m, "gpipe")], by[(p, m, "1f1b")]
        measured = [f"{statistics.median(r['measured_median_cost']):.3f} "
                    f"({statistics.median(r.get('measured_raw') or [float('nan')]):.3f})" for r in (g, f)]
        lines.append(f"| {p} | {m} | {g['predicted']:.3f} | {f['unit_cost']:.3f} | {measured[0]} | {measured[1]} |")
    lines += ["", ("Measured op times: each stage's median forward and backward time replayed through the "
                  "schedule; in brackets, the run's own virtual clock with every op's time as measured. "
                  "Medians over the repeats.")]
    worst = max(rows, key=lambda r: r["p"] * 100 + r["m"])
    if worst.get("stage_forward_s"):
        costs = ", ".join(f"{(a + b) * 1e3:.2f}" for a, b in zip(worst["stage_forward_s"], worst["stage_backward_s"]))
        lines += ["", (f"Median forward + backward time per stage at p = {worst['p']}, m = {worst['m']} "
                      f"({worst['schedule']}), ms: {costs}. The slowest stage sets the pace; the formula assumes "
                      "they are all equal.")]
    lines += ["", ("| m | global batch | GPipe peak (busiest stage) | 1F1B peak (busiest stage) | "
                  "1F1B per stage | data-parallel rank: activations | params per pipeline rank | "
                  "params per data-parallel rank |"), "|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in mem:
        lines.append(f"| {r['m']} | {r['global_batch']} | {human_bytes(max(r['gpipe']['peak_stash_bytes']), 3)} | "
                     f"{human_bytes(max(r['1f1b']['peak_stash_bytes']), 3)} | "
                     f"{' / '.join(human_bytes(b, 3) for b in r['1f1b']['peak_stash_bytes'])} | "
                     f"{human_bytes(r['data_parallel']['activation_bytes'], 3)} | "
                     f"{human_bytes(max(r['gpipe']['param_bytes']), 3)} | "
                     f"{human_bytes(r['data_parallel']['param_bytes'], 3)} |")
    lines += ["", ("| checkpoint | save_checkpoint | np.savez (no fsync, no checksum) | load_checkpoint (verified) | "
                  "np.load |"), "|---:|---:|---:|---:|---:|"]
    for r in data["checkpoint"]:
        t = r["mb_per_s"]
        lines.append(f"| {human_bytes(r['bytes'], 3)} | {t['save']:.0f} MB/s ({t['save'] / t['savez']:.2f}× savez) | "
                     f"{t['savez']:.0f} MB/s | {t['load']:.0f} MB/s ({t['load'] / t['npload']:.2f}× np.load) | "
                     f"{t['npload']:.0f} MB/s |")
    lines += ["", f"*Machine:* {machine}."]
    return {"bubble": bubble_svg, "memory": memory_svg, "checkpoint": checkpoint_svg}, "\n".join(lines) + "\n"
