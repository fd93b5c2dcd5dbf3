"""The deploy benchmark's pieces: the crossover rule, and the plotter on the committed results."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference_impl.bench.deploy import crossover

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "assets" / "bench" / "deploy.json"

pytestmark = pytest.mark.timeout(120)


def test_crossover_interpolates_where_the_time_ratio_crosses_one():
    dens = [0.1, 0.2, 0.4]
    dense = [1.0, 1.0, 1.0]
    assert crossover(dens, [0.5, 0.9, 1.3], dense) == pytest.approx(0.2 + (1 - 0.9) * 0.2 / (1.3 - 0.9))
    assert crossover(dens, [1.5, 0.5, 0.5], dense) is None      # slower at the lowest density
    assert crossover(dens, [0.1, 0.2, 0.3], dense) == 1.0       # faster everywhere measured
    assert crossover(dens, [0.1, None, None], dense) == 0.1     # not measured beyond: last win


def test_committed_results_come_from_a_full_run():
    """The site plots this file (tests/test_site.py builds it); here: it is complete and coherent."""
    data = json.loads(RESULTS.read_text(encoding="utf-8"))
    assert data["benchmark"] == "deploy" and not data["settings"]["quick"]
    sweep = data["sweep"]
    assert sweep["densities"][0] <= 0.01 and sweep["densities"][-1] == 1.0
    for batch, series in sweep["seconds"].items():
        assert {"dense_blas", "jit_csr", "jit_bitmask", "csr_numpy", "jit_dense"} <= set(series), batch
        assert all(len(v) == len(sweep["densities"]) for v in series.values())
    assert set(data["mlp"]["seconds"]) == {"interpreter", "numpy", "jit_numpy", "jit_c", "jit_c_ctypes", "jit_c_kernel_only",
                                             "int8_numpy", "int8_c", "read_weights_only"}
    assert max(data["mlp"]["max_abs_error_vs_interpreter"][k] for k in ("numpy", "jit_numpy", "jit_c", "jit_c_ctypes")) < 1e-3
    acc = data["accuracy"]
    assert set(acc["gradual"]) == {"layer", "global", "block", "row"}
    assert all(len(v) == len(acc["sparsities"]) for v in acc["gradual"].values())


def jit_page_figures(data: dict) -> str:
    """The sentence of docs/concepts/jit-compilation.md that quotes the batch-1 MLP results."""
    s, m = data["mlp"]["seconds"], data["mlp"]
    us = {k: v * 1e6 for k, v in s.items()}
    return (f"the interpreter took {us['interpreter']:.1f} µs per inference and the JIT's C "
            f"{us['jit_c']:.1f} µs, {s['interpreter'] / s['jit_c']:.1f}× faster (through ctypes "
            f"{us['jit_c_ctypes']:.1f} µs); the library call alone took {us['jit_c_kernel_only']:.1f} µs, "
            f"and a C loop that only reads as many floats as the MLP has weights "
            f"({m['weight_bytes'] / 1e3:.0f} kB) took {us['read_weights_only']:.1f} µs "
            f"({m['weight_bytes'] / s['read_weights_only'] / 1e9:.0f} GB/s): a ceiling of "
            f"{s['interpreter'] / s['read_weights_only']:.1f}× over the interpreter for any kernel that "
            f"reads every weight once")


def test_the_jit_page_quotes_the_committed_results():
    page = " ".join((ROOT / "docs" / "concepts" / "jit-compilation.md").read_text(encoding="utf-8").split())
    want = jit_page_figures(json.loads(RESULTS.read_text(encoding="utf-8")))
    assert want in page, f"update docs/concepts/jit-compilation.md to say: {want}"
