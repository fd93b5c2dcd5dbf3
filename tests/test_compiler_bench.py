"""The deploy benchmark's pieces: the crossover rule, and the plotter on the committed results."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from page_tools import assert_pages_quote

from benchmarks.deploy import crossover

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
    mlp = data["mlp"]
    names = {"interpreter", "numpy", "jit_numpy", "jit_c", "jit_c_ctypes", "jit_c_kernel_only", "int8_numpy", "int8_c",
             "int8_c_portable", "read_weights_only"}
    assert set(mlp["seconds"]) == names
    assert max(mlp["max_abs_error_vs_interpreter"][k] for k in ("numpy", "jit_numpy", "jit_c", "jit_c_ctypes")) < 1e-3
    # the int8 kernels reproduce the NumPy int8 model exactly, so all three differ from float equally
    errors = mlp["max_abs_error_vs_interpreter"]
    assert mlp["int8_matches_numpy_reference"] and errors["int8_c"] == errors["int8_c_portable"] == errors["int8_numpy"]
    # every round recorded; the headline is the round with the median JIT speed-up
    rounds = mlp["rounds"]
    assert len(rounds) == data["settings"]["mlp_rounds"] >= 3
    assert all(set(r["seconds"]) == names for r in rounds)
    assert mlp["seconds"] == rounds[mlp["median_round"]]["seconds"]
    jit = sorted(r["speedup_vs_interpreter"]["jit_c"] for r in rounds)
    assert mlp["speedup_vs_interpreter"]["jit_c"] == jit[(len(jit) - 1) // 2]
    assert mlp["speedup_range"]["jit_c"] == [jit[0], jit[-1]]
    acc = data["accuracy"]
    assert set(acc["gradual"]) == {"layer", "global", "block", "row"}
    assert all(len(v) == len(acc["sparsities"]) for v in acc["gradual"].values())


def jit_page_figures(data: dict) -> list[str]:
    """The sentences of docs/concepts/jit-compilation.md that quote the batch-1 MLP results."""
    s, m = data["mlp"]["seconds"], data["mlp"]
    us = {k: v * 1e6 for k, v in s.items()}
    rounds = m["rounds"]
    ceiling = [r["speedup_vs_interpreter"]["read_weights_only"] for r in rounds]
    jit, q8 = m["speedup_range"]["jit_c"], m["speedup_range"]["int8_c"]
    below = [r["seconds"]["read_weights_only"] / r["seconds"]["int8_c"] for r in rounds]
    return [
        (f"In the median of the {len(rounds)} rounds, the interpreter took {us['interpreter']:.1f} µs per inference "
         f"and the JIT's C {us['jit_c']:.1f} µs, {s['interpreter'] / s['jit_c']:.1f}× faster (through ctypes "
         f"{us['jit_c_ctypes']:.1f} µs); the library call alone took {us['jit_c_kernel_only']:.1f} µs, "
         f"and a C loop that only reads as many floats as the MLP has weights "
         f"({m['weight_bytes'] / 1e3:.0f} kB) took {us['read_weights_only']:.1f} µs "
         f"({m['weight_bytes'] / s['read_weights_only'] / 1e9:.0f} GB/s): a ceiling of "
         f"{s['interpreter'] / s['read_weights_only']:.1f}× over the interpreter for any kernel that "
         f"reads every weight once"),
        (f"Across the rounds the JIT's C was {jit[0]:.1f}× to {jit[1]:.1f}× faster than the interpreter, "
         f"and the floor's ceiling ranged from {min(ceiling):.1f}× to {max(ceiling):.1f}×"),
        (f"in C ({m['int8_weight_bytes'] / 1e3:.0f} kB of int8 weights with their float scales "
         f"and biases) took "
         f"{us['int8_c']:.1f} µs: {s['interpreter'] / s['int8_c']:.1f}× faster than the interpreter "
         f"({q8[0]:.1f}× to {q8[1]:.1f}× across the rounds), {s['jit_c'] / s['int8_c']:.1f}× faster than the "
         f"float32 C, and {s['read_weights_only'] / s['int8_c']:.1f}× faster than the float32 floor "
         f"({min(below):.1f}× to {max(below):.1f}× across the rounds)"),
    ]


def quantisation_page_figures(data: dict) -> list[str]:
    """The sentence of docs/concepts/quantisation.md that quotes the int8 MLP's speed."""
    s = data["mlp"]["seconds"]
    us = {k: v * 1e6 for k, v in s.items()}
    return [(f"int8 in NumPy took {us['int8_numpy']:.0f} µs against {us['numpy']:.1f} µs for float32 NumPy; "
             f"in C the VNNI kernel took {us['int8_c']:.1f} µs, the portable loops {us['int8_c_portable']:.1f} µs "
             f"and the float32 JIT {us['jit_c']:.1f} µs")]


def test_the_jit_and_quantisation_pages_quote_the_committed_results():
    data = json.loads(RESULTS.read_text(encoding="utf-8"))
    concepts = ROOT / "docs" / "concepts"
    assert_pages_quote([*((concepts / "jit-compilation.md", s) for s in jit_page_figures(data)),
                        *((concepts / "quantisation.md", s) for s in quantisation_page_figures(data))])
