"""Megatron-LM vocabulary-parallel embedding and cross-entropy (reference_impl/parallel/vocab_parallel.py).

* ``shard_vocab`` pads V to a multiple of p with zero rows and the shards put back together;
* on 1, 2 and 4 thread ranks (and V = 10, 9 on 4 ranks, V = 10 on 3: padded, one shard all
  padding), the loss and the gathered logits-shard gradients equal a direct NumPy
  log-softmax cross-entropy to 1e-9 (float64), and the whole tied head (``a @ wte_shard.T``,
  the loss, ``dwte_shard``) equals the transformer's own ``head_forward``/``head_backward``;
* the embedding lookup and its gathered gradient equal ``wte[tokens]`` and ``embed_backward``'s;
* bytes sent per rank: three ring allreduces of B T values for the loss, one of B T C for the
  embedding, nothing backward;
* the same under ``mpiexec -n 2`` (tests/mpi_programs/vocab_parallel.py).
"""
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import CountingCommunicator, run_threads
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.parallel import transformer as tf
from reference_impl.parallel import vocab_parallel as vp

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "mpi_programs" / "vocab_parallel.py"
pytestmark = pytest.mark.timeout(60)

CFG = tf.GPTConfig(vocab_size=96, block_size=4, n_layer=2, n_head=2, n_embd=8)
B, T, C = 2, 4, 8  # B T = 8: divisible by 1, 2 and 4
CASES = [(96, 1), (96, 2), (96, 4), (10, 4), (9, 4), (10, 3)]


def reference_ce(logits, targets):
    """Mean cross-entropy and d(logits) by a direct NumPy log-softmax."""
    z = logits.reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    logp = z - z.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    N = z.shape[0]
    d = np.exp(logp)
    d[np.arange(N), t] -= 1.0
    return float(-logp[np.arange(N), t].mean()), (d / N).reshape(logits.shape)


def data(V, seed=0):
    rng = np.random.default_rng(seed)
    logits = 3.0 * rng.standard_normal((B, T, V))
    targets = rng.integers(0, V, size=(B, T))
    targets[0, 0], targets[-1, -1] = 0, V - 1  # both ends of the vocabulary
    return logits, targets


def test_shard_vocab_pads_with_zero_rows_and_puts_back_together():
    wte = np.arange(10 * 3, dtype=np.float64).reshape(10, 3) + 1
    shards = [vp.shard_vocab(wte, r, 4) for r in range(4)]
    assert vp.padded_vocab(10, 4) == 12 and [s.shape for s in shards] == [(3, 3)] * 4
    assert [vp.vocab_range(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert np.array_equal(shards[3][1:], np.zeros((2, 3)))
    assert np.array_equal(vp.unshard_vocab(shards, 10), wte)
    with pytest.raises(ValueError):
        vp.shard_vocab(wte, 4, 4)


@pytest.mark.parametrize("V,ranks", CASES)
def test_cross_entropy_equals_single_rank(V, ranks):
    logits, targets = data(V)
    ref_loss, ref_d = reference_ce(logits, targets)
    Vp = vp.padded_vocab(V, ranks)
    padded = np.concatenate([logits, np.zeros((B, T, Vp - V))], axis=-1)  # zero rows of wte give logit 0

    def body(comm):
        start, end = vp.vocab_range(V, comm.rank, comm.size)
        loss, backward = vp.vocab_parallel_cross_entropy(comm, padded[..., start:end], targets, start, V)
        return loss, backward()

    results = run_threads(ranks, body, timeout=30)
    for loss, _ in results:
        assert abs(loss - ref_loss) < 1e-9
    d = vp.unshard_vocab([r[1] for r in results], V, axis=-1)
    assert np.abs(d - ref_d).max() < 1e-9
    for r, (_, dr) in enumerate(results):  # padded columns get no gradient
        start, end = vp.vocab_range(V, r, ranks)
        assert not np.any(dr[..., max(0, V - start):])


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_tied_head_equals_the_transformers_own(ranks):
    params = tf.init_params(CFG, seed=3, dtype=np.float64)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, T, C))
    targets = rng.integers(0, CFG.vocab_size, size=(B, T))
    ref_loss, head = tf.head_forward(params, x, targets)
    _, ref_grads = tf.head_backward(params, head)
    a, _, _ = tf._layer_norm(x, params["ln_f.weight"], params["ln_f.bias"])

    def body(comm):
        start, _ = vp.vocab_range(CFG.vocab_size, comm.rank, comm.size)
        shard = vp.shard_vocab(params["wte.weight"], comm.rank, comm.size)
        loss, backward = vp.vocab_parallel_cross_entropy(comm, a @ shard.T, targets, start, CFG.vocab_size)
        d = backward().reshape(B * T, -1)
        return loss, d.T @ a.reshape(B * T, C)

    results = run_threads(ranks, body, timeout=30)
    assert all(abs(loss - ref_loss) < 1e-9 for loss, _ in results)
    dwte = vp.unshard_vocab([r[1] for r in results], CFG.vocab_size)
    assert np.abs(dwte - ref_grads["wte.weight"]).max() < 1e-9


@pytest.mark.parametrize("V,ranks", CASES)
def test_embedding_equals_full_table(V, ranks):
    rng = np.random.default_rng(1)
    wte = rng.standard_normal((V, C))
    tokens = rng.integers(0, V, size=(B, T))
    tokens[0, 0], tokens[0, 1], tokens[1, 0] = V - 1, 0, 0  # a repeated id: gradients add
    dout = rng.standard_normal((B, T, C))
    params = {"wte.weight": wte, "wpe.weight": np.zeros((T, C))}
    ref_dwte = tf.embed_backward(params, tokens, dout)["wte.weight"]

    def body(comm):
        start, _ = vp.vocab_range(V, comm.rank, comm.size)
        emb = vp.VocabParallelEmbedding(comm, vp.shard_vocab(wte, comm.rank, comm.size), start)
        return emb.forward(tokens), emb.backward(dout)["weight"]

    results = run_threads(ranks, body, timeout=30)
    for out, _ in results:
        assert np.abs(out - wte[tokens]).max() < 1e-12
    dwte = vp.unshard_vocab([r[1] for r in results], V)
    assert np.abs(dwte - ref_dwte).max() < 1e-12
    for r, (_, dw) in enumerate(results):  # padded rows get no gradient
        start, _ = vp.vocab_range(V, r, ranks)
        assert not np.any(dw[max(0, V - start):])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_bytes_sent_are_the_closed_form(ranks, dtype):
    V = CFG.vocab_size
    logits, targets = data(V)
    wte = np.random.default_rng(2).standard_normal((V, C)).astype(dtype)
    logits = logits.astype(dtype)

    def body(inner):
        comm = CountingCommunicator(inner)
        start, end = vp.vocab_range(V, comm.rank, comm.size)
        emb = vp.VocabParallelEmbedding(comm, vp.shard_vocab(wte, comm.rank, comm.size), start)
        emb.forward(targets)
        e_fwd = comm.bytes_sent
        emb.backward(np.ones((B, T, C), dtype=dtype))
        e_bwd = comm.bytes_sent - e_fwd
        _, backward = vp.vocab_parallel_cross_entropy(comm, logits[..., start:end], targets, start, V)
        l_fwd = comm.bytes_sent - e_fwd - e_bwd
        backward()
        l_bwd = comm.bytes_sent - e_fwd - e_bwd - l_fwd
        return e_fwd, e_bwd, l_fwd, l_bwd

    isz = np.dtype(dtype).itemsize
    emb_bytes = vp.embedding_comm_bytes(B, T, C, ranks, isz)
    ce_bytes = vp.cross_entropy_comm_bytes(B, T, ranks, isz)
    assert ce_bytes["forward"] == 3 * 2 * (ranks - 1) * B * T * isz // ranks
    for e_fwd, e_bwd, l_fwd, l_bwd in run_threads(ranks, body, timeout=30):
        assert (e_fwd, e_bwd) == (emb_bytes["forward"], 0)
        assert (l_fwd, l_bwd) == (ce_bytes["forward"], 0)


def test_vocab_parallel_on_two_mpi_processes():
    run = subprocess.run(mpiexec_command(2, str(PROGRAM)), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    m = re.search(r"VP ranks=2 maxdiff=(\S+) bytes_emb=(\d+) bytes_ce=(\d+) bytes_bwd=(\d+)", run.stdout)
    assert m, run.stdout + run.stderr
    assert float(m[1]) < 1e-9
    assert int(m[2]) == vp.embedding_comm_bytes(B, T, C, 2, 8)["forward"]
    assert int(m[3]) == vp.cross_entropy_comm_bytes(B, T, 2, 8)["forward"]
    assert int(m[4]) == 0


def test_cross_entropy_is_stable_for_large_logits():
    logits, targets = data(96)
    logits[:, :, 50:] += 1000.0  # exp overflows float64 without the global max; rank 0's max is far below
    ref_loss, ref_d = reference_ce(logits, targets)

    def body(comm):
        start, end = vp.vocab_range(96, comm.rank, comm.size)
        loss, backward = vp.vocab_parallel_cross_entropy(comm, logits[..., start:end], targets, start, 96)
        return loss, backward()

    results = run_threads(2, body, timeout=30)
    assert np.isfinite(results[0][0]) and abs(results[0][0] - ref_loss) < 1e-9
    assert np.abs(vp.unshard_vocab([r[1] for r in results], 96, axis=-1) - ref_d).max() < 1e-9
