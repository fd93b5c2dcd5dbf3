"""Figures of ``overlap.json`` (``python -m benchmarks overlap``).

It produces

* ``assets/bench/overlap-fusion.svg``: 1000 separate 4 KiB allreduces against the same
  tensors fused into buckets, as a speed-up against bucket size, per rank count, for our
  ring and for the MPI library;
* ``assets/bench/overlap-steps.svg``: measured step time of the data-parallel trainer in
  ``overlap`` and ``end`` modes against the communication/backward ratio (2 ranks), with
  the simulator's predictions beside the measurements, each divided by that point's own
  forward + backward time (so drifts of the machine's speed between points cancel);
* ``assets/bench/overlap-gain.svg``: the overlap gain (end / overlap) against the ratio:
  the simulator's curve for the stated hypothetical model, and the measured points;
* ``assets/bench/overlap-scaling.svg``: simulated weak-scaling efficiency from 1 to 1024
  workers per interconnect, with and without overlap;

and replaces ``<!-- bench:overlap:summary -->`` with the fusion speed-ups and the
measured-against-predicted table, followed by the machine line.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from plotkit import bad, color, figure, human_bytes, machine_line, size_axis, svg

NAME = "overlap"
IMPLS = {"ours": "our ring", "mpi": "MPI library"}
FUSION_KEYS = ("ranks", "bucket_bytes", "time_s")
OVERLAP_KEYS = ("ranks", "target_ratio", "measured_overlap_s", "measured_end_s", "predicted_overlap_s",
                "predicted_end_s", "backward_s", "comm_model_s", "forward_s")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _rows(path: Path, data: dict[str, Any]) -> tuple[list[dict], list[dict], dict[str, Any]]:
    rows = data.get("results")
    if not isinstance(rows, list) or not rows:
        raise bad(path, "'results' must be a non-empty list")
    fusion, overlap = [], []
    for i, row in enumerate(rows):
        part = row.get("part") if isinstance(row, dict) else None
        keys = {"fusion": FUSION_KEYS, "overlap": OVERLAP_KEYS}.get(part)
        if keys is None:
            raise bad(path, f"results[{i}].part must be 'fusion' or 'overlap'")
        if not all(_number(row.get(k)) and row[k] >= 0 for k in keys):
            raise bad(path, f"results[{i}] needs non-negative numbers {', '.join(keys)}")
        if part == "fusion" and row.get("impl") not in IMPLS:
            raise bad(path, f"results[{i}].impl must be one of {sorted(IMPLS)}")
        (fusion if part == "fusion" else overlap).append(row)
    if not fusion or not overlap:
        raise bad(path, "needs both 'fusion' and 'overlap' results")
    for ranks, impl in {(r["ranks"], r["impl"]) for r in fusion}:
        if not any(r["ranks"] == ranks and r["impl"] == impl and r["bucket_bytes"] == 0 for r in fusion):
            raise bad(path, f"fusion on {ranks} ranks ({impl}) lacks the separate-calls baseline (bucket_bytes 0)")
    sim = data.get("simulation")
    if not isinstance(sim, dict) or not sim.get("scaling") or not sim.get("gain") or not isinstance(sim.get("model"), dict):
        raise bad(path, "'simulation' must hold 'model', 'scaling' and 'gain'")
    return fusion, overlap, sim


def _speedups(fusion: list[dict]) -> dict[tuple[str, int], dict[int, float]]:
    """{(impl, ranks): {bucket_bytes: time(separate) / time(fused)}}."""
    base = {(r["impl"], r["ranks"]): r["time_s"] for r in fusion if r["bucket_bytes"] == 0}
    out: dict[tuple[str, int], dict[int, float]] = {}
    for r in fusion:
        if r["bucket_bytes"]:
            out.setdefault((r["impl"], r["ranks"]), {})[r["bucket_bytes"]] = base[(r["impl"], r["ranks"])] / r["time_s"]
    return out


def _ratio(row: dict) -> float:
    """Communication / backward of an overlap point (what the x axes show).

    Communication is the allreduce time of the step's buckets on the calibrated link, not
    the time the allreduces took in the run: that one also holds the wait for the slower
    rank, which depends on timing noise rather than on the network.
    """
    return row["comm_model_s"] / row["backward_s"]


def _log_ratio_axis(ax, values: list[float]) -> None:
    ax.set_xscale("log", base=2)
    lo, hi = math.floor(math.log2(min(values))), math.ceil(math.log2(max(values)))
    ticks = [2.0**e for e in range(lo, hi + 1)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    fusion, overlap, sim = _rows(path, data)
    machine = machine_line(path, data)
    caption = f"Measured on {machine}"
    model = sim["model"]
    figures: dict[str, bytes] = {}

    # (a) fusion speed-up against bucket size.
    speedups = _speedups(fusion)
    all_ranks = sorted({r for _, r in speedups})
    fig, ax = figure(caption)
    for (impl, ranks), points in sorted(speedups.items()):
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], color=color(ranks, all_ranks), marker="o" if impl == "ours" else "s",
                linestyle="-" if impl == "ours" else "--", markersize=4, linewidth=1.4,
                label=f"{IMPLS[impl]}, {ranks} ranks")
    ax.axhline(1.0, color="0.5", linewidth=2, alpha=0.5, label="no gain")
    size_axis(ax, sorted({r["bucket_bytes"] for r in fusion if r["bucket_bytes"]}))
    ax.set_xlabel("bucket size (log scale)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}×"))
    ax.set_ylabel("time of 1000 separate allreduces / time fused")
    tensor = human_bytes(fusion[0].get("tensor_bytes", 4096))
    ax.set_title(f"Tensor fusion: {fusion[0].get('tensors', 1000)} gradients of {tensor}, one allreduce each vs bucketed")
    ax.legend(loc="upper left", fontsize=8)
    figures["fusion"] = svg(fig)

    # (b, c) step times against the ratio, measured and predicted (the sweep's rank count).
    sweep_ranks = min(r["ranks"] for r in overlap)
    sweep = sorted((r for r in overlap if r["ranks"] == sweep_ranks), key=_ratio)
    xs = [_ratio(r) for r in sweep]
    fig, ax = figure(caption)
    compute = [r["forward_s"] + r["backward_s"] for r in sweep]  # each point's own: the machine drifts
    for mode, c in (("end", "C3"), ("overlap", "C0")):
        ax.plot(xs, [r[f"measured_{mode}_s"] / t for r, t in zip(sweep, compute)], color=c, marker="o",
                linewidth=1.6, label=f"{mode}: measured")
        ax.plot(xs, [r[f"predicted_{mode}_s"] / t for r, t in zip(sweep, compute)], color=c, marker="x",
                linestyle="--", linewidth=1.0, label=f"{mode}: simulator's prediction")
    ax.axhline(1.0, color="0.4", linestyle=":", label="forward + backward alone")
    _log_ratio_axis(ax, xs)
    ax.set_xlabel("communication time (calibrated link) / backward time (log scale)")
    ax.set_ylabel("step time / (forward + backward time)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Data-parallel step on {sweep_ranks} ranks: allreduce after backward vs overlapped with it")
    ax.legend(loc="upper left", fontsize=8)
    figures["steps"] = svg(fig)

    # The gain against the ratio: simulated curve and measured points.
    gain = sim["gain"]
    fig, ax = figure(caption + f"; line: simulated, {model['workers_for_gain']} workers")
    sim_x = [1 / g["backward_ratio"] for g in gain]
    ax.plot(sim_x, [g["gain"] for g in gain], color="C0", linewidth=1.8, label="simulator, hypothetical model")
    ax.plot(xs, [r["measured_end_s"] / r["measured_overlap_s"] for r in sweep], "o", color="C3",
            label=f"measured, {sweep_ranks} ranks")
    ax.plot(xs, [r["predicted_end_s"] / r["predicted_overlap_s"] for r in sweep], "x", color="C2",
            label=f"simulator, the measured profile ({sweep_ranks} ranks)")
    ax.axvline(1.0, color="0.5", linewidth=1, linestyle=":")
    ax.axhline(1.0, color="0.5", linewidth=2, alpha=0.5)
    _log_ratio_axis(ax, sim_x + xs)
    ax.set_xlabel("communication time / backward time (log scale)")
    ax.set_ylabel("step time without overlap / with overlap")
    ax.set_title("The overlap gain peaks where communication takes as long as backward")
    ax.legend(loc="upper right", fontsize=8)
    figures["gain"] = svg(fig)

    # (d) simulated scaling efficiency.
    scaling = sim["scaling"]
    names = list(dict.fromkeys(r["interconnect"] for r in scaling))
    fig, ax = figure(f"Simulated (not measured): {model['grad_bytes'] / 1e6:g} MB of gradients in {model['layers']} layers, "
                     f"forward {model['forward_s'] * 1e3:g} ms, backward {model['backward_s'] * 1e3:g} ms, "
                     f"{human_bytes(model['bucket_bytes'])} buckets, {model['algorithm']} allreduce")
    for k, name in enumerate(names):
        rows = [r for r in scaling if r["interconnect"] == name]
        w = [r["workers"] for r in rows]
        ax.plot(w, [r["efficiency_overlap"] for r in rows], color=f"C{k}", marker="o", markersize=3,
                label=f"{name}, overlap")
        ax.plot(w, [r["efficiency_end"] for r in rows], color=f"C{k}", linestyle="--", marker="s", markersize=3,
                label=f"{name}, allreduce after backward")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.set_xlabel("workers (log scale)")
    ax.set_ylabel("scaling efficiency = step(1 worker) / step(n workers)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Weak scaling to 1024 workers, with and without overlap")
    ax.legend(loc="lower left", fontsize=7, ncol=2)
    figures["scaling"] = svg(fig)

    # Summary for the page.
    lines = ["| ranks | implementation | separate calls | best bucket size | speed-up there | speed-up at 4 MiB |",
             "|---:|---|---:|---:|---:|---:|"]
    base = {(r["impl"], r["ranks"]): r["time_s"] for r in fusion if r["bucket_bytes"] == 0}
    for (impl, ranks), points in sorted(speedups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        best = max(points, key=points.get)
        at4 = f"{points[4 << 20]:.1f}×" if (4 << 20) in points else "n/a"
        lines.append(f"| {ranks} | {IMPLS[impl]} | {base[(impl, ranks)] * 1e3:.1f} ms | {human_bytes(best)} "
                     f"| {points[best]:.1f}× | {at4} |")
    lines += ["", "| ranks | comm / backward | end: measured | end: predicted | overlap: measured "
              "| overlap: predicted | gain measured | gain predicted |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(overlap, key=lambda r: (r["ranks"], _ratio(r))):
        def ms(key: str) -> str:
            return f"{r[key] * 1e3:.0f} ms"

        def err(mode: str) -> str:
            return f"{r[f'predicted_{mode}_s'] / r[f'measured_{mode}_s'] - 1:+.0%}"
        lines.append(
            f"| {r['ranks']} | {_ratio(r):.2f} | {ms('measured_end_s')} | {ms('predicted_end_s')} ({err('end')}) "
            f"| {ms('measured_overlap_s')} | {ms('predicted_overlap_s')} ({err('overlap')}) "
            f"| {r['measured_end_s'] / r['measured_overlap_s']:.2f}× "
            f"| {r['predicted_end_s'] / r['predicted_overlap_s']:.2f}× |")
    errors = [abs(r[f"predicted_{m}_s"] / r[f"measured_{m}_s"] - 1) for r in overlap for m in ("end", "overlap")]
    within = sum(e <= 0.25 for e in errors)
    lines += ["", f"Predictions within 25 % of the measurement: {within} of {len(errors)} "
              f"(largest error {max(errors):.0%}).",
              "", f"*Machine:* {machine}."]
    return figures, "\n".join(lines) + "\n"
