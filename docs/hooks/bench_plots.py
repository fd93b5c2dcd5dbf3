"""MkDocs hook: plot the measured benchmarks at build time.

``make bench`` (``python -m benchmarks NAME --publish``) writes one JSON file per benchmark
under ``docs/assets/bench/``, with the machine it ran on. This hook reads them on every
build and adds the figures to the site as *generated* files (``File.generated``), so the
plots always show the data in the repository, nothing generated is written into ``docs/``,
and ``mkdocs build --strict`` sees the image links as valid.

Each benchmark has a plotter module beside this file, ``plot_<benchmark>.py``, with a
``NAME`` and ``plot(path, data) -> ({kind: svg_bytes}, summary_markdown)``; the figure
``<kind>`` of ``<stem>.json`` is served as ``assets/bench/<stem>-<kind>.svg``, and the
marker ``<!-- bench:<NAME>:summary -->`` in a page is replaced by the summary table. A
summary may be cut into named parts, each opened by a line ``<!-- part:<PART> -->``;
``<!-- bench:<NAME>:summary:<PART> -->`` is replaced by that part alone, so each page shows
the tables it explains.
A missing or malformed required file fails the build and says to run ``make bench``.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import plot_allreduce
import plot_alpha_beta
import plot_autodiff
import plot_cluster
import plot_collectives
import plot_custom_ops
import plot_deploy
import plot_determinism
import plot_distributed_session
import plot_grading
import plot_graph
import plot_interconnects
import plot_model_parallel
import plot_optimizers
import plot_overlap
import plot_passes
import plot_pipeline
import plot_ps
import plot_ps_cluster
import plot_sharded
import plot_training
import plot_training_loop
import plotkit
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.bench_plots")

BENCH_URI = "assets/bench"
PLOTTERS = {
    m.NAME: m.plot
    for m in (plot_allreduce, plot_alpha_beta, plot_autodiff, plot_cluster, plot_collectives, plot_custom_ops,
              plot_deploy, plot_determinism, plot_distributed_session, plot_grading, plot_graph,
              plot_interconnects, plot_model_parallel, plot_optimizers, plot_overlap, plot_passes, plot_pipeline,
              plot_ps, plot_ps_cluster, plot_sharded, plot_training, plot_training_loop)
}
REQUIRED = tuple(PLOTTERS)  # every benchmark with a plotter must have its measured file
_MARKER = re.compile(r"<!--\s*bench:([A-Za-z0-9_-]+):summary(?::([a-z0-9-]+))?\s*-->")
_PART = re.compile(r"^<!-- part:([a-z0-9-]+) -->$", re.MULTILINE)


def summary_part(summary: str, part: str) -> str | None:
    """The text of ``summary`` from the line ``<!-- part:<part> -->`` to the next part (None if absent)."""
    marks = list(_PART.finditer(summary))
    for i, mark in enumerate(marks):
        if mark.group(1) == part:
            end = marks[i + 1].start() if i + 1 < len(marks) else len(summary)
            return summary[mark.end():end].strip("\n") + "\n"
    return None


_summaries: dict[str, str] = {}


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
        data = plotkit.load(path)
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
        if match.group(2) is None:
            return _summaries[name]
        text = summary_part(_summaries[name], match.group(2))
        if text is None:
            raise PluginError(
                f"bench_plots hook: page '{page.file.src_uri}' asks for part '{match.group(2)}' of the "
                f"'{name}' summary, which has parts {_PART.findall(_summaries[name])}."
            )
        return text

    return _MARKER.sub(table, markdown)
