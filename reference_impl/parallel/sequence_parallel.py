"""Sequence parallelism: the tensor-parallel group also splits the LayerNorms' tokens.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198, section 4.2.2 (figure 5). The real code: ``NVIDIA/Megatron-LM``,
``megatron/core/tensor_parallel/mappings.py`` (``scatter_to_sequence_parallel_region``,
``gather_from_sequence_parallel_region``, ``reduce_scatter_to_sequence_parallel_region``),
``megatron/core/tensor_parallel/layers.py`` (``ColumnParallelLinear``/``RowParallelLinear``
with ``sequence_parallel=True``; ``LinearWithGradAccumulationAndAsyncCommunication``) and
``megatron/core/distributed/finalize_model_grads.py``
(``_allreduce_non_tensor_model_parallel_grads``, formerly ``_allreduce_layernorm_grads``).

**What tensor parallelism leaves replicated.** Under Megatron tensor parallelism
(``tensor_parallel``, ``tensor_parallel_attention``) every rank of the group of ``t`` holds
the whole ``(B, T, C)`` activation between the two parallel sublayers: the LayerNorms and
the residual adds (and, in the paper's layer, the dropouts) run identically on every rank,
and so do the arrays they keep for backward. Those arrays do not shrink with ``t``: the
paper's per-layer activation memory is ``s b h (10 + 24/t + 5 a s / (h t))`` bytes, and the
``10 s b h`` is this replicated part.

**The fix.** LayerNorm and residual adds work token by token, so the tokens can be split:
rank ``r`` keeps rows ``[r T/t, (r+1) T/t)`` of the sequence, ``(B, T/t, C)``, in those
regions. Where a sequence-split region meets a tensor-parallel one, the paper replaces
Megatron's conjugate pair ``f`` / ``g`` (identity / allreduce) by ``g`` / ``ḡ``:

* ``g`` = ``gather_from_sequence_parallel_region``: all-gather along the sequence forward
  (each rank needs every token to multiply by its column shard), reduce-scatter backward
  (each rank's input gradient is a partial sum over the ranks' columns; each keeps its rows);
* ``ḡ`` = ``reduce_scatter_to_sequence_parallel_region``: reduce-scatter forward (the
  row-parallel linear's partial sums are added *and* split by tokens in one collective),
  all-gather backward;
* ``scatter_to_sequence_parallel_region`` (after the embedding, whose output every rank
  has): keep your own rows forward, all-gather backward.

A ring allreduce *is* a reduce-scatter followed by an all-gather (``comm/ring.py``), so
forward ``ḡ`` then ``g`` sends exactly the bytes of ``g``'s allreduce: the paper's point that
sequence parallelism costs no extra bandwidth. (One caveat, measured in the tests: to keep the
column-parallel linear's *input* as a shard too, Megatron saves the pre-gather shard and
all-gathers it again in backward for the weight gradient (``layers.py``: "all_gather_buffer"
in ``backward``), overlapped with the input-gradient GEMM: one extra all-gather per linear;
``keep_gathered_inputs=True`` keeps the gathered input instead, same bytes as TP alone, more
memory.)

**Layout.** Megatron keeps activations as ``[s, b, h]`` (sequence first) so a split along the
sequence is a contiguous slice of memory and its collectives (``_gather_along_first_dim``,
``_reduce_scatter_along_first_dim``) move one block per rank. This NumPy model is
``(B, T, C)``, batch first, so each operator here transposes to ``(T, B, C)``, runs the flat
ring collective (``comm.reduce_scatter``/``comm.allgather``, whose rank-``r`` chunk is then
exactly rows ``[r T/t, (r+1) T/t)``) and transposes back: a copy Megatron avoids by its layout.

**Parameter gradients.** A LayerNorm in a sequence-split region sees only its rank's tokens,
so its weight and bias gradients are partial sums: ``finalize_model_grads`` (in
``tensor_parallel_model``) allreduces them over the group once per step, as Megatron's
``_allreduce_non_tensor_model_parallel_grads`` does for every parameter marked
``sequence_parallel`` (LayerNorms, and the row-parallel linears' biases, added after ``ḡ``).

**Activation memory** (``activation_bytes``): what one layer of ``tensor_parallel_model``
keeps for backward, array by array, with and without sequence parallelism; see its docstring
for the mapping to the paper's ``10 + 24/t + 5as/(ht)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..backend import require_numpy
from ..comm import Communicator, allgather, reduce_scatter
from .tensor_parallel import f_backward, f_forward, g_backward, g_forward
from .transformer import GPTConfig

_MODULE = "reference_impl.parallel.sequence_parallel"  # NumPy-only: other arrays are refused, naming it


# ------------------------------------------------------------------ the three sequence primitives
def check_sequence_split(T: int, p: int, op: str, rank: int | None = None) -> int:
    """``T / p``, or a ``ValueError`` naming both numbers (and the rank and operation)."""
    if p < 1:
        raise ValueError(f"{op}: {p} ranks")
    if T % p:
        who = f"rank {rank}: " if rank is not None else ""
        raise ValueError(f"{who}{op}: sequence parallelism over {p} ranks needs the sequence length "
                         f"T = {T} divisible by {p}")
    return T // p


def split_sequence(comm: Communicator, x: np.ndarray) -> np.ndarray:
    """This rank's rows ``[r T/p, (r+1) T/p)`` of ``x`` ``(B, T, C)`` (a contiguous copy); no communication."""
    require_numpy(_MODULE, x)
    n = check_sequence_split(x.shape[1], comm.size, "split_sequence", comm.rank)
    if comm.size == 1:
        return x
    return np.ascontiguousarray(x[:, comm.rank * n:(comm.rank + 1) * n])


# --8<-- [start:sequence_collectives]
def all_gather_sequence(comm: Communicator, x_shard: np.ndarray) -> np.ndarray:
    """``(B, T/p, C)`` shards -> the full ``(B, T, C)`` on every rank: ring all-gather of ``(p-1)/p`` of it."""
    require_numpy(_MODULE, x_shard)
    if comm.size == 1:
        return x_shard
    B, n, C = x_shard.shape
    seq_first = np.ascontiguousarray(x_shard.transpose(1, 0, 2))  # (T/p, B, C): one contiguous block
    full = allgather(comm, seq_first, sizes=[seq_first.size] * comm.size)
    return np.ascontiguousarray(full.reshape(comm.size * n, B, C).transpose(1, 0, 2))


def reduce_scatter_sequence(comm: Communicator, x: np.ndarray) -> np.ndarray:
    """Sum ``(B, T, C)`` over the ranks and keep rows ``[r T/p, (r+1) T/p)``: ring reduce-scatter."""
    require_numpy(_MODULE, x)
    n = check_sequence_split(x.shape[1], comm.size, "reduce_scatter_sequence", comm.rank)
    if comm.size == 1:
        return x
    B, _, C = x.shape
    seq_first = np.ascontiguousarray(x.transpose(1, 0, 2))  # (T, B, C): rank r's chunk is its rows
    mine = reduce_scatter(comm, seq_first)
    return np.ascontiguousarray(mine.reshape(n, B, C).transpose(1, 0, 2))
# --8<-- [end:sequence_collectives]


# ------------------------------------------------------------------ conjugate operator pairs
@dataclass(frozen=True)
class Conjugate:
    """An operator and its backward: what Megatron writes as a ``torch.autograd.Function``."""

    name: str
    forward: Callable[[Communicator, np.ndarray], np.ndarray]
    backward: Callable[[Communicator, np.ndarray], np.ndarray]


# --8<-- [start:conjugates]
# Megatron's names (mappings.py); the paper's letters in ``name``.
copy_to_tensor_model_parallel_region = Conjugate("f: identity / allreduce", f_forward, f_backward)
reduce_from_tensor_model_parallel_region = Conjugate("g: allreduce / identity", g_forward, g_backward)
scatter_to_sequence_parallel_region = Conjugate("split / all-gather", split_sequence, all_gather_sequence)
gather_from_sequence_parallel_region = Conjugate("g (SP): all-gather / reduce-scatter",
                                                 all_gather_sequence, reduce_scatter_sequence)
reduce_scatter_to_sequence_parallel_region = Conjugate("g-bar: reduce-scatter / all-gather",
                                                       reduce_scatter_sequence, all_gather_sequence)


def sublayer_conjugates(sequence_parallel: bool) -> tuple[Conjugate, Conjugate]:
    """``(enter, exit)`` around a column-parallel -> row-parallel sublayer: ``(f, g)`` or ``(g, ḡ)``."""
    if sequence_parallel:
        return gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region
    return copy_to_tensor_model_parallel_region, reduce_from_tensor_model_parallel_region
# --8<-- [end:conjugates]


# ------------------------------------------------------------------ activation memory, closed form
def activation_elements(config: GPTConfig, batch: int, seq: int, tp: int, sp: bool,
                        keep_gathered_inputs: bool = False) -> dict[str, int]:
    """Values one ``ParallelTransformerLayer`` keeps for backward on one rank, by part.

    With ``N = B T`` tokens, ``C`` features, ``a`` heads, ``t`` ranks:

    * ``replicated`` (the LayerNorm regions): ``xhat1, xhat2`` (``C`` per token each),
      ``rstd1, rstd2`` (1 each), and the two column-parallel linears' inputs ``a1, a2``
      (``C`` each): ``4 N C + 2 N``. Every rank holds all of it under TP; with sequence
      parallelism only its ``N / t`` tokens: ``(4 N C + 2 N) / t``. With
      ``keep_gathered_inputs`` the all-gathered ``a1, a2`` stay whole: ``2 N C + (2 N C + 2 N) / t``.
    * ``parallel`` (inside the sublayers, already split by heads/columns): ``qkv`` (``3C/t``),
      ``y`` (``C/t``), ``h`` and ``g`` (``4C/t`` each): ``12 N C / t``.
    * ``attention``: the softmax probabilities, ``B (a/t) T^2``.

    The paper (fp16, 2 bytes per value, 1 per dropout mask) counts ``34 s b h + 5 a s^2 b`` bytes
    per layer on one device and ``s b h (10 + 24/t + 5 a s/(h t))`` under TP. Mapping: its
    ``24/t`` is our ``12 N C / t`` values (Q, K, V; the projection's input; GELU's input and
    output) at 2 bytes; its replicated ``10 s b h`` is LayerNorm inputs (4) + the two linears'
    inputs (4) + two dropout masks (2): ours is 8 of those 10 (we keep ``xhat`` in place of
    the LayerNorm input, plus ``rstd``) since we have no dropout; its ``5 a s^2 b`` is the
    softmax (2) + its dropout mask (1) and output (2): ours is the softmax's 2. With sequence
    parallelism the paper's total becomes ``s b h (34/t + 5 a s/(h t))``: everything divided
    by ``t``, as ours (``sp=True``).
    """
    C, a = config.n_embd, config.n_head
    if config.n_head % tp:
        raise ValueError(f"tensor parallelism over {tp} ranks needs n_head = {config.n_head} divisible by {tp}")
    N = batch * seq
    if sp:
        check_sequence_split(seq, tp, "activation_elements")
        gathered = 2 * N * C if keep_gathered_inputs else 2 * N * C // tp
        replicated = gathered + (2 * N * C + 2 * N) // tp
    else:
        replicated = 4 * N * C + 2 * N
    return {"replicated": replicated, "parallel": 12 * N * C // tp,
            "attention": batch * (a // tp) * seq * seq,
            "total": replicated + 12 * N * C // tp + batch * (a // tp) * seq * seq}


def activation_bytes(config: GPTConfig, batch: int, seq: int, tp: int, sp: bool, itemsize: int = 4,
                     keep_gathered_inputs: bool = False) -> dict[str, int]:
    """``activation_elements`` times ``itemsize``: bytes per layer per rank, for a benchmark or a plot."""
    return {k: v * itemsize for k, v in
            activation_elements(config, batch, seq, tp, sp, keep_gathered_inputs).items()}


def paper_activation_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool) -> float:
    """The paper's per-layer bytes (fp16, with dropout): ``sbh(10 + 24/t + 5as/(ht))`` or ``sbh(34/t + 5as/(ht))``."""
    per_token = 34 / t if sp else 10 + 24 / t
    return s * b * h * (per_token + 5 * a * s / (h * t))
