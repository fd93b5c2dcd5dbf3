"""The custom-ops benchmark runs, writes the JSON the site plots, and the plotter accepts it."""
import json
import sys

import numpy as np
import pytest

from conftest import ROOT
from reference_impl.toolchain import ToolchainError, find_c_compiler

try:
    find_c_compiler()
except ToolchainError:
    pytest.skip("no C compiler on this machine", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)


def test_quick_benchmark_writes_a_plottable_json(tmp_path, monkeypatch):
    from benchmarks import custom_ops

    out = tmp_path / "custom_ops.json"
    assert custom_ops.main(["--quick", "--repeats", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == "custom_ops" and "cpu" in data["machine"]
    ops = {(r["op"], r["rows"]) for r in data["results"]}
    assert ops == {("sparse_segment_sum", n) for n in custom_ops.SEGMENT_ROWS[:3]} | {
        ("bias_add_relu", n) for n in custom_ops.BIAS_ROWS[:3]}
    for row in data["results"]:
        assert all(t > 0 for stat in ("min_s", "median_s") for t in row[stat].values())
        assert all(row["min_s"][k] <= row["median_s"][k] for k in row["min_s"])
    assert set(data["call_overhead_us"]) == {"numpy", "c_kernel", "eager_op"}

    monkeypatch.syspath_prepend(str(ROOT / "docs" / "hooks"))
    import plot_custom_ops

    svgs, summary = plot_custom_ops.plot(out, data)
    assert svgs["speedup"].startswith(b"<?xml") and "numpy_add_at" in summary and "eager mode" in summary
    sys.modules.pop("plot_custom_ops", None)


def test_numpy_peers_agree_with_each_other(rng):
    from benchmarks.custom_ops import numpy_segment_sum_add_at, numpy_segment_sum_sorted

    for n, k in ((0, 3), (1, 1), (50, 7)):
        data, ids = rng.standard_normal((n, 4)), rng.integers(0, k, size=n)
        got = numpy_segment_sum_sorted(data, ids, k)
        assert got.shape == (k, 4)
        np.testing.assert_allclose(got, numpy_segment_sum_add_at(data, ids, k), rtol=1e-12, atol=1e-12)
