"""Figures of ``model_parallel.json`` (``python -m benchmarks model_parallel``).

From its ``alltoall`` section, per rank count ``<n>``:

* ``assets/bench/model_parallel-alltoall-busbw-<n>.svg``: bus bandwidth against the send
  buffer per rank for our ``pairwise`` and ``bruck`` all-to-all (solid) and the MPI library's
  ``MPI_Alltoall`` with its default choice (black, dashed), and with MPICH's algorithms
  forced (``MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM``, dotted; separate jobs);

and for all rank counts together

* ``assets/bench/model_parallel-alltoall-ratio.svg``: best of ours over the library's
  busbw against size (above 1, ours is faster), against its default choice (solid) and
  against MPICH's own pairwise exchange timed beside ours (dashed).

From its ``routing`` section (``moe.routing_sweep``; routing decisions, not timings):

* ``assets/bench/model_parallel-routing.svg``: the busiest expert's load over the mean and
  the fraction of assignments dropped, over the training steps, at capacity factor 1.25,
  top-1 (solid) and top-2 (dashed), with Switch's load-balancing loss (blue) and without
  (red): the mean of the seeds, each seed thin;
* ``assets/bench/model_parallel-routing-capacity.svg``: the fraction dropped at the end of
  training against the capacity factor, with the floor ``1 - cf`` that no router can beat.

From its ``activations`` section (one transformer layer under tensor and sequence parallelism):

* ``assets/bench/model_parallel-activations.svg``: bytes the layer keeps for backward per rank
  against the tensor-parallel size, measured with ``tracemalloc`` (points) and the closed form
  ``sequence_parallel.activation_bytes`` (lines); and the same as a fraction of one rank's,
  measured against the paper's formula (dashed). It adds no summary table.

From its ``layouts`` section (one GPT in many layouts on 4 and 2 MPI processes; a MoE layer):

* ``assets/bench/model_parallel-layouts.svg``: per layout, the median step time (whiskers: the
  fastest and slowest repeat) and the peak bytes per rank (``tracemalloc``; darker: the model
  state, 16 bytes per parameter held; a cross: ``zero.zero_memory``'s peak for DP and ZeRO-3);
* ``assets/bench/model_parallel-layouts-moe.svg``: the same for one MoE layer, experts spread
  over the ranks (EP) against all of them on every rank.

From its ``predicted`` section (``planner.predict_step`` on this machine's measured numbers):

* ``assets/bench/model_parallel-predicted.svg``: predicted against measured step time (the
  diagonal, shaded within 25 %), and predicted over measured per layout.

``<!-- bench:model_parallel:summary -->`` becomes the tables: those ratios at 1 MiB and
above, and our ``alltoallv`` against ``MPI_Alltoallv`` with uneven blocks. busbw is
nccl-tests' for all-to-all: algbw (send buffer per rank / time) times (n - 1) / n.
"""
from __future__ import annotations

import statistics
import textwrap
from pathlib import Path
from typing import Any

from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from plotkit import bad, date_text, figure, human_bytes, machine_line, size_axis, svg
from matplotlib.ticker import FixedLocator, NullLocator  # the activations figure

NAME = "model_parallel"
OURS = {"pairwise": "C0", "bruck": "C1"}
FORCED_STYLE = {"mpi:pairwise": "0.45", "mpi:brucks": "C4", "mpi:scattered": "C2"}
LARGE = 1 << 20
ROW_KEYS = {"op": str, "ranks": int, "bytes": int, "impl": str, "job": str, "time_s": (int, float),
            "busbw_GBps": (int, float)}
RATIO_KEYS = {"job": str, "ranks": int, "op": str, "bytes": int, "against": str, "ours_over_mpi": (int, float),
              "pairwise_over_mpi": (int, float)}


def _rows(path: Path, section: dict[str, Any], key: str, keys: dict[str, Any]) -> list[dict[str, Any]]:
    rows = section.get(key)
    if not isinstance(rows, list) or not rows:
        raise bad(path, f"'alltoall.{key}' must be a non-empty list")
    for i, row in enumerate(rows):
        for k, kind in keys.items():
            if not isinstance(row, dict) or not isinstance(row.get(k), kind) or isinstance(row.get(k), bool):
                raise bad(path, f"alltoall.{key}[{i}].{k} is missing or not {kind}")
    return rows


def _series(rows: list[dict[str, Any]], op: str, ranks: int, impl: str, job: str | None = None) -> dict[int, float]:
    return {r["bytes"]: r["busbw_GBps"] for r in rows
            if r["op"] == op and r["ranks"] == ranks and r["impl"] == impl and (job is None or r["job"] == job)}


def _alltoall(path: Path, section: dict[str, Any], machine: str) -> tuple[dict[str, bytes], str]:
    rows = _rows(path, section, "results", ROW_KEYS)
    ratios = _rows(path, section, "ratios", RATIO_KEYS)
    all_ranks = sorted({r["ranks"] for r in rows if r["op"] == "alltoall"})
    if not all_ranks:
        raise bad(path, "no alltoall results")
    figures: dict[str, bytes] = {}
    for ranks in all_ranks:
        sizes = sorted({r["bytes"] for r in rows if r["op"] == "alltoall" and r["ranks"] == ranks})
        fig, ax = figure(f"Measured on {machine}")
        for impl, colour in OURS.items():
            points = _series(rows, "alltoall", ranks, impl, "main")
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], color=colour, marker="o", markersize=3, linewidth=1.4,
                    label=f"ours: {impl}")
        mpi = _series(rows, "alltoall", ranks, "mpi", "main")
        if not mpi:
            raise bad(path, f"no 'mpi' alltoall results of the main job on {ranks} ranks")
        xs = sorted(mpi)
        ax.plot(xs, [mpi[x] for x in xs], color="black", linestyle="--", marker="s", markersize=3, linewidth=1.3,
                label="MPI_Alltoall (library's choice)")
        for impl, colour in FORCED_STYLE.items():
            points = _series(rows, "alltoall", ranks, impl)
            if points:
                xs = sorted(points)
                ax.plot(xs, [points[x] for x in xs], color=colour, linestyle=":", linewidth=1.2,
                        label=f"MPICH {impl.split(':', 1)[1]}, forced (separate job)")
        size_axis(ax, sizes)
        ax.set_xlabel("send buffer per rank (bytes, log scale)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("bus bandwidth, GB/s (log scale)")
        ax.set_title(f"All-to-all on {ranks} ranks: busbw = algbw × (n−1)/n (nccl-tests)")
        ax.legend(loc="lower right", fontsize=7)
        figures[f"alltoall-busbw-{ranks}"] = svg(fig)

    sizes = sorted({r["bytes"] for r in ratios if r["op"] == "alltoall"})
    fig, ax = figure(f"Measured on {machine}")
    for i, ranks in enumerate(all_ranks):
        default = {r["bytes"]: r["ours_over_mpi"] for r in ratios
                   if r["op"] == "alltoall" and r["ranks"] == ranks and r["job"] == "main"}
        same = {r["bytes"]: r["pairwise_over_mpi"] for r in ratios
                if r["op"] == "alltoall" and r["ranks"] == ranks and r["job"] == "forced:pairwise"}
        xs = sorted(default)
        ax.plot(xs, [default[x] for x in xs], color=f"C{i}", marker="o", markersize=3, linewidth=1.4,
                label=f"{ranks} ranks: best of ours / library's choice")
        if same:
            xs = sorted(same)
            ax.plot(xs, [same[x] for x in xs], color=f"C{i}", linestyle="--", linewidth=1.1,
                    label=f"{ranks} ranks: our pairwise / MPICH pairwise")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axvspan(LARGE, max(sizes) * 1.4, color="0.92", zorder=0)
    size_axis(ax, sizes)
    ax.set_xlabel("send buffer per rank (bytes, log scale)")
    ax.set_ylabel("busbw ratio (above 1: ours faster)")
    ax.set_title("All-to-all: ours against the MPI library (shaded: ≥ 1 MiB, where ours should keep up)")
    ax.legend(loc="upper left", fontsize=7)
    figures["alltoall-ratio"] = svg(fig)
    return figures, _summary(section, rows, ratios, all_ranks, machine)


def _summary(section: dict[str, Any], rows: list[dict[str, Any]], ratios: list[dict[str, Any]], all_ranks: list[int],
             machine: str) -> str:
    large = sorted({r["bytes"] for r in ratios if r["op"] == "alltoall" and r["bytes"] >= LARGE})
    lines = ["| ranks | against | " + " | ".join(human_bytes(b) for b in large) + " | median |",
             "|---:|---|" + "---:|" * (len(large) + 1)]
    for ranks in all_ranks if large else []:
        for job, label, key in (("main", "library's choice (best of ours)", "ours_over_mpi"),
                                ("forced:pairwise", "MPICH pairwise (our pairwise)", "pairwise_over_mpi")):
            got = {r["bytes"]: r[key] for r in ratios
                   if r["op"] == "alltoall" and r["ranks"] == ranks and r["job"] == job and r["bytes"] >= LARGE}
            if not got:
                continue
            cells = [f"{got[b]:.2f}" if b in got else "" for b in large]
            lines.append(f"| {ranks} | {label} | " + " | ".join(cells) + f" | {statistics.median(got.values()):.2f} |")
    lines = (lines + ["", "All-to-all, busbw ratio of ours over the MPI library (above 1, ours is faster), from "
                          "1 MiB of send buffer per rank up.", ""]) if large else []
    v = [r for r in ratios if r["op"] == "alltoallv"]
    if v:
        lines += ["| ranks | send bytes per rank | ours / MPI_Alltoallv, counts known | "
                  "ours / MPI, counts exchanged first |", "|---:|---:|---:|---:|"]
        for r in sorted(v, key=lambda r: (r["ranks"], r["bytes"])):
            counts = r.get("with_counts_over_mpi")
            nominal = _nominal(rows, r)
            lines.append(f"| {r['ranks']} | {human_bytes(nominal)} | {r['ours_over_mpi']:.2f} | "
                         + (f"{counts:.2f}" if isinstance(counts, (int, float)) else "n/a") + " |")
        lines += ["", "Alltoallv with uneven blocks (shares 1 : 2 : … : n of the buffer, rotated by rank).", ""]
    loads = [j["loadavg_before"][0] for j in section.get("jobs", []) if isinstance(j, dict) and j.get("loadavg_before")]
    load = f" Load average (1 min) before the jobs: {min(loads):.2f} to {max(loads):.2f}." if loads else ""
    lines.append(f"*Machine:* {machine}.{load}")
    return "\n".join(lines) + "\n"


def _nominal(rows: list[dict[str, Any]], ratio: dict[str, Any]) -> int:
    """An alltoallv size as asked for (``nominal_bytes``); its blocks' total is a little less."""
    for r in rows:
        if r["op"] == "alltoallv" and r["ranks"] == ratio["ranks"] and r["bytes"] == ratio["bytes"]:
            return int(r.get("nominal_bytes", r["bytes"]))
    return ratio["bytes"]


# ----------------------------------------------------------------- routing (moe.routing_sweep)

ROUTING_KEYS = {"top_k": int, "aux_loss_coeff": (int, float), "capacity_factor": (int, float), "seed": int,
                "step": list, "max_load": list, "dropped": list, "loss": list}
SUMMARY_KEYS = {"top_k": int, "aux_loss_coeff": (int, float), "capacity_factor": (int, float),
                "max_load_last": (int, float), "dropped_last": (int, float), "loss_last": (int, float),
                "max_load_first": (int, float), "dropped_first": (int, float)}
AUX_STYLE = {False: ("C3", "no auxiliary loss"), True: ("C0", "load-balancing loss")}
TRAINING_CF = 1.25  # the capacity factor whose training curves are drawn


def _routing_rows(path: Path, section: dict[str, Any], key: str, keys: dict[str, Any]) -> list[dict[str, Any]]:
    rows = section.get(key)
    if not isinstance(rows, list) or not rows:
        raise bad(path, f"'routing.{key}' must be a non-empty list")
    for i, row in enumerate(rows):
        for k, kind in keys.items():
            if not isinstance(row, dict) or not isinstance(row.get(k), kind) or isinstance(row.get(k), bool):
                raise bad(path, f"routing.{key}[{i}].{k} is missing or not {kind}")
    return rows


def _routing(path: Path, section: dict[str, Any], machine: str) -> tuple[dict[str, bytes], str]:
    runs = _routing_rows(path, section, "runs", ROUTING_KEYS)
    summary = _routing_rows(path, section, "summary", SUMMARY_KEYS)
    tops = sorted({r["top_k"] for r in runs})
    alphas = sorted({r["aux_loss_coeff"] for r in runs})
    n_experts, tokens = section.get("n_experts", "?"), section.get("tokens", "?")

    # training curves at one capacity factor: load and drops, mean over seeds (thin: each seed)
    fig, ax = figure(f"Computed on {machine}")
    fig.set_size_inches(9.6, 4.4)
    ax.remove()
    axes = fig.subplots(1, 2)
    for ax, key, label in ((axes[0], "max_load", "busiest expert's load / mean load"),
                           (axes[1], "dropped", "fraction of assignments dropped")):
        ax.grid(True, which="major", alpha=0.3)
        for k in tops:
            for alpha in alphas:
                same = [r for r in runs if r["top_k"] == k and r["aux_loss_coeff"] == alpha
                        and r["capacity_factor"] == TRAINING_CF]
                if not same:
                    continue
                colour, name = AUX_STYLE[alpha > 0]
                style = "-" if k == 1 else "--"
                for r in same:
                    ax.plot(r["step"], r[key], color=colour, linestyle=style, linewidth=0.5, alpha=0.35)
                steps = same[0]["step"]
                mean = [statistics.fmean(r[key][i] for r in same) for i in range(len(steps))]
                ax.plot(steps, mean, color=colour, linestyle=style, linewidth=1.8,
                        label=f"top-{k}, {name}" + (f" (α = {alpha:g})" if alpha else ""))
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylim(bottom=0)
    axes[0].legend(loc="upper left", fontsize=7)
    fig.suptitle(f"Routing while training, {n_experts} experts, {tokens} tokens a step, capacity factor "
                 f"{TRAINING_CF:g} (mean of the seeds; thin: each seed)", fontsize=10)
    figures = {"routing": svg(fig)}

    # dropped fraction at the end of training against the capacity factor
    fig, ax = figure(f"Computed on {machine}")
    cfs = sorted({e["capacity_factor"] for e in summary})
    for k in tops:
        for alpha in alphas:
            pts = {e["capacity_factor"]: e["dropped_last"] for e in summary
                   if e["top_k"] == k and e["aux_loss_coeff"] == alpha}
            colour, name = AUX_STYLE[alpha > 0]
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], color=colour, linestyle="-" if k == 1 else "--", marker="o",
                    markersize=4, linewidth=1.5, label=f"top-{k}, {name}")
    grid = [cfs[0] + (cfs[-1] - cfs[0]) * i / 100 for i in range(101)]
    ax.plot(grid, [max(0.0, 1 - c) for c in grid], color="black", linestyle=":", linewidth=1.2,
            label="floor: 1 − capacity factor (E × capacity < T k)")
    ax.set_xlabel("capacity factor")
    ax.set_ylabel("fraction of assignments dropped (last 50 steps)")
    ax.set_ylim(bottom=0)
    ax.set_title("Drops at the end of training against capacity (mean of the seeds)")
    ax.legend(loc="upper right", fontsize=7)
    figures["routing-capacity"] = svg(fig)
    return figures, _routing_summary(summary, tops, alphas, cfs)


def _routing_summary(summary: list[dict[str, Any]], tops: list[int], alphas: list[float], cfs: list[float]) -> str:
    lines = ["| top-k | auxiliary loss | " + " | ".join(f"cf {c:g}" for c in cfs) + " |",
             "|---:|---|" + "---:|" * len(cfs)]
    for k in tops:
        for alpha in alphas:
            got = {e["capacity_factor"]: e for e in summary if e["top_k"] == k and e["aux_loss_coeff"] == alpha}
            cells = [f"{got[c]['max_load_last']:.2f}× / {got[c]['dropped_last'] * 100:.1f} %" if c in got else ""
                     for c in cfs]
            lines.append(f"| {k} | {f'α = {alpha:g}' if alpha else 'off'} | " + " | ".join(cells) + " |")
    lines += ["", "Routing at the end of training (last 50 steps, mean of the seeds): the busiest expert's load "
                  "over the mean, and the fraction of assignments dropped, per capacity factor (cf).", ""]
    return "\n".join(lines)


def _numpy_machine(machine: Any) -> str:
    """The routing section's caption: routing decisions depend on NumPy, not on an MPI library."""
    if not isinstance(machine, dict):
        return "?"
    return (f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, NumPy {machine.get('numpy', '?')}, "
            f"{date_text(machine.get('date', '?'))}")


# ----------------------------------------------------------------- activations

ACT_STYLE = {"TP": ("0.3", "o"), "TP+SP": ("C0", "s"), "TP+SP keep": ("C1", "^")}
ACT_LABEL = {"TP": "tensor parallelism", "TP+SP": "+ sequence parallelism (Megatron: inputs re-gathered)",
             "TP+SP keep": "+ sequence parallelism, gathered inputs kept"}
ACT_KEYS = {"mode": str, "ranks": int, "measured_max": int, "closed_form": dict, "fraction_of_one_rank": (int, float)}


def _activations(path: Path, section: dict[str, Any], machine: str) -> dict[str, bytes]:
    """Bytes one layer keeps for backward per rank against t: measured and closed form; as a
    fraction of one rank's, measured and by the paper's formula."""
    rows = section.get("memory")
    if not isinstance(rows, list) or not rows:
        raise bad(path, "'activations.memory' must be a non-empty list")
    for i, row in enumerate(rows):
        for k, kind in ACT_KEYS.items():
            if not isinstance(row, dict) or not isinstance(row.get(k), kind) or isinstance(row.get(k), bool):
                raise bad(path, f"activations.memory[{i}].{k} is missing or not {kind}")
        if row["mode"] not in ACT_STYLE:
            raise bad(path, f"activations.memory[{i}].mode is {row['mode']!r}, not one of {list(ACT_STYLE)}")
    c = section.get("config", {})
    caption = (f"One transformer layer of a GPT with width {c.get('n_embd')}, {c.get('n_head')} heads, "
               f"{section.get('batch')} sequences of {section.get('seq')} tokens, float32; one MPI process per rank, "
               "each tracing itself with tracemalloc; the largest rank shown. Paper: Korthikanti et al. 2022, "
               f"s b h (10 + 24/t + 5as/(ht)) and s b h (34/t + 5as/(ht)). Measured on {machine}")
    fig, _ = figure("\n".join(textwrap.wrap(caption, 130)))
    fig.clear()
    fig.supxlabel("\n".join(textwrap.wrap(caption, 130)), fontsize=7, color="0.35")
    left, right = fig.subplots(1, 2)
    ranks = sorted({r["ranks"] for r in rows})
    for mode, (colour, marker) in ACT_STYLE.items():
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["ranks"])
        if not mine:
            continue
        xs = [r["ranks"] for r in mine]
        left.plot(xs, [r["closed_form"]["total"] / 2**20 for r in mine], color=colour, linewidth=1.2, alpha=0.8)
        left.plot(xs, [r["measured_max"] / 2**20 for r in mine], color=colour, marker=marker, linestyle="none",
                  markersize=6, label=ACT_LABEL[mode])
        right.plot(xs, [r["fraction_of_one_rank"] for r in mine], color=colour, marker=marker, linestyle="none",
                   markersize=6)
        paper = [r.get("paper_fraction_of_one_rank") for r in mine]
        if all(isinstance(p, (int, float)) for p in paper):
            right.plot(xs, paper, color=colour, linewidth=1.2, linestyle="--", alpha=0.8)
    right.plot(ranks, [1 / t for t in ranks], color="0.6", linewidth=1, linestyle=":", label="1/t (everything split)")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(ranks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_xlim(min(ranks) / 1.3, max(ranks) * 1.3)
        ax.set_xlabel("tensor-parallel size t (log scale)")
        ax.set_ylim(bottom=0)
    left.set_ylabel("bytes kept for backward per rank (MiB)")
    left.set_title("per layer: points measured, lines closed form", fontsize=9)
    right.set_ylabel("fraction of what one rank keeps")
    right.set_title("measured (points) and the paper's formula (dashed)", fontsize=9)
    left.legend(loc="lower left", fontsize=7)
    right.legend(loc="lower left", fontsize=7)
    return {"activations": svg(fig)}


# ----------------------------------------------------------------- layouts and predicted (one GPT, many layouts)

LAYOUT_KEYS = {"kind": str, "ranks": int, "layout": str, "step_s": (int, float), "step_times": list,
               "peak_bytes": int, "model_state_bytes": int}
PRED_KEYS = {"ranks": int, "layout": str, "measured_s": (int, float), "predicted_s": (int, float),
             "ratio": (int, float), "predicted_shared_s": (int, float), "ratio_shared": (int, float),
             "measured_peak_bytes": int, "predicted_memory_bytes": (int, float)}
RANK_COLOUR = {4: "C0", 2: "C1", 1: "C2", 8: "C3"}
MIB = 2**20
ONE_RANK = "1 rank"  # benchmarks/model_parallel_layouts.py's baseline row


def _checked(path: Path, rows: Any, where: str, keys: dict[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(rows, list) or not rows:
        raise bad(path, f"'{where}' must be a non-empty list")
    for i, row in enumerate(rows):
        for k, kind in keys.items():
            if not isinstance(row, dict) or not isinstance(row.get(k), kind) or isinstance(row.get(k), bool):
                raise bad(path, f"{where}[{i}].{k} is missing or not {kind}")
    return rows


def _section_machine(path: Path, data: dict[str, Any], name: str, fallback: str) -> str:
    section_machine = data.get("section_machines", {}).get(name)
    return machine_line(path, {"machine": section_machine}) if section_machine else fallback


def _label(row: dict[str, Any]) -> str:
    if row["layout"] == ONE_RANK:
        return f"1 rank (baseline, {row.get('job_ranks', '?')}-rank job)"
    return f"{row['layout']} ({row['ranks']} ranks)"


def _bars(rows: list[dict[str, Any]], title: str, caption: str, zero_peak: bool) -> bytes:
    """Two panels of horizontal bars, one per row: step time (whiskers: fastest and slowest repeat)
    and peak bytes per rank (the model-state part darker; x: a closed-form peak where there is one)."""
    fig, _ = figure("\n".join(textwrap.wrap(caption, 130)))
    fig.clear()
    fig.supxlabel("\n".join(textwrap.wrap(caption, 130)), fontsize=7, color="0.35")
    fig.suptitle(title, fontsize=9)
    fig.set_size_inches(7.6, 2.4 + 0.27 * len(rows))
    left, right = fig.subplots(1, 2, sharey=True)
    ys = list(range(len(rows)))[::-1]
    colours = ["0.55" if r["layout"] == ONE_RANK else RANK_COLOUR.get(r["ranks"], "0.5") for r in rows]
    ms = [1e3 * r["step_s"] for r in rows]
    lo = [m - 1e3 * min(r["step_times"]) for m, r in zip(ms, rows)]
    hi = [1e3 * max(r["step_times"]) - m for m, r in zip(ms, rows)]
    left.barh(ys, ms, color=colours, alpha=0.85, xerr=[lo, hi], error_kw={"elinewidth": 0.8, "capsize": 2})
    right.barh(ys, [r["peak_bytes"] / MIB for r in rows], color=colours, alpha=0.45)
    right.barh(ys, [r["model_state_bytes"] / MIB for r in rows], color=colours, alpha=0.95, height=0.4)
    closed = [(y, r["predicted_peak_bytes"] / MIB) for y, r in zip(ys, rows)
              if zero_peak and isinstance(r.get("predicted_peak_bytes"), (int, float))]
    if closed:
        right.plot([c[1] for c in closed], [c[0] for c in closed], "kx", markersize=7,
                   label="closed form: zero.zero_memory peak")
        right.legend(loc="lower right", fontsize=7)
    left.set_yticks(ys, [_label(r) for r in rows])
    left.set_xlabel("median step time (ms)\nwhiskers: fastest and slowest repeat")
    right.set_xlabel("peak per rank (MiB, tracemalloc)\ndark: model state, 16 B per parameter held")
    for ax in (left, right):
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_xlim(left=0)
    return svg(fig)


def _layouts(path: Path, section: dict[str, Any], machine: str) -> tuple[dict[str, bytes], str]:
    rows = _checked(path, section.get("results"), "layouts.results", LAYOUT_KEYS)
    gpt = sorted((r for r in rows if r["kind"] == "gpt"),
                 key=lambda r: (-r.get("job_ranks", r["ranks"]), r["layout"] != ONE_RANK))
    moe = sorted((r for r in rows if r["kind"] == "moe_layer"), key=lambda r: (-r["ranks"], r.get("top_k", 0)))
    if not gpt:
        raise bad(path, "layouts.results has no 'gpt' rows")
    m = section.get("model", {})
    cores = section.get("cores")
    over = [j for j in section.get("jobs", []) if isinstance(j, dict) and j.get("oversubscribed")]
    loads = [j["loadavg_before"][0] for j in section.get("jobs", []) if isinstance(j, dict) and j.get("loadavg_before")]
    shared = (f" {max(j['ranks'] for j in over)} processes on {cores} cores: oversubscribed." if over else "")
    caption = (f"GPT of {m.get('n_layer')} blocks, width {m.get('n_embd')}, {m.get('n_head')} heads, "
               f"{(m.get('n_params') or 0) / 1e6:.1f} M parameters, float32, Adam; "
               f"global batch {section.get('batch')} x "
               f"{section.get('seq')} in every layout; PP: GPipe, {section.get('microbatches')} micro-batches; "
               f"one MPI process per rank.{shared} Measured on {machine}")
    figures = {"layouts": _bars(gpt, "One GPT, every layout: step time and memory per rank", caption, True)}
    lines = ["| ranks | layout | step (ms) | peak per rank (MiB) | model state (MiB) | closed-form peak (MiB) |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in gpt:
        closed = r.get("predicted_peak_bytes")
        layout = f"{ONE_RANK} (baseline of the {r.get('job_ranks', '?')}-rank job)" if r["layout"] == ONE_RANK \
            else r["layout"]
        lines.append(f"| {r['ranks']} | {layout} | {1e3 * r['step_s']:.0f} | {r['peak_bytes'] / MIB:.1f} | "
                     f"{r['model_state_bytes'] / MIB:.1f} | "
                     + (f"{closed / MIB:.1f}" if isinstance(closed, (int, float)) else "") + " |")
    check = gpt[0].get("loss_check", {})
    lines += ["", f"One GPT ({(m.get('n_params') or 0) / 1e6:.1f} M parameters, float32), the same global batch in "
                  f"every layout: median step time and each rank's tracemalloc peak (the largest rank); the baseline "
                  f"is one process training the whole model on the whole batch, timed between the layouts' steps. "
                  f"Every layout's losses equal the baseline's to {check.get('max_rel_diff', float('nan')):.1e} "
                  f"(relative)."
                  + (f" {section.get('caveat')}." if over else ""), ""]
    if moe:
        k_note = "; ".join(sorted({f"k = {r.get('top_k')}" for r in moe}))
        ml = section.get("moe_layer") or {}
        caption = (f"One mixture-of-experts layer (not the GPT): {ml.get('n_experts')} experts of shape "
                   f"{ml.get('expert_shape')}, {k_note}, capacity factor {ml.get('capacity_factor')}, "
                   f"{ml.get('tokens_per_rank')} tokens per rank, float32, Adam. EP: experts spread over the ranks, "
                   f"all-to-all; replicated: all experts on every rank, gradients allreduced.{shared} "
                   f"Measured on {machine}")
        figures["layouts-moe"] = _bars(moe, "A MoE layer: expert parallelism against replicated experts", caption,
                                       False)
        lines += ["| ranks | MoE layer | step (ms) | peak per rank (MiB) | model state (MiB) |",
                  "|---:|---|---:|---:|---:|"]
        for r in moe:
            lines.append(f"| {r['ranks']} | {r['layout']} | {1e3 * r['step_s']:.0f} | {r['peak_bytes'] / MIB:.1f} | "
                         f"{r['model_state_bytes'] / MIB:.1f} |")
        lines += ["", "One MoE layer (not the GPT), the same tokens per rank in both layouts; their losses and "
                      "expert parameters are checked equal.", ""]
    load = f" Load average (1 min) before the jobs: {min(loads):.2f} to {max(loads):.2f}." if loads else ""
    lines.append(f"*Machine:* {machine}.{load}")
    return figures, "\n".join(lines) + "\n"


def _predicted(path: Path, section: dict[str, Any], machine: str) -> tuple[dict[str, bytes], str]:
    rows = _checked(path, section.get("rows"), "predicted.rows", PRED_KEYS)
    target = float(section.get("target", 0.25))
    rates = section.get("flops_per_s")
    rate_text = ", ".join(f"{v / 1e9:.0f} GFLOP/s in the {k}-rank job" for k, v in sorted(rates.items())) \
        if isinstance(rates, dict) else "?"
    fig_caption = "\n".join(textwrap.wrap(
        f"planner.predict_step on this machine: one rank's measured rate, forward and backward "
        f"({rate_text}), and the calibrated link "
        f"(alpha {section.get('link', {}).get('alpha', 0) * 1e6:.1f} us, "
        f"{1e-9 / max(section.get('link', {}).get('beta', 1e-30), 1e-30):.1f} GB/s). Filled: as the planner is "
        f"(a core per rank); open: each rank's rate times cores / ranks. Shaded: within {target:.0%}. "
        f"Measured on {machine}", 130))
    fig, _ = figure(fig_caption)
    fig.clear()
    fig.supxlabel(fig_caption, fontsize=7, color="0.35")
    fig.set_size_inches(7.6, 4.8)
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.15])
    values = [1e3 * v for r in rows for v in (r["measured_s"], r["predicted_s"], r["predicted_shared_s"])]
    lo, hi = 0.0, max(values) * 1.1
    diag = [lo, hi]
    left.fill_between(diag, [x * (1 - target) for x in diag], [x * (1 + target) for x in diag], color="0.9")
    left.plot(diag, diag, color="0.4", linewidth=1, label="predicted = measured")
    ordered = sorted(rows, key=lambda r: (-r["ranks"], r["measured_s"]))
    ys = list(range(len(ordered)))[::-1]
    for ranks in sorted({r["ranks"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["ranks"] == ranks]
        colour = RANK_COLOUR.get(ranks, "0.5")
        shared = any(r["predicted_shared_s"] != r["predicted_s"] for r in mine)
        left.plot([1e3 * r["measured_s"] for r in mine], [1e3 * r["predicted_s"] for r in mine], "o", color=colour,
                  label=f"{ranks} ranks")
        if shared:
            left.plot([1e3 * r["measured_s"] for r in mine], [1e3 * r["predicted_shared_s"] for r in mine], "o",
                      mfc="none", color=colour, label=f"{ranks} ranks, rate x cores/ranks")
        mine_y = [y for y, r in zip(ys, ordered) if r["ranks"] == ranks]
        mine_rows = [r for r in ordered if r["ranks"] == ranks]
        right.plot([r["ratio"] for r in mine_rows], mine_y, "o", color=colour)
        if shared:
            right.plot([r["ratio_shared"] for r in mine_rows], mine_y, "o", mfc="none", color=colour)
    left.set_xlim(lo, hi)
    left.set_ylim(lo, hi)
    left.set_aspect("equal")
    left.grid(True, alpha=0.3)
    left.set_xlabel("measured step time (ms)")
    left.set_ylabel("predicted step time (ms)")
    left.legend(loc="upper left", fontsize=7)
    ratios = [v for r in rows for v in (r["ratio"], r["ratio_shared"])]
    right.axvspan(1 - target, 1 + target, color="0.9")
    right.axvline(1, color="0.4", linewidth=1)
    right.set_xlim(0, max(max(ratios), 1 + target) * 1.1)
    right.set_yticks(ys, [f"{r['layout']} ({r['ranks']})" for r in ordered])
    right.yaxis.tick_right()
    right.set_xlabel("predicted / measured")
    right.grid(True, axis="x", alpha=0.3)
    lines = ["| ranks | layout | measured (ms) | predicted (ms) | predicted / measured | cores shared | "
             "memory predicted / measured |", "|---:|---|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (-r["ranks"], r["measured_s"])):
        shared = f"{r['ratio_shared']:.2f}" if r["predicted_shared_s"] != r["predicted_s"] else "(same)"
        lines.append(f"| {r['ranks']} | {r['layout']} | {1e3 * r['measured_s']:.0f} | {1e3 * r['predicted_s']:.0f} | "
                     f"{r['ratio']:.2f} | {shared} | "
                     f"{r['predicted_memory_bytes'] / r['measured_peak_bytes']:.2f} |")
    ok = sum(abs(r["ratio"] - 1) <= target for r in rows)
    shared_ok = sum(abs(r["ratio_shared"] - 1) <= target for r in rows)
    lines += ["", f"The layout planner's step time on this machine against the measured one: {ok} of {len(rows)} "
                  f"within {target:.0%}."]
    if any(r["predicted_shared_s"] != r["predicted_s"] for r in rows):
        lines[-1] += (f" Where ranks outnumber cores the planner, which gives each rank a core, cannot be right: "
                      f"'cores shared' scales each rank's rate by cores / ranks ({shared_ok} of {len(rows)} within "
                      f"{target:.0%} so).")
    for entry in section.get("ranking", []):
        if not isinstance(entry, dict) or "measured_order" not in entry:
            continue
        decisive = (f" Of the {entry['decisive_pairs']} pairs it predicts more than "
                    f"{entry.get('decisive_margin', 0.05):.0%} apart, the measurement orders "
                    f"{entry.get('decisive_agree')} the same way." if isinstance(entry.get("decisive_pairs"), int)
                    else "")
        lines.append(f"{entry['ranks']} ranks, fastest first: measured {', '.join(entry['measured_order'])}; "
                     f"planner {', '.join(entry.get('predicted_order', []))} (Kendall's tau "
                     f"{entry.get('kendall_tau', float('nan')):.2f}).{decisive}")
    lines += ["", f"*Machine:* {machine}."]
    return {"predicted": svg(fig)}, "\n".join(lines) + "\n"



def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    machine = machine_line(path, data)
    figures: dict[str, bytes] = {}
    summaries = []
    if isinstance(data.get("alltoall"), dict):
        f, s = _alltoall(path, data["alltoall"], machine)
        figures.update(f)
        summaries.append(s)
    if isinstance(data.get("routing"), dict):
        section_machine = data.get("section_machines", {}).get("routing")
        f, s = _routing(path, data["routing"], _numpy_machine(section_machine or data.get("machine", {})))
        figures.update(f)
        summaries.append(s)
    if isinstance(data.get("activations"), dict):  # a figure for its page, no summary table
        section_machine = data.get("section_machines", {}).get("activations")
        figures.update(_activations(path, data["activations"],
                                    machine_line(path, {"machine": section_machine}) if section_machine else machine))
    for name, draw in (("layouts", _layouts), ("predicted", _predicted)):
        if isinstance(data.get(name), dict):
            f, s = draw(path, data[name], _section_machine(path, data, name, machine))
            figures.update(f)
            summaries.append(s)
    if not summaries and not figures:
        raise bad(path, "no section this plotter knows ('alltoall', 'routing', 'activations', 'layouts', "
                        "'predicted')")
    return figures, "\n".join(summaries)
