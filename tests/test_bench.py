"""The allreduce benchmark runs end to end on a tiny sweep and writes well-formed JSON.

No timing is asserted here (figures come from `make bench`, not from tests); we check the
document's shape, the nccl-tests bandwidth formulas, and the summary arithmetic.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.allreduce import MAX_BYTES, MIN_BYTES, summarise
from benchmarks.harness import bandwidths, sizes

ROOT = Path(__file__).resolve().parent.parent


def test_sizes_are_powers_of_two_from_8_bytes_to_64_mib():
    s = sizes(MIN_BYTES, MAX_BYTES)
    assert s[0] == 8 and s[-1] == 64 << 20 and len(s) == 24
    assert all(b == 2 * a for a, b in zip(s, s[1:]))


def test_busbw_follows_nccl_tests_definition():
    algbw, busbw = bandwidths(8 << 20, 0.004, 4)
    assert algbw == pytest.approx((8 << 20) / 0.004 / 1e9)
    assert busbw == pytest.approx(algbw * 2 * 3 / 4)
    assert bandwidths(1000, 1e-6, 2)[1] == pytest.approx(1.0)  # n=2: busbw == algbw


def test_summary_is_median_ratio_over_large_sizes():
    rows = [
        {"ranks": 2, "bytes": b, "impl": impl, "busbw_GBps": bw}
        for b, ring, mpi in [(1024, 1.0, 4.0), (1 << 20, 2.0, 1.0), (2 << 20, 3.0, 1.0), (4 << 20, 1.0, 1.0)]
        for impl, bw in (("ring", ring), ("mpi", mpi))
    ]
    assert summarise(rows) == {2: 2.0}


def test_benchmark_writes_json_with_machine_info(tmp_path):
    out = tmp_path / "allreduce.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", "allreduce", "--ranks", "2,3", "--torch-ranks", "2",
         "--min-bytes", "8", "--max-bytes", "64", "--warmup", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "allreduce" and doc["dtype"] == "float32"
    for key in ("cpu", "cores", "python", "numpy", "mpi4py", "mpi_library", "date"):
        assert doc["machine"][key], key
    assert "MPICH" in doc["machine"]["mpi_library"]
    points = {(r["ranks"], r["bytes"], r["impl"]) for r in doc["results"]}
    assert points == {(n, b, i) for n in (2, 3) for b in (8, 16, 32, 64)
                      for i in ("ring", "ring_alloc", "library", "mpi")}
    # the torch.distributed peer, from a torchrun job in the same run
    torch_points = {(r["ranks"], r["bytes"], r["impl"]) for r in doc["torch"]["results"]}
    assert torch_points == {(2, b, i) for b in (8, 16, 32, 64) for i in ("ring", "library", "torch")}
    assert "backend gloo" in doc["torch"]["library"] and doc["torch"]["machine"]["cores"] >= 1
    assert all(r["time_s"] > 0 for r in doc["torch"]["results"])
    for r in doc["results"] + doc["torch"]["results"]:
        assert r["time_s"] > 0 and r["repeats"] >= 5
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * (r["ranks"] - 1) / r["ranks"])
    assert "median busbw ratio" not in run.stdout  # no size >= 1 MiB in this sweep
    assert "wrote" in run.stdout


def test_unknown_benchmark_prints_usage():
    run = subprocess.run([sys.executable, "-m", "benchmarks", "nope"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and "usage" in run.stderr
