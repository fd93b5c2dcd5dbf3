"""MkDocs hook: plot the measured benchmarks at build time.

``make bench`` (``python -m reference_impl.bench ...``) writes one JSON file per benchmark
under ``docs/assets/bench/``, with the machine it ran on. This hook reads them on every
build and adds the figures to the site as *generated* files (``File.generated``), so the
plots always show the data in the repository, nothing generated is written into ``docs/``,
and ``mkdocs build --strict`` sees the image links as valid.

For ``allreduce.json`` it produces

* ``assets/bench/allreduce-busbw.svg``: bus bandwidth against message size, one line per
  (implementation, rank count): our ring (solid) and the MPI library's own (dashed);
* ``assets/bench/allreduce-ratio.svg``: ring busbw / MPI busbw against size, per rank count;

and replaces the marker ``<!-- bench:allreduce:summary -->`` in any page with a table: per
rank count, the median ring/MPI ratio over sizes of at least 1 MiB and the best busbw of
each, followed by the machine line.

A missing or malformed ``allreduce.json`` fails the build and says to run ``make bench``.
"""
from __future__ import annotations

import io
import json
import logging
import math
import re
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402  (after choosing the backend)
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator  # noqa: E402
from mkdocs.exceptions import PluginError  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

log = logging.getLogger("mkdocs.hooks.bench_plots")

BENCH_URI = "assets/bench"
REQUIRED = ("allreduce",)
IMPLS = {"ring": "ring (ours)", "ring_alloc": "ring, new output array per call", "mpi": "MPI library"}
STYLES = {
    "ring": dict(linestyle="-", marker="o"),
    "ring_alloc": dict(linestyle=":", marker="^"),
    "mpi": dict(linestyle="--", marker="s"),
}
LARGE = 1 << 20  # the summary's "large message" threshold: 1 MiB
_MARKER = re.compile(r"<!--\s*bench:([A-Za-z0-9_-]+):summary\s*-->")

_summaries: dict[str, str] = {}

matplotlib.rcParams.update(
    {
        "svg.hashsalt": "dl-systems-lab",  # stable element ids: same data, same SVG bytes
        "svg.fonttype": "path",  # text as outlines: no font needed in the reader's browser
        "font.size": 9,
    }
)


# --------------------------------------------------------------------------- helpers


def human_bytes(n: float) -> str:
    """8 -> '8 B', 4096 -> '4 KiB', 67108864 -> '64 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _bad(path: Path, why: str) -> PluginError:
    return PluginError(
        f"bench_plots hook: {path} is not a usable benchmark file: {why}.\n"
        "  Regenerate it with `make bench` (python -m reference_impl.bench allreduce)."
    )


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise _bad(path, f"cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmark"), str):
        raise _bad(path, "the top level must be an object with a 'benchmark' name")
    return data


def _machine_line(path: Path, data: dict[str, Any]) -> str:
    machine = data.get("machine")
    if not isinstance(machine, dict):
        raise _bad(path, "'machine' must be an object")
    missing = [k for k in ("cpu", "cores", "mpi_library", "date") if k not in machine]
    if missing:
        raise _bad(path, f"'machine' lacks {', '.join(missing)}")
    lines = str(machine["mpi_library"] or "?").strip().splitlines() or ["?"]
    mpi_lib = " ".join(lines[0].split())  # "MPICH Version:      5.0.2" -> "MPICH Version: 5.0.2"
    if len(mpi_lib) > 60:
        mpi_lib = mpi_lib[:57] + "..."
    return f"{machine['cpu']}, {machine['cores']} cores, {mpi_lib}, measured {_date(machine['date'])}"


def _date(iso: Any) -> str:
    """'2025-11-21T23:40:12.5+00:00' -> '2025-11-21 23:40 UTC'; anything unparsable as given."""
    try:
        when = datetime.fromisoformat(str(iso))
    except ValueError:
        return str(iso)
    zone = when.strftime(" %Z") if when.tzinfo else ""
    return when.strftime("%Y-%m-%d %H:%M") + zone


def _allreduce_rows(path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = data.get("results")
    if not isinstance(rows, list) or not rows:
        raise _bad(path, "'results' must be a non-empty list")
    keys = {"ranks": int, "bytes": int, "impl": str, "time_s": (int, float), "busbw_GBps": (int, float)}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise _bad(path, f"results[{i}] is not an object")
        for key, kind in keys.items():
            if not isinstance(row.get(key), kind) or isinstance(row.get(key), bool):
                raise _bad(path, f"results[{i}].{key} is missing or not {kind}")
        if row["impl"] not in IMPLS:
            raise _bad(path, f"results[{i}].impl is {row['impl']!r}, expected one of {sorted(IMPLS)}")
        if row["bytes"] <= 0 or not math.isfinite(row["busbw_GBps"]) or row["busbw_GBps"] < 0:
            raise _bad(path, f"results[{i}] has a non-positive size or an invalid busbw")
    return rows


def _series(rows: list[dict[str, Any]], key: str = "busbw_GBps") -> dict[tuple[str, int], dict[int, float]]:
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


def _ratios(series, ranks: int, impl: str = "ring") -> dict[int, float]:
    """{bytes: busbw of ``impl`` / busbw of the MPI library} for one rank count."""
    ring, mpi = series.get((impl, ranks), {}), series.get(("mpi", ranks), {})
    return {b: ring[b] / mpi[b] for b in sorted(ring.keys() & mpi.keys()) if mpi[b] > 0}


def _size_axis(ax, sizes: list[int]) -> None:
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


def _svg(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def _figure(caption: str) -> tuple[Figure, Any]:
    fig = Figure(figsize=(7.6, 4.4), layout="constrained")
    ax = fig.add_subplot()
    ax.grid(True, which="major", alpha=0.3)
    fig.get_layout_engine().set(h_pad=0.08)
    fig.supxlabel(caption, fontsize=7, color="0.35")
    return fig, ax


def _color(ranks: int, all_ranks: list[int]) -> str:
    return f"C{all_ranks.index(ranks) % 10}"


# --------------------------------------------------------------------------- allreduce


def _allreduce(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    rows = _allreduce_rows(path, data)
    machine = _machine_line(path, data)
    dtype = data.get("dtype", "?")
    series = _series(rows)
    times = _series(rows, "time_s")
    all_ranks = sorted({r for _, r in series})
    sizes = sorted({row["bytes"] for row in rows})
    caption = f"Measured on {machine}"

    # Bus bandwidth against size.
    fig, ax = _figure(caption)
    for ranks in all_ranks:
        for impl in IMPLS:
            points = series.get((impl, ranks))
            if not points:
                continue
            xs = sorted(points)
            ax.plot(
                xs, [points[x] for x in xs], color=_color(ranks, all_ranks), markersize=3,
                linewidth=1.4, label=f"{IMPLS[impl]}, {ranks} ranks", **STYLES[impl],
            )
    _size_axis(ax, sizes)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"Allreduce bus bandwidth ({dtype}, sum): ring vs the MPI library")
    ax.legend(loc="upper left", fontsize=8)
    busbw_svg = _svg(fig)

    # Ratio ring / MPI.
    fig, ax = _figure(caption)
    every_ratio = []
    for ranks in all_ranks:
        for impl in ("ring", "ring_alloc"):
            ratio = _ratios(series, ranks, impl)
            if not ratio:
                continue
            xs = sorted(ratio)
            every_ratio += list(ratio.values())
            ax.plot(
                xs, [ratio[x] for x in xs], color=_color(ranks, all_ranks), markersize=3,
                linewidth=1.4, label=f"{IMPLS[impl]} / MPI, {ranks} ranks", **STYLES[impl],
            )
    if not every_ratio:
        raise _bad(path, "no message size was measured with both 'ring' and 'mpi'")
    ax.axhline(1.0, color="0.5", linewidth=2.0, linestyle="-", alpha=0.5, label="parity (1.0)")
    positive = [r for r in every_ratio if r > 0]
    if positive and max(positive + [1.0]) / min(positive + [1.0]) > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    else:
        ax.set_ylim(bottom=0, top=max(every_ratio + [1.0]) * 1.15)
    _size_axis(ax, sizes)
    ax.set_ylabel("ring busbw / MPI busbw")
    ax.set_title("Allreduce: our ring relative to the MPI library (higher is better, 1 = parity)")
    ax.legend(loc="best", fontsize=8)
    ratio_svg = _svg(fig)

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
    summary = "\n".join(lines) + "\n"

    return {"busbw": busbw_svg, "ratio": ratio_svg}, summary


PLOTTERS = {"allreduce": _allreduce}


# --------------------------------------------------------------------------- mkdocs events


def on_files(files, config):
    _summaries.clear()
    bench_dir = Path(config["docs_dir"]) / BENCH_URI
    found = {p.stem: p for p in sorted(bench_dir.glob("*.json"))}
    for name in REQUIRED:
        if name not in found:
            raise PluginError(
                f"bench_plots hook: {bench_dir / (name + '.json')} is missing, so the site "
                f"cannot show the {name} figures.\n"
                "  Run `make bench` to measure them on this machine (it writes that file)."
            )
    for stem, path in found.items():
        data = _load(path)
        plotter = PLOTTERS.get(data["benchmark"])
        if plotter is None:
            log.info("bench_plots: no plotter for benchmark %r in %s; skipped", data["benchmark"], path)
            continue
        svgs, summary = plotter(path, data)
        _summaries[data["benchmark"]] = summary
        for kind, content in svgs.items():
            uri = f"{BENCH_URI}/{stem}-{kind}.svg"
            existing = files.get_file_from_path(uri)
            if existing is not None:
                files.remove(existing)  # a stale copy in docs/: the generated one wins
            files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    def table(match: re.Match) -> str:
        name = match.group(1)
        if name not in _summaries:
            raise PluginError(
                f"bench_plots hook: page '{page.file.src_uri}' asks for the '{name}' summary, but "
                f"there is no benchmark file for it under docs/{BENCH_URI}/. Run `make bench`."
            )
        return _summaries[name]

    return _MARKER.sub(table, markdown)
