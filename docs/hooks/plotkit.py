"""Shared pieces of the build-time benchmark plots: loading a result file, axes, SVG output.

Every plotter module (``plot_<benchmark>.py`` beside this file) uses these, so all figures
look alike: log2 size axes with human labels, a caption naming the machine, text drawn as
outlines (no font needed in the reader's browser) and byte-identical SVG for the same data.
"""
from __future__ import annotations

import io
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402  (after choosing the backend)
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402
from mkdocs.exceptions import PluginError  # noqa: E402

matplotlib.rcParams.update(
    {
        "svg.hashsalt": "dl-systems-lab",  # stable element ids: same data, same SVG bytes
        "svg.fonttype": "path",  # text as outlines: no font needed in the reader's browser
        "font.size": 9,
    }
)


def check_rows(path: Path, data: dict[str, Any], keys: dict[str, Any]) -> list[dict[str, Any]]:
    """``data["results"]``, checked to be a non-empty list of objects with ``keys`` of those types."""
    rows = data.get("results")
    if not isinstance(rows, list) or not rows:
        raise bad(path, "'results' must be a non-empty list")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise bad(path, f"results[{i}] is not an object")
        for key, kind in keys.items():
            if not isinstance(row.get(key), kind) or isinstance(row.get(key), bool):
                raise bad(path, f"results[{i}].{key} is missing or not {kind}")
    return rows


def human_bytes(n: float, digits: int = 6) -> str:
    """8 -> '8 B', 4096 -> '4 KiB', 67108864 -> '64 MiB'; 16907 with digits=3 -> '16.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.{digits}g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def bad(path: Path, why: str) -> PluginError:
    return PluginError(
        f"bench_plots hook: {path} is not a usable benchmark file: {why}.\n"
        "  Regenerate it with `make bench` (python -m benchmarks NAME --publish)."
    )


def load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise bad(path, f"cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmark"), str):
        raise bad(path, "the top level must be an object with a 'benchmark' name")
    return data


def machine_line(path: Path, data: dict[str, Any]) -> str:
    machine = data.get("machine")
    if not isinstance(machine, dict):
        raise bad(path, "'machine' must be an object")
    missing = [k for k in ("cpu", "cores", "mpi_library", "date") if k not in machine]
    if missing:
        raise bad(path, f"'machine' lacks {', '.join(missing)}")
    lines = str(machine["mpi_library"] or "?").strip().splitlines() or ["?"]
    mpi_lib = " ".join(lines[0].split())  # "MPICH Version:      5.0.2" -> "MPICH Version: 5.0.2"
    if len(mpi_lib) > 60:
        mpi_lib = mpi_lib[:57] + "..."
    return f"{machine['cpu']}, {machine['cores']} cores, {mpi_lib}, measured {date_text(machine['date'])}"


def date_text(iso: Any) -> str:
    """'2025-11-21T23:40:12.5+00:00' -> '2025-11-21 23:40 UTC'; anything unparsable as given."""
    try:
        when = datetime.fromisoformat(str(iso))
    except ValueError:
        return str(iso)
    zone = when.strftime(" %Z") if when.tzinfo else ""
    return when.strftime("%Y-%m-%d %H:%M") + zone


def series_of(rows: list[dict[str, Any]], key: str = "busbw_GBps") -> dict[tuple[str, int], dict[int, float]]:
    """{(impl, ranks): {bytes: row[key]}}."""
    out: dict[tuple[str, int], dict[int, float]] = {}
    for row in rows:
        out.setdefault((row["impl"], row["ranks"]), {})[row["bytes"]] = float(row[key])
    return out


def human_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def size_axis(ax, sizes: list[int]) -> None:
    """log2 x axis with human labels, at most about ten of them, first and last included."""
    ax.set_xscale("log", base=2)
    lo, hi = int(math.log2(min(sizes))), int(math.log2(max(sizes)))
    step = max(1, math.ceil((hi - lo) / 9))
    exps = list(range(lo, hi + 1, step))
    if exps[-1] != hi:
        if hi - exps[-1] < step / 2 and len(exps) > 1:
            exps.pop()
        exps.append(hi)
    ax.xaxis.set_major_locator(FixedLocator([2.0**e for e in exps]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v)))
    ax.set_xlim(min(sizes) / 1.4, max(sizes) * 1.4)
    ax.set_xlabel("message size per rank (bytes, log scale)")
    for label in ax.get_xticklabels():
        label.set_rotation(30)
        label.set_horizontalalignment("right")


def svg(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def figure(caption: str) -> tuple[Figure, Any]:
    fig = Figure(figsize=(7.6, 4.4), layout="constrained")
    ax = fig.add_subplot()
    ax.grid(True, which="major", alpha=0.3)
    fig.get_layout_engine().set(h_pad=0.08)
    fig.supxlabel(caption, fontsize=7, color="0.35")
    return fig, ax


def color(ranks: int, all_ranks: list[int]) -> str:
    return f"C{all_ranks.index(ranks) % 10}"
