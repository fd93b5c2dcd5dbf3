"""Megatron-LM tensor parallelism of the MLP block (reference_impl/parallel/tensor_parallel.py).

* the single-rank reference is the transformer's own MLP: its output is block_forward's
  output minus the same block's with the MLP zeroed, its gradients block_backward's;
* on 1, 2 and 4 thread ranks (4C = 32), the parallel block's output, input gradient and
  gathered parameter gradients equal the single-rank ones to 1e-6 (float64; in fact ~1e-15);
* each rank sends exactly one ring allreduce of B T C values forward and one backward:
  2 (p-1)/p x B T C x itemsize bytes, 2 (p-1) messages each;
* the same under ``mpiexec -n 2`` (tests/mpi_programs/tensor_parallel_mlp.py).
"""
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import CountingCommunicator, run_threads
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.parallel import tensor_parallel as tp
from reference_impl.parallel import transformer as tf

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "mpi_programs" / "tensor_parallel_mlp.py"
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


def test_parallel_mlp_equals_single_rank_on_two_mpi_processes():
    run = subprocess.run(mpiexec_command(2, str(PROGRAM)), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    m = re.search(r"TP ranks=2 maxdiff=(\S+) bytes_fwd=(\d+) bytes_bwd=(\d+) expected=(\d+)", run.stdout)
    assert m, run.stdout + run.stderr
    assert float(m[1]) < 1e-6
    assert int(m[2]) == int(m[3]) == int(m[4]) == tp.mlp_comm_bytes(B, T, C, 2, 8)["forward"]
