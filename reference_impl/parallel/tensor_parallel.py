"""Tensor (intra-layer) model parallelism for the transformer's MLP block, Megatron-LM style.

Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", arXiv:1909.08053, section 3 (figure 3a). The real code: ``NVIDIA/Megatron-LM``,
``megatron/core/tensor_parallel/layers.py`` (``ColumnParallelLinear``, ``RowParallelLinear``)
and ``megatron/core/tensor_parallel/mappings.py`` (``copy_to_tensor_model_parallel_region``,
the paper's ``f``, and ``reduce_from_tensor_model_parallel_region``, the paper's ``g``).

**The block.** ``transformer.block_forward``'s MLP is ``out = c_proj(gelu(c_fc(x)))`` with
``c_fc.weight`` ``(4C, C)``, ``c_proj.weight`` ``(C, 4C)``, ``nn.Linear`` layout
``y = x @ W.T + b``. On ``p`` ranks (``4C % p == 0``, ``n = 4C / p``):

* ``c_fc`` is split by its *outputs* (``ColumnParallelLinear``: the columns of ``A`` in the
  paper's ``Y = X A``, i.e. the rows of our ``W``): rank ``r`` holds rows ``[r n, (r+1) n)``
  of ``c_fc.weight`` and the same slice of its bias, and computes its ``n`` hidden features
  ``h_r = x @ W_r.T + b_r`` with no communication;
* GELU is element-wise, so ``gelu(h)``'s slice ``r`` is ``gelu(h_r)``: again no
  communication (this is why the first matrix is split by columns, not rows);
* ``c_proj`` is split by its *inputs* (``RowParallelLinear``): rank ``r`` holds columns
  ``[r n, (r+1) n)`` of ``c_proj.weight``; ``g_r @ W_r.T`` is a partial sum of the output,
  and ``g`` (an allreduce) adds the ``p`` partials; the bias (replicated) is added once,
  after the allreduce;
* the conjugate operators: ``f`` before the block is the identity forward and an allreduce
  of the input gradient backward (each rank's ``dh_r @ W_r`` is a partial sum of ``dx``);
  ``g`` after it is an allreduce forward and the identity backward.

So a forward and backward of one MLP cost exactly two allreduces of ``B T C`` values per
rank (one in ``g`` forward, one in ``f`` backward): with the ring algorithm each sends
``2 (p-1)/p x B T C x itemsize`` bytes per rank (exact when ``p`` divides ``B T C``;
``mlp_comm_bytes``). Parameter gradients need no communication at all inside the tensor-
parallel group: each rank's shard gradient is already complete.

Gradients are those of the single-rank block up to the order the ring adds the partials.
``shard_mlp`` cuts a single-model parameter dict into a rank's shards (same names);
``unshard_mlp`` puts the ranks' shards (parameters or gradients) back together.

The layers are array-API code (the tanh GELU included): shards and activations may be
NumPy, GPU or PyTorch arrays, and the allreduces go through ``comm``, which follows them.

The attention block, the other half of section 3 (``c_attn`` column-parallel by heads,
``attn.c_proj`` row-parallel, the same one allreduce each way), is in
``tensor_parallel_attention``, built from this module's ``f``/``g`` and linears.

Left for later: sequence parallelism (Korthikanti et al., arXiv:2205.05198: reduce-scatter/
all-gather instead of allreduce around LayerNorm/dropout), a whole tensor-parallel block and
model (LayerNorms and residuals replicated around the two parallel sublayers), and combining
TP with data parallelism. Vocabulary-parallel embedding and cross-entropy are in ``vocab_parallel``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..backend import namespace_of
from ..comm import Communicator, allreduce
from .transformer import _gelu, _gelu_backward, _weight_grad

MLP_NAMES = ("mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


# ------------------------------------------------------------------ the conjugate operators
# --8<-- [start:conjugates]
def f_forward(comm: Communicator, x: np.ndarray) -> np.ndarray:
    """``copy_to_tensor_model_parallel_region`` forward: the identity (every rank has ``x``)."""
    return x


def f_backward(comm: Communicator, dx: np.ndarray) -> np.ndarray:
    """``copy_to_tensor_model_parallel_region`` backward: allreduce (sum) the partial input gradients."""
    return _allreduce(comm, dx)


def g_forward(comm: Communicator, y: np.ndarray) -> np.ndarray:
    """``reduce_from_tensor_model_parallel_region`` forward: allreduce (sum) the partial outputs."""
    return _allreduce(comm, y)


def g_backward(comm: Communicator, dy: np.ndarray) -> np.ndarray:
    """``reduce_from_tensor_model_parallel_region`` backward: the identity."""
    return dy
# --8<-- [end:conjugates]


def _allreduce(comm: Communicator, x: np.ndarray) -> np.ndarray:
    if comm.size == 1:
        return x
    # NumPy: a strided view becomes one contiguous buffer to send; other libraries as they are
    return allreduce(comm, np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x, algorithm="ring")


# ------------------------------------------------------------------ the two linears
# --8<-- [start:linears]
@dataclass
class ColumnParallelLinear:
    """Rank ``r``'s rows of an ``(out, in)`` weight: ``y_r = x @ W_r.T + b_r``, no communication.

    ``backward`` returns the *partial* input gradient ``dy_r @ W_r`` (``f_backward`` sums it
    over the ranks) and the complete gradients of this rank's shard.
    """
    weight: np.ndarray  # (out / p, in)
    bias: np.ndarray  # (out / p,)

    def forward(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight.T
        y += self.bias
        return y

    def backward(self, dy: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return dy @ self.weight, {"weight": _weight_grad(dy, x), "bias": namespace_of(dy).sum(dy, axis=(0, 1))}


@dataclass
class RowParallelLinear:
    """Rank ``r``'s columns of an ``(out, in)`` weight, on its slice ``x_r`` of the input features.

    ``forward``: the partial ``x_r @ W_r.T``, allreduced by ``g``, then the (replicated) bias
    added once. ``backward``: ``g``'s identity, then ``dx_r = dy @ W_r`` (this rank's slice,
    complete) and the shard's gradients; the bias gradient is the same on every rank.
    """
    comm: Communicator
    weight: np.ndarray  # (out, in / p)
    bias: np.ndarray  # (out,), the same on every rank

    def forward(self, x_r: np.ndarray) -> np.ndarray:
        y = g_forward(self.comm, x_r @ self.weight.T)
        return y + self.bias

    def backward(self, dy: np.ndarray, x_r: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        dy = g_backward(self.comm, dy)
        return dy @ self.weight, {"weight": _weight_grad(dy, x_r), "bias": namespace_of(dy).sum(dy, axis=(0, 1))}
# --8<-- [end:linears]


# ------------------------------------------------------------------ the MLP block
@dataclass
class ParallelMLP:
    """One rank's part of block ``i``'s MLP: ``f -> column (c_fc) -> GELU -> row (c_proj, g)``.

    Built from a rank's shards (``shard_mlp``), ``forward(x)`` takes the full ``(B, T, C)``
    input (the same on every rank) and returns the full output (the same on every rank);
    ``backward(dout)`` returns the full input gradient and this rank's shard gradients named
    as the parameters (``h.{i}.mlp.c_fc.weight`` ...). One allreduce each way.
    """
    comm: Communicator
    shards: Mapping[str, np.ndarray]
    i: int
    activation: str = "gelu_tanh"
    cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        p = f"h.{self.i}."
        self.c_fc = ColumnParallelLinear(self.shards[p + "mlp.c_fc.weight"], self.shards[p + "mlp.c_fc.bias"])
        self.c_proj = RowParallelLinear(self.comm, self.shards[p + "mlp.c_proj.weight"],
                                        self.shards[p + "mlp.c_proj.bias"])

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = f_forward(self.comm, x)
        h = self.c_fc.forward(x)  # (B, T, 4C/p): this rank's hidden features
        g = _gelu(h, self.activation)
        self.cache = dict(x=x, h=h, g=g)
        return self.c_proj.forward(g)

    def backward(self, dout: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        x, h, g = self.cache.pop("x"), self.cache.pop("h"), self.cache.pop("g")
        dg, proj = self.c_proj.backward(dout, g)
        dh = _gelu_backward(dg, h, self.activation)
        dx_partial, fc = self.c_fc.backward(dh, x)
        dx = f_backward(self.comm, dx_partial)
        p = f"h.{self.i}.mlp."
        grads = {p + "c_fc.weight": fc["weight"], p + "c_fc.bias": fc["bias"],
                 p + "c_proj.weight": proj["weight"], p + "c_proj.bias": proj["bias"]}
        return dx, grads


def parallel_mlp_forward(comm: Communicator, shards: Mapping[str, np.ndarray], i: int, x: np.ndarray,
                         activation: str = "gelu_tanh") -> tuple[np.ndarray, ParallelMLP]:
    """The output of block ``i``'s MLP on ``x`` and the ``ParallelMLP`` (holding the cache) for backward."""
    mlp = ParallelMLP(comm, shards, i, activation)
    return mlp.forward(x), mlp


def parallel_mlp_backward(mlp: ParallelMLP, dout: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The full input gradient and this rank's shard gradients; consumes ``mlp``'s cache."""
    return mlp.backward(dout)


# ------------------------------------------------------------------ sharding
def _check(C4: int, p: int, rank: int) -> int:
    if p < 1 or not 0 <= rank < p:
        raise ValueError(f"rank {rank} of {p} ranks")
    if C4 % p:
        raise ValueError(f"tensor parallelism over {p} ranks needs 4C = {C4} divisible by {p}")
    return C4 // p


def shard_mlp(params: Mapping[str, np.ndarray], i: int, rank: int, p: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s shards of block ``i``'s MLP parameters (copies), under the parameters' own names."""
    pre = f"h.{i}."
    C4 = params[pre + "mlp.c_fc.weight"].shape[0]
    n = _check(C4, p, rank)
    sl = slice(rank * n, (rank + 1) * n)
    xp = namespace_of(params[pre + "mlp.c_fc.weight"])
    return {pre + "mlp.c_fc.weight": xp.asarray(params[pre + "mlp.c_fc.weight"][sl, :], copy=True),
            pre + "mlp.c_fc.bias": xp.asarray(params[pre + "mlp.c_fc.bias"][sl], copy=True),
            pre + "mlp.c_proj.weight": xp.asarray(params[pre + "mlp.c_proj.weight"][:, sl], copy=True),
            pre + "mlp.c_proj.bias": xp.asarray(params[pre + "mlp.c_proj.bias"], copy=True)}


def unshard_mlp(shards: Sequence[Mapping[str, np.ndarray]], i: int) -> dict[str, np.ndarray]:
    """Put every rank's shards (parameters or gradients, by rank) of block ``i``'s MLP back together.

    ``c_fc`` pieces are concatenated along their rows, ``c_proj.weight`` along its columns;
    ``c_proj.bias`` is replicated, so rank 0's is taken (the ranks' copies must agree).
    """
    pre = f"h.{i}."
    xp = namespace_of(shards[0][pre + "mlp.c_fc.weight"])
    full = {pre + "mlp.c_fc.weight": xp.concat([s[pre + "mlp.c_fc.weight"] for s in shards], axis=0),
            pre + "mlp.c_fc.bias": xp.concat([s[pre + "mlp.c_fc.bias"] for s in shards], axis=0),
            pre + "mlp.c_proj.weight": xp.concat([s[pre + "mlp.c_proj.weight"] for s in shards], axis=1),
            pre + "mlp.c_proj.bias": shards[0][pre + "mlp.c_proj.bias"]}
    bias = full[pre + "mlp.c_proj.bias"]
    for s in shards[1:]:  # np.allclose(..., rtol=1e-12, atol=1e-12), in the standard's terms
        if not bool(xp.all(xp.abs(s[pre + "mlp.c_proj.bias"] - bias) <= 1e-12 + 1e-12 * xp.abs(bias))):
            raise ValueError(f"unshard_mlp: replicated h.{i}.mlp.c_proj.bias differs between ranks")
    return full


# ------------------------------------------------------------------ communication
def mlp_comm_bytes(batch: int, seq: int, n_embd: int, p: int, itemsize: int) -> dict[str, int]:
    """Bytes one rank sends per MLP with the ring allreduce: ``forward`` (``g``), ``backward`` (``f``), ``total``.

    Each direction is one allreduce of ``B T C`` values: ``2 (p-1)/p x B T C x itemsize``
    (exact when ``p`` divides ``B T C``; otherwise ranks differ by a few elements).
    """
    one = 2 * (p - 1) * batch * seq * n_embd * itemsize // p
    return {"forward": one, "backward": one, "total": 2 * one}


# ------------------------------------------------------------------ single-rank reference
def reference_mlp(params: Mapping[str, np.ndarray], i: int, x: np.ndarray, dout: np.ndarray,
                  activation: str = "gelu_tanh") -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Block ``i``'s MLP on one rank, as ``transformer.block_forward``/``block_backward`` compute it.

    Returns ``(out, dx, grads)``: ``out = c_proj(gelu(c_fc(x)))`` (no residual), the input
    gradient and the four parameter gradients for the output gradient ``dout``.
    """
    pre = f"h.{i}.mlp."
    h = x @ params[pre + "c_fc.weight"].T + params[pre + "c_fc.bias"]
    g = _gelu(h, activation)
    out = g @ params[pre + "c_proj.weight"].T + params[pre + "c_proj.bias"]
    dg = dout @ params[pre + "c_proj.weight"]
    dh = _gelu_backward(dg, h, activation)
    xp = namespace_of(x)
    grads = {pre + "c_fc.weight": _weight_grad(dh, x), pre + "c_fc.bias": xp.sum(dh, axis=(0, 1)),
             pre + "c_proj.weight": _weight_grad(dout, g), pre + "c_proj.bias": xp.sum(dout, axis=(0, 1))}
    return out, dh @ params[pre + "c_fc.weight"], grads
