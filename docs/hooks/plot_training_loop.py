"""Figures of ``training_loop.json`` (``python -m benchmarks training_loop``).

* ``training_loop-input.svg``: steps per second of a loop fed by a serial, a prefetching
  and a parallel-map input pipeline, against the ideals ``1/(X+Y)``, ``1/max(X,Y)`` and
  ``1/max(X/k,Y)``: over the ratio ``X/Y`` when both stages wait (left), and when the
  input stage is Python parsing that holds the GIL (right);
* ``training_loop-estimator.svg``: the time of the same training run under the Estimator
  (checkpoint frequency, evaluation frequency) relative to a hand-written Session loop.

The ``<!-- bench:training_loop:summary -->`` marker becomes a table of the measured numbers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from plotkit import bad, machine_line, svg

NAME = "training_loop"


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_case(path: Path, where: str, case: Any) -> None:
    if not (isinstance(case, dict) and _number(case.get("input_s")) and _number(case.get("step_s"))
            and isinstance(case.get("pipelines"), dict) and "serial" in case["pipelines"]):
        raise bad(path, f"'{where}' needs 'input_s', 'step_s' and 'pipelines' (with 'serial')")
    for name, p in case["pipelines"].items():
        if not (isinstance(p, dict) and _number(p.get("steps_per_s")) and _number(p.get("ideal_steps_per_s"))):
            raise bad(path, f"'{where}.pipelines.{name}' needs numbers steps_per_s and ideal_steps_per_s")


def _check(path: Path, data: dict[str, Any]) -> None:
    inp, est = data.get("input"), data.get("estimator")
    if not isinstance(inp, dict) or not isinstance(inp.get("wait"), list) or not inp["wait"]:
        raise bad(path, "'input.wait' must be a non-empty list of measured ratios")
    for i, row in enumerate(inp["wait"]):
        _check_case(path, f"input.wait[{i}]", row)
        if not _number(row.get("ratio")):
            raise bad(path, f"'input.wait[{i}].ratio' must be a number")
    _check_case(path, "input.parse", inp.get("parse"))
    if not isinstance(est, dict) or not isinstance(est.get("timing"), dict) or \
            "hand-written Session loop" not in est["timing"]:
        raise bad(path, "'estimator.timing' must include the hand-written Session loop")
    for name, row in est["timing"].items():
        if not (isinstance(row, dict) and _number(row.get("steps_per_s")) and _number(row.get("time_vs_hand_written"))):
            raise bad(path, f"'estimator.timing.{name}' needs numbers steps_per_s and time_vs_hand_written")
    resume = est.get("resume")
    if not isinstance(resume, dict) or not all(
            isinstance(r, dict) and isinstance(r.get("bit_identical"), bool) and _number(r.get("max_abs_diff"))
            for r in resume.values()):
        raise bad(path, "'estimator.resume' must map cases to bit_identical and max_abs_diff")


def _fig(machine: str, cols: int, width: float = 7.6) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, 3.9), layout="constrained")
    axes = [fig.add_subplot(1, cols, i + 1) for i in range(cols)]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.supxlabel(f"Measured on {machine}", fontsize=7, color="0.35")
    return fig, axes


def _input(data: dict[str, Any], machine: str) -> bytes:
    fig, (left, right) = _fig(machine, 2)
    rows = data["input"]["wait"]
    names = list(rows[0]["pipelines"])
    ratios = [r["ratio"] for r in rows]
    for i, name in enumerate(names):
        left.plot(ratios, [r["pipelines"][name]["steps_per_s"] for r in rows], marker="o", ms=4, color=f"C{i}",
                  lw=1.2, label=name)
        left.plot(ratios, [r["pipelines"][name]["ideal_steps_per_s"] for r in rows], color=f"C{i}", lw=0.9, ls="--")
    left.set_xscale("log", base=2)
    left.set_xticks(ratios, [f"{r:g}" for r in ratios])
    left.set_xlabel(f"input time X / step time Y (Y = {rows[0]['step_s'] * 1e3:.0f} ms)")
    left.set_ylabel("training steps per second")
    left.set_title("both stages wait (dashed: ideal)", fontsize=9)
    left.legend(fontsize=6.5)
    parse = data["input"]["parse"]
    xs = range(len(parse["pipelines"]))
    right.bar([x - 0.2 for x in xs], [p["steps_per_s"] for p in parse["pipelines"].values()], width=0.4,
              color="C0", label="measured")
    right.bar([x + 0.2 for x in xs], [p["ideal_steps_per_s"] for p in parse["pipelines"].values()], width=0.4,
              color="0.75", label="ideal from X and Y")
    right.set_xticks(list(xs), [n.replace(" + prefetch", "\n+ prefetch") for n in parse["pipelines"]], fontsize=6.5)
    right.set_title(f"input = Python parsing, X = {parse['input_s'] * 1e3:.0f} ms (holds the GIL)", fontsize=9)
    right.legend(fontsize=7)
    return svg(fig)


def _estimator(data: dict[str, Any], machine: str) -> bytes:
    fig, (ax,) = _fig(machine, 1)
    timing = data["estimator"]["timing"]
    names = list(timing)[::-1]
    ax.barh(range(len(names)), [timing[n]["time_vs_hand_written"] for n in names], color="C0")
    ax.axvline(1.0, color="0.3", lw=0.8)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for y, n in enumerate(names):
        ax.text(timing[n]["time_vs_hand_written"], y, f" {timing[n]['steps_per_s']:.0f} steps/s", va="center",
                fontsize=7)
    steps = data["settings"]["estimator"]["steps"]
    ax.set_xlabel(f"time for {steps} steps / time of the hand-written loop")
    ax.set_title("the same model, optimiser (Adam) and input", fontsize=9)
    ax.set_xlim(0, max(timing[n]["time_vs_hand_written"] for n in names) * 1.35)
    return svg(fig)


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    figs = {"input": _input(data, machine), "estimator": _estimator(data, machine)}
    lines = ["| experiment | configuration | measured | ideal / reference |", "|---|---|---:|---:|"]
    for row in data["input"]["wait"]:
        for name, p in row["pipelines"].items():
            lines.append(f"| steps/s, X/Y = {row['ratio']:g} (waits) | {name} | {p['steps_per_s']:.1f} | "
                         f"{p['ideal_steps_per_s']:.1f} |")
    parse = data["input"]["parse"]
    for name, p in parse["pipelines"].items():
        lines.append(f"| steps/s, Python parsing ({parse['lines_per_batch']} lines/batch) | {name} | "
                     f"{p['steps_per_s']:.1f} | {p['ideal_steps_per_s']:.1f} |")
    for name, row in data["estimator"]["timing"].items():
        lines.append(f"| training time | {name} | {row['steps_per_s']:.0f} steps/s | "
                     f"{row['time_vs_hand_written']:.2f}× the hand-written loop |")
    for name, r in data["estimator"]["resume"].items():
        verdict = "bit-identical" if r["bit_identical"] else f"max abs. difference {r['max_abs_diff']:.3g}"
        lines.append(f"| resumed halfway vs uninterrupted | {name} | {verdict} | |")
    lines += ["", f"*Machine:* {machine}."]
    return figs, "\n".join(lines) + "\n"
