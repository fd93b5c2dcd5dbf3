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

``<!-- bench:model_parallel:summary -->`` becomes the tables: those ratios at 1 MiB and
above, and our ``alltoallv`` against ``MPI_Alltoallv`` with uneven blocks. busbw is
nccl-tests' for all-to-all: algbw (send buffer per rank / time) times (n - 1) / n.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from plotkit import bad, figure, human_bytes, machine_line, size_axis, svg

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


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    machine = machine_line(path, data)
    figures: dict[str, bytes] = {}
    summaries = []
    if isinstance(data.get("alltoall"), dict):
        f, s = _alltoall(path, data["alltoall"], machine)
        figures.update(f)
        summaries.append(s)
    if not summaries:
        raise bad(path, "no section this plotter knows ('alltoall')")
    return figures, "\n".join(summaries)
