"""Tensor parallelism of the transformer's attention block, Megatron-LM style: heads split over ranks.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

The other half of Shoeybi et al., arXiv:1909.08053, section 3 (figure 3b); the real code is
``NVIDIA/Megatron-LM``'s ``megatron/core/transformer/attention.py`` (``linear_qkv`` is a
``ColumnParallelLinear``, ``linear_proj`` a ``RowParallelLinear``). The pieces (``f``, ``g``,
the two linears, ``mlp_comm_bytes``) are ``tensor_parallel``'s, reused unchanged.

**The block.** ``transformer.block_forward``'s attention is
``out = c_proj(causal_attention(c_attn(x)))`` with ``c_attn.weight`` ``(3C, C)``, the rows
stacked ``[q | k | v]``, each block of ``C`` rows cut into ``n_head`` heads of
``head_dim = C / n_head`` rows, and ``c_proj.weight`` ``(C, C)``. Heads are independent, so
on ``p`` ranks (``n_head % p == 0``, ``h = n_head / p`` heads each, ``n = h head_dim``):

* ``c_attn`` is column-parallel *by heads*: rank ``r`` holds the rows of heads
  ``[r h, (r+1) h)`` from *each* of the three blocks, i.e. rows ``[r n, (r+1) n)``,
  ``[C + r n, C + (r+1) n)`` and ``[2C + r n, 2C + (r+1) n)``, stacked again as
  ``[q_r | k_r | v_r]`` (``(3n, C)``), with the same slices of the bias; its output is the
  ``q, k, v`` of its own heads, with no communication;
* causal softmax attention runs on those ``h`` heads alone (no communication: a head's
  scores use only its own ``q, k``), giving the heads' outputs ``y_r`` ``(B, T, n)``, which are
  exactly columns ``[r n, (r+1) n)`` of the single-rank merged ``y``;
* ``c_proj`` is row-parallel over the same columns: rank ``r`` holds ``c_proj.weight[:, r n:(r+1) n]``,
  ``g`` allreduces the partial outputs, and the replicated bias is added once after it;
* ``f`` before ``c_attn``: identity forward, allreduce of the partial input gradients backward.

So, like the MLP, one attention sublayer costs one allreduce of ``B T C`` values forward
(``g``) and one backward (``f``): ``mlp_comm_bytes`` gives the bytes. The shard gradients
are complete on their rank; ``unshard_attention`` reassembles them (or the parameters).

``_attention_forward``/``_attention_backward`` are the per-head lines of
``transformer.block_forward``/``block_backward`` (same operations, same order, built on its
``_heads`` and ``_causal_mask``) for any number of heads; ``reference_attention`` runs them on
all heads, and the tests check it against the block itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..backend import require_numpy
from ..comm import Communicator
from .tensor_parallel import ColumnParallelLinear, RowParallelLinear, f_backward, f_forward
from .transformer import GPTConfig, _causal_mask, _heads, _weight_grad

_MODULE = "reference_impl.parallel.tensor_parallel_attention"  # NumPy-only: other arrays are refused, naming it

ATTN_NAMES = ("attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias")


# ------------------------------------------------------------------ causal attention over some heads
def _attention_forward(qkv: np.ndarray, n_head: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``(y, att)``: heads merged ``(B, T, n_head head_dim)`` and the probabilities ``(B, n_head, T, T)``."""
    B, T, _ = qkv.shape
    q, k, v = _heads(qkv, n_head)
    att = q @ k.transpose(0, 1, 3, 2)  # (B, nh, T, T) scores
    att *= 1.0 / math.sqrt(head_dim)
    att[:, :, _causal_mask(T)] = -np.inf
    att -= att.max(axis=-1, keepdims=True)  # softmax over keys, in place
    np.exp(att, out=att)
    att /= att.sum(axis=-1, keepdims=True)
    y = np.empty((B, T, n_head * head_dim), dtype=qkv.dtype)  # head-major within the features
    np.matmul(att, v, out=y.reshape(B, T, n_head, head_dim).transpose(0, 2, 1, 3))
    return y, att


def _attention_backward(dy: np.ndarray, qkv: np.ndarray, att: np.ndarray, n_head: int,
                        head_dim: int) -> np.ndarray:
    """``dqkv`` ``(B, T, 3 n_head head_dim)`` from ``dy`` (the merged heads' gradient)."""
    B, T, _ = dy.shape
    dy = dy.reshape(B, T, n_head, head_dim).transpose(0, 2, 1, 3)
    q, k, v = _heads(qkv, n_head)
    dqkv = np.empty_like(qkv)
    dq, dk, dv = _heads(dqkv, n_head)
    np.matmul(att.transpose(0, 1, 3, 2), dy, out=dv)
    datt = dy @ v.transpose(0, 1, 3, 2)  # d(probabilities), (B, nh, T, T)
    datt -= np.einsum("bhij,bhij->bhi", datt, att)[..., None]  # softmax backward:
    datt *= att  # dS = P * (dP - rowsum(dP * P))
    datt *= 1.0 / math.sqrt(head_dim)
    np.matmul(datt, k, out=dq)
    np.matmul(datt.transpose(0, 1, 3, 2), q, out=dk)
    return dqkv


# ------------------------------------------------------------------ the attention block
@dataclass
class ParallelAttention:
    """One rank's part of block ``i``'s attention: ``f -> column (c_attn, its heads) -> attention -> row (c_proj, g)``.

    Built from a rank's shards (``shard_attention``), ``forward(x)`` takes the full
    ``(B, T, C)`` input (the same on every rank) and returns the full output;
    ``backward(dout)`` returns the full input gradient and this rank's shard gradients named
    as the parameters (``h.{i}.attn.c_attn.weight`` ...). One allreduce each way.
    """
    comm: Communicator
    shards: Mapping[str, np.ndarray]
    i: int
    n_head_local: int
    head_dim: int
    cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        p = f"h.{self.i}.attn."
        self.c_attn = ColumnParallelLinear(self.shards[p + "c_attn.weight"], self.shards[p + "c_attn.bias"])
        self.c_proj = RowParallelLinear(self.comm, self.shards[p + "c_proj.weight"], self.shards[p + "c_proj.bias"])
        if self.c_attn.weight.shape[0] != 3 * self.n_head_local * self.head_dim:
            raise ValueError(f"ParallelAttention: c_attn shard has {self.c_attn.weight.shape[0]} rows, not "
                             f"3 x {self.n_head_local} heads x {self.head_dim}")

    def forward(self, x: np.ndarray) -> np.ndarray:
        require_numpy(_MODULE, x)
        x = f_forward(self.comm, x)
        qkv = self.c_attn.forward(x)  # (B, T, 3n): [q | k | v] of this rank's heads
        y, att = _attention_forward(qkv, self.n_head_local, self.head_dim)
        self.cache = dict(x=x, qkv=qkv, att=att, y=y)
        return self.c_proj.forward(y)

    def backward(self, dout: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        x, qkv, att, y = (self.cache.pop(k) for k in ("x", "qkv", "att", "y"))
        dy, proj = self.c_proj.backward(dout, y)
        dqkv = _attention_backward(dy, qkv, att, self.n_head_local, self.head_dim)
        dx_partial, attn = self.c_attn.backward(dqkv, x)
        dx = f_backward(self.comm, dx_partial)
        p = f"h.{self.i}.attn."
        grads = {p + "c_attn.weight": attn["weight"], p + "c_attn.bias": attn["bias"],
                 p + "c_proj.weight": proj["weight"], p + "c_proj.bias": proj["bias"]}
        return dx, grads


# ------------------------------------------------------------------ sharding
def _head_slices(C: int, n_head: int, rank: int, p: int) -> tuple[slice, list[slice]]:
    """This rank's feature columns ``[r n, (r+1) n)`` and its three row slices of ``c_attn``."""
    if p < 1 or not 0 <= rank < p:
        raise ValueError(f"rank {rank} of {p} ranks")
    if n_head < 1 or C % n_head:
        raise ValueError(f"n_embd = {C} is not divisible by n_head = {n_head}")
    if n_head % p:
        raise ValueError(f"tensor parallelism over {p} ranks needs n_head = {n_head} divisible by {p}")
    n = (n_head // p) * (C // n_head)
    cols = slice(rank * n, (rank + 1) * n)
    return cols, [slice(j * C + rank * n, j * C + (rank + 1) * n) for j in range(3)]


def shard_attention(params: Mapping[str, np.ndarray], i: int, rank: int, p: int,
                    n_head: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s shards of block ``i``'s attention (copies), under the parameters' own names."""
    require_numpy(_MODULE, *params.values())
    pre = f"h.{i}.attn."
    C = params[pre + "c_proj.weight"].shape[0]
    cols, rows = _head_slices(C, n_head, rank, p)
    return {pre + "c_attn.weight": np.concatenate([params[pre + "c_attn.weight"][s] for s in rows], axis=0),
            pre + "c_attn.bias": np.concatenate([params[pre + "c_attn.bias"][s] for s in rows], axis=0),
            pre + "c_proj.weight": params[pre + "c_proj.weight"][:, cols].copy(),
            pre + "c_proj.bias": params[pre + "c_proj.bias"].copy()}


def unshard_attention(shards: Sequence[Mapping[str, np.ndarray]], i: int) -> dict[str, np.ndarray]:
    """Put every rank's shards (parameters or gradients, by rank) of block ``i``'s attention back together.

    Each ``c_attn`` piece is ``[q_r | k_r | v_r]``: the ``q`` thirds of the ranks are
    concatenated, then the ``k`` thirds, then the ``v`` thirds; ``c_proj.weight`` along its
    columns; ``c_proj.bias`` is replicated, so rank 0's is taken (the copies must agree).
    """
    pre = f"h.{i}.attn."

    def stacked(name):
        thirds = [np.split(s[pre + name], 3, axis=0) for s in shards]
        return np.concatenate([t[j] for j in range(3) for t in thirds], axis=0)

    full = {pre + "c_attn.weight": stacked("c_attn.weight"), pre + "c_attn.bias": stacked("c_attn.bias"),
            pre + "c_proj.weight": np.concatenate([s[pre + "c_proj.weight"] for s in shards], axis=1),
            pre + "c_proj.bias": shards[0][pre + "c_proj.bias"]}
    for s in shards[1:]:
        if not np.allclose(s[pre + "c_proj.bias"], full[pre + "c_proj.bias"], rtol=1e-12, atol=1e-12):
            raise ValueError(f"unshard_attention: replicated h.{i}.attn.c_proj.bias differs between ranks")
    return full


# ------------------------------------------------------------------ single-rank reference
def reference_attention(params: Mapping[str, np.ndarray], i: int, x: np.ndarray, dout: np.ndarray,
                        config: GPTConfig) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Block ``i``'s attention on one rank, as ``transformer.block_forward``/``block_backward`` compute it.

    Returns ``(out, dx, grads)``: ``out = c_proj(attention(c_attn(x)))`` (no LayerNorm, no
    residual), the input gradient and the four parameter gradients for ``dout``.
    """
    pre = f"h.{i}.attn."
    qkv = x @ params[pre + "c_attn.weight"].T + params[pre + "c_attn.bias"]
    y, att = _attention_forward(qkv, config.n_head, config.head_dim)
    out = y @ params[pre + "c_proj.weight"].T + params[pre + "c_proj.bias"]
    dqkv = _attention_backward(dout @ params[pre + "c_proj.weight"], qkv, att, config.n_head, config.head_dim)
    grads = {pre + "c_attn.weight": _weight_grad(dqkv, x), pre + "c_attn.bias": dqkv.sum(axis=(0, 1)),
             pre + "c_proj.weight": _weight_grad(dout, y), pre + "c_proj.bias": dout.sum(axis=(0, 1))}
    return out, dqkv @ params[pre + "c_attn.weight"], grads
