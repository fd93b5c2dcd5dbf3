"""The whole tensor-parallel GPT (tensor_parallel_model.py) and sequence parallelism (sequence_parallel.py).

* the three sequence operators equal NumPy's split / sum-then-split / concatenate along T on
  1, 2, 4 thread ranks, and each conjugate pair's backward is its forward's adjoint
  (sum over ranks of <fwd(x), y> = <x, bwd(y)>, a replicated input's gradient counted once),
  which is what makes it a correct backward;
* the whole model's loss and every gathered gradient equal ``transformer.loss_and_grads`` to
  1e-6 (float64; in fact ~1e-16) on 1, 2, 4 thread ranks, with tensor parallelism alone, with
  sequence parallelism, and with sequence parallelism keeping the gathered inputs; TP+SP
  therefore equals TP;
* with sequence parallelism each rank's LayerNorm / c_proj-bias gradients are partial sums
  over its tokens (they differ between ranks and add up to the single-rank gradient):
  ``finalize_model_grads`` is needed, and ``unshard_model`` refuses ranks that disagree;
* bytes each rank sends per layer, counted by ``CountingCommunicator``, equal
  ``layer_comm_bytes``: TP two allreduces of B T C values each way; SP the same bytes forward
  (all-gather + reduce-scatter = ring allreduce) and, with Megatron's re-gather of the linears'
  inputs, two more all-gathers backward; keeping the gathered inputs makes SP's bytes TP's
  exactly. The whole step's bytes are the sum of the layers, the embedding, the head and the
  gradient allreduce;
* activation memory kept per layer, the sum of the cached arrays' bytes and a ``tracemalloc``
  measurement, equals ``activation_bytes`` for TP = 1, 2, 4, SP on/off; at TP = 1 it is the
  transformer's own block cache (``memory.block_cache_elements``); SP divides the replicated
  part by t; the difference to the paper's formula is exactly its dropout terms;
* a sequence length or head count that the group size does not divide is refused, naming both;
* the same equalities and byte counts under ``mpiexec -n 2`` and ``-n 4``
  (tests/mpi_programs/sequence_parallel.py).
"""
import re
import subprocess
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import CountingCommunicator, run_threads
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.parallel import memory
from reference_impl.parallel import sequence_parallel as sp
from reference_impl.parallel import tensor_parallel_model as tpm
from reference_impl.parallel import transformer as tf
from reference_impl.parallel import vocab_parallel as vp

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "mpi_programs" / "sequence_parallel.py"
pytestmark = pytest.mark.timeout(120)

CFG = tf.GPTConfig(vocab_size=37, block_size=8, n_layer=2, n_head=4, n_embd=16)  # V = 37: padded on 2, 4 ranks
B, T = 2, 8
MODES = {"tp": (False, False), "tp+sp": (True, False), "tp+sp-keep": (True, True)}


def model(dtype=np.float64):
    rng = np.random.default_rng(5)
    params = tf.init_params(CFG, seed=2, dtype=dtype)
    for name in params:  # non-zero biases, LayerNorm away from (1, 0): a bias added twice would show
        if "bias" in name or "ln" in name:
            params[name] = (params[name] + 0.1 * rng.standard_normal(params[name].shape)).astype(dtype)
    tokens = rng.integers(0, CFG.vocab_size, (B, T))
    targets = rng.integers(0, CFG.vocab_size, (B, T))
    return params, tokens, targets


def max_diff(a, b):
    assert sorted(a) == sorted(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


# ------------------------------------------------------------------ the operators
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_sequence_operators_are_numpy_split_sum_concat_and_adjoint(ranks):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((B, T, 3)) for _ in range(ranks)]  # one full array per rank
    ys = [rng.standard_normal((B, T // ranks, 3)) for _ in range(ranks)]  # one shard per rank
    n = T // ranks

    def fn(comm):
        r = comm.rank
        out = {"split": sp.split_sequence(comm, xs[r]), "gather": sp.all_gather_sequence(comm, ys[r]),
               "rs": sp.reduce_scatter_sequence(comm, xs[r])}
        # <fwd(x), y> summed over ranks equals <x, bwd(y)> summed over ranks, for each pair
        pairs = {}
        for name, op, x_in, y_in in [
                ("scatter", sp.scatter_to_sequence_parallel_region, xs[0], ys[r]),  # input replicated
                ("g", sp.gather_from_sequence_parallel_region, ys[r], xs[r]),
                ("g-bar", sp.reduce_scatter_to_sequence_parallel_region, xs[r], ys[r])]:
            pairs[name] = (float(np.sum(op.forward(comm, x_in) * y_in)), float(np.sum(x_in * op.backward(comm, y_in))))
        out["pairs"] = pairs
        return out

    res = run_threads(ranks, fn)
    total = sum(xs)
    for r, out in enumerate(res):
        np.testing.assert_array_equal(out["split"], xs[r][:, r * n:(r + 1) * n])
        np.testing.assert_array_equal(out["gather"], np.concatenate(ys, axis=1))
        np.testing.assert_allclose(out["rs"], total[:, r * n:(r + 1) * n], rtol=1e-12, atol=1e-12)
    for name in ("scatter", "g", "g-bar"):
        lhs = sum(out["pairs"][name][0] for out in res)
        # a replicated input's gradient is replicated (each rank holds all of it): count it once
        rhs = res[0]["pairs"][name][1] if name == "scatter" else sum(out["pairs"][name][1] for out in res)
        assert lhs == pytest.approx(rhs, rel=1e-12), name


# ------------------------------------------------------------------ the whole model equals the single rank
@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("mode", list(MODES))
def test_whole_model_equals_single_rank(ranks, mode):
    params, tokens, targets = model()
    ref_loss, ref_grads = tf.loss_and_grads(params, tokens, targets, CFG)
    sequence_parallel, keep = MODES[mode]

    def fn(comm):
        shards = tpm.shard_model(params, CFG, comm.rank, comm.size)
        return tpm.loss_and_grads(comm, shards, tokens, targets, CFG, sequence_parallel, keep)

    res = run_threads(ranks, fn)
    assert all(abs(loss - ref_loss) < 1e-12 for loss, _ in res)
    full = tpm.unshard_model([g for _, g in res], CFG)
    assert max_diff(full, ref_grads) < 1e-6
    if mode == "tp" and ranks == 1:  # the sharding itself round-trips
        assert max_diff(tpm.unshard_model([tpm.shard_model(params, CFG, 0, 1)], CFG), params) == 0


def test_sequence_parallel_layernorm_gradients_are_partial_until_finalized():
    params, tokens, targets = model()
    _, ref_grads = tf.loss_and_grads(params, tokens, targets, CFG)

    def fn(comm):
        shards = tpm.shard_model(params, CFG, comm.rank, comm.size)
        x, _ = tpm.embed_forward(comm, shards, tokens, CFG, sequence_parallel=True)
        layers = [tpm.ParallelTransformerLayer(comm, shards, i, CFG, sequence_parallel=True) for i in range(2)]
        for layer in layers:
            x = layer.forward(x)
        _, dx, grads = tpm.head_forward_backward(comm, shards, x, targets, CFG, sequence_parallel=True)
        for layer in reversed(layers):
            dx, g = layer.backward(dx)
            grads.update(g)
        partial = {k: v.copy() for k, v in grads.items() if tpm.is_sequence_parallel_param(k)}
        tpm.finalize_model_grads(comm, grads, sequence_parallel=True)
        return partial, {k: grads[k] for k in partial}

    res = run_threads(2, fn)
    names = sorted(res[0][0])
    assert "h.0.ln_1.weight" in names and "h.1.mlp.c_proj.bias" in names and "ln_f.bias" in names
    for name in names:
        a, b = res[0][0][name], res[1][0][name]
        assert np.abs(a - b).max() > 1e-6, f"{name}: the ranks' partial gradients should differ"
        np.testing.assert_allclose(a + b, ref_grads[name], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(res[0][1][name], ref_grads[name], rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="ln_1.weight differs between rank 0 and rank 1"):
        shards = [tpm.shard_model(params, CFG, r, 2) for r in range(2)]
        for r in range(2):
            shards[r]["h.0.ln_1.weight"] = res[r][0]["h.0.ln_1.weight"]
        tpm.unshard_model(shards, CFG)


# ------------------------------------------------------------------ bytes
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("mode", list(MODES))
def test_bytes_per_layer_and_per_step_equal_the_closed_form(ranks, mode):
    params, tokens, targets = model()
    sequence_parallel, keep = MODES[mode]
    rng = np.random.default_rng(1)
    x, dout = rng.standard_normal((B, T, CFG.n_embd)), rng.standard_normal((B, T, CFG.n_embd))

    def fn(comm):
        shards = tpm.shard_model(params, CFG, comm.rank, comm.size)
        layer = tpm.ParallelTransformerLayer(comm, shards, 1, CFG, sequence_parallel, keep)
        x_in = sp.split_sequence(comm, x) if sequence_parallel else x
        d_in = sp.split_sequence(comm, dout) if sequence_parallel else dout
        start = comm.bytes_sent
        layer.forward(x_in)
        fwd = comm.bytes_sent - start
        layer.backward(d_in)
        bwd = comm.bytes_sent - start - fwd
        start = comm.bytes_sent
        tpm.loss_and_grads(comm, shards, tokens, targets, CFG, sequence_parallel, keep)
        return fwd, bwd, comm.bytes_sent - start

    res = run_threads(ranks, fn, wrap=CountingCommunicator)
    expected = tpm.layer_comm_bytes(B, T, CFG.n_embd, ranks, 8, sequence_parallel, keep)
    tp_alone = tpm.layer_comm_bytes(B, T, CFG.n_embd, ranks, 8)
    V = B * T * CFG.n_embd * 8
    assert tp_alone["forward"] == tp_alone["backward"] == 2 * 2 * (ranks - 1) * V // ranks  # two ring allreduces
    assert expected["forward"] == tp_alone["forward"]
    assert expected["backward"] == tp_alone["backward"] + (2 * (ranks - 1) * V // ranks if mode == "tp+sp" else 0)
    half = (ranks - 1) * V // ranks  # one all-gather or reduce-scatter of B T C
    embed = vp.embedding_comm_bytes(B, T, CFG.n_embd, ranks, 8)["total"] + (half if sequence_parallel else 0)
    head = vp.cross_entropy_comm_bytes(B, T, ranks, 8)["total"] + 2 * half  # f's allreduce, or g's pair
    grads = tpm.sequence_parallel_grad_bytes(CFG, ranks, 8) if sequence_parallel else 0
    step = CFG.n_layer * expected["total"] + embed + head + grads
    for fwd, bwd, total in res:
        assert (fwd, bwd) == (expected["forward"], expected["backward"])
        assert total == step


# ------------------------------------------------------------------ activation memory
def _layers_after_forward(ranks, sequence_parallel, keep, config, batch, seq, dtype=np.float32):
    params = tf.init_params(config, seed=1, dtype=dtype)
    x = np.random.default_rng(0).standard_normal((batch, seq, config.n_embd)).astype(dtype)
    shards = [tpm.shard_model(params, config, r, ranks) for r in range(ranks)]

    def fn(comm):
        layer = tpm.ParallelTransformerLayer(comm, shards[comm.rank], 0, config, sequence_parallel, keep)
        out = layer.forward(sp.split_sequence(comm, x) if sequence_parallel else x)
        return layer, out

    run_threads(ranks, fn)  # warm: the causal mask cache, lazy imports
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        res = run_threads(ranks, fn)
        kept = tracemalloc.get_traced_memory()[0] - base - sum(out.nbytes for _, out in res)
    finally:
        tracemalloc.stop()
    return [layer for layer, _ in res], kept / ranks


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_activation_bytes_measured_equal_the_closed_form(ranks):
    config, batch, seq = tf.GPTConfig(vocab_size=64, block_size=64, n_layer=1, n_head=4, n_embd=64), 4, 64
    measured = {}
    for mode, (sequence_parallel, keep) in MODES.items():
        layers, traced = _layers_after_forward(ranks, sequence_parallel, keep, config, batch, seq)
        closed = sp.activation_bytes(config, batch, seq, ranks, sequence_parallel, 4, keep)
        assert all(layer.cached_bytes() == closed["total"] for layer in layers), mode
        assert traced == pytest.approx(closed["total"], rel=0.03), mode  # thread and dict overhead only
        measured[mode] = closed
    N, C = batch * seq, config.n_embd
    if ranks == 1:  # the transformer's own block keeps exactly this much
        assert measured["tp"]["total"] == 4 * memory.block_cache_elements(config, batch, seq)
    # SP divides the replicated part by t and leaves the rest alone
    assert measured["tp"]["replicated"] == 4 * (4 * N * C + 2 * N)
    assert measured["tp+sp"]["replicated"] == measured["tp"]["replicated"] // ranks
    for key in ("parallel", "attention"):
        assert measured["tp+sp"][key] == measured["tp"][key]
    assert measured["tp+sp-keep"]["replicated"] == 4 * (2 * N * C + (2 * N * C + 2 * N) // ranks)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_closed_form_differs_from_the_papers_by_its_dropout_terms(t, sequence_parallel):
    config, b, s = tf.GPTConfig(vocab_size=64, block_size=128, n_layer=1, n_head=8, n_embd=64), 2, 128
    h, a = config.n_embd, config.n_head
    ours = sp.activation_bytes(config, b, s, t, sequence_parallel, itemsize=2)["total"]  # fp16, as the paper
    paper = sp.paper_activation_bytes(s, b, h, a, t, sequence_parallel)
    div = t if sequence_parallel else 1
    # paper - ours = 2 dropout masks (s b h bytes each) + attention dropout mask and output (3 a s^2 b)
    #                - our two rstd per token (2 x 2 bytes)
    assert paper - ours == pytest.approx(2 * s * b * h / div + 3 * a * s * s * b / t - 4 * s * b / div)


# ------------------------------------------------------------------ bad input
def test_bad_splits_are_refused_naming_both_numbers():
    params, tokens, targets = model()
    with pytest.raises(ValueError, match=r"n_head = 4 divisible by 3"):
        tpm.shard_model(params, CFG, 0, 3)

    def odd_sequence(comm):
        shards = tpm.shard_model(params, CFG, comm.rank, comm.size)
        tpm.loss_and_grads(comm, shards, tokens[:, :6], targets[:, :6], CFG, sequence_parallel=True)

    with pytest.raises(ValueError, match=r"rank \d: embed_forward: .*T = 6 divisible by 4"):
        run_threads(4, odd_sequence)
    with pytest.raises(ValueError, match=r"T = 6 divisible by 4"):
        sp.activation_bytes(CFG, B, 6, 4, sp=True)
    with pytest.raises(ValueError, match=r"n_head = 4 divisible by 3"):
        sp.activation_bytes(CFG, B, T, 3, sp=False)


# ------------------------------------------------------------------ real processes
@pytest.mark.parametrize("ranks", [2, 4])
def test_tp_and_sp_equal_single_rank_on_mpi_processes(ranks):
    run = subprocess.run(mpiexec_command(ranks, str(PROGRAM)), capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = re.findall(r"SP mode=(\S+) ranks=(\d+) maxdiff=(\S+) layer_fwd=(\d+) layer_bwd=(\d+) "
                       r"expected_fwd=(\d+) expected_bwd=(\d+)", run.stdout)
    assert [m[0] for m in lines] == list(MODES), run.stdout
    by_mode = {}
    for mode, n, diff, fwd, bwd, efwd, ebwd in lines:
        assert int(n) == ranks and float(diff) < 1e-6
        assert (fwd, bwd) == (efwd, ebwd)
        by_mode[mode] = (int(fwd), int(bwd))
    assert by_mode["tp+sp-keep"] == by_mode["tp"]
    assert by_mode["tp+sp"][0] == by_mode["tp"][0] and by_mode["tp+sp"][1] > by_mode["tp"][1]
