"""``python -m benchmarks sharded``: its sections give the schema the site's plotter reads,
the plotter renders the committed file, and the committed bytes per step are the closed forms exactly."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import sharded
from reference_impl.parallel import transformer as tf
from reference_impl.parallel import zero

ROOT = Path(__file__).resolve().parents[1]
SHARDED_JSON = ROOT / "docs" / "assets" / "bench" / "sharded.json"

pytestmark = pytest.mark.timeout(90)


def plotter():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import plot_sharded
    finally:
        sys.path.pop(0)
    return plot_sharded


def test_small_sections_give_the_schema_the_plotter_reads(tmp_path):
    memory = sharded.memory_section(timeout=120)
    assert {(e["run"], e["ranks"]) for e in memory["results"]} == {
        (sharded.run_name(s, p), n) for s, p in sharded.RUNS for n in sharded.MEMORY_RANKS}
    for e in memory["results"]:
        assert len(e["measured_per_process"]) == max(sharded.MEMORY_RANKS) and e["measured_max"] > 0
        assert 0.9 < e["predicted_over_measured"] < 1.1
    timing = sharded.time_section(repeats=2, warmup=1, ranks=(2,), timeout=120)
    runs = [sharded.run_name(s, p) for s, p in sharded.RUNS]
    nets = ["shared-memory", *sharded.LINKS]
    assert timing["nets"] == nets
    assert sorted((r["transport"], r["net"], r["run"]) for r in timing["results"]) == sorted(
        (t, net, run) for t in ("mpi", "threads") for net in nets for run in runs)
    assert all(len(r["step_s"]) == 2 and r["median_s"] > 0 for r in timing["results"])
    assert len(timing["ratios"]) == 2 * len(nets)
    for r in timing["ratios"]:
        assert r["relative_to_dp"]["DP"] == 1.0 and r["prefetch_speedup"] > 0
    counted = sharded.bytes_section(ranks=(1, 3), steps=1)
    assert all(r["exact"] for m in counted["models"].values() for r in m["results"])
    document = {"benchmark": "sharded", "machine": {"cpu": "test", "cores": 1, "mpi_library": "x", "date": "now"},
                "memory": memory, "time": timing, "bytes": counted}
    out = tmp_path / "sharded.json"
    out.write_text(json.dumps(document))
    figures, summary = plotter().plot(out, json.loads(out.read_text()))
    assert set(figures) == {"memory", "time"} and all(b"<svg" in f[:1000] for f in figures.values())
    assert "| ZeRO-3 prefetch | 3 |" in summary


def test_the_plotter_renders_the_committed_file():
    data = json.loads(SHARDED_JSON.read_text())
    assert data["benchmark"] == "sharded" and not data["settings"]["quick"]
    figures, summary = plotter().plot(SHARDED_JSON, data)
    assert set(figures) == {"memory", "time", "precision"}  # the committed run has the precision section
    runs = data["precision"]["runs"]
    assert {"fp32", "bf16", "fp16", "fp8"} <= set(runs)
    assert "**Peak memory per rank**" in summary and "**Step time relative to plain DP**" in summary
    assert "| NO |" not in summary


def test_the_committed_bytes_per_step_are_the_closed_forms_exactly():
    data = json.loads(SHARDED_JSON.read_text())
    models = data["bytes"]["models"]
    assert set(models) == {"memory", "time"}
    for m in models.values():
        config = tf.GPTConfig(**m["config"])
        seen = set()
        for r in m["results"]:
            n, stage = r["ranks"], r["stage"]
            psi_pad = zero.padded_params(config, n)
            closed = 4 * (3 if stage == 3 else 2) * psi_pad * (n - 1) // n
            assert r["psi_pad"] == psi_pad and r["closed_form_bytes"] == closed == 4 * zero.comm_elements(config, stage, n)
            assert len(r["measured_bytes_per_step"]) == n  # every rank
            assert all(sent == closed for per_rank in r["measured_bytes_per_step"] for sent in per_rank)
            seen.add((r["run"], n))
        assert seen == {(sharded.run_name(s, p), n) for s, p in sharded.RUNS for n in sharded.BYTES_RANKS}
