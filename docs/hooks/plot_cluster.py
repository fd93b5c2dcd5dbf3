"""Figures of ``cluster.json`` (``python -m benchmarks cluster``).

It produces ``assets/bench/cluster-busbw.svg`` (one figure per rank count: bus bandwidth
against size, a colour per setting, our ring solid and the MPI library dashed) and a summary
table per setting and rank count: the latency at the smallest size, the busbw at the
largest, and the median ring/MPI busbw ratio over sizes of at least 1 MiB.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from plotkit import bad, check_rows, figure, human_bytes, human_time, machine_line, size_axis, svg

NAME = "cluster"
STYLES = {"ring": dict(linestyle="-", marker="o"), "mpi": dict(linestyle="--", marker="s")}
LABELS = {"ring": "ring (ours)", "mpi": "MPI library"}


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    keys = {"ranks": int, "bytes": int, "impl": str, "time_s": (int, float), "busbw_GBps": (int, float), "setting": str}
    rows = [r for r in check_rows(path, data, keys) if r["impl"] in STYLES]
    settings = list(data.get("settings") or dict.fromkeys(r["setting"] for r in rows))
    if not rows or not settings:
        raise bad(path, "no ring or mpi results, or no settings")
    series: dict[tuple[str, str, int], dict[int, dict]] = {}
    for r in rows:
        series.setdefault((r["setting"], r["impl"], r["ranks"]), {})[r["bytes"]] = r
    all_ranks = sorted({r["ranks"] for r in rows})
    sizes = sorted({r["bytes"] for r in rows})
    machine = machine_line(path, data)

    figures = {}
    for ranks in all_ranks:
        fig, ax = figure(f"Measured on {machine}")
        for i, setting in enumerate(settings):
            for impl in STYLES:
                points = series.get((setting, impl, ranks))
                if points:
                    xs = sorted(points)
                    ax.plot(xs, [points[x]["busbw_GBps"] for x in xs], color=f"C{i}", markersize=3, linewidth=1.4,
                            label=f"{setting}: {LABELS[impl]}", **STYLES[impl])
        size_axis(ax, sizes)
        ax.set_yscale("log")
        ax.set_ylabel("bus bandwidth (GB/s, log scale)")
        ax.set_title(f"The same allreduce program on {ranks} ranks: one host vs {ranks} hosts")
        ax.legend(loc="lower right", fontsize=7)
        figures[f"busbw-{ranks}"] = svg(fig)

    lines = [
        f"| setting | ranks | time at {human_bytes(sizes[0])}: ring / MPI | MPI busbw at {human_bytes(sizes[-1])} "
        "| ring / MPI busbw, median over sizes ≥ 1 MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for setting in settings:
        for ranks in all_ranks:
            ring, mpi = series.get((setting, "ring", ranks), {}), series.get((setting, "mpi", ranks), {})
            if not ring or not mpi:
                continue
            ratios = [ring[b]["busbw_GBps"] / mpi[b]["busbw_GBps"] for b in ring.keys() & mpi.keys()
                      if b >= 1 << 20 and mpi[b]["busbw_GBps"] > 0]
            small, large = min(mpi), max(mpi)
            ratio = f"{statistics.median(ratios):.2f}" if ratios else "n/a"
            lines.append(
                f"| {setting} | {ranks} | {human_time(ring[small]['time_s'])} / {human_time(mpi[small]['time_s'])} "
                f"| {mpi[large]['busbw_GBps']:.3f} GB/s | {ratio} |"
            )
    lines += ["", f"*Machine:* {machine}."]
    return figures, "\n".join(lines) + "\n"
