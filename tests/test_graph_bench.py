"""The graph benchmark runs end to end on a tiny setting, and its plotter reads the result.

No timing is asserted (figures come from ``make bench``); we check that the three training
steps compute the same loss (so they time the same work), the JSON's shape, and the plot."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def test_numpy_graph_and_eager_steps_agree():
    from benchmarks import graph as bench

    x, y, params = bench._data()
    graph_step, sess = bench.graph_step_fn(x, y, [p.copy() for p in params])
    eager_step = bench.eager_step_fn(x, y, [p.copy() for p in params])
    ps = [p.copy() for p in params]
    for _ in range(2):  # the second step sees the first step's update in all three
        losses = [bench.numpy_step(ps, x, y), graph_step(), eager_step()]
        np.testing.assert_allclose(losses, losses[0], rtol=2e-5)
    sess.close()


def test_benchmark_writes_json_and_the_plotter_reads_it(tmp_path):
    out = tmp_path / "graph.json"
    run = subprocess.run([sys.executable, "-m", "benchmarks", "graph", "--repeats", "2",
                          "--chain", "20", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                         timeout=240)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "graph" and doc["settings"]["widths"] == [784, 512, 512, 10]
    assert set(doc["step_seconds"]) == {"numpy", "graph", "eager"}
    assert all(len(v) == 2 for v in doc["step_seconds"].values())
    assert doc["ratio_to_numpy"]["numpy"] == 1.0 and "machine" in doc
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import plot_graph
    finally:
        sys.path.pop(0)
    figures, summary = plot_graph.plot(out, doc)
    assert figures["step"].startswith(b"<?xml") and "| graph |" in summary and "µs per op" in summary
