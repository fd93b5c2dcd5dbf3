"""Figures of ``optimizers.json`` (``python -m benchmarks optimizers``).

* ``optimizers-curves.svg``: the training loss of the digits MLP against the step for each
  optimiser at its own best learning rate (left), and the validation loss at every rate of
  the grid (right: how wide each optimiser's good range is);
* ``optimizers-cost.svg``: optimiser state and peak update memory in bytes per parameter
  (left), and the time of one update relative to plain SGD (right).

The ``<!-- bench:optimizers:summary -->`` marker becomes a table of the measured numbers.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from plotkit import bad, machine_line, svg

NAME = "optimizers"
SMOOTH = 25  # steps in the moving average of the mini-batch loss


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check(path: Path, data: dict[str, Any]) -> None:
    tuning, cost = data.get("tuning"), data.get("cost")
    if not isinstance(tuning, dict) or not tuning:
        raise bad(path, "'tuning' must map optimisers to their grid and runs")
    for name, t in tuning.items():
        if not (isinstance(t, dict) and _number(t.get("best_learning_rate")) and isinstance(t.get("grid"), list)
                and t["grid"] and isinstance(t.get("runs"), list) and t["runs"]):
            raise bad(path, f"'tuning.{name}' needs 'best_learning_rate', a non-empty 'grid' and 'runs'")
        for run in t["runs"]:
            if not (isinstance(run, dict) and isinstance(run.get("losses"), list) and run["losses"]
                    and _number(run.get("test_loss")) and _number(run.get("test_accuracy"))):
                raise bad(path, f"'tuning.{name}.runs' need 'losses', 'test_loss' and 'test_accuracy'")
    if not isinstance(cost, dict) or not isinstance(cost.get("optimisers"), dict) or "SGD" not in cost["optimisers"]:
        raise bad(path, "'cost.optimisers' must be an object that includes SGD")
    for name, row in cost["optimisers"].items():
        keys = ("state_bytes_per_param", "peak_update_bytes_per_param", "time_vs_sgd", "update_nodes")
        if not isinstance(row, dict) or not all(_number(row.get(k)) for k in keys):
            raise bad(path, f"'cost.optimisers.{name}' needs numbers {', '.join(keys)}")


def _fig(machine: str) -> tuple[Figure, list]:
    fig = Figure(figsize=(7.6, 3.9), layout="constrained")
    axes = [fig.add_subplot(1, 2, i + 1) for i in range(2)]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.supxlabel(f"Measured on {machine}", fontsize=7, color="0.35")
    return fig, axes


def _smooth(xs: list[float], k: int) -> list[float]:
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x
        if i >= k:
            total -= xs[i - k]
        out.append(total / min(i + 1, k))
    return out


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _curves(data: dict[str, Any], machine: str) -> bytes:
    fig, (left, right) = _fig(machine)
    for i, (name, t) in enumerate(data["tuning"].items()):
        losses = t["runs"][0]["losses"]
        left.plot(range(1, len(losses) + 1), _smooth(losses, SMOOTH), color=f"C{i}", lw=1.2,
                  label=f"{name}, lr {t['best_learning_rate']:g}: test acc. {_median(t['runs'], 'test_accuracy'):.3f}")
        rates = [row["learning_rate"] for row in t["grid"]]
        vals = [row["val_loss"] if _number(row["val_loss"]) and math.isfinite(row["val_loss"]) else float("nan")
                for row in t["grid"]]
        right.plot(rates, vals, marker="o", ms=3, color=f"C{i}", lw=1, label=name)
    left.set_yscale("log")
    left.set_xlabel("step")
    left.set_ylabel(f"training loss ({SMOOTH}-step moving average)")
    left.set_title("each at its own best learning rate", fontsize=9)
    left.legend(fontsize=6.5)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_ylim(top=3.0)
    right.set_xlabel("learning rate")
    right.set_ylabel("validation loss after training")
    right.set_title("the rate grid (missing point: diverged)", fontsize=9)
    right.legend(fontsize=6.5)
    return svg(fig)


def _cost(data: dict[str, Any], machine: str) -> bytes:
    fig, (left, right) = _fig(machine)
    rows = data["cost"]["optimisers"]
    names = list(rows)
    xs = range(len(names))
    left.bar([x - 0.2 for x in xs], [rows[n]["state_bytes_per_param"] for n in names], width=0.4, color="C0",
             label="optimiser state (slots)")
    left.bar([x + 0.2 for x in xs], [rows[n]["peak_update_bytes_per_param"] for n in names], width=0.4,
             color="C1", label="peak during one update")
    left.set_xticks(list(xs), names, fontsize=7, rotation=30)
    left.set_ylabel("bytes per float32 parameter")
    left.set_title(f"{data['cost']['params']:,} parameters".replace(",", " "), fontsize=9)
    left.legend(fontsize=7)
    right.bar(list(xs), [rows[n]["time_vs_sgd"] for n in names], color="C2")
    right.axhline(1.0, color="0.3", lw=0.8)
    right.set_xticks(list(xs), names, fontsize=7, rotation=30)
    right.set_ylabel("update time / SGD's update time")
    right.set_title("one update step, graph ops composed", fontsize=9)
    return svg(fig)


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    figs = {"curves": _curves(data, machine), "cost": _cost(data, machine)}
    seeds = len(next(iter(data["tuning"].values()))["runs"])
    header = (f"| optimiser | best learning rate | test loss (median of {seeds} seeds) | test accuracy | "
              "state bytes / parameter | update time / SGD's |")
    lines = [header, "|---|---:|---:|---:|---:|---:|"]
    cost = data["cost"]["optimisers"]
    for name, row in cost.items():
        t = data["tuning"].get(name)
        trained = (f"{t['best_learning_rate']:g} | {_median(t['runs'], 'test_loss'):.4f} | "
                   f"{_median(t['runs'], 'test_accuracy'):.3f}") if t else "not trained here | | "
        lines.append(f"| {name} | {trained} | {row['state_bytes_per_param']:.2f} | {row['time_vs_sgd']:.2f}× |")
    lines += ["", f"*Machine:* {machine}."]
    return figs, "\n".join(lines) + "\n"
