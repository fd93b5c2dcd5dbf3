"""Figures of ``collectives.json`` (``python -m benchmarks collectives``).

Per rank count it produces

* ``assets/bench/collectives-busbw-<n>.svg``: bus bandwidth against size for each of our
  algorithms (solid) and the MPI library's default (black, dashed);
* ``assets/bench/collectives-predicted-<n>.svg``: measured time of each algorithm (points)
  against the α–β–γ prediction (lines) from the parameters fitted in ``alpha_beta.json``;

and a summary table: best of ours against the library at ≥ 1 MiB and at the smallest size,
the algorithm ``auto`` behaved like, and each of ours against MPICH's own implementation of
the same algorithm (forced with ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM``, separate runs); with a
``torch`` section, a second table: each of ours and ``algorithm="library"`` on
``TorchCommunicator`` against ``torch.distributed.all_reduce``.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from plotkit import bad, check_rows, figure, human_bytes, human_time, machine_line, size_axis, svg

from reference_impl.comm.cost_model import LinkParams, allreduce_time

NAME = "collectives"
OURS = ("ring", "recursive_doubling", "rabenseifner", "tree")
SAME_ALGORITHM = {"ring": "mpi:ring", "recursive_doubling": "mpi:recursive_doubling",
                  "rabenseifner": "mpi:reduce_scatter_allgather", "tree": "mpi:tree"}
LARGE = 1 << 20


def _fitted_link(path: Path) -> tuple[LinkParams, str]:
    """α, β, γ from the ping-pong fit stored beside this file (``make bench`` writes both)."""
    fit_path = path.with_name("alpha_beta.json")
    try:
        fit = json.loads(fit_path.read_text(encoding="utf-8"))["fit"]
        link = LinkParams(fit["alpha_s"], fit["beta_s_per_byte"], fit["gamma_s_per_byte"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise bad(path, f"the prediction needs the fitted α, β, γ in {fit_path} ({exc})") from None
    return link, f"α = {link.alpha * 1e6:.2f} µs, β = {link.beta * 1e9:.3f} ns/B, γ = {link.gamma * 1e9:.3f} ns/B"


def _median_ratio(a: dict[int, float], b: dict[int, float]) -> str:
    """Median over sizes ≥ 1 MiB of b[size] / a[size] (times, so > 1 means a is faster)."""
    ratios = [b[s] / a[s] for s in a.keys() & b.keys() if s >= LARGE]
    return f"{statistics.median(ratios):.2f}" if ratios else "n/a"


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    keys = {"ranks": int, "bytes": int, "impl": str, "time_s": (int, float), "busbw_GBps": (int, float)}
    rows = check_rows(path, data, keys)
    times: dict[tuple[str, int], dict[int, float]] = {}
    busbw: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        times.setdefault((r["impl"], r["ranks"]), {})[r["bytes"]] = r["time_s"]
        busbw.setdefault((r["impl"], r["ranks"]), {})[r["bytes"]] = r["busbw_GBps"]
    all_ranks = sorted({r["ranks"] for r in rows})
    sizes = sorted({r["bytes"] for r in rows})
    link, link_text = _fitted_link(path)
    machine = machine_line(path, data)
    figures: dict[str, bytes] = {}
    lines = [
        "| ranks | best of ours / MPI busbw, median ≥ 1 MiB | best of ours / MPI time at "
        f"{human_bytes(sizes[0])} | ring / MPICH ring | recursive doubling / MPICH's | "
        "Rabenseifner / MPICH's | tree / MPICH's |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ranks in all_ranks:
        mpi = times.get(("mpi", ranks))
        if not mpi:
            raise bad(path, f"no 'mpi' results for {ranks} ranks")
        fig, ax = figure(f"Measured on {machine}")
        for i, algorithm in enumerate(OURS):
            points = busbw.get((algorithm, ranks), {})
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], color=f"C{i}", marker="o", markersize=3, linewidth=1.3, label=algorithm)
        xs = sorted(mpi)
        ax.plot(xs, [busbw[("mpi", ranks)][x] for x in xs], color="black", linestyle="--", marker="s",
                markersize=3, linewidth=1.3, label="MPI library (default choice)")
        size_axis(ax, sizes)
        ax.set_yscale("log")
        ax.set_ylabel("bus bandwidth (GB/s, log scale)")
        ax.set_title(f"Allreduce algorithms on {ranks} ranks, float32 sum")
        ax.legend(loc="lower right", fontsize=8)
        figures[f"busbw-{ranks}"] = svg(fig)

        fig, ax = figure(f"Measured on {machine}")
        for i, algorithm in enumerate(OURS):
            measured = times.get((algorithm, ranks), {})
            xs = sorted(measured)
            ax.plot(xs, [measured[x] for x in xs], color=f"C{i}", marker="o", markersize=3, linestyle="none",
                    label=f"{algorithm}: measured")
            ax.plot(xs, [allreduce_time(algorithm, x, ranks, link) for x in xs], color=f"C{i}", linewidth=1.2,
                    label=f"{algorithm}: predicted")
        size_axis(ax, sizes)
        ax.set_yscale("log")
        ax.set_ylabel("time per allreduce (s, log scale)")
        ax.set_title(f"Measured against the α–β–γ model, {ranks} ranks\n(fitted by ping-pong: {link_text})", fontsize=9)
        ax.legend(loc="upper left", fontsize=7, ncol=2)
        figures[f"predicted-{ranks}"] = svg(fig)

        ours = [times.get((a, ranks), {}) for a in OURS]
        best = {s: min(t[s] for t in ours if s in t) for s in mpi if any(s in t for t in ours)}
        same = [_median_ratio(times.get((a, ranks), {}), times.get((SAME_ALGORITHM[a], ranks), {})) for a in OURS]
        small = sizes[0]
        lines.append(f"| {ranks} | {_median_ratio(best, mpi)} | {best[small] / mpi[small]:.2f} "
                     f"({human_time(best[small])} / {human_time(mpi[small])}) | " + " | ".join(same) + " |")
    lines += [
        "",
        "Ratios of bandwidth: above 1, ours is faster. The time ratio at the smallest size: below 1, ours is faster. "
        "The last four columns compare each of our algorithms with MPICH running the same algorithm "
        "(bandwidth ratio, sizes ≥ 1 MiB, separate runs).",
        "",
        f"*Machine:* {machine}. *Model:* {link_text}.",
    ]
    if "torch" in data:
        lines += ["", *_torch_lines(path, data["torch"])]
    return figures, "\n".join(lines) + "\n"


def _torch_lines(path: Path, part: dict[str, Any]) -> list[str]:
    """The ``torch`` section as a table: each of ours and the library path over ``all_reduce``, in time."""
    impls = (*OURS, "auto", "library", "torch")
    keys = {"ranks": int, "bytes": int, "impl": str, "time_s": (int, float)}
    rows = check_rows(path, part, keys)
    if any(r["impl"] not in impls for r in rows):
        raise bad(path, f"torch.results: impl must be one of {impls}")
    times: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        times.setdefault((r["impl"], r["ranks"]), {})[r["bytes"]] = r["time_s"]
    small = min(r["bytes"] for r in rows)
    shown = (*OURS, "auto", "library")
    lines = [f"On torch.distributed ({part.get('library', 'torch')}): time of each over the time of "
             f"`all_reduce` called directly, median over sizes ≥ 1 MiB (and at {human_bytes(small)}); "
             "below 1, faster than `all_reduce`.", "",
             "| processes | " + " | ".join(shown) + " |", "|---:|" + "---:|" * len(shown)]
    for ranks in sorted({r["ranks"] for r in rows}):
        direct = times.get(("torch", ranks), {})
        cells = []
        for impl in shown:
            mine = times.get((impl, ranks), {})
            large = [mine[b] / direct[b] for b in mine.keys() & direct.keys() if b >= LARGE]
            at_small = f"{mine[small] / direct[small]:.2f}" if small in mine and small in direct else "n/a"
            cells.append(f"{statistics.median(large):.2f} ({at_small})" if large else f"n/a ({at_small})")
        lines.append(f"| {ranks} | " + " | ".join(cells) + " |")
    return lines
