"""Figures of ``training.json`` (``python -m benchmarks training``).

* ``training-init.svg``: activation standard deviation through 50 layers per initialiser
  (tanh and ReLU side by side, log scale);
* ``training-warmup.svg``: loss against epochs for small-batch, large-batch, scaled and
  scaled-with-warm-up SGD;
* ``training-mixed.svg``: the underflow demo with and without loss scaling, and the
  classifier in float32 and mixed precision;
* ``training-search.svg``: the best validation loss found by grid, random and successive-
  halving search over the seeds, and where each trial's learning rate fell.

The ``<!-- bench:training:summary -->`` marker becomes a table of the measured numbers.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from plotkit import bad, machine_line, svg

NAME = "training"


def _check(path: Path, data: dict[str, Any]) -> None:
    for key in ("init_depth", "warmup", "mixed_precision", "search"):
        if not isinstance(data.get(key), dict):
            raise bad(path, f"'{key}' must be an object (run the whole benchmark)")
    for act in ("tanh", "relu"):
        curves = data["init_depth"].get(act)
        if not isinstance(curves, dict) or not curves or not all(
                isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v) for v in curves.values()):
            raise bad(path, f"'init_depth.{act}' must map initialisers to lists of standard deviations")
    runs = data["warmup"].get("runs")
    if not isinstance(runs, dict) or len(runs) != 4:
        raise bad(path, "'warmup.runs' must hold the four runs")
    mp = data["mixed_precision"]
    if not all(isinstance(mp.get(k), dict) for k in ("underflow", "training", "step_cost")):
        raise bad(path, "'mixed_precision' needs 'underflow', 'training' and 'step_cost'")
    s = data["search"]
    if not (isinstance(s.get("grid"), list) and s["grid"] and isinstance(s.get("random"), list) and s["random"]
            and isinstance(s.get("halving"), list) and len(s["halving"]) == len(s["random"])):
        raise bad(path, "'search' needs non-empty 'grid', 'random' and 'halving' lists")


def _fig(caption: str, cols: int) -> tuple[Figure, list]:
    fig = Figure(figsize=(7.6, 4.0), layout="constrained")
    axes = [fig.add_subplot(1, cols, i + 1) for i in range(cols)]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.supxlabel(caption, fontsize=7, color="0.35")
    return fig, axes


def _finite(xs: list[float]) -> list[float]:
    return [x if isinstance(x, (int, float)) and math.isfinite(x) else float("nan") for x in xs]


def _init(data: dict[str, Any], machine: str) -> bytes:
    fig, axes = _fig(f"Measured on {machine}", 2)
    s = data["settings"]["init"]
    for ax, act in zip(axes, ("tanh", "relu")):
        for i, (label, stds) in enumerate(data["init_depth"][act].items()):
            ys = [max(v, 1e-30) for v in stds]
            ax.plot(range(1, len(ys) + 1), ys, label=label, color=f"C{i}", lw=1.3,
                    ls="--" if "normal(0.05)" in label or "uniform(" in label else "-")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(f"{act}, width {s['width']}")
    axes[0].set_ylabel("std of the activations")
    axes[1].legend(fontsize=6.5, loc="lower left")
    return svg(fig)


def _warmup(data: dict[str, Any], machine: str) -> bytes:
    fig, axes = _fig(f"Measured on {machine}", 1)
    ax = axes[0]
    for i, (label, run) in enumerate(data["warmup"]["runs"].items()):
        tag = "diverged" if run["diverged"] else f"val. loss {run['val_loss']:.3f}"
        ax.plot(run["epochs"], _finite(run["losses"]), label=f"{label}: {tag}", color=f"C{i}", lw=1.1)
    ax.set_yscale("log")
    ax.set_ylim(0.05, 50)
    ax.set_xlabel("epochs")
    ax.set_ylabel("training loss (mini-batch)")
    ax.set_title("SGD on the same task for the same number of epochs")
    ax.legend(fontsize=7)
    return svg(fig)


def _mixed(data: dict[str, Any], machine: str) -> bytes:
    """Underflow demo; the classifier's loss curves (on top of one another: their differences
    are far below the line width); and each mixed-precision curve minus float32's."""
    fig = Figure(figsize=(5.0, 9.0), layout="constrained")
    axes = [fig.add_subplot(3, 1, i + 1) for i in range(3)]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.supxlabel(f"Measured on {machine}", color="0.35")
    mp = data["mixed_precision"]
    for i, (label, run) in enumerate(mp["underflow"].items()):
        axes[0].plot(range(len(run["losses"])), run["losses"], color=f"C{i}",
                     label=f"{label} ({100 * run['zero_grad_fraction']:.0f}% of gradients are 0 in float16)")
    axes[0].set_yscale("log")
    low = min(x for run in mp["underflow"].values() for x in run["losses"] if x > 0)
    axes[0].set_ylim(bottom=low / 1e5)  # empty room below the curves for the legend
    axes[0].set_title("underflowing gradients")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("loss")
    axes[0].legend(loc="lower left")
    runs = mp["training"]
    base_label, base = next(iter(runs.items()))
    ref = _finite(base["losses"])
    gap = 0.0
    for i, (label, run) in enumerate(runs.items()):
        losses = _finite(run["losses"])
        axes[1].plot(range(len(losses)), losses, color=f"C{i}", lw=1, label=f"{label}: val. loss {run['val_loss']:.4f}")
        if label != base_label:
            diff = [a - b for a, b in zip(losses, ref)]
            gap = max([gap] + [abs(d) for d in diff if math.isfinite(d)])
            axes[2].plot(range(len(diff)), diff, color=f"C{i}", lw=1, label=f"{label} − {base_label}")
    axes[1].set_title(f"classifier, Adam: the curves lie on one another\n(at most {gap:.3f} apart; below: the gaps)")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("training loss (mini-batch)")
    axes[1].legend(loc="upper right")
    axes[2].axhline(0, color="0.3", lw=0.8)
    axes[2].set_title(f"difference from {base_label}, same step")
    axes[2].set_xlabel("step")
    axes[2].set_ylabel("loss difference")
    axes[2].legend(loc="upper right")
    return svg(fig)


def _mixed_memory(data: dict[str, Any], machine: str) -> bytes:
    """Peak memory and time of one training step, float32 against float16 (mixed precision)."""
    fig = Figure(figsize=(5.0, 5.6), layout="constrained")
    axes = [fig.add_subplot(2, 1, i + 1) for i in range(2)]
    fig.supxlabel(f"Measured on {machine}", color="0.35")
    cost = data["mixed_precision"]["step_cost"]
    st = data["settings"]["mixed_precision"]
    names = list(cost)
    hatches = ["", "//", "xx", ".."]
    mib = [cost[k]["peak_bytes"] / 2**20 for k in names]
    bars = axes[0].barh(range(len(names)), mib, color=[f"C{i}" for i in range(len(names))],
                        hatch=None, edgecolor="0.2")
    for b, h in zip(bars, hatches):
        b.set_hatch(h)
    axes[0].bar_label(bars, [f"{v:.2f} MiB" for v in mib], padding=3)
    shown = [{"float16": "mixed\n(float16)"}.get(k, k) for k in names]
    axes[0].set_yticks(range(len(names)), shown)
    axes[0].invert_yaxis()
    axes[0].set_xlim(0, max(mib) * 1.35)
    axes[0].set_xlabel("peak memory of one training step (MiB, tracemalloc)")
    axes[0].set_title(f"MLP {'-'.join(map(str, st['mem_widths']))}, batch {st['mem_batch']}: "
                      f"{mib[-1] / mib[0]:.2f}× the memory" if len(names) == 2 else "peak memory")
    ms = [statistics.median(cost[k]["step_seconds"]) * 1e3 for k in names]
    bars = axes[1].barh(range(len(names)), ms, color=[f"C{i}" for i in range(len(names))], edgecolor="0.2")
    for b, h in zip(bars, hatches):
        b.set_hatch(h)
    axes[1].bar_label(bars, [f"{v:,.0f} ms" if v >= 100 else f"{v:.3g} ms" for v in ms], padding=3)
    axes[1].set_yticks(range(len(names)), shown)
    axes[1].invert_yaxis()
    axes[1].set_xscale("log")
    axes[1].set_xlim(min(ms) / 2, max(ms) * 8)
    axes[1].set_xlabel("median time of one step (ms, log scale; NumPy has\nno float16 matrix multiply on a CPU)")
    for ax in axes:
        ax.grid(True, axis="x", alpha=0.3)
    return svg(fig)


def _search_stats(data: dict[str, Any]) -> dict[str, list[float]]:
    s = data["search"]
    return {"grid (3 × 3)": [min(t["loss"] for t in s["grid"])],
            "random (9 trials)": [min(t["loss"] for t in trials) for trials in s["random"]],
            "successive halving": [trials[-1]["loss"] for trials in s["halving"]]}


def _search(data: dict[str, Any], machine: str) -> bytes:
    fig, axes = _fig(f"Measured on {machine}", 2)
    s = data["search"]
    grid = s["grid"]
    axes[0].scatter([t["config"]["learning_rate"] for t in grid], _finite([t["loss"] for t in grid]),
                    marker="s", color="C0", label="grid trials")
    rand = s["random"][0]
    axes[0].scatter([t["config"]["learning_rate"] for t in rand], _finite([t["loss"] for t in rand]),
                    marker="o", color="C1", label="random trials (seed 0)")
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("learning rate")
    axes[0].set_ylabel("validation loss")
    axes[0].set_title("9 trials each")
    axes[0].legend(fontsize=7, loc="upper center")
    stats = _search_stats(data)
    axes[1].boxplot(list(stats.values()))
    axes[1].set_xticks(range(1, len(stats) + 1), list(stats), fontsize=7)
    axes[1].set_ylabel("best validation loss found")
    axes[1].set_title(f"equal compute, {len(s['random'])} seeds")
    return svg(fig)


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    figs = {"init": _init(data, machine), "warmup": _warmup(data, machine), "mixed": _mixed(data, machine),
            "mixed-memory": _mixed_memory(data, machine),
            "search": _search(data, machine)}
    lines = ["| experiment | configuration | measured |", "|---|---|---:|"]
    for act in ("tanh", "relu"):
        for label, stds in data["init_depth"][act].items():
            lines.append(f"| activation std after layer {len(stds)} ({act}) | {label} | {stds[-1]:.3g} |")
    for label, run in data["warmup"]["runs"].items():
        value = "diverged (NaN)" if run["diverged"] else f"{run['val_loss']:.4f}"
        lines.append(f"| validation loss after {run['steps']} steps | {label} | {value} |")
    mp = data["mixed_precision"]
    for label, run in mp["underflow"].items():
        lines.append(f"| underflow demo: loss after {len(run['losses'])} steps / first loss | {label} | "
                     f"{run['losses'][-1] / run['losses'][0]:.2e} |")
    for label, run in mp["training"].items():
        lines.append(f"| classifier validation loss | {label} | {run['val_loss']:.4f} |")
    lines.append(f"| peak memory of one training step, float16 / float32 | "
                 f"widths {data['settings']['mixed_precision']['mem_widths']}, batch "
                 f"{data['settings']['mixed_precision']['mem_batch']} | {mp['memory_ratio']:.3f} |")
    lines.append(f"| step time, float16 / float32 (NumPy on this CPU) | same | {mp['time_ratio']:.1f}× |")
    for label, values in _search_stats(data).items():
        lines.append(f"| search: median best validation loss | {label} | {statistics.median(values):.4f} |")
    wins = sum(r < min(t["loss"] for t in data["search"]["grid"]) for r in _search_stats(data)["random (9 trials)"])
    lines.append(f"| search: random beats the grid | seeds | {wins} of {len(data['search']['random'])} |")
    lines += ["", f"*Machine:* {machine}."]
    return figs, "\n".join(lines) + "\n"
