"""Figures of ``sharded.json`` (``python -m benchmarks sharded``): ZeRO against plain DP.

* ``assets/bench/sharded-memory.svg``: peak bytes per rank against the number of ranks for
  plain data parallelism and ZeRO stages 1-3 (stage 3 with and without prefetch): measured
  points (the largest rank's ``tracemalloc`` peak, one MPI process per rank) and the
  prediction of ``zero.zero_memory`` as lines, same colour per run;
* ``assets/bench/sharded-time.svg``: the median step time of each stage relative to plain DP
  on the same ranks and network, one panel per (MPI or thread ranks, rank count), grouped by
  network (shared memory, simulated 10 Gb/s and 1 Gb/s links), with ZeRO-3's prefetch speedup
  (no-prefetch median over prefetch median) written over its pair of bars.

``<!-- bench:sharded:summary -->`` becomes the tables: memory measured against predicted,
step-time ratios and prefetch speedups, and bytes per step against the closed forms.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from plotkit import bad, figure, human_bytes, machine_line, svg

NAME = "sharded"
RUNS = ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3 prefetch", "ZeRO-3 no prefetch")
COLOURS = {"DP": "0.35", "ZeRO-1": "C0", "ZeRO-2": "C1", "ZeRO-3 prefetch": "C3", "ZeRO-3 no prefetch": "C2"}
MARKERS = {"DP": "o", "ZeRO-1": "s", "ZeRO-2": "^", "ZeRO-3 prefetch": "D", "ZeRO-3 no prefetch": "v"}


def _check(path: Path, data: dict[str, Any]) -> None:
    for key in ("memory", "time", "bytes"):
        if not isinstance(data.get(key), dict):
            raise bad(path, f"missing the '{key}' section")
    for i, e in enumerate(data["memory"].get("results") or []):
        for k in ("run", "ranks", "measured_max", "predicted_peak", "measured_per_process"):
            if k not in e:
                raise bad(path, f"memory.results[{i}] lacks '{k}'")
    if not data["memory"].get("results"):
        raise bad(path, "'memory.results' must be a non-empty list")
    t = data["time"]
    if not t.get("results") or not t.get("ratios") or not t.get("nets"):
        raise bad(path, "'time' needs non-empty 'results', 'ratios' and 'nets'")
    for i, r in enumerate(t["ratios"]):
        for k in ("transport", "ranks", "net", "relative_to_dp", "prefetch_speedup"):
            if k not in r:
                raise bad(path, f"time.ratios[{i}] lacks '{k}'")
    models = data["bytes"].get("models")
    if not isinstance(models, dict) or not models:
        raise bad(path, "'bytes.models' must be a non-empty object")
    for label, m in models.items():
        for i, r in enumerate(m.get("results") or []):
            for k in ("run", "ranks", "measured_bytes_per_step", "closed_form_bytes", "psi_pad"):
                if k not in r:
                    raise bad(path, f"bytes.models.{label}.results[{i}] lacks '{k}'")


def _wrap(caption: str, width: int) -> str:
    """A long caption on several lines, so the figure's width does not cut it off."""
    return "\n".join(textwrap.wrap(caption, width))


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _memory_figure(mem: dict[str, Any], machine: str) -> bytes:
    c = mem["config"]
    fig, ax = figure(_wrap(f"{c['n_layer']}-layer GPT, width {c['n_embd']}, float32 Adam, batch {mem['batch_per_rank']} x "
                     f"{mem['seq']} tokens per rank; one MPI process per rank, each traced with tracemalloc; "
                     f"the largest rank shown. Measured on {machine}", 110))
    ranks = sorted({e["ranks"] for e in mem["results"]})
    for run in RUNS:
        rows = sorted((e for e in mem["results"] if e["run"] == run), key=lambda e: e["ranks"])
        if not rows:
            continue
        xs = [e["ranks"] for e in rows]
        ax.plot(xs, [e["predicted_peak"] / 2**20 for e in rows], color=COLOURS[run], linewidth=1.2, alpha=0.8,
                linestyle="--" if run == "ZeRO-3 no prefetch" else "-")
        ax.plot(xs, [e["measured_max"] / 2**20 for e in rows], color=COLOURS[run], marker=MARKERS[run],
                linestyle="none", markersize=6, label=run)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ranks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.set_xlim(min(ranks) / 1.3, max(ranks) * 1.3)
    top = max(max(e["measured_max"], e["predicted_peak"]) for e in mem["results"]) / 2**20
    ax.set_ylim(0, top * 1.08)
    ax.set_xlabel("ranks N (data-parallel group size, log scale)")
    ax.set_ylabel("peak memory per rank (MiB)")
    handles, labels = ax.get_legend_handles_labels()
    from matplotlib.lines import Line2D

    handles.append(Line2D([], [], color="0.3", linewidth=1.2))
    labels.append("lines: predicted (zero_memory)")
    ax.legend(handles, labels, loc="lower left", fontsize=8, title="points: measured", title_fontsize=8)
    return svg(fig)


def _time_figure(t: dict[str, Any], machine: str) -> bytes:
    c = t["config"]
    caption = (f"{c['n_layer']}-layer GPT, width {c['n_embd']}, float32, batch {t['batch_per_rank']} x {t['seq']} "
               f"tokens per rank, one BLAS thread per rank; median of {t['repeats']} interleaved steps, slowest rank. "
               f"Links simulated in sleep timing (cost wall time, no CPU). Measured on {machine}")
    caption = _wrap(caption, 135)
    panels = sorted({(r["transport"], r["ranks"]) for r in t["ratios"]}, key=lambda p: (p[0] != "mpi", p[1]))
    fig, _ = figure(caption)
    fig.set_size_inches(9, 5.6)
    fig.clear()  # a grid of panels instead of plotkit's one axis: redo its caption
    fig.supxlabel(caption, fontsize=7, color="0.35")
    cols = 2
    rows_n = (len(panels) + cols - 1) // cols
    axes = fig.subplots(rows_n, cols, sharey=True, squeeze=False).ravel()
    shown = [r for r in RUNS if r != "DP"]
    width = 0.8 / len(shown)
    nets = t["nets"]
    ymax = max(v for r in t["ratios"] for k, v in r["relative_to_dp"].items())
    for ax, (transport, n) in zip(axes, panels):
        ax.grid(True, axis="y", alpha=0.3)
        ax.axhline(1.0, color="0.35", linewidth=1, linestyle=":")
        by_net = {r["net"]: r for r in t["ratios"] if r["transport"] == transport and r["ranks"] == n}
        for j, run in enumerate(shown):
            xs = [i + (j - (len(shown) - 1) / 2) * width for i in range(len(nets))]
            ys = [by_net[net]["relative_to_dp"].get(run, float("nan")) for net in nets]
            ax.bar(xs, ys, width, color=COLOURS[run], label=run)
        for i, net in enumerate(nets):
            r = by_net[net]
            top = max(r["relative_to_dp"].get(k, 0) for k in ("ZeRO-3 prefetch", "ZeRO-3 no prefetch"))
            ax.text(i + width, top + 0.03 * ymax, f"{r['prefetch_speedup']:.2f}x", ha="center", va="bottom",
                    fontsize=7)
        ax.set_xticks(range(len(nets)), [net.replace("shared-memory", "shared memory")
                                         + ("" if net == "shared-memory" else " (sim.)") for net in nets])
        ax.set_title(f"{n} {'MPI processes' if transport == 'mpi' else 'thread ranks'}", fontsize=9)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax in axes[::cols]:
        ax.set_ylabel("median step time / DP's")
    axes[0].set_ylim(0, ymax * 1.22)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncol=2, fontsize=8,
               title="bars: each stage's median over plain DP's (dotted line: DP); "
                     "over ZeRO-3's pair: prefetch speedup (no prefetch / prefetch)", title_fontsize=8)
    return svg(fig)


PRECISION_STYLE = {"fp32": ("0.15", "-", "o"), "bf16": ("C0", "--", "s"), "fp16": ("C1", "-.", "^"),
                   "fp8": ("C3", ":", "D")}  # colour, line style and marker: told apart without colour too


def _precision_figure(prec: dict[str, Any], machine: str) -> bytes:
    """Held-out loss against the step for each format (the same seed, batches and model)."""
    caption = _wrap(f"Validation loss of the same GPT run in each format ({prec['steps']} Adam steps, float32 master "
                    f"weights; fp16 with dynamic loss scaling; fp8: E4M3 forward, E5M2 backward, delayed scaling). "
                    f"Source: {prec['source']}. Measured on {machine}", 135)
    fig, ax = figure(caption)
    for name, run in prec["runs"].items():
        colour, style, marker = PRECISION_STYLE.get(name, ("0.5", "-", "x"))
        steps, losses = zip(*run["eval"])
        ax.plot(steps, losses, color=colour, linestyle=style, marker=marker, markersize=4, linewidth=1.4,
                label=f"{name}: {run['final_eval']:.4f} at the end")
    ax.set_xlabel("Adam step")
    ax.set_ylabel("validation loss (nats per character)")
    ax.legend(loc="upper right", fontsize=8, title="format: final validation loss", title_fontsize=8)
    return svg(fig)


def _bytes_table(b: dict[str, Any]) -> list[str]:
    lines = []
    for label, m in b["models"].items():
        c = m["config"]
        rows = m["results"]
        psi = rows[0].get("psi")
        lines += ["", f"**Bytes one rank sends per step**, {label} model ({c['n_layer']} layers, width {c['n_embd']}, "
                      f"Ψ = {psi} float32 values; counted by `CountingCommunicator` on thread ranks over "
                      f"{b['steps']} steps, every rank), against `comm_elements`: 2 Ψ_pad (N−1)/N values for "
                      "DP and ZeRO-1/2, 3 Ψ_pad (N−1)/N for ZeRO-3:", "",
                  "| run | N | Ψ_pad | measured bytes / step | closed form | equal |", "|---|---:|---:|---:|---:|---|"]
        for r in sorted(rows, key=lambda r: (RUNS.index(r["run"]), r["ranks"])):
            sent = sorted({s for per in r["measured_bytes_per_step"] for s in per})
            shown = ", ".join(str(s) for s in sent)
            lines.append(f"| {r['run']} | {r['ranks']} | {r['psi_pad']} | {shown} | {r['closed_form_bytes']} "
                         f"({human_bytes(r['closed_form_bytes'], 3)}) | {'yes' if sent == [r['closed_form_bytes']] else 'NO'} |")
    return lines


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    figs = {"memory": _memory_figure(data["memory"], machine), "time": _time_figure(data["time"], machine)}
    if data.get("precision"):
        figs["precision"] = _precision_figure(data["precision"], machine)

    mem = data["memory"]
    ranks = sorted({e["ranks"] for e in mem["results"]})
    cell = {(e["run"], e["ranks"]): e for e in mem["results"]}
    lines = ["**Peak memory per rank** (largest rank; measured with tracemalloc / predicted by `zero_memory`, "
             "and predicted ÷ measured):", "",
             "| run | " + " | ".join(f"N = {n}" for n in ranks) + " |", "|---|" + "---:|" * len(ranks)]
    for run in RUNS:
        cells = []
        for n in ranks:
            e = cell.get((run, n))
            cells.append("–" if e is None else f"{_mib(e['measured_max'])} / {_mib(e['predicted_peak'])} "
                                               f"({e['predicted_over_measured']:.3f})")
        lines.append(f"| {run} | " + " | ".join(cells) + " |")

    t = data["time"]
    nets = t["nets"]
    lines += ["", f"**Step time relative to plain DP** (median of {t['repeats']} interleaved steps; ZeRO-1 / ZeRO-2 / "
                  "ZeRO-3 prefetch / ZeRO-3 no prefetch; then the prefetch speedup, no-prefetch ÷ prefetch):", "",
              "| ranks | " + " | ".join(nets) + " |", "|---|" + "---|" * len(nets)]
    for transport, n in sorted({(r["transport"], r["ranks"]) for r in t["ratios"]}, key=lambda p: (p[0] != "mpi", p[1])):
        by_net = {r["net"]: r for r in t["ratios"] if r["transport"] == transport and r["ranks"] == n}
        cells = []
        for net in nets:
            r = by_net[net]
            rel = " / ".join(f"{r['relative_to_dp'][k]:.2f}" for k in RUNS[1:])
            dp = next(x["median_s"] for x in t["results"] if x["transport"] == transport and x["ranks"] == n
                      and x["net"] == net and x["run"] == "DP")
            cells.append(f"{rel}; prefetch {r['prefetch_speedup']:.2f}× (DP {dp * 1e3:.1f} ms)")
        lines.append(f"| {n} {'MPI' if transport == 'mpi' else 'threads'} | " + " | ".join(cells) + " |")
    lines += _bytes_table(data["bytes"])
    prec = data.get("precision")
    if prec:
        lines += ["", f"**Precision** (`{prec['source']}`: the same model, initialisation and batches, "
                      f"{prec['steps']} steps; float32 loss of the master weights on a fixed validation batch):", "",
                  "| format | final validation loss | mean training loss, last 10 steps | skipped steps |",
                  "|---|---:|---:|---:|"]
        for name, r in prec["runs"].items():
            lines.append(f"| {name} | {r['final_eval']:.4f} | {r['final_train']:.4f} | {len(r['skipped'])} |")
    lines += ["", f"*Machine:* {machine}."]
    return figs, "\n".join(lines) + "\n"
