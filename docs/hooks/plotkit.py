"""Shared pieces of the build-time benchmark plots: loading a result file, axes, SVG output.

Every plotter module (``plot_<benchmark>.py`` beside this file) uses these, so all figures
look alike: log2 size axes with human labels, a caption naming the machine, text drawn as
outlines (no font needed in the reader's browser) and byte-identical SVG for the same data.

``svg(fig)`` also *finishes* every figure the same way, so no plotter has to remember it:

* readable on a phone: the figure is at most ``MAX_WIDTH_IN`` wide and no text is smaller
  than ``MIN_FONT_PT``, so in a 360 px wide screen (an image about 330 px wide) text is at
  least 9 px high; long titles, labels and legend entries are wrapped to fit;
* distinguishable without colour: labelled lines in one panel get distinct line style and
  marker pairs, and the palette ``PALETTE`` keeps at least 3:1 contrast against a white page
  and, inverted by the dark scheme's CSS filter, against the dark page;
* panels side by side are stacked in one column, each as wide as the figure;
* legends never cover data: a one-panel figure's goes below the plot, a panel's legend of a
  several-panel figure above that panel, under its title;
* log axes label ticks as plain numbers (``3``, ``0.02``), never ``3×10⁰``;
* a transparent background, so the dark scheme (docs/assets/stylesheets/figures.css)
  can invert the figure onto its own background.
"""
from __future__ import annotations

import io
import json
import math
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # after choosing the backend
from matplotlib.collections import Collection
from matplotlib.colors import to_rgb, to_rgba
from matplotlib.patches import Patch
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatterSciNotation, NullLocator
from mkdocs.exceptions import PluginError

MAX_WIDTH_IN = 5.0  # figure width: a 360 pt wide SVG viewBox
MIN_FONT_PT = 10.0  # 10 pt in 360 pt shown 330 px wide is 9.2 px
# Colour-blind-friendly hues, each with at least 3:1 contrast against white and, after the dark
# scheme's invert(1) hue-rotate(180deg), against Material's slate background (tab10 with its
# orange, pink, olive and cyan darkened). "C0".."C9" in the plotters refer to these.
PALETTE = ("#1f77b4", "#d55e00", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#c51b7d", "#7f7f7f", "#6a6a00", "#008b8b")
# (line style, marker) pairs given in turn to the labelled lines of one panel.
LINE_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ("-", "v"), ("--", "x"),
               (":", "P"), ("-.", "*"), ("-", "<"), ("--", ">"), (":", "h"), ("-.", "+"))

matplotlib.rcParams.update(
    {
        "svg.hashsalt": "dl-systems-lab",  # stable element ids: same data, same SVG bytes
        "svg.fonttype": "path",  # text as outlines: no font needed in the reader's browser
        "font.size": MIN_FONT_PT,
        "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
        "savefig.transparent": True,
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
    finish(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, transparent=True)
    return buf.getvalue()


def figure(caption: str) -> tuple[Figure, Any]:
    fig = Figure(figsize=(MAX_WIDTH_IN, 3.6), layout="constrained")
    ax = fig.add_subplot()
    ax.grid(True, which="major", alpha=0.3)
    fig.get_layout_engine().set(h_pad=0.08)
    fig.supxlabel(caption, fontsize=MIN_FONT_PT, color="0.35")
    return fig, ax


# --------------------------------------------------------------------------- finishing


class PlainLogFormatter(LogFormatterSciNotation):
    """Matplotlib's choice of which log ticks to label, written as plain numbers: ``3``, not ``3×10⁰``."""

    def __call__(self, x, pos=None):
        if not super().__call__(x, pos):
            return ""
        return plain_number(x)


def plain_number(x: float) -> str:
    """0.3 -> '0.3', 3 -> '3', 20000 -> '20000'; outside [1e-3, 1e5) a power of ten in mathtext."""
    if x == 0 or 1e-3 <= abs(x) < 1e5:
        return f"{x:g}"
    exp = math.floor(math.log10(abs(x)) + 1e-9)
    mant = x / 10**exp
    return f"$10^{{{exp}}}$" if abs(mant - 1) < 1e-9 else f"${mant:g}\\times10^{{{exp}}}$"


def _panels(fig: Figure) -> list[list[Any]]:
    """The figure's axes grouped by position: a twin axes shares its panel with its host."""
    groups: dict[tuple, list[Any]] = {}
    for ax in fig.axes:
        if getattr(ax, "legend_holder", False):
            continue
        spec = ax.get_subplotspec()
        key = (id(spec.get_gridspec()), spec.rowspan.start, spec.colspan.start) if spec else (id(ax),)
        groups.setdefault(key, []).append(ax)
    return list(groups.values())


def _columns(fig: Figure) -> int:
    specs = [ax.get_subplotspec() for ax in fig.axes if ax.get_subplotspec() is not None]
    return max((s.get_gridspec().ncols for s in specs), default=1)


def _restack(fig: Figure, panels: list[list[Any]]) -> int:
    """Panels side by side in one row are stacked in one column instead (each as wide as the
    figure, so a phone shows them at a readable size); returns the new number of columns."""
    specs = [panel[0].get_subplotspec() for panel in panels]
    if any(s is None for s in specs) or len({id(s.get_gridspec()) for s in specs}) != 1:
        return _columns(fig)
    grid = specs[0].get_gridspec()
    if grid.ncols < 2 or any(s.rowspan.stop - s.rowspan.start != 1 or s.colspan.stop - s.colspan.start != 1
                             for s in specs):
        return grid.ncols
    n = len(panels)
    order = sorted(range(n), key=lambda i: (specs[i].rowspan.start, specs[i].colspan.start))
    new = fig.add_gridspec(n, 1)
    for row, i in enumerate(order):
        for ax in panels[i]:
            ax.set_subplotspec(new[row])
            ax.xaxis.set_tick_params(labelbottom=True)
            if ax.yaxis.get_label_position() == "left":
                ax.yaxis.set_tick_params(labelleft=True)
    w, h = fig.get_size_inches()
    fig.set_size_inches(w, n * max(2.9, h / grid.nrows - 0.6) + 0.8)
    return 1


def _wrap_ticks(ax: Any, width_pt: float) -> None:
    """Category labels under an x axis that would run into each other: wrapped onto lines, or
    turned 30° where a single word is still too long."""
    ticks = [t for t in ax.get_xticklabels() if t.get_text()]
    if not ticks or any(t.get_rotation() for t in ticks) or "$" in "".join(t.get_text() for t in ticks):
        return
    size = max(MIN_FONT_PT, ticks[0].get_fontsize())
    per = width_pt * 0.95 / len(ticks)
    chars = max(4, int(per / (0.55 * size)))
    if max(len(w) for t in ticks for line in t.get_text().split("\n") for w in line.split()) > chars:
        ax.tick_params(axis="x", labelrotation=30)
        for t in ax.get_xticklabels():
            t.set_horizontalalignment("right")
        return
    texts = ["\n".join(textwrap.fill(line, chars) for line in t.get_text().split("\n")) for t in ticks]
    if any(a != t.get_text() for a, t in zip(texts, ticks)):
        ax.set_xticks(ax.get_xticks()[:len(ticks)] if len(ax.get_xticks()) == len(ticks) else ax.get_xticks(),
                      texts if len(ax.get_xticks()) == len(ticks) else [t.get_text() for t in ax.get_xticklabels()])


def _wrap_yticks(ax: Any, width_pt: float) -> None:
    """Category labels beside a y axis longer than about 40% of the width, wrapped onto lines."""
    if not isinstance(ax.yaxis.get_major_locator(), FixedLocator):
        return
    chars = max(12, int(width_pt * 0.4 / (0.58 * MIN_FONT_PT)))
    texts = [t.get_text() for t in ax.get_yticklabels()]
    if texts and max(len(x) for x in texts) > chars:
        ax.set_yticks(ax.get_yticks(), [textwrap.fill(x, chars) for x in texts])


def _wrap(text: Text, width_pt: float) -> None:
    s = text.get_text()
    if not s or "$" in s:
        return
    chars = max(12, int(width_pt * 0.85 / (0.62 * text.get_fontsize())))
    lines = [textwrap.fill(line, chars) if len(line) > chars else line for line in s.split("\n")]
    text.set_text("\n".join(lines))


def _restyle(ax: Any) -> None:
    """Distinct styles for this panel's labelled lines (each has a legend entry): (line style,
    marker) pairs for lines, markers for marker-only series."""
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    seen: set[tuple[str, str]] = set()
    for ln in lines:
        pair = (ln.get_linestyle(), str(ln.get_marker()))
        if pair in seen:
            if pair[0] == "None":
                pair = next(((ls, m) for _, m in LINE_STYLES for ls in ("None",) if ("None", m) not in seen), pair)
            else:
                pair = next((c for c in LINE_STYLES if c not in seen), pair)
            ln.set_linestyle(pair[0])
            ln.set_marker(pair[1])
            n = len(ln.get_xdata())
            if n > 15 and pair[0] != "None":
                ln.set_markevery(max(1, n // 12))
            if ln.get_markersize() > 6:
                ln.set_markersize(5)
        seen.add(pair)


# Matplotlib's tab10 (the default "C0".."C9" and "tab:blue"...), named directly by some plotters:
# redrawn in PALETTE, hue for hue.
_TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _repaint(fig: Figure) -> None:
    """Every tab10 colour in the figure (lines, markers, bars, scatter points) in PALETTE instead."""
    swap = {to_rgb(a): b for a, b in zip(_TAB10, PALETTE)}

    def new(colour):
        if colour is None or (isinstance(colour, str) and colour in ("none", "None", "auto")):
            return None
        rgba = to_rgba(colour)
        if rgba[:3] in swap:
            return to_rgba(swap[rgba[:3]], rgba[3])
        return None

    for artist in fig.findobj(Line2D):
        for get, put in ((artist.get_color, artist.set_color), (artist.get_markerfacecolor, artist.set_markerfacecolor),
                         (artist.get_markeredgecolor, artist.set_markeredgecolor)):
            c = new(get())
            if c is not None:
                put(c)
    for artist in fig.findobj(Patch):
        for get, put in ((artist.get_facecolor, artist.set_facecolor), (artist.get_edgecolor, artist.set_edgecolor)):
            c = new(get())
            if c is not None:
                put(c)
    for artist in fig.findobj(Collection):
        for get, put in ((artist.get_facecolor, artist.set_facecolor), (artist.get_edgecolor, artist.set_edgecolor)):
            cols = get()
            if len(cols):
                mapped = [new(tuple(c)) or tuple(c) for c in cols]
                if any(new(tuple(c)) is not None for c in cols):
                    put(mapped)


def _legend_items(axes: list[Any], legends: list[Any]) -> tuple[list[Any], list[str]]:
    """The entries of ``legends``, each with the live artist of its label where the panel has one
    (so a restyled line shows its new style), else the legend's own copy of the handle."""
    live: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            live.setdefault(lab, h)
    handles, labels = [], []
    for leg in legends:
        for h, t in zip(leg.legend_handles, leg.get_texts()):
            lab = t.get_text()
            if lab not in labels:
                handles.append(live.get(lab, h))
                labels.append(lab)
    return handles, labels


def finish(fig: Figure) -> None:
    """Make ``fig`` readable at phone width, in both colour schemes, without colour alone."""
    w, h = fig.get_size_inches()
    if w > MAX_WIDTH_IN:
        fig.set_size_inches(MAX_WIDTH_IN, max(h * 0.9, 3.4))
    w, h = fig.get_size_inches()
    width_pt = w * 72
    cols = _columns(fig)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                for getter, setter, minor in ((axis.get_major_formatter, axis.set_major_formatter, False),
                                              (axis.get_minor_formatter, axis.set_minor_formatter, True)):
                    old = getter()
                    if type(old) is LogFormatterSciNotation:
                        new = PlainLogFormatter(base=old._base, labelOnlyBase=old.labelOnlyBase,
                                                minor_thresholds=old.minor_thresholds)
                        setter(new)
    _repaint(fig)
    panels = _panels(fig)
    cols = _restack(fig, panels) if len(panels) > 1 else cols
    w, h = fig.get_size_inches()
    for panel in panels:
        for ax in panel:
            _restyle(ax)
    one_panel = len(panels) == 1
    for panel in panels:
        old = [ax.get_legend() for ax in panel if ax.get_legend() is not None]
        if not old:
            continue
        for ax in panel:
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        handles, labels = _legend_items(panel, old)
        if one_panel:
            longest = max(len(lab) for lab in labels)
            ncol = 2 if longest * 0.58 * MIN_FONT_PT < width_pt / 2 - 30 and len(labels) > 2 else 1
            labels = [textwrap.fill(lab, max(20, int((width_pt / ncol - 40) / (0.58 * MIN_FONT_PT))))
                      for lab in labels]
            # A row of its own below the plot, above the caption: a near-zero-height axes whose
            # legend hangs below it; the constrained layout makes room for the legend.
            grid = fig.add_gridspec(2, 1, height_ratios=[1, 1e-3])
            for ax in panel:
                ax.set_subplotspec(grid[0])
            holder = fig.add_subplot(grid[1])
            holder.axis("off")
            holder.legend_holder = True  # not a panel: _panels and the label wrapping skip it
            holder.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncols=ncol,
                          frameon=False, borderaxespad=0)
            rows = math.ceil(len(labels) / ncol) + sum(lab.count("\n") for lab in labels) / ncol
            fig.set_size_inches(w, h + rows * MIN_FONT_PT * 1.45 / 72 + 0.1)  # room for the legend
        else:
            # Above its panel, under the panel's title (the legend's title), clear of the data.
            chars = max(16, int((width_pt - 40) / (0.58 * MIN_FONT_PT)))
            labels = [textwrap.fill(lab, chars) for lab in labels]
            longest = max(len(line) for lab in labels for line in lab.split("\n"))
            ncol = 2 if longest * 0.58 * MIN_FONT_PT < width_pt / 2 - 30 and len(labels) > 2 else 1
            host = panel[0]
            title = host.get_title()
            host.set_title("")
            host.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=ncol, frameon=False,
                        title=textwrap.fill(title, int(width_pt * 0.9 / (0.62 * 1.2 * MIN_FONT_PT))) or None,
                        title_fontsize=1.2 * MIN_FONT_PT, borderaxespad=0.2)
    for leg in fig.legends:
        texts = leg.get_texts()
        longest = max((len(t.get_text()) for t in texts), default=0)
        ncol = 2 if longest * 0.58 * MIN_FONT_PT < width_pt / 2 - 30 and len(texts) > 2 else 1
        leg.set_ncols(ncol)
        for t in texts:
            t.set_text(textwrap.fill(t.get_text(), max(20, int((width_pt / ncol - 40) / (0.58 * MIN_FONT_PT)))))
        _wrap(leg.get_title(), width_pt)
    for text in fig.findobj(Text):
        if text.get_fontsize() < MIN_FONT_PT:
            text.set_fontsize(MIN_FONT_PT)
    if fig._supxlabel is not None:
        _wrap(fig._supxlabel, width_pt)
    if fig._suptitle is not None:
        _wrap(fig._suptitle, width_pt)
    rows = max(1, math.ceil(len(_panels(fig)) / cols))
    for ax in fig.axes:
        if getattr(ax, "legend_holder", False):
            continue
        _wrap_ticks(ax, width_pt / cols)
        _wrap_yticks(ax, width_pt / cols)
        _wrap(ax.title, width_pt * 0.75 / cols)  # centred on the axes, which tick labels may narrow
        _wrap(ax.xaxis.label, width_pt * 0.75 / cols)
        _wrap(ax.yaxis.label, h * 72 * 0.55 / rows)  # the plot area, without title, labels and caption


def color(ranks: int, all_ranks: list[int]) -> str:
    return f"C{all_ranks.index(ranks) % 10}"
