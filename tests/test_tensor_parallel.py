"""Megatron-LM tensor parallelism of the MLP block (reference_impl/parallel/tensor_parallel.py).

* the single-rank reference is the transformer's own MLP: its output is block_forward's
  output minus the same block's with the MLP zeroed, its gradients block_backward's;
* on 1, 2 and 4 thread ranks (4C = 32), the parallel block's output, input gradient and
  gathered parameter gradients equal the single-rank ones to 1e-6 (float64; in fact ~1e-15);
* each rank sends exactly one ring allreduce of B T C values forward and one backward:
  2 (p-1)/p x B T C x itemsize bytes, 2 (p-1) messages each;
* the same under ``mpiexec -n 2`` (tests/mpi_programs/tensor_parallel.py);
* attention with its heads split over the ranks (tensor_parallel_attention.py; n_head = 4):
  the reference is the block's own attention (output, parameter gradients, and the input
  gradient through ln_1), the parallel sublayer equals it on 1, 2, 4 thread ranks and under
  ``mpiexec -n 2`` (tests/mpi_programs/tensor_parallel.py), at the MLP's cost of one
  allreduce of B T C values each way; a rank count that does not divide n_head is refused.
"""
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import CountingCommunicator, run_threads
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.parallel import tensor_parallel as tp
from reference_impl.parallel import tensor_parallel_attention as tpa
from reference_impl.parallel import transformer as tf

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "mpi_programs" / "tensor_parallel.py"
pytestmark = pytest.mark.timeout(60)

CFG = tf.GPTConfig(vocab_size=96, block_size=4, n_layer=2, n_head=2, n_embd=8)
B, T, C, LAYER = 2, 4, 8, 1  # B T C = 64: divisible by 1, 2 and 4


def inputs(dtype=np.float64, activation="gelu_tanh"):
    cfg = tf.GPTConfig(**{**CFG.__dict__, "activation": activation})
    params = tf.init_params(cfg, seed=3, dtype=dtype)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((B, T, C)).astype(dtype)
    dout = rng.standard_normal((B, T, C)).astype(dtype)
    return cfg, params, x, dout


def max_diff(a, b):
    assert sorted(a) == sorted(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_reference_is_the_transformers_own_mlp(activation):
    cfg, params, x, dout = inputs(activation=activation)
    out, cache = tf.block_forward(params, LAYER, x, cfg)
    a2 = cache["a2"].copy()
    no_mlp = dict(params)
    pre = f"h.{LAYER}.mlp."
    no_mlp[pre + "c_proj.weight"] = np.zeros_like(params[pre + "c_proj.weight"])
    no_mlp[pre + "c_proj.bias"] = np.zeros_like(params[pre + "c_proj.bias"])
    residual, _ = tf.block_forward(no_mlp, LAYER, x, cfg)
    _, block_grads = tf.block_backward(params, LAYER, dout, cache, cfg)
    ref_out, _, ref_grads = tp.reference_mlp(params, LAYER, a2, dout, activation)
    assert np.abs(ref_out - (out - residual)).max() < 1e-12
    assert max_diff(ref_grads, {k: block_grads[k] for k in ref_grads}) < 1e-12


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_parallel_mlp_equals_single_rank(ranks, activation):
    cfg, params, x, dout = inputs(activation=activation)
    ref_out, ref_dx, ref_grads = tp.reference_mlp(params, LAYER, x, dout, activation)

    def body(comm):
        shards = tp.shard_mlp(params, LAYER, comm.rank, comm.size)
        out, mlp = tp.parallel_mlp_forward(comm, shards, LAYER, x, activation)
        dx, grads = tp.parallel_mlp_backward(mlp, dout)
        return out, dx, grads

    results = run_threads(ranks, body, timeout=30)
    for out, dx, _ in results:  # every rank ends with the full output and input gradient
        assert out.shape == (B, T, C) and np.abs(out - ref_out).max() < 1e-6
        assert np.abs(dx - ref_dx).max() < 1e-6
    grads = tp.unshard_mlp([g for _, _, g in results], LAYER)
    assert max_diff(grads, ref_grads) < 1e-6
    for r, (_, _, g) in enumerate(results):  # each rank's shard gradient is complete by itself
        assert max_diff(g, tp.shard_mlp(ref_grads, LAYER, r, ranks)) < 1e-6


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_one_allreduce_of_BTC_values_each_way(ranks, dtype):
    _, params, x, dout = inputs(dtype)
    size = np.dtype(dtype).itemsize

    def body(comm):
        mlp = tp.ParallelMLP(comm, tp.shard_mlp(params, LAYER, comm.rank, comm.size), LAYER)
        mlp.forward(x)
        fwd = (comm.bytes_sent, comm.messages_sent)
        mlp.backward(dout)
        return fwd, (comm.bytes_sent - fwd[0], comm.messages_sent - fwd[1])

    expected = tp.mlp_comm_bytes(B, T, C, ranks, size)
    assert expected["forward"] == expected["backward"] == 2 * (ranks - 1) * B * T * C * size // ranks
    for fwd, bwd in run_threads(ranks, body, timeout=30, wrap=CountingCommunicator):
        assert fwd == (expected["forward"], 2 * (ranks - 1))
        assert bwd == (expected["backward"], 2 * (ranks - 1))


def test_shards_put_back_together_and_bad_splits_are_refused():
    _, params, _, _ = inputs()
    shards = [tp.shard_mlp(params, 0, r, 4) for r in range(4)]
    assert shards[1]["h.0.mlp.c_fc.weight"].shape == (8, C)
    assert shards[1]["h.0.mlp.c_proj.weight"].shape == (C, 8)
    whole = tp.unshard_mlp(shards, 0)
    assert all(np.array_equal(whole[k], params[k]) for k in whole)
    with pytest.raises(ValueError, match="divisible"):
        tp.shard_mlp(params, 0, 0, 3)


@pytest.fixture(scope="module")
def mpi_run():
    """The MPI program, run once for both sublayers' tests."""
    run = subprocess.run(mpiexec_command(2, str(PROGRAM)), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def _mpi_check(run, name: str) -> None:
    m = re.search(rf"TP {name} ranks=2 maxdiff=(\S+) bytes_fwd=(\d+) bytes_bwd=(\d+) expected=(\d+)", run.stdout)
    assert m, run.stdout + run.stderr
    assert float(m[1]) < 1e-6
    assert int(m[2]) == int(m[3]) == int(m[4]) == tp.mlp_comm_bytes(B, T, C, 2, 8)["forward"]


def test_parallel_mlp_equals_single_rank_on_two_mpi_processes(mpi_run):
    _mpi_check(mpi_run, "mlp")


# ------------------------------------------------------------------ attention: heads split over ranks
# (reference_impl/parallel/tensor_parallel_attention.py) n_head = 4, head_dim = 2; on 1, 2, 4 thread
# ranks the parallel attention equals the single-rank one, and costs the MLP's one allreduce each way.
ATT_CFG = tf.GPTConfig(vocab_size=96, block_size=4, n_layer=2, n_head=4, n_embd=8)


def attention_inputs(dtype=np.float64):
    params = tf.init_params(ATT_CFG, seed=3, dtype=dtype)
    rng = np.random.default_rng(11)
    for name in tpa.ATTN_NAMES:  # non-zero biases, so a bias added twice or sliced wrongly shows
        key = f"h.{LAYER}.{name}"
        if name.endswith("bias"):
            params[key] = (0.1 * rng.standard_normal(params[key].shape)).astype(dtype)
    x = rng.standard_normal((B, T, C)).astype(dtype)
    dout = rng.standard_normal((B, T, C)).astype(dtype)
    return params, x, dout


def test_reference_is_the_transformers_own_attention():
    params, x, dout = attention_inputs()
    pre = f"h.{LAYER}."
    no_mlp = dict(params)  # the MLP's output and gradient vanish: out = x + attention(ln_1(x))
    no_mlp[pre + "mlp.c_proj.weight"] = np.zeros_like(params[pre + "mlp.c_proj.weight"])
    no_mlp[pre + "mlp.c_proj.bias"] = np.zeros_like(params[pre + "mlp.c_proj.bias"])
    out, cache = tf.block_forward(no_mlp, LAYER, x, ATT_CFG)
    a1, xhat1, rstd1 = cache["a1"].copy(), cache["xhat1"].copy(), cache["rstd1"].copy()
    block_dx, block_grads = tf.block_backward(no_mlp, LAYER, dout, cache, ATT_CFG)
    ref_out, ref_dx, ref_grads = tpa.reference_attention(params, LAYER, a1, dout, ATT_CFG)
    assert np.abs(ref_out - (out - x)).max() < 1e-12
    assert max_diff(ref_grads, {k: block_grads[k] for k in ref_grads}) < 1e-12
    dx_ln, _, _ = tf._layer_norm_backward(ref_dx, xhat1, rstd1, params[pre + "ln_1.weight"])
    assert np.abs(dx_ln + dout - block_dx).max() < 1e-12  # the input gradient, through ln_1 and the residual


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_parallel_attention_equals_single_rank(ranks):
    params, x, dout = attention_inputs()
    ref_out, ref_dx, ref_grads = tpa.reference_attention(params, LAYER, x, dout, ATT_CFG)

    def body(comm):
        shards = tpa.shard_attention(params, LAYER, comm.rank, comm.size, ATT_CFG.n_head)
        attn = tpa.ParallelAttention(comm, shards, LAYER, ATT_CFG.n_head // comm.size, ATT_CFG.head_dim)
        out = attn.forward(x)
        dx, grads = attn.backward(dout)
        return out, dx, grads

    results = run_threads(ranks, body, timeout=30)
    for out, dx, _ in results:  # every rank ends with the full output and input gradient
        assert out.shape == (B, T, C) and np.abs(out - ref_out).max() < 1e-6
        assert np.abs(dx - ref_dx).max() < 1e-6
    grads = tpa.unshard_attention([g for _, _, g in results], LAYER)
    assert max_diff(grads, ref_grads) < 1e-6
    for r, (_, _, g) in enumerate(results):  # each rank's shard gradient is complete by itself
        assert max_diff(g, tpa.shard_attention(ref_grads, LAYER, r, ranks, ATT_CFG.n_head)) < 1e-6


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_attention_is_one_allreduce_of_BTC_values_each_way(ranks):
    params, x, dout = attention_inputs()

    def body(comm):
        shards = tpa.shard_attention(params, LAYER, comm.rank, comm.size, ATT_CFG.n_head)
        attn = tpa.ParallelAttention(comm, shards, LAYER, ATT_CFG.n_head // comm.size, ATT_CFG.head_dim)
        attn.forward(x)
        fwd = (comm.bytes_sent, comm.messages_sent)
        attn.backward(dout)
        return fwd, (comm.bytes_sent - fwd[0], comm.messages_sent - fwd[1])

    expected = tp.mlp_comm_bytes(B, T, C, ranks, 8)  # the same closed form as the MLP's
    for fwd, bwd in run_threads(ranks, body, timeout=30, wrap=CountingCommunicator):
        assert fwd == (expected["forward"], 2 * (ranks - 1))
        assert bwd == (expected["backward"], 2 * (ranks - 1))


def test_attention_shards_are_whole_heads_and_bad_splits_are_refused():
    params, _, _ = attention_inputs()
    pre = f"h.{LAYER}.attn."
    W = params[pre + "c_attn.weight"]
    s1 = tpa.shard_attention(params, LAYER, 1, 2, ATT_CFG.n_head)  # heads 2, 3: features 4..7 of q, k, v
    assert np.array_equal(s1[pre + "c_attn.weight"], np.concatenate([W[4:8], W[12:16], W[20:24]]))
    assert s1[pre + "c_proj.weight"].shape == (C, 4)
    shards = [tpa.shard_attention(params, LAYER, r, 4, ATT_CFG.n_head) for r in range(4)]
    whole = tpa.unshard_attention(shards, LAYER)
    assert all(np.array_equal(whole[k], params[k]) for k in whole)
    with pytest.raises(ValueError, match="n_head = 4 divisible by 3"):
        tpa.shard_attention(params, LAYER, 0, 3, ATT_CFG.n_head)
    with pytest.raises(ValueError, match="n_head"):
        tpa.shard_attention(params, LAYER, 0, 8, 8 * 2)  # 16 heads cannot split C = 8


def test_parallel_attention_equals_single_rank_on_two_mpi_processes(mpi_run):
    _mpi_check(mpi_run, "attention")
