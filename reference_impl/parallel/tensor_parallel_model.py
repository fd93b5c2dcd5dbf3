"""The whole GPT under Megatron tensor parallelism (optionally with sequence parallelism).

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Shoeybi et al., arXiv:1909.08053, section 3, and Korthikanti et al., arXiv:2205.05198,
section 4.2.2. The real code: ``NVIDIA/Megatron-LM``'s
``megatron/core/transformer/transformer_layer.py`` (``TransformerLayer``: input LayerNorm,
self-attention, bias-dropout-add, pre-MLP LayerNorm, MLP, bias-dropout-add),
``megatron/core/models/common/embeddings/language_model_embedding.py`` (word + position
embeddings, then ``scatter_to_sequence_parallel_region`` under sequence parallelism),
``megatron/core/transformer/transformer_block.py`` (``final_layernorm``),
``megatron/core/models/gpt/gpt_model.py`` (``output_layer``, a ``ColumnParallelLinear``
sharing the word embedding; the loss is ``vocab_parallel_cross_entropy``, called from
``language_module.py``'s ``compute_language_model_loss``) and
``megatron/core/distributed/finalize_model_grads.py``.

Nothing is re-implemented: the sublayers are ``tensor_parallel.ParallelMLP`` and
``tensor_parallel_attention.ParallelAttention``, the embedding and loss are
``vocab_parallel``'s, the LayerNorm is ``transformer``'s, and the operators between regions
are ``sequence_parallel``'s conjugate pairs.

**One layer** (``ParallelTransformerLayer``), pre-LayerNorm as ``transformer.block_forward``::

    x2  = x  + exit(Attention(enter(ln_1(x))))  + attn.c_proj.bias
    out = x2 + exit(MLP(enter(ln_2(x2))))       + mlp.c_proj.bias

``enter``/``exit`` is the conjugate pair ``(f, g)`` under tensor parallelism (identity /
allreduce, then allreduce / identity; ``x`` is the whole ``(B, T, C)`` on every rank) or
``(g, ḡ)`` with sequence parallelism (all-gather / reduce-scatter along the sequence, then
reduce-scatter / all-gather; ``x`` is this rank's ``(B, T/t, C)`` rows, and the LayerNorms
and residual adds run on those rows only). The sublayers in between are the existing ones,
given a one-rank communicator so their own ``f``/``g`` do nothing: the layer places the
collectives. Their ``c_proj`` biases are added by the layer after ``exit``, on the residual
stream (Megatron's ``RowParallelLinear(skip_bias_add=True)`` followed by the layer's
``bias_dropout_add``), so that a bias is added once, whichever collective precedes it.

**Parameter gradients.** Column/row shards' gradients are complete on their rank. The
replicated parameters (LayerNorms, the ``c_proj`` biases) get complete gradients under plain
TP (every rank sees every token); with sequence parallelism each rank's are partial sums over
its tokens, and ``finalize_model_grads`` allreduces them over the group, coalesced into one
buffer (Megatron's ``_allreduce_non_tensor_model_parallel_grads``, alias
``_allreduce_layernorm_grads``, sums every parameter marked ``sequence_parallel``).

**Stable API** (a tensor x pipeline trainer, ``parallel/hybrid.py``, composes these; the
``comm`` is always the tensor-parallel group's communicator, ``t = comm.size``)::

    shards = shard_model(params, config, rank, t)          # this rank's dict, the params' names
    params = unshard_model([shards of rank 0..t-1], config) # parameters or gradients

    x, ecache = embed_forward(comm, shards, tokens, config, sequence_parallel)
    layer = ParallelTransformerLayer(comm, shards, i, config, sequence_parallel)
    x = layer.forward(x)                    # (B, T, C), or (B, T/t, C) with sequence parallelism
    loss, dx, head_grads = head_forward_backward(comm, shards, x, targets, config, sequence_parallel)
    dx, layer_grads = layer.backward(dx)
    embed_grads = embed_backward(comm, shards, ecache, dx, sequence_parallel)
    finalize_model_grads(comm, grads, sequence_parallel)   # in place, once all are summed

``head_grads`` holds ``ln_f.*`` and the head's part of the tied ``wte.weight`` shard;
``embed_grads`` holds ``wpe.weight`` and the embedding's part: the ``wte.weight`` gradient is
their sum (on one pipeline stage, ``loss_and_grads`` adds them; with the embedding and the head
on different stages, Megatron allreduces the two parts between the first and last stage,
``_allreduce_word_embedding_grads``). The loss is the mean over the ``B T`` tokens; every rank
of the group returns it. ``loss_and_grads`` runs all of it on one stage.

**Communication per step** (ring, per rank, ``V = B T C`` values of ``itemsize`` bytes):
each layer forward two allreduces of ``V`` (TP) or two all-gathers and two reduce-scatters
(SP), the same bytes (``2 (t-1)/t V`` each pair); backward the same again, plus, with sequence
parallelism and the default ``keep_gathered_inputs=False``, two all-gathers that rebuild the
linears' inputs from the kept shards (``layer_comm_bytes``). The embedding adds one allreduce
forward (and an all-gather backward with SP), the head three allreduces of ``B T`` values
(the loss) and an input-gradient allreduce (TP) or all-gather + reduce-scatter (SP).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..backend import require_numpy
from ..comm import Communicator
from .sequence_parallel import (
    all_gather_sequence,
    check_sequence_split,
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    split_sequence,
    sublayer_conjugates,
)
from .tensor_parallel import ParallelMLP, _allreduce, shard_mlp, unshard_mlp
from .tensor_parallel_attention import ParallelAttention, shard_attention, unshard_attention
from .transformer import GPTConfig, _layer_norm, _layer_norm_backward, _weight_grad
from .vocab_parallel import (
    VocabParallelEmbedding,
    shard_vocab,
    unshard_vocab,
    vocab_parallel_cross_entropy,
    vocab_range,
)

_MODULE = "reference_impl.parallel.tensor_parallel_model"  # NumPy-only: other arrays are refused, naming it

LN_NAMES = ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias")


class _OneRank(Communicator):
    """A group of one: the sublayers' own ``f``/``g`` see ``size == 1`` and pass arrays through."""

    rank, size = 0, 1

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        raise RuntimeError("a one-rank group has no peer to send to")

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        raise RuntimeError("a one-rank group has no peer to receive from")

    def barrier(self) -> None:
        pass


_LOCAL = _OneRank()


def check_tensor_parallel(config: GPTConfig, p: int, rank: int | None = None) -> None:
    """Refuse a group size that does not divide the heads (or the MLP width), naming both numbers."""
    who = f"rank {rank}: " if rank is not None else ""
    if p < 1:
        raise ValueError(f"{who}tensor parallelism needs at least one rank, got {p}")
    if config.n_head % p:
        raise ValueError(f"{who}tensor parallelism over {p} ranks needs n_head = {config.n_head} divisible by {p}")


# ------------------------------------------------------------------ sharding the whole model
def shard_model(params: Mapping[str, np.ndarray], config: GPTConfig, rank: int, p: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s parameters (copies), under the single-model names.

    ``wte.weight``: its rows of the padded vocabulary (``vocab_parallel.shard_vocab``); each
    block's attention by heads and MLP by columns/rows (``shard_attention``, ``shard_mlp``);
    ``wpe.weight``, the LayerNorms and the ``c_proj`` biases replicated.
    """
    require_numpy(_MODULE, *params.values())
    check_tensor_parallel(config, p, rank)
    shards = {"wte.weight": shard_vocab(params["wte.weight"], rank, p), "wpe.weight": params["wpe.weight"].copy()}
    for i in range(config.n_layer):
        shards.update({f"h.{i}.{n}": params[f"h.{i}.{n}"].copy() for n in LN_NAMES})
        shards.update(shard_attention(params, i, rank, p, config.n_head))
        shards.update(shard_mlp(params, i, rank, p))
    shards.update({n: params[n].copy() for n in ("ln_f.weight", "ln_f.bias")})
    return shards


def unshard_model(shards_by_rank: Sequence[Mapping[str, np.ndarray]], config: GPTConfig) -> dict[str, np.ndarray]:
    """Put every rank's shards (parameters or gradients, by rank) back into the single-model dict.

    Replicated entries are taken from rank 0 after checking that the ranks agree (they must, after
    ``finalize_model_grads``): a rank that missed an allreduce shows up here.
    """
    first = shards_by_rank[0]
    replicated = ["wpe.weight", "ln_f.weight", "ln_f.bias"] + [f"h.{i}.{n}" for i in range(config.n_layer)
                                                               for n in LN_NAMES]
    full = {"wte.weight": unshard_vocab([s["wte.weight"] for s in shards_by_rank], config.vocab_size),
            "wpe.weight": first["wpe.weight"]}
    for i in range(config.n_layer):
        full.update({f"h.{i}.{n}": first[f"h.{i}.{n}"] for n in LN_NAMES})
        full.update(unshard_attention(shards_by_rank, i))
        full.update(unshard_mlp(shards_by_rank, i))
    full.update({n: first[n] for n in ("ln_f.weight", "ln_f.bias")})
    for r, s in enumerate(shards_by_rank[1:], start=1):
        for name in replicated:
            if not np.allclose(s[name], first[name], rtol=1e-12, atol=1e-12):
                raise ValueError(f"unshard_model: replicated {name} differs between rank 0 and rank {r}")
    return full


# ------------------------------------------------------------------ one layer
class ParallelTransformerLayer:
    """Block ``i`` on one rank of the tensor-parallel group ``comm`` (see the module docstring).

    ``forward(x)``: ``x`` is ``(B, T, C)`` (TP) or this rank's ``(B, T/t, C)`` rows (SP); the
    output has the same shape. ``backward(dout)`` -> ``(dx, shard_grads)``: the gradient at
    ``x`` (same shape) and this rank's gradients under the parameters' names; with sequence
    parallelism the LayerNorm and ``c_proj`` bias gradients are partial (``finalize_model_grads``).

    ``keep_gathered_inputs`` (SP only): keep the all-gathered inputs of ``c_attn``/``c_fc`` for
    backward (memory ``2 B T C`` per layer, TP's bytes on the wire) instead of only this rank's
    rows and an all-gather again in backward (Megatron's choice: memory divided by ``t``, one
    more all-gather per sublayer, overlapped there with the input-gradient GEMM).
    """

    def __init__(self, comm: Communicator, shards: Mapping[str, np.ndarray], i: int, config: GPTConfig,
                 sequence_parallel: bool = False, keep_gathered_inputs: bool = False):
        check_tensor_parallel(config, comm.size, comm.rank)
        self.comm, self.shards, self.i, self.config = comm, shards, i, config
        self.sequence_parallel = sequence_parallel
        self.regather = sequence_parallel and not keep_gathered_inputs and comm.size > 1
        self.enter, self.exit = sublayer_conjugates(sequence_parallel)
        p = f"h.{i}."
        self.attn_bias, self.mlp_bias = shards[p + "attn.c_proj.bias"], shards[p + "mlp.c_proj.bias"]
        # the communication-free middles: one-rank group, bias skipped (added by this layer)
        no_bias = {p + "attn.c_proj.bias": np.zeros_like(self.attn_bias),
                   p + "mlp.c_proj.bias": np.zeros_like(self.mlp_bias)}
        middle = {**{k: v for k, v in shards.items() if k.startswith(p)}, **no_bias}
        self.attn = ParallelAttention(_LOCAL, middle, i, config.n_head // comm.size, config.head_dim)
        self.mlp = ParallelMLP(_LOCAL, middle, i, config.activation)
        self.cache: dict[str, np.ndarray] = {}

    # --8<-- [start:sublayer]
    def _sublayer_forward(self, sublayer: ParallelAttention | ParallelMLP, a: np.ndarray, bias: np.ndarray,
                          key: str) -> np.ndarray:
        out = self.exit.forward(self.comm, sublayer.forward(self.enter.forward(self.comm, a)))
        if self.regather:  # keep only this rank's rows of the linear's input
            sublayer.cache["x"] = None
            self.cache[key] = a
        out += bias
        return out

    def _sublayer_backward(self, sublayer: ParallelAttention | ParallelMLP, dout: np.ndarray,
                           key: str) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        if self.regather:
            sublayer.cache["x"] = all_gather_sequence(self.comm, self.cache.pop(key))
        da_partial, grads = sublayer.backward(self.exit.backward(self.comm, dout))
        return self.enter.backward(self.comm, da_partial), grads, dout.sum(axis=(0, 1))
    # --8<-- [end:sublayer]

    # --8<-- [start:layer_forward]
    def forward(self, x: np.ndarray) -> np.ndarray:
        require_numpy(_MODULE, x)
        p = f"h.{self.i}."
        a1, xhat1, rstd1 = _layer_norm(x, self.shards[p + "ln_1.weight"], self.shards[p + "ln_1.bias"])
        x2 = self._sublayer_forward(self.attn, a1, self.attn_bias, "a1")
        x2 += x  # residual
        a2, xhat2, rstd2 = _layer_norm(x2, self.shards[p + "ln_2.weight"], self.shards[p + "ln_2.bias"])
        out = self._sublayer_forward(self.mlp, a2, self.mlp_bias, "a2")
        out += x2  # residual
        self.cache.update(xhat1=xhat1, rstd1=rstd1, xhat2=xhat2, rstd2=rstd2)
        return out
    # --8<-- [end:layer_forward]

    def backward(self, dout: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        p = f"h.{self.i}."
        da2, grads, dbias = self._sublayer_backward(self.mlp, dout, "a2")
        grads[p + "mlp.c_proj.bias"] = dbias
        dx2, grads[p + "ln_2.weight"], grads[p + "ln_2.bias"] = _layer_norm_backward(
            da2, self.cache.pop("xhat2"), self.cache.pop("rstd2"), self.shards[p + "ln_2.weight"])
        dx2 += dout  # residual
        da1, attn_grads, dbias = self._sublayer_backward(self.attn, dx2, "a1")
        grads.update(attn_grads)
        grads[p + "attn.c_proj.bias"] = dbias
        dx, grads[p + "ln_1.weight"], grads[p + "ln_1.bias"] = _layer_norm_backward(
            da1, self.cache.pop("xhat1"), self.cache.pop("rstd1"), self.shards[p + "ln_1.weight"])
        dx += dx2  # residual
        return dx, grads

    def cached_arrays(self) -> list[np.ndarray]:
        """Every distinct array this layer keeps for backward (its own and its sublayers' caches)."""
        seen, out = set(), []
        for cache in (self.cache, self.attn.cache, self.mlp.cache):
            for value in cache.values():
                if isinstance(value, np.ndarray) and id(value) not in seen:
                    seen.add(id(value))
                    out.append(value)
        return out

    def cached_bytes(self) -> int:
        """Bytes kept for backward after ``forward``: compare with ``sequence_parallel.activation_bytes``."""
        return sum(a.nbytes for a in self.cached_arrays())


# ------------------------------------------------------------------ embedding and head
def embed_forward(comm: Communicator, shards: Mapping[str, np.ndarray], tokens: np.ndarray, config: GPTConfig,
                  sequence_parallel: bool = False) -> tuple[np.ndarray, dict]:
    """``wte[tokens] + wpe[:T]`` with the vocabulary-parallel lookup (one allreduce of ``B T C``).

    Returns the input of layer 0 (``(B, T, C)``, or this rank's ``(B, T/t, C)`` rows with sequence
    parallelism: ``scatter_to_sequence_parallel_region``, no communication forward) and the cache
    for ``embed_backward``.
    """
    require_numpy(_MODULE, tokens)
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] > config.block_size:
        raise ValueError(f"embed_forward: tokens must be (B, T) with T <= block_size {config.block_size}, "
                         f"got {tokens.shape}")
    if sequence_parallel:
        check_sequence_split(tokens.shape[1], comm.size, "embed_forward", comm.rank)
    start, _ = vocab_range(config.vocab_size, comm.rank, comm.size)
    embedding = VocabParallelEmbedding(comm, shards["wte.weight"], start)
    x = embedding.forward(tokens)
    x += shards["wpe.weight"][:tokens.shape[1]]
    if sequence_parallel:
        x = split_sequence(comm, x)
    return x, dict(embedding=embedding, T=tokens.shape[1])


def embed_backward(comm: Communicator, shards: Mapping[str, np.ndarray], cache: dict, dx: np.ndarray,
                   sequence_parallel: bool = False) -> dict[str, np.ndarray]:
    """``{wte.weight: the embedding's part of this rank's shard gradient, wpe.weight}``; consumes ``cache``."""
    if sequence_parallel:
        dx = all_gather_sequence(comm, dx)  # backward of the split
    dwte = cache.pop("embedding").backward(dx)["weight"]
    dwpe = np.zeros_like(shards["wpe.weight"], dtype=dx.dtype)
    dwpe[:cache.pop("T")] = dx.sum(axis=0)
    return {"wte.weight": dwte, "wpe.weight": dwpe}


def head_forward_backward(comm: Communicator, shards: Mapping[str, np.ndarray], x: np.ndarray,
                          targets: np.ndarray, config: GPTConfig, sequence_parallel: bool = False
                          ) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
    """ln_f, the tied output layer on this rank's vocabulary slice, the vocabulary-parallel loss.

    Returns ``(loss, dx, grads)``: the mean cross-entropy over the ``B T`` tokens (the same on
    every rank), the gradient at ``x`` (same shape as ``x``) and ``{ln_f.weight, ln_f.bias,
    wte.weight}`` (the head's part of the shard; ``ln_f`` partial with sequence parallelism).
    The output layer is a ``ColumnParallelLinear`` entered through ``f`` (TP) or ``g`` (SP: the
    ln_f output is all-gathered along the sequence); ``targets`` is always the full ``(B, T)``.
    """
    a, xhat, rstd = _layer_norm(x, shards["ln_f.weight"], shards["ln_f.bias"])
    enter = gather_from_sequence_parallel_region if sequence_parallel else copy_to_tensor_model_parallel_region
    a_in = enter.forward(comm, a)  # (B, T, C)
    wte = shards["wte.weight"]  # (Vp / t, C)
    start, _ = vocab_range(config.vocab_size, comm.rank, comm.size)
    loss, dlogits_of = vocab_parallel_cross_entropy(comm, a_in @ wte.T, targets, start, config.vocab_size)
    dlogits = dlogits_of()  # (B, T, Vp / t)
    dwte = _weight_grad(dlogits, a_in)
    da = enter.backward(comm, dlogits @ wte)
    dx, dw, db = _layer_norm_backward(da, xhat, rstd, shards["ln_f.weight"])
    return loss, dx, {"ln_f.weight": dw, "ln_f.bias": db, "wte.weight": dwte}


# ------------------------------------------------------------------ gradients of replicated parameters
def is_sequence_parallel_param(name: str) -> bool:
    """Replicated parameters used on sequence-split activations: LayerNorms and the ``c_proj`` biases."""
    return (name.startswith("ln_f.") or any(name.endswith(n) for n in LN_NAMES)
            or name.endswith("attn.c_proj.bias") or name.endswith("mlp.c_proj.bias"))


def finalize_model_grads(comm: Communicator, grads: dict[str, np.ndarray],
                         sequence_parallel: bool = False) -> dict[str, np.ndarray]:
    """With sequence parallelism, sum the replicated parameters' partial gradients over the group (in place).

    One allreduce of all of them, coalesced (Megatron's ``_flatten_dense_tensors`` then
    ``all_reduce`` in ``_allreduce_non_tensor_model_parallel_grads``). Without sequence
    parallelism they are already complete and nothing is sent.
    """
    names = sorted(n for n in grads if is_sequence_parallel_param(n))
    if not sequence_parallel or comm.size == 1 or not names:
        return grads
    flat = _allreduce(comm, np.concatenate([grads[n].reshape(-1) for n in names]))
    offset = 0
    for n in names:
        size = grads[n].size
        grads[n] = flat[offset:offset + size].reshape(grads[n].shape)
        offset += size
    return grads


# ------------------------------------------------------------------ the whole step
def loss_and_grads(comm: Communicator, shards: Mapping[str, np.ndarray], tokens: np.ndarray,
                   targets: np.ndarray, config: GPTConfig, sequence_parallel: bool = False,
                   keep_gathered_inputs: bool = False) -> tuple[float, dict[str, np.ndarray]]:
    """The loss and this rank's gradients (names and shapes of ``shards``), as ``transformer.loss_and_grads``.

    ``unshard_model`` of every rank's gradients equals the single-rank gradients.
    """
    x, ecache = embed_forward(comm, shards, tokens, config, sequence_parallel)
    layers = [ParallelTransformerLayer(comm, shards, i, config, sequence_parallel, keep_gathered_inputs)
              for i in range(config.n_layer)]
    for layer in layers:
        x = layer.forward(x)
    loss, dx, grads = head_forward_backward(comm, shards, x, targets, config, sequence_parallel)
    for layer in reversed(layers):
        dx, layer_grads = layer.backward(dx)
        grads.update(layer_grads)
    embed_grads = embed_backward(comm, shards, ecache, dx, sequence_parallel)
    grads["wte.weight"] = grads["wte.weight"] + embed_grads["wte.weight"]  # the tied weight's two parts
    grads["wpe.weight"] = embed_grads["wpe.weight"]
    return loss, finalize_model_grads(comm, grads, sequence_parallel)


# ------------------------------------------------------------------ communication, closed forms
def layer_comm_bytes(batch: int, seq: int, n_embd: int, p: int, itemsize: int, sequence_parallel: bool = False,
                     keep_gathered_inputs: bool = False) -> dict[str, int]:
    """Bytes one rank sends per layer (ring): ``forward``, ``backward``, ``total``.

    A ring all-gather or reduce-scatter of ``V = B T C`` values sends ``(p-1)/p V``; an
    allreduce is both, ``2 (p-1)/p V``. TP: two allreduces each way. SP: two (all-gather,
    reduce-scatter) pairs each way, the same bytes, plus two all-gathers in backward unless
    ``keep_gathered_inputs``. Exact when ``p`` divides ``T`` (SP) or ``B T C`` (TP).
    """
    half = (p - 1) * batch * seq * n_embd * itemsize // p  # one all-gather or one reduce-scatter
    forward = 4 * half
    backward = 4 * half + (2 * half if sequence_parallel and not keep_gathered_inputs else 0)
    return {"forward": forward, "backward": backward, "total": forward + backward}


def sequence_parallel_grad_bytes(config: GPTConfig, p: int, itemsize: int) -> int:
    """Bytes one rank sends in ``finalize_model_grads`` with SP: one allreduce of ``6 C L + 2 C`` values."""
    n = (6 * config.n_layer + 2) * config.n_embd
    return 2 * (p - 1) * n * itemsize // p
