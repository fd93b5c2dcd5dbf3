"""bf16/float16 mixed precision and fp8 with delayed scaling (reference_impl/parallel/low_precision.py, fp8.py)."""
import math

import ml_dtypes
import numpy as np
import pytest

from reference_impl.parallel import fp8, low_precision as lp, memory, transformer as tf


def _bf16_by_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (as float32) by round-to-nearest-even on the bit pattern, independently of ml_dtypes."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def test_dtypes_are_real_ml_dtypes():
    assert lp.BF16 == np.dtype(ml_dtypes.bfloat16) and lp.BF16.itemsize == 2
    assert fp8.E4M3 == np.dtype(ml_dtypes.float8_e4m3fn) and fp8.E5M2 == np.dtype(ml_dtypes.float8_e5m2)
    assert fp8.E4M3.itemsize == fp8.E5M2.itemsize == 1
    params = lp.compute_copy(tf.init_params(lp.SMALL), lp.BF16)
    w = params["h.0.mlp.c_fc.weight"]
    assert isinstance(w, lp.LowPrecisionArray) and w.dtype == lp.BF16 and w.nbytes == 2 * w.size


def test_bf16_rounding_matches_bit_manipulation():
    known = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 256.5, 257.0, 259.0, 3.14159265, -2.5e-3], np.float32)
    got = known.astype(lp.BF16).astype(np.float32)
    np.testing.assert_array_equal(got, _bf16_by_bits(known))
    # halfway cases round to even: 1 + 2^-8 -> 1; 257 (between 256 and 258) -> 256; 259 -> 260
    assert got[0] == 1.0 and got[1] == 1 + 2.0 ** -6 and got[2] == 256.0 and got[3] == 256.0 and got[4] == 260.0
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100_000) * np.exp(rng.uniform(-30, 30, 100_000))).astype(np.float32)
    np.testing.assert_array_equal(x.astype(lp.BF16).astype(np.float32), _bf16_by_bits(x))
    # LowPrecisionArray rounds every result the same way, after computing in float32
    a, b = lp.as_low(x[:1000], lp.BF16), lp.as_low(x[1000:2000], lp.BF16)
    exact = np.asarray(a, np.float32) * np.asarray(b, np.float32)
    np.testing.assert_array_equal(np.asarray(a * b, np.float32), _bf16_by_bits(exact))


def test_low_precision_array_accumulates_in_float32():
    ones = np.ones(10_000, lp.BF16)
    assert float(ones.sum()) == 256.0  # ml_dtypes alone: a bfloat16 accumulator stops growing at 256
    # float32 accumulation, one rounding of the total: 10000 -> 9984 (bf16's spacing is 64 there)
    assert float(lp.as_low(ones, lp.BF16).sum()) == float(_bf16_by_bits(np.float32(10_000))) == 9984.0
    a = lp.as_low(np.full((4, 300), 0.1, np.float32), lp.BF16)
    y = a @ a.T
    assert isinstance(y, lp.LowPrecisionArray) and y.dtype == lp.BF16
    assert float(y[0, 0]) == float(_bf16_by_bits(np.float32(300 * float(a[0, 0]) ** 2)))
    assert float(np.einsum("ij,ij->", a, a)) == pytest.approx(1200 * float(a[0, 0]) ** 2, rel=2 ** -8)


def test_fp8_max_values_and_ml_dtypes_overflow():
    assert float(ml_dtypes.finfo(fp8.E4M3).max) == fp8.FP8_MAX[fp8.E4M3] == 448.0
    assert float(ml_dtypes.finfo(fp8.E5M2).max) == fp8.FP8_MAX[fp8.E5M2] == 57344.0
    # ml_dtypes does not saturate: E4M3FN has no inf and gives NaN, E5M2 gives inf; quantize clips instead
    assert np.isnan(np.float32(500).astype(fp8.E4M3).astype(np.float32))
    assert np.isinf(np.float32(1e6).astype(fp8.E5M2).astype(np.float32))
    q, stats = fp8.quantize(np.array([500.0, -1e6, 1.0], np.float32), 1.0, fp8.E4M3)
    np.testing.assert_array_equal(q.dequantize(), [448.0, -448.0, 1.0])
    assert stats["overflow"] == 2


def test_delayed_scaling_scale_from_amax_history():
    recipe = fp8.DelayedScaling(amax_history_len=4)
    state = fp8.TensorScaling(fp8.E4M3, recipe)
    assert state.scale == 1.0  # scales start at 1
    scales = []
    for amax in (2.0, 8.0, 1.0, 1.0, 1.0, 1.0):
        state.record(amax)
        state.update()
        scales.append(state.scale)
    # "max" over the window: 8 stays for amax_history_len updates, then drops out
    np.testing.assert_allclose(scales, [448 / 2, 448 / 8, 448 / 8, 448 / 8, 448 / 8, 448 / 1], rtol=1e-6)
    state.update()  # amax 0 this step: the history still holds 1s
    state = fp8.TensorScaling(fp8.E5M2, fp8.DelayedScaling(amax_history_len=4, margin=2, amax_compute_algo="most_recent"))
    for amax in (2.0, 8.0, 1.0):
        state.record(amax)
        state.update()
    assert state.scale == pytest.approx(57344 / 1.0 / 2 ** 2)
    state.update()  # most recent amax is 0: the scale is kept
    assert state.scale == pytest.approx(57344 / 4)
    assert fp8.compute_scale(np.array([3.0, 7.0, 5.0]), fp8.E4M3, margin=1) == pytest.approx(448 / 7 / 2)


def test_fp8_matmul_error_bounded():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = (rng.standard_normal((96, 256)) * 0.02).astype(np.float32)
    sx, sw = 448 / np.abs(x).max(), 448 / np.abs(w).max()
    qx, _ = fp8.quantize(x, sx, fp8.E4M3)
    qw, _ = fp8.quantize(w, sw, fp8.E4M3)
    y8, y = fp8.fp8_matmul(qx, fp8.Quantized(qw.codes.T, qw.scale)), x @ w.T
    u = 2.0 ** -4  # E4M3's unit roundoff (3 mantissa bits)
    dx, dw = 2.0 ** -10 / sx, 2.0 ** -10 / sw  # half the subnormal spacing 2^-9, unscaled
    ax, aw = np.abs(x), np.abs(w)
    ex, ew = u * ax + dx, u * aw + dw  # per-element quantisation error bounds
    bound = ax @ ew.T + ex @ aw.T + ex @ ew.T + 1e-5 * (ax @ aw.T)
    assert np.all(np.abs(y8 - y) <= bound)
    assert np.linalg.norm(y8 - y) / np.linalg.norm(y) < 0.05


def test_fp8_overflow_with_scaling_disabled_is_reported():
    ctx = fp8.FP8Context(fp8.DelayedScaling(enabled=False))
    assert ctx.overflow == "raise"
    x = np.ones((2, 3, 4), np.float32)
    x[0, 1, 2] = 1000.0
    with pytest.raises(fp8.FP8OverflowError, match="'blk.input'"):
        ctx.linear("blk", x, np.ones((5, 4), np.float32))
    ctx = fp8.FP8Context(fp8.DelayedScaling(enabled=False), overflow="saturate")
    y = ctx.linear("blk", x, np.ones((5, 4), np.float32))
    assert ctx.report()["overflows"] == {"blk.input": 1} and np.isfinite(y).all()
    np.testing.assert_array_equal(y[0, 1], 3 + 448.0)
    # inside the transformer: weights too large for E4M3 without scaling, the step stops and names the tensor
    params = tf.init_params(lp.SMALL)
    params["h.1.mlp.c_fc.weight"] *= 3e4
    tokens = np.zeros((1, 8), np.int64)
    opt = lp.Adam()
    with pytest.raises(fp8.FP8OverflowError, match="h.1.mlp.c_fc.weight"):
        lp.train_step(params, opt, tokens, tokens, lp.SMALL, "fp32", fp8=fp8.FP8Context(fp8.DelayedScaling(enabled=False)))
    assert np.isfinite(params["h.1.mlp.c_fc.weight"]).all() and opt.t == 0  # nothing was updated


def test_fp16_underflows_where_bf16_does_not():
    r = lp.gradient_underflow(lp.SMALL, batch=8, seq=64)
    bf16, fp16, scaled = r["bf16"], r["fp16"], r["fp16 x 32768"]
    assert bf16["backward"]["underflow"] == 0.0 and bf16["backward"]["subnormal"] == 0.0
    assert fp16["backward"]["underflow"] > 1e-3 and fp16["backward"]["subnormal"] > 0.1
    assert scaled["backward"]["underflow"] < fp16["backward"]["underflow"] / 5
    assert fp16["param_grad_zeroed"] > 0 and scaled["param_grad_zeroed"] == 0.0
    # and the price of bf16's range: 8 significant bits, a larger error than float16's 11
    assert bf16["param_grad_rel_error"] > 3 * fp16["param_grad_rel_error"]


def test_loss_scaled_backward():
    cfg = tf.GPTConfig(vocab_size=96, block_size=16, n_layer=2, n_head=2, n_embd=16)
    params = tf.init_params(cfg, dtype=np.float64)
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 96, (2, 16)), rng.integers(0, 96, (2, 16))
    ref = tf.loss_and_grads(params, tokens, targets, cfg)[1]
    same, _ = lp.backward(params, tf.forward(params, tokens, targets, cfg)[1], cfg)
    scaled, _ = lp.backward(params, tf.forward(params, tokens, targets, cfg)[1], cfg, loss_scale=1024.0)
    for k in ref:
        np.testing.assert_array_equal(same[k], ref[k])
        np.testing.assert_allclose(scaled[k] / 1024.0, ref[k], rtol=1e-9, atol=1e-15)


def test_dynamic_loss_scaler_skips_overflowing_steps():
    r = lp.train("fp16", 3, batch=2, seq=16, initial_scale=2.0 ** 40, eval_every=3)
    assert r["skipped"] == [1, 2, 3] and r["scales"] == [2.0 ** 40, 2.0 ** 39, 2.0 ** 38]
    assert r["eval"][-1][1] == r["eval"][0][1]  # no update reached the master weights


def test_short_bf16_run_tracks_fp32():
    """40 steps from the same initialisation on the same batches: the float32 evaluation loss of the
    bf16 run's master weights stays within 0.05 nats of the float32 run's at every evaluation."""
    fp32 = lp.train("fp32", 40, eval_every=10)
    bf16 = lp.train("bf16", 40, eval_every=10)
    gaps = [abs(a - b) for (_, a), (_, b) in zip(fp32["eval"], bf16["eval"])]
    assert fp32["eval"][-1][1] < fp32["eval"][0][1] - 0.5  # it learns
    assert max(gaps) < 0.05, gaps
    assert not bf16["skipped"]


def test_fp8_training_flag_runs_every_linear_in_fp8():
    ctx = fp8.FP8Context()
    r = lp.train("fp32", 3, batch=4, seq=32, eval_every=3, fp8=ctx)
    linears = [f"h.{i}.{n}" for i in range(2) for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    assert set(r["fp8_scales"]) == {f"{l}.{t}" for l in linears for t in ("input", "weight", "grad_output")}
    assert all(ctx.states[f"{l}.grad_output"].dtype == fp8.E5M2 and ctx.states[f"{l}.input"].dtype == fp8.E4M3
               for l in linears)
    assert all(s != 1.0 for s in r["fp8_scales"].values())  # delayed scaling moved every scale
    assert np.isfinite(r["losses"]).all() and r["eval"][-1][1] < r["eval"][0][1]


def test_format_bytes_match_memory_accounting():
    cfg = lp.SMALL
    for prec in ("fp32", "bf16", "fp16"):
        b, m = lp.format_bytes(cfg, prec), memory.memory_breakdown(cfg, "adam", prec)
        assert (b["parameters"], b["gradients"], b["optimizer_state"]) == (m.parameters, m.gradients, m.optimizer_state)
    fp8b, bf16b = lp.format_bytes(cfg, "fp8"), lp.format_bytes(cfg, "bf16")
    assert fp8b["parameters"] - bf16b["parameters"] == lp.linear_weight_elements(cfg)  # the 1-byte weight cache
    assert lp.format_bytes(cfg, "bf16")["allreduce_bytes_per_rank"] * 2 == lp.format_bytes(cfg, "fp32")["allreduce_bytes_per_rank"]
    assert math.isclose(lp.range_fractions(np.array([1e-9, 1.0], np.float32), lp.FP16)["underflow"], 0.5)
