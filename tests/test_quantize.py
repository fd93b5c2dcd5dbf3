"""Post-training int8 quantisation: per-channel weights, calibration, the NumPy and C int8 MLPs."""
from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from reference_impl.compiler.c_codegen import host_has_avx512
from reference_impl.quantize import (
    GROUP,
    LANES,
    QuantizedMLP,
    calibrate,
    compile_int8,
    float_mlp,
    int8_c_source,
    pack_int8,
    quantize_activation,
    quantize_per_channel,
)

pytestmark = pytest.mark.timeout(120)


def test_per_channel_error_is_within_half_a_step_per_column():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(30, 6)).astype(np.float32) * np.array([0.01, 0.1, 1, 10, 100, 0], np.float32)
    q, s = quantize_per_channel(w)
    assert q.dtype == np.int8 and s.shape == (6,) and s[5] == 1 and not q[:, 5].any()
    assert np.all(np.abs(q[:, :5]).max(axis=0) == 127)  # each channel uses its full range
    assert np.all(np.abs(q.astype(np.float32) * s - w) <= s / 2 + 1e-7)
    # one scale for the whole tensor would leave the small channels almost nothing
    per_tensor = np.abs(w).max() / 127
    err_tensor = np.abs(np.rint(w[:, 0] / per_tensor) * per_tensor - w[:, 0]).max()
    assert np.abs(q[:, 0] * s[0] - w[:, 0]).max() < err_tensor / 100


def test_calibration_scales_and_saturation():
    rng = np.random.default_rng(1)
    params = [rng.normal(size=(4, 3)).astype(np.float32), np.zeros(3, np.float32),
              rng.normal(size=(3, 2)).astype(np.float32), np.zeros(2, np.float32)]
    x = rng.normal(size=(50, 4)).astype(np.float32)
    s = calibrate(params, x)
    assert s[0] == pytest.approx(np.abs(x).max() / 127)
    assert s[1] == pytest.approx(np.abs(np.maximum(x @ params[0], 0)).max() / 127)
    np.testing.assert_array_equal(quantize_activation(np.array([-1e9, 0.0, 1e9], np.float32), 1.0),
                                  np.array([-127, 0, 127], np.int8))


def _random_mlp(seed=2, widths=(32, 64, 64, 10)):
    rng = np.random.default_rng(seed)
    params = []
    for a, b in pairwise(widths):
        params += [(rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32), rng.normal(size=b).astype(np.float32) * 0.1]
    return params, rng.normal(size=(200, widths[0])).astype(np.float32)


def test_int8_mlp_tracks_float_and_c_matches_numpy(tmp_path):
    params, x = _random_mlp()
    q = QuantizedMLP.from_float(params, x[:100])
    want, got = float_mlp(params, x[100:]), q(x[100:])
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    assert (got.argmax(1) == want.argmax(1)).mean() > 0.9
    assert q.weight_bytes() < 0.3 * sum(p.nbytes for p in params)
    f = compile_int8(q, cache_dir=tmp_path)
    np.testing.assert_array_equal(f(x[100:]), got)  # the same arithmetic, rounding for rounding
    with pytest.raises(ValueError, match=r"shape \(n, 32\)"):
        f(x[:, :31])
    with pytest.raises(ValueError, match="float32"):
        f(x.astype(np.float64))


def test_packed_layout_and_column_offsets():
    """``packed[p, g, l, t]`` is weight (GROUP·g + t, LANES·p + l), zero in the padding; the
    offsets are 128 × each column's sum, so that Σ (q_x + 128)·w − offset = Σ q_x·w."""
    rng = np.random.default_rng(5)
    q = rng.integers(-127, 128, size=(10, 19)).astype(np.int8)
    packed, offsets = pack_int8(q)
    assert packed.shape == (2, 3, LANES, GROUP) and offsets.shape == (32,)
    for p, g, lane, t in np.ndindex(*packed.shape):
        k, j = GROUP * g + t, LANES * p + lane
        assert packed[p, g, lane, t] == (q[k, j] if k < 10 and j < 19 else 0)
    np.testing.assert_array_equal(offsets[:19], 128 * q.astype(np.int64).sum(axis=0))
    assert not offsets[19:].any()
    qx = rng.integers(-127, 128, size=10)
    u = np.concatenate([qx + 128, np.full(2, 128)])  # padded inputs are q_x = 0
    sums = np.einsum("pglt,gt->pl", packed.astype(np.int64), u.reshape(3, GROUP)).ravel() - offsets
    np.testing.assert_array_equal(sums[:19], qx @ q.astype(np.int64))


@pytest.mark.parametrize("widths", [(30, 64, 50, 10), (3, 5, 1)])
def test_vnni_and_portable_kernels_equal_the_numpy_reference_bit_for_bit(tmp_path, widths):
    """Odd sizes exercise the padding; inputs 3× the calibration range exercise saturation."""
    params, x = _random_mlp(seed=6, widths=widths)
    q = QuantizedMLP.from_float(params, x[:100])
    want = q(3 * x)
    fast, portable = compile_int8(q, cache_dir=tmp_path), compile_int8(q, cache_dir=tmp_path, simd=False)
    assert not portable.uses_vnni
    vnni = host_has_avx512() and " avx512_vnni" in Path("/proc/cpuinfo").read_text()
    assert fast.uses_vnni == vnni
    for f in (fast, portable):
        np.testing.assert_array_equal(f(3 * x), want)
        np.testing.assert_array_equal(f(3 * x[:1]), want[:1])
        assert f(x[:0]).shape == (0, widths[-1])
        strided = np.asfortranarray(3 * x)  # not C-contiguous: the Python path copies it
        np.testing.assert_array_equal(f(strided), want)


def test_the_entry_point_returns_fresh_arrays(tmp_path):
    params, x = _random_mlp(seed=7)
    f = compile_int8(QuantizedMLP.from_float(params, x[:100]), cache_dir=tmp_path)
    a = f(x[:2])
    b = f(x[2:4])
    assert not np.shares_memory(a, b) and not np.array_equal(a, b)


def test_a_layer_too_wide_for_int32_sums_is_refused():
    q = QuantizedMLP([np.zeros((70_000, 2), np.int8)], [np.ones(2, np.float32)], [np.zeros(2, np.float32)], [1.0])
    with pytest.raises(ValueError, match="70000 inputs could overflow"):
        int8_c_source(q)


def test_without_python_headers_the_call_goes_through_ctypes(tmp_path, monkeypatch):
    from reference_impl.compiler import c_entry

    monkeypatch.setattr(c_entry, "python_include_dir", lambda: None)
    params, x = _random_mlp(seed=8)
    q = QuantizedMLP.from_float(params, x[:100])
    f = compile_int8(q, cache_dir=tmp_path)
    assert f.entry is None
    np.testing.assert_array_equal(f(x), q(x))
    with pytest.raises(ValueError, match=r"shape \(n, 32\)"):
        f(x[:, :30])
