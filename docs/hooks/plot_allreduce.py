"""Figures of ``allreduce.json`` (``python -m benchmarks allreduce``).

It produces

* ``assets/bench/allreduce-busbw.svg``: bus bandwidth against message size, one line per
  (implementation, rank count): our ring (solid) and the MPI library's own (dashed);
* ``assets/bench/allreduce-ratio.svg``: ring busbw / MPI busbw against size, per rank count;
* ``assets/bench/allreduce-torch.svg`` (when the file has a ``torch`` section): time of our ring
  and of ``algorithm="library"`` on ``TorchCommunicator``, each over the time of
  ``torch.distributed.all_reduce`` called directly, against size, per rank count;

and replaces the marker ``<!-- bench:allreduce:summary -->`` in any page with a table: per
rank count, the median ring/MPI ratio over sizes of at least 1 MiB and the best busbw of
each, followed by the machine line (and, with a ``torch`` section, the same per rank count for
torch.distributed: ring / all_reduce and library / all_reduce).
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
from plotkit import (
    bad, check_rows, color, date_text, figure, human_bytes, human_time, machine_line, series_of, size_axis, svg,
)

NAME = "allreduce"
IMPLS = {"ring": "ring (ours)", "ring_alloc": "ring, new output array per call",
         "library": "algorithm='library'", "mpi": "MPI library"}
STYLES = {
    "ring": dict(linestyle="-", marker="o"),
    "ring_alloc": dict(linestyle=":", marker="^"),
    "library": dict(linestyle="-.", marker="D"),
    "mpi": dict(linestyle="--", marker="s"),
}
TORCH_IMPLS = {"ring": "ring (ours)", "library": "algorithm='library'", "torch": "torch.distributed.all_reduce"}
LARGE = 1 << 20  # the summary's "large message" threshold: 1 MiB


def _rows(path: Path, data: dict[str, Any], impls: dict[str, str] = IMPLS) -> list[dict[str, Any]]:
    keys = {"ranks": int, "bytes": int, "impl": str, "time_s": (int, float), "busbw_GBps": (int, float)}
    rows = check_rows(path, data, keys)
    for i, row in enumerate(rows):
        if row["impl"] not in impls:
            raise bad(path, f"results[{i}].impl is {row['impl']!r}, expected one of {sorted(impls)}")
        if row["bytes"] <= 0 or not math.isfinite(row["busbw_GBps"]) or row["busbw_GBps"] < 0:
            raise bad(path, f"results[{i}] has a non-positive size or an invalid busbw")
    return rows


def _ratios(series, ranks: int, impl: str = "ring") -> dict[int, float]:
    """{bytes: busbw of ``impl`` / busbw of the MPI library} for one rank count."""
    ring, mpi = series.get((impl, ranks), {}), series.get(("mpi", ranks), {})
    return {b: ring[b] / mpi[b] for b in sorted(ring.keys() & mpi.keys()) if mpi[b] > 0}


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    rows = _rows(path, data)
    machine = machine_line(path, data)
    dtype = data.get("dtype", "?")
    series = series_of(rows)
    times = series_of(rows, "time_s")
    all_ranks = sorted({r for _, r in series})
    sizes = sorted({row["bytes"] for row in rows})
    caption = f"Measured on {machine}"

    # Bus bandwidth against size.
    fig, ax = figure(caption)
    for ranks in all_ranks:
        for impl in IMPLS:
            points = series.get((impl, ranks))
            if not points:
                continue
            xs = sorted(points)
            ax.plot(
                xs, [points[x] for x in xs], color=color(ranks, all_ranks), markersize=3,
                linewidth=1.4, label=f"{IMPLS[impl]}, {ranks} ranks", **STYLES[impl],
            )
    size_axis(ax, sizes)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"Allreduce bus bandwidth ({dtype}, sum): ring vs the MPI library")
    ax.legend(loc="upper left", fontsize=8)
    busbw_svg = svg(fig)

    # Ratio ring / MPI.
    fig, ax = figure(caption)
    every_ratio = []
    for ranks in all_ranks:
        for impl in ("ring", "ring_alloc"):
            ratio = _ratios(series, ranks, impl)
            if not ratio:
                continue
            xs = sorted(ratio)
            every_ratio += list(ratio.values())
            ax.plot(
                xs, [ratio[x] for x in xs], color=color(ranks, all_ranks), markersize=3,
                linewidth=1.4, label=f"{IMPLS[impl]} / MPI, {ranks} ranks", **STYLES[impl],
            )
    if not every_ratio:
        raise bad(path, "no message size was measured with both 'ring' and 'mpi'")
    ax.axhline(1.0, color="0.5", linewidth=2.0, linestyle="-", alpha=0.5, label="parity (1.0)")
    positive = [r for r in every_ratio if r > 0]
    if positive and max(positive + [1.0]) / min(positive + [1.0]) > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    else:
        ax.set_ylim(bottom=0, top=max(every_ratio + [1.0]) * 1.15)
    size_axis(ax, sizes)
    ax.set_ylabel("ring busbw / MPI busbw")
    ax.set_title("Allreduce: our ring relative to the MPI library (higher is better, 1 = parity)")
    ax.legend(loc="best", fontsize=8)
    ratio_svg = svg(fig)

    # Summary table for the page.
    lines = [
        "| ranks | 2(n−1)/n | busbw ring / MPI, median over sizes ≥ 1 MiB "
        "| same, ring with a new output array per call "
        f"| best ring busbw | best MPI busbw | time at {human_bytes(sizes[0])}: ring / MPI |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ranks in all_ranks:
        medians = []
        for impl in ("ring", "ring_alloc"):
            large = [v for b, v in _ratios(series, ranks, impl).items() if b >= LARGE]
            medians.append(f"{statistics.median(large):.2f}" if large else "n/a (no size ≥ 1 MiB)")
        best = []
        for impl in ("ring", "mpi"):
            points = series.get((impl, ranks), {})
            if points:
                at = max(points, key=points.get)
                best.append(f"{points[at]:.2f} GB/s at {human_bytes(at)}")
            else:
                best.append("not measured")
        small = [times.get((impl, ranks), {}).get(sizes[0]) for impl in ("ring", "mpi")]
        small_text = " / ".join("n/a" if t is None else human_time(t) for t in small)
        factor = 2 * (ranks - 1) / ranks
        lines.append(
            f"| {ranks} | {factor:.3g} | {medians[0]} | {medians[1]} | {best[0]} | {best[1]} | {small_text} |"
        )
    m = data["machine"]
    extras = ", ".join(
        f"{k} {m[k]}" for k in ("platform", "python", "numpy", "mpi4py") if m.get(k)
    )
    lines += ["", f"*Machine:* {machine}" + (f" ({extras})." if extras else ".")]
    figures = {"busbw": busbw_svg, "ratio": ratio_svg}
    if "torch" in data:
        torch_svg, torch_lines = _torch(path, data["torch"])
        figures["torch"] = torch_svg
        lines += ["", *torch_lines]
    summary = "\n".join(lines) + "\n"

    return figures, summary


def _torch(path: Path, part: dict[str, Any]) -> tuple[bytes, list[str]]:
    """The ``torch`` section: a figure of time / all_reduce's time, and its rows for the summary."""
    rows = _rows(path, part, TORCH_IMPLS)
    times = series_of(rows, "time_s")
    all_ranks = sorted({r for _, r in times})
    sizes = sorted({row["bytes"] for row in rows})
    m = part.get("machine")
    if not isinstance(m, dict) or any(k not in m for k in ("cpu", "cores", "date")):
        raise bad(path, "'torch.machine' must be an object with cpu, cores and date")
    fig, ax = figure(f"Measured on {m['cpu']}, {m['cores']} cores, {part.get('library', 'torch')}, "
                     f"measured {date_text(m['date'])}")
    for ranks in all_ranks:
        direct = times.get(("torch", ranks), {})
        for impl in ("ring", "library"):
            mine = times.get((impl, ranks), {})
            xs = sorted(mine.keys() & direct.keys())
            ax.plot(xs, [mine[x] / direct[x] for x in xs], color=color(ranks, all_ranks), markersize=3,
                    linewidth=1.4, label=f"{TORCH_IMPLS[impl]} / all_reduce, {ranks} ranks", **STYLES[impl])
    ax.axhline(1.0, color="0.5", linewidth=2.0, alpha=0.5, label="parity (1.0)")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    size_axis(ax, sizes)
    ax.set_ylabel("time / time of all_reduce")
    ax.set_title("Allreduce on torch.distributed (gloo): ours relative to all_reduce (lower is better)")
    ax.legend(loc="best", fontsize=8)
    lines = ["| ranks (torch.distributed, gloo) | time ring / all_reduce, median over sizes ≥ 1 MiB "
             "| time library / all_reduce, median over all sizes | same, sizes ≥ 1 MiB |",
             "|---:|---:|---:|---:|"]
    for ranks in all_ranks:
        direct = times.get(("torch", ranks), {})
        cells = []
        for impl, least in (("ring", LARGE), ("library", 0), ("library", LARGE)):
            mine = times.get((impl, ranks), {})
            ratios = [mine[b] / direct[b] for b in mine.keys() & direct.keys() if b >= least]
            cells.append(f"{statistics.median(ratios):.2f}" if ratios else "n/a")
        lines.append(f"| {ranks} | {' | '.join(cells)} |")
    return svg(fig), lines
