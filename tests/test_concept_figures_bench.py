"""The autodiff and passes benchmarks, their plotters, and the concept pages that quote them.

No timing is asserted (figures come from ``make bench``). We check what the benchmarks
compute against independent computations (finite differences, op counts derived from the
model's structure), that each runs end to end on a tiny setting and writes the JSON its
plotter draws, that each plotter draws the committed file and refuses a broken one, and
that the autodiff, graph-optimisation and checkpoints pages quote the committed numbers.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from page_tools import assert_pages_quote
from benchmarks.harness import BLAS_THREAD_VARS

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "assets" / "bench"
CONCEPTS = ROOT / "docs" / "concepts"

pytestmark = pytest.mark.timeout(120)


def _plotter(name: str):
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


# --------------------------------------------------------------------------- autodiff


def test_reverse_mode_gradient_matches_finite_differences_and_a_numpy_backward_pass():
    from benchmarks.autodiff import LossModel

    model = LossModel(hidden=3, batch=5, seed=1)
    assert model.n == 2 * 3 * 3 + 3 * 3 + 1  # two h x h layers, h x 1, and h + h + 1 biases
    reverse = model.gradient()
    fd = model.finite_differences()
    assert np.max(np.abs(reverse - fd)) < 1e-7 * np.max(np.abs(fd))
    # the same gradient by hand in NumPy, from the fed arrays
    feed = {t.op.name: v for t, v in model.feed.items()}
    w0, b0, w1, b1, w2, b2 = (feed[n] for n in ("w0", "b0", "w1", "b1", "w2", "b2"))
    h1 = np.tanh(feed["x"] @ w0 + b0)
    h2 = np.tanh(h1 @ w1 + b1)
    d_out = 2 * (h2 @ w2 + b2 - feed["y"]) / feed["y"].size
    d2 = (d_out @ w2.T) * (1 - h2**2)
    d1 = (d2 @ w1.T) * (1 - h1**2)
    by_hand = [feed["x"].T @ d1, d1.sum(0), h1.T @ d2, d2.sum(0), h2.T @ d_out, d_out.sum(0)]
    np.testing.assert_allclose(reverse, np.concatenate([g.ravel() for g in by_hand]), rtol=1e-10, atol=1e-14)
    model.session.close()


def test_autodiff_benchmark_writes_json_and_the_plotter_reads_it(tmp_path, monkeypatch):
    from benchmarks import autodiff
    from benchmarks.__main__ import BENCHMARKS

    assert BENCHMARKS["autodiff"] is autodiff.main  # so `make bench` and the command line find it
    for var in BLAS_THREAD_VARS:  # as if re-started with one BLAS thread: main runs here, no exec
        monkeypatch.setenv(var, "1")
    out = tmp_path / "autodiff.json"
    assert autodiff.main(["--quick", "--repeats", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "autodiff" and "machine" in doc and doc["settings"]["repeats"] == 2
    rows = doc["results"]
    assert [r["hidden"] for r in rows] == [2, 4] and [r["params"] for r in rows] == [15, 45]
    for r in rows:
        assert r["fd_evaluations"] == 2 * r["params"] and len(r["forward_s"]) == len(r["gradient_s"]) == 2
        assert r["max_rel_error"] < 1e-6 and r["ops"]["gradient"] > r["ops"]["forward"]
    figures, summary = _plotter("plot_autodiff").plot(out, doc)
    assert figures["cost"].startswith(b"<?xml") and "| 45 (4) |" in summary and "*Machine:*" in summary


def test_autodiff_plotter_draws_the_committed_file_and_refuses_a_broken_one():
    from mkdocs.exceptions import PluginError

    plot = _plotter("plot_autodiff").plot
    path = BENCH / "autodiff.json"
    data = json.loads(path.read_text())
    figures, summary = plot(path, data)
    assert set(figures) == {"cost"} and b'id="line2d_' in figures["cost"]
    assert summary.count("\n| ") == len(data["results"])  # one row per width, after the header
    broken = dict(data, results=[{k: v for k, v in data["results"][0].items() if k != "fd_over_forward"}])
    with pytest.raises(PluginError, match="fd_over_forward is missing"):
        plot(path, broken)
    negative = dict(data, results=[dict(data["results"][0], forward_median_s=-1.0)])
    with pytest.raises(PluginError, match="negative, zero or non-finite"):
        plot(path, negative)


# --------------------------------------------------------------------------- passes


def test_passes_benchmark_counts_match_the_models_structure(tmp_path):
    from benchmarks import passes
    from benchmarks.__main__ import BENCHMARKS

    assert BENCHMARKS["passes"] is passes.main
    out = tmp_path / "passes.json"
    assert passes.main(["--repeats", "2", "--blas-threads", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    training, inference = doc["results"]
    # each pass starts from the previous one's result
    for r in (training, inference):
        counts = [p[2] for p in r["passes"]]
        assert [p[1] for p in r["passes"][1:]] == counts[:-1]
    # Adam on 6 variables builds beta1^t and beta2^t once per variable; CSE keeps one of each
    assert training["cse_removed"]["Pow"] == 2 * 6 - 2 and training["cse_removed"]["Sub"] >= 2 * 6 - 2
    assert training["ops_run"]["session passes"] == training["passes"][-1][2]
    assert training["losses"]["prune only"] == training["losses"]["session passes"]
    # two hidden layers: one fused op each; the pipeline's outputs equal the original's
    assert inference["fused_ops"] == 2 and inference["max_abs_diff"] == 0.0
    assert inference["ops_run"]["inference pipeline"] == inference["passes"][-1][2]
    assert [t["batch"] for t in inference["timings"]] == [1, passes.INFERENCE_BATCH]
    assert all(len(v) == 2 for t in inference["timings"] for v in t["seconds"].values())
    figures, summary = _plotter("plot_passes").plot(out, doc)
    assert set(figures) == {"ops", "time"} and "| elementwise fusion | 28 | 20 |" in summary


def test_passes_plotter_draws_the_committed_file_and_refuses_a_broken_one():
    from mkdocs.exceptions import PluginError

    plot = _plotter("plot_passes").plot
    path = BENCH / "passes.json"
    data = json.loads(path.read_text())
    figures, summary = plot(path, data)
    assert all(f.startswith(b"<?xml") and b"<path" in f for f in figures.values())
    assert "**training**" in summary and "**inference**" in summary and "*Machine:*" in summary
    row = data["results"][0]
    no_baseline = dict(row, timings=[{"batch": 64, "best_s": {"session passes": 1e-3}}])
    with pytest.raises(PluginError, match="'prune only'"):
        plot(path, dict(data, results=[no_baseline]))
    with pytest.raises(PluginError, match=r"\[name, ops before, ops after\]"):
        plot(path, dict(data, results=[dict(row, passes=[["prune", 3]])]))


def test_pipeline_plotter_draws_the_checkpoint_figure_and_refuses_a_broken_row():
    from mkdocs.exceptions import PluginError

    plot = _plotter("plot_pipeline").plot
    path = BENCH / "pipeline.json"
    data = json.loads(path.read_text())
    figures, _ = plot(path, data)
    assert set(figures) == {"bubble", "memory", "checkpoint"} and b"<path" in figures["checkpoint"]
    bad_row = dict(data["checkpoint"][0], bytes=0)
    with pytest.raises(PluginError, match="positive size in 'bytes'"):
        plot(path, dict(data, checkpoint=[bad_row]))


# --------------------------------------------------------------------------- the pages' numbers


def quoted_figures() -> list[tuple[str, str]]:
    """(concept page, text it must contain), formatted from the committed benchmark results.

    When a benchmark is run again, this says which sentences no longer match the data
    (update the page, not this list)."""
    ad = json.loads((BENCH / "autodiff.json").read_text())["results"]
    ad = sorted(ad, key=lambda r: r["params"])
    ratios = [r["gradient_over_forward"] for r in ad]
    first, last = ad[0], ad[-1]
    ps = {r["graph"]: r for r in json.loads((BENCH / "passes.json").read_text())["results"]}
    tr, inf = ps["training"], ps["inference"]
    tp = {name: after for name, _, after in tr["passes"]}
    ip = {name: after for name, _, after in inf["passes"]}
    rel = {(r["graph"], t["batch"]): {k: v / t["best_s"]["prune only"] for k, v in t["best_s"].items()}
           for r in ps.values() for t in r["timings"]}
    t64, i1, i256 = rel[("training", 64)], rel[("inference", 1)], rel[("inference", 256)]
    removed = tr["cse_removed"]
    ck = {r["mib"]: r["mb_per_s"] for r in json.loads((BENCH / "pipeline.json").read_text())["checkpoint"]}
    return [
        ("autodiff", f"n = {first['params']} to {last['params']} parameters"),
        ("autodiff", f"between {min(ratios):.2f}× and {max(ratios):.2f}× the time of one forward pass"),
        ("autodiff", (f"from {first['params']} to {last['params']} parameters; finite differences took "
                     f"{first['fd_over_forward']:.0f}× at n = {first['params']} and {last['fd_over_forward']:.0f}× "
                     f"at n = {last['params']}")),
        ("autodiff", f"agreed to within {max(r['max_rel_error'] for r in ad):.1e}"),
        ("autodiff", f"runs {last['ops']['gradient']} ops against the forward plan's {last['ops']['forward']}"),
        ("graph-optimisation", f"({tr['ops_built']} → {tp['prune']})"),
        ("graph-optimisation", (f"CSE then removes {tp['prune'] - tp['common_subexpression_elimination']} ops "
                               f"({tp['prune']} → {tp['common_subexpression_elimination']})")),
        ("graph-optimisation", (f"({removed['Const']} `Const`, {removed['Pow']} `Pow`, {removed['Sub']} `Sub` and "
                               f"{removed['Add']} `Add` ops went)")),
        ("graph-optimisation", f"turns the variables into constants ({inf['ops_built']} → {ip['freeze']})"),
        ("graph-optimisation", f"(the count stays {ip['constant_folding']}:"),
        ("graph-optimisation", f"identical $\\varepsilon$ constants ({ip['common_subexpression_elimination']})"),
        ("graph-optimisation", f"drops the folded inputs ({ip['dead_code_elimination']})"),
        ("graph-optimisation", f"one `FusedElementwise` op ({ip['elementwise_fusion']})"),
        ("graph-optimisation", f"(largest difference {inf['max_abs_diff']:.1f})"),
        ("graph-optimisation", (f"the Adam step with the passes took {t64['session passes']:.2f}× the time of "
                               f"pruning alone, and batch-1 inference {i1['pipeline without fusion']:.2f}× after the "
                               f"pipeline without fusion and {i1['inference pipeline']:.2f}× with it")),
        ("graph-optimisation", (f"the pipeline without fusion took {i256['pipeline without fusion']:.2f}× and the "
                               f"fused graph {i256['inference pipeline']:.2f}× the time of pruning alone")),
        ("graph-optimisation", (f"cut the inference graph from {ip['dead_code_elimination']} to {ip['elementwise_fusion']} "
                               f"ops, yet the batch-256 step took {i256['inference pipeline']:.2f}× as long")),
        ("checkpoints", (f"At 128 MiB `save_checkpoint` wrote {ck[128]['save']:.0f} MB/s against "
                        f"{ck[128]['savez']:.0f} MB/s for `np.savez` ({ck[128]['save'] / ck[128]['savez']:.2f}×) and "
                        f"`load_checkpoint` read {ck[128]['load']:.0f} MB/s against {ck[128]['npload']:.0f} MB/s for "
                        f"`np.load` ({ck[128]['load'] / ck[128]['npload']:.2f}×); at 32 MiB the ratios were "
                        f"{ck[32]['save'] / ck[32]['savez']:.2f}× and {ck[32]['load'] / ck[32]['npload']:.2f}×")),
        ("checkpoints", (f"ran at {ck[4]['save'] / ck[4]['savez']:.2f}× of `np.savez` ({ck[4]['save']:.0f} against "
                        f"{ck[4]['savez']:.0f} MB/s)")),
        ("checkpoints", (f"took {ck[32]['savez'] / ck[32]['save']:.2f}× as long as `np.savez` at 32 MiB, "
                        f"{ck[128]['savez'] / ck[128]['save']:.2f}× at 128 MiB and {ck[4]['savez'] / ck[4]['save']:.1f}× "
                        "at 4 MiB")),
    ]


def test_concept_pages_quote_the_committed_figures():
    assert_pages_quote((CONCEPTS / f"{page}.md", text) for page, text in quoted_figures())
