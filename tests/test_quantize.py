"""Post-training int8 quantisation: per-channel weights, calibration, the NumPy and C int8 MLPs."""
from __future__ import annotations

import numpy as np
import pytest

from reference_impl.quantize import (QuantizedMLP, calibrate, compile_int8, float_mlp, quantize_activation,
                                     quantize_per_channel)

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
    for a, b in zip(widths[:-1], widths[1:]):
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
    np.testing.assert_allclose(f(x[100:]), got, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"shape \(n, 32\)"):
        f(x[:, :31])
    with pytest.raises(ValueError, match="float32"):
        f(x.astype(np.float64))
