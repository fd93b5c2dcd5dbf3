"""Vocabulary-parallel embedding and cross-entropy, Megatron-LM style.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", arXiv:1909.08053, section 3 (the input embedding and the tied output layer are
split along the vocabulary, and the cross-entropy is fused with the output layer so that the
``B T V`` logits are never gathered). The real code: ``NVIDIA/Megatron-LM``,
``megatron/core/tensor_parallel/layers.py`` (``VocabParallelEmbedding``) and
``megatron/core/tensor_parallel/cross_entropy.py`` (``vocab_parallel_cross_entropy``).

**The split.** ``wte.weight`` is ``(V, C)`` and tied: it is the input embedding
(``x = wte[tokens]``) and the output layer (``logits = ln_f(x) @ wte.T``). On ``p`` ranks the
vocabulary is padded to ``Vp = ceil(V / p) p`` (zero rows appended, as Megatron pads its
vocabulary to a multiple of the tensor-parallel size) and rank ``r`` holds rows
``[r Vp/p, (r+1) Vp/p)`` (``shard_vocab``); ``vocab_range`` gives the bounds.

* ``VocabParallelEmbedding``: each rank looks up only the ids in its range (the others give
  zero rows), and ``g`` (an allreduce, sum) adds the ``p`` partial lookups: exactly one id's
  rank contributes a nonzero row. Backward is ``g``'s identity, then the output gradient is
  scattered into the shard's own rows only: no communication. One allreduce of ``B T C``
  values forward, none backward (``embedding_comm_bytes``).
* ``vocab_parallel_cross_entropy``: rank ``r`` holds the logits of its vocabulary slice,
  ``(B T, Vp/p)``. The numerically stable softmax cross-entropy
  ``loss_i = log sum_v exp(z_iv - m_i) - (z_{i,t_i} - m_i)`` needs three row-wise quantities
  from every rank, each one allreduce of ``B T`` values: the row max ``m`` (op ``max``), the
  sum of ``exp(z - m)`` (sum), and the target's shifted logit (sum; each rank contributes
  it only where the target is in its range, 0 elsewhere). The loss is the mean over the
  ``B T`` tokens. Backward needs nothing more: ``d z_shard = (softmax_shard - onehot_shard) / (B T)``,
  with the softmax from the local ``exp`` and the global sum kept from forward. So three
  allreduces of ``B T`` values forward, none backward (``cross_entropy_comm_bytes``), against
  ``B T V`` values to gather the logits.

**Padded rows.** A padded row of ``wte`` is zero, so its logit is 0, not ``-inf``: left in,
it would add ``exp(0 - m)`` to every row's sum. Here the logits of columns ``>= vocab_size``
are set to ``-inf`` before the max (so ``exp`` gives exactly 0, their probability and gradient
are 0), and the loss is exactly the unpadded single-rank loss. (Megatron's padded rows are
ordinary trainable rows that no target ever names; it does not mask them, and their
probabilities are simply learned down. Masking keeps this reference equal to the
transformer's own head.) A shard made entirely of padding has row max ``-inf``, which the
max-allreduce discards.

Bytes (ring allreduce) are exact when ``p`` divides the allreduced count; otherwise the
ranks differ by a few elements.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..backend import require_numpy
from ..comm import Communicator, allreduce
from .tensor_parallel import _allreduce, g_backward, g_forward

_MODULE = "reference_impl.parallel.vocab_parallel"  # NumPy-only: other arrays are refused, naming it


# ------------------------------------------------------------------ sharding
def padded_vocab(vocab_size: int, p: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``p``."""
    if p < 1:
        raise ValueError(f"{p} ranks")
    return -(-vocab_size // p) * p


def vocab_range(vocab_size: int, rank: int, p: int) -> tuple[int, int]:
    """``(start, end)`` of rank ``rank``'s rows of the padded vocabulary (``end`` may exceed ``vocab_size``)."""
    if p < 1 or not 0 <= rank < p:
        raise ValueError(f"rank {rank} of {p} ranks")
    n = padded_vocab(vocab_size, p) // p
    return rank * n, (rank + 1) * n


def shard_vocab(wte: np.ndarray, rank: int, p: int) -> np.ndarray:
    """Rank ``rank``'s rows ``[r Vp/p, (r+1) Vp/p)`` of ``wte`` ``(V, C)`` (a copy), padded with zero rows."""
    require_numpy(_MODULE, wte)
    V = wte.shape[0]
    start, end = vocab_range(V, rank, p)
    shard = np.zeros((end - start,) + wte.shape[1:], dtype=wte.dtype)
    real = max(0, min(end, V) - start)
    shard[:real] = wte[start:start + real]
    return shard


def unshard_vocab(shards: Sequence[np.ndarray], vocab_size: int, axis: int = 0) -> np.ndarray:
    """Concatenate the ranks' shards (rows of ``wte`` or its gradient; ``axis=-1`` for logits) and drop the padding."""
    full = np.concatenate(list(shards), axis=axis)
    return np.take(full, np.arange(vocab_size), axis=axis)


# ------------------------------------------------------------------ the embedding
@dataclass
class VocabParallelEmbedding:
    """One rank's rows of the embedding table; ``forward`` allreduces (``g``), ``backward`` does not communicate.

    ``weight`` is ``shard_vocab(wte, rank, p)``; ``vocab_start`` its first row's global id.
    """
    comm: Communicator
    weight: np.ndarray  # (Vp / p, C)
    vocab_start: int
    cache: dict = field(default_factory=dict, repr=False)

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        require_numpy(_MODULE, tokens)
        tokens = np.asarray(tokens)
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        local = np.where(outside, 0, local)
        partial = self.weight[local]  # (B, T, C)
        partial[outside] = 0
        self.cache = dict(local=local, outside=outside)
        return g_forward(self.comm, partial)

    def backward(self, dout: np.ndarray) -> dict[str, np.ndarray]:
        """``{"weight": d(shard)}``: ``dout``'s rows for this rank's ids only; consumes the cache."""
        dout = g_backward(self.comm, dout)
        local, outside = self.cache.pop("local"), self.cache.pop("outside")
        inside = ~outside
        dw = np.zeros_like(self.weight, dtype=dout.dtype)
        np.add.at(dw, local[inside], dout[inside])
        return {"weight": dw}


# ------------------------------------------------------------------ the cross-entropy
def vocab_parallel_cross_entropy(comm: Communicator, logits_shard: np.ndarray, targets: np.ndarray,
                                 vocab_start: int, vocab_size: int | None = None
                                 ) -> tuple[float, Callable[[], np.ndarray]]:
    """Mean softmax cross-entropy over logits split by vocabulary, without gathering them.

    ``logits_shard`` is ``(..., Vp/p)``: this rank's columns ``[vocab_start, vocab_start + Vp/p)``;
    ``targets`` the ``(...)`` global ids. ``vocab_size`` (the unpadded ``V``) masks the padded
    columns out of the softmax. Returns ``(loss, backward)``: ``backward()`` gives
    ``d(logits_shard) = (softmax - onehot) / N`` for the shard (``N`` tokens), no communication.
    Communication: three allreduces of ``N`` values forward (max, exp-sum, target logit).
    """
    require_numpy(_MODULE, logits_shard, targets)
    shape = logits_shard.shape
    Vs = shape[-1]
    z = np.array(logits_shard, dtype=logits_shard.dtype).reshape(-1, Vs)  # a copy: becomes exp, then the gradient
    t = np.asarray(targets).reshape(-1)
    N = z.shape[0]
    if t.shape[0] != N:
        raise ValueError(f"vocab_parallel_cross_entropy: {N} rows of logits but {t.shape[0]} targets")
    if vocab_size is not None and vocab_start + Vs > vocab_size:
        z[:, max(0, vocab_size - vocab_start):] = -np.inf  # padded columns: exp gives exactly 0
    # 1. the global row max (numerical stability)
    m = _allreduce_max(comm, z.max(axis=1))
    z -= m[:, None]
    # 3 (computed before exp overwrites z). the target's shifted logit, from the rank that holds it
    local = t - vocab_start
    inside = (local >= 0) & (local < Vs)
    rows = np.nonzero(inside)[0]
    picked = np.zeros(N, dtype=z.dtype)
    picked[rows] = z[rows, local[rows]]
    # 2. the global sum of exp
    np.exp(z, out=z)
    total = _allreduce(comm, z.sum(axis=1))
    picked = _allreduce(comm, picked)
    loss = float(np.mean(np.log(total) - picked))

    def backward() -> np.ndarray:
        """``(softmax - onehot) / N`` for this rank's columns, shaped as ``logits_shard``."""
        d = z / total[:, None]
        d[rows, local[rows]] -= 1.0
        d /= N
        return d.reshape(shape)

    return loss, backward


def _allreduce_max(comm: Communicator, x: np.ndarray) -> np.ndarray:
    if comm.size == 1:
        return x
    return allreduce(comm, np.ascontiguousarray(x), algorithm="ring", op="max")


# ------------------------------------------------------------------ communication
def cross_entropy_comm_bytes(batch: int, seq: int, p: int, itemsize: int) -> dict[str, int]:
    """Bytes one rank sends for the loss (ring): three allreduces of ``B T`` values forward, none backward."""
    one = 2 * (p - 1) * batch * seq * itemsize // p
    return {"forward": 3 * one, "backward": 0, "total": 3 * one}


def embedding_comm_bytes(batch: int, seq: int, n_embd: int, p: int, itemsize: int) -> dict[str, int]:
    """Bytes one rank sends for the embedding (ring): one allreduce of ``B T C`` values forward, none backward."""
    one = 2 * (p - 1) * batch * seq * n_embd * itemsize // p
    return {"forward": one, "backward": 0, "total": one}
