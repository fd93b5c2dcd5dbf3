"""Hybrid parallelism: the GPT trained on a ``dp x tp x pp`` process grid, equal to single-rank training.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

**What.** Each strategy of this room answers one limit: tensor parallelism (TP) splits the
matrices of every layer when one layer's work or memory is too big for a device; pipeline
parallelism (PP) splits the layers when the model is too deep to fit; data parallelism (DP)
splits the batch to use more devices once the model fits. Real runs combine all three
(Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC'21, arXiv:2104.04473: "PTD-P"), each on its own group of the process
grid (``process_grid.ProcessGrid``, Megatron's rank order: TP inside a node, PP outermost).

**One step on rank (tp, dp, pp)** (``HybridTrainer.step``), after Megatron-LM's
``megatron/core/pipeline_parallel/schedules.py`` (micro-batches, the loss divided by their
number in ``forward_step_calc_loss``; Megatron's own order is 1F1B,
``forward_backward_pipelining_without_interleaving``, which computes the same gradients with
less activation memory) and ``megatron/core/distributed/finalize_model_grads.py`` (the
gradient reductions, in its order):

1. *Data.* DP replica ``dp`` takes its ``batch / DP`` rows of the global batch
   (``zero.local_batch``), and cuts them into ``m`` micro-batches.
2. *Pipeline, GPipe.* Stage ``pp`` holds a contiguous block of layers
   (``pipeline_parallel.split_layers``: the first half of the blocks on stage 0 of 2, with
   the embedding; the rest, ``ln_f``, the tied output layer and the loss on the last). It runs
   the GPipe order of ``pipeline_parallel.gpipe_schedule``: all ``m`` forwards, then all
   ``m`` backwards. A forward receives the activation ``(b, T, C)`` from the stage before on
   ``pp_group`` (from the rank with the same TP and DP coordinates: each TP rank of a stage
   holds the whole activation, or its ``T / tp`` rows with sequence parallelism, and sends it
   to its counterpart) and sends its output on; a backward does the same with gradients,
   the other way. The last stage runs the head's forward and backward inside its forward
   op, dividing the loss gradient by ``m``: the batch loss is the mean of the micro-batch
   losses, so the summed micro-batch gradients are the batch gradient.
3. *Tensor parallelism inside a stage.* Every layer is ``tensor_parallel_model``'s
   (``embed_forward``, ``ParallelTransformerLayer``, ``head_forward_backward``,
   ``embed_backward``) on ``tp_group``: Megatron's column/row-parallel linears, the
   vocabulary-parallel embedding and loss, optionally sequence parallelism.
4. *Gradients* (``finalize_grads``, Megatron's ``finalize_model_grads`` order):
   (a) ``finish_grad_sync``: every gradient this rank holds is averaged over ``dp_group``,
   all of them coalesced in one ring allreduce (Megatron's DDP grad buffer, one bucket);
   (b) with sequence parallelism, the LayerNorm and bias gradients are summed over
   ``tp_group`` (``_allreduce_non_tensor_model_parallel_grads``);
   (c) *the tied embedding*: with ``pp > 1`` the word embedding ``wte`` lives twice, as
   the input embedding on the first stage and as the output layer on the last. Megatron
   (``LanguageModule.setup_embeddings_and_output_layer``) zeroes the last stage's copy and
   allreduces the two over the *embedding group*, the first and last stage of each pipeline
   (``parallel_state``'s ``_EMBEDDING_GROUP``), so they start equal; ``HybridTrainer`` does
   the same. Each copy then gets only its own part of the gradient, and the two parts are
   summed by an allreduce over the same group (``_allreduce_word_embedding_grads``): both
   copies take the same Adam step and stay equal.
5. *Adam* (``adam.Adam``) on this rank's shards only: Adam is element-wise, so updating the
   shards is updating the whole model.

The loss every rank returns is the global batch's mean, one allreduce of one value on the
world (only the last stage's ranks contribute).

**Why it equals one rank.** Every piece is an exact re-arrangement of the single-rank
computation: TP splits sums over features, PP splits the layers, micro-batches and DP split
the sum over tokens; the reductions put the sums back. So after any number of Adam steps the
parameters (``full_params`` gathers them) equal ``zero.reference_train``'s up to rounding;
the tests check it to 1e-6 in float64 on 4 and 8 thread ranks and under ``mpiexec -n 4``.

**Communication per step** (``CountingCommunicator``: the children count their own group):
``pp_group``: ``m`` activations forward and ``m`` gradients backward of ``b T C`` values
each (``b = batch / (DP m)``; ``T / tp`` rows with SP), from every stage but the last /
first; ``dp_group``: one ring allreduce of every parameter this rank holds, ``2 (DP-1)/DP``
of them; ``embedding_group``: one allreduce of the ``wte`` shard, ``(V_pad / tp) C``
values per rank for a group of two; ``tp_group``: ``tensor_parallel_model``'s per-layer,
embedding and head traffic for each micro-batch (``step_comm_bytes`` has every closed form).

Left out: 1F1B (its steady state pairs each send with a receive, Megatron's
``send_forward_recv_backward``; with blocking sends it needs that pairing to not deadlock),
interleaved stages, context parallelism, ZeRO on the DP group, overlapping the gradient
allreduce with backward.
"""
from __future__ import annotations

import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..backend import require_numpy
from ..comm import Communicator, allreduce
from ..train.pipeline_parallel import gpipe_schedule, split_layers
from . import tensor_parallel_model as tpm
from . import transformer as tf
from .adam import Adam
from .process_grid import GridLayout, ProcessGrid
from .vocab_parallel import cross_entropy_comm_bytes, embedding_comm_bytes, padded_vocab
from .zero import local_batch

_MODULE = "reference_impl.parallel.hybrid"  # NumPy-only: other arrays are refused, naming it


def stage_layers(config: tf.GPTConfig, pp: int, stage: int) -> range:
    """The blocks of pipeline stage ``stage`` (``pipeline_parallel.split_layers``: earlier stages get the extra one)."""
    return split_layers(config.n_layer, pp)[stage]


def stage_param_names(config: tf.GPTConfig, pp: int, stage: int) -> list[str]:
    """The parameters stage ``stage`` holds: the embedding's on the first, its blocks', ``ln_f`` and the
    tied ``wte`` (the output layer's copy) on the last."""
    by_layer = {layer.name: layer for layer in tf.layers(config)}
    names = list(by_layer["embed"].owns) if stage == 0 else []
    for i in stage_layers(config, pp, stage):
        names += by_layer[f"h.{i}"].owns
    if stage == pp - 1:
        names += [n for n in by_layer["head"].uses if n not in names]
    return names


def check_layout(config: tf.GPTConfig, layout: GridLayout, batch: int, seq: int, microbatches: int,
                 sequence_parallel: bool) -> None:
    """Refuse a run that cannot be split as asked, naming the numbers."""
    tpm.check_tensor_parallel(config, layout.tp)
    if (4 * config.n_embd) % layout.tp:
        raise ValueError(f"tensor parallelism over {layout.tp} ranks needs the MLP width 4 n_embd = "
                         f"{4 * config.n_embd} divisible by {layout.tp}")
    if layout.pp > config.n_layer:
        raise ValueError(f"{layout.pp} pipeline stages need at least {layout.pp} blocks, the model has "
                         f"n_layer = {config.n_layer}")
    if microbatches < 1 or batch % (layout.dp * microbatches):
        raise ValueError(f"global batch {batch} does not split into dp = {layout.dp} replicas x {microbatches} "
                         f"micro-batches of equal size")
    if seq > config.block_size:
        raise ValueError(f"sequence length {seq} exceeds block_size {config.block_size}")
    if sequence_parallel and seq % layout.tp:
        raise ValueError(f"sequence parallelism over tp = {layout.tp} ranks needs seq = {seq} divisible by {layout.tp}")


class HybridTrainer:
    """One rank of DP x TP x PP training: its stage's parameter shards, its Adam, its groups (``grid``)."""

    def __init__(self, grid: ProcessGrid, config: tf.GPTConfig, params: Mapping[str, np.ndarray], *,
                 lr: float = 1e-3, microbatches: int = 1, sequence_parallel: bool = False):
        require_numpy(_MODULE, *params.values())
        tpm.check_tensor_parallel(config, grid.tp, grid.world.rank)
        self.grid, self.config, self.m, self.sp = grid, config, microbatches, sequence_parallel
        stage = grid.coords.pp
        self.layers = stage_layers(config, grid.pp, stage)
        all_shards = tpm.shard_model(params, config, grid.coords.tp, grid.tp)
        self.shards = {n: all_shards[n] for n in stage_param_names(config, grid.pp, stage)}
        if grid.pp > 1 and grid.embedding_group is not None:  # setup_embeddings_and_output_layer:
            if grid.is_last_stage:  # the output layer's copy starts at zero and receives stage 0's values
                self.shards["wte.weight"][...] = 0
            self.shards["wte.weight"] = allreduce(grid.embedding_group, self.shards["wte.weight"])
        self.dtype = params["wte.weight"].dtype
        self.opt = Adam(lr)
        self.opt.init_state(self.shards)
        self.step_seconds: list[float] = []

    # -- the pipeline messages: activations forward on tag 2i, their gradients back on 2i + 1
    def _activation(self, b: int, T: int) -> np.ndarray:
        rows = T // self.grid.tp if self.sp else T
        return np.empty((b, rows, self.config.n_embd), dtype=self.dtype)

    def step(self, tokens: np.ndarray, targets: np.ndarray) -> float:
        """Forward, backward, gradient reductions and Adam on this replica's rows; the global batch's mean loss."""
        require_numpy(_MODULE, tokens, targets)
        t0 = time.perf_counter()
        grid, cfg, m, sp = self.grid, self.config, self.m, self.sp
        tp, pipe, s, last = grid.tp_group, grid.pp_group, grid.coords.pp, grid.pp - 1
        b, T = tokens.shape[0] // m, tokens.shape[1]
        grads = {n: np.zeros_like(p) for n, p in self.shards.items()}
        stash: dict[int, tuple] = {}  # micro-batch -> (its layers, the embedding's cache, the head's dx)
        losses = []
        for kind, i in gpipe_schedule(grid.pp, m)[s]:
            rows = slice(i * b, (i + 1) * b)
            if kind == "F":
                ecache = None
                if s == 0:
                    x, ecache = tpm.embed_forward(tp, self.shards, tokens[rows], cfg, sp)
                else:
                    x = self._activation(b, T)
                    pipe.recv(x, s - 1, tag=2 * i)
                layers = [tpm.ParallelTransformerLayer(tp, self.shards, j, cfg, sp) for j in self.layers]
                for layer in layers:
                    x = layer.forward(x)
                dx = None
                if s == last:
                    loss, dx, head_grads = tpm.head_forward_backward(tp, self.shards, x, targets[rows], cfg, sp)
                    losses.append(loss)
                    dx /= m  # the batch loss is the mean of the m micro-batch losses
                    for n, g in head_grads.items():
                        grads[n] += g / m
                else:
                    pipe.send(np.ascontiguousarray(x), s + 1, tag=2 * i)
                stash[i] = (layers, ecache, dx)
            else:
                layers, ecache, dx = stash.pop(i)
                if dx is None:
                    dx = self._activation(b, T)
                    pipe.recv(dx, s + 1, tag=2 * i + 1)
                for layer in reversed(layers):
                    dx, layer_grads = layer.backward(dx)
                    for n, g in layer_grads.items():
                        grads[n] += g
                if s == 0:
                    for n, g in tpm.embed_backward(tp, self.shards, ecache, dx, sp).items():
                        grads[n] += g
                else:
                    pipe.send(np.ascontiguousarray(dx), s - 1, tag=2 * i + 1)
        self.finalize_grads(grads)
        self.opt.step(self.shards, grads)
        mine = np.array([sum(losses) / m / (grid.dp * grid.tp) if s == last else 0.0])
        loss = float(allreduce(grid.world, mine)[0])  # the mean over the DP replicas
        self.step_seconds.append(time.perf_counter() - t0)
        return loss

    def finalize_grads(self, grads: dict[str, np.ndarray]) -> None:
        """Megatron's ``finalize_model_grads``, in its order: DP average, SP LayerNorm sums, tied embedding."""
        grid = self.grid
        if grid.dp > 1:  # finish_grad_sync: one coalesced ring allreduce, then the mean
            names = sorted(grads)
            flat = allreduce(grid.dp_group, np.concatenate([grads[n].reshape(-1) for n in names]))
            flat /= grid.dp
            offset = 0
            for n in names:
                grads[n] = flat[offset:offset + grads[n].size].reshape(grads[n].shape)
                offset += grads[n].size
        tpm.finalize_model_grads(grid.tp_group, grads, self.sp)  # _allreduce_non_tensor_model_parallel_grads
        if grid.pp > 1 and grid.embedding_group is not None:  # _allreduce_word_embedding_grads
            grads["wte.weight"] = allreduce(grid.embedding_group, grads["wte.weight"])


# ------------------------------------------------------------------ putting the model back together
def full_params(shards_by_rank: Sequence[Mapping[str, np.ndarray]], layout: GridLayout,
                config: tf.GPTConfig) -> dict[str, np.ndarray]:
    """The single-model parameters from every world rank's ``HybridTrainer.shards`` (listed by world rank).

    Checks what must hold: every DP replica and both copies of the tied ``wte`` are equal.
    """
    if len(shards_by_rank) != layout.size:
        raise ValueError(f"full_params: got {len(shards_by_rank)} ranks' shards for a grid of {layout.size}")
    by_tp = []
    for t in range(layout.tp):
        merged: dict[str, np.ndarray] = {}
        for s in range(layout.pp):
            replicas = [shards_by_rank[layout.rank_of(tp=t, dp=d, pp=s)] for d in range(layout.dp)]
            for d, other in enumerate(replicas[1:], start=1):
                for n, v in other.items():
                    if not np.array_equal(v, replicas[0][n]):
                        raise ValueError(f"full_params: {n} differs between DP replicas 0 and {d} (tp {t}, stage {s})")
            for n, v in replicas[0].items():
                if n in merged and not np.array_equal(merged[n], v):
                    raise ValueError(f"full_params: the two copies of {n} (first and last stage, tp {t}) differ")
                merged.setdefault(n, v)
        by_tp.append(merged)
    return tpm.unshard_model(by_tp, config)


# ------------------------------------------------------------------ a run, for tests and benchmarks
@dataclass
class HybridResult:
    """What one rank returns from ``train``."""

    rank: int
    coords: object  # process_grid.GridCoords
    losses: list[float]
    step_seconds: list[float]
    shards: dict[str, np.ndarray]  # this rank's parameters after the run (``full_params`` of all ranks)
    peak_bytes: int | None = None  # tracemalloc peak of the process (one rank per process under MPI)
    bytes_sent: dict[str, int] = field(default_factory=dict)  # per group, when the world is counted


def train(comm: Communicator, config: tf.GPTConfig, *, dp: int = 1, tp: int = 1, pp: int = 1, steps: int,
          batch: int, seq: int, microbatches: int = 1, lr: float = 1e-3, dtype: type = np.float64,
          seed: int = 0, sequence_parallel: bool = False, measure_memory: bool = False) -> HybridResult:
    """Train the GPT for ``steps`` Adam steps on the global batches of ``zero.global_batch`` on a
    ``dp x tp x pp`` grid of ``comm``'s ranks; ``full_params`` of all ranks' results equals
    ``zero.reference_train(config, steps, batch, seq, lr=lr, dtype=dtype, seed=seed)``.

    ``measure_memory`` traces this process's allocations (``tracemalloc``) from before the
    parameters are built: the peak of one rank when each rank is a process (MPI), of all of
    them together on thread ranks. If ``comm`` is a ``CountingCommunicator``, ``bytes_sent``
    holds what this rank sent per group (``tp``, ``dp``, ``pp``, ``embedding``) and in all.
    """
    layout = GridLayout(dp=dp, tp=tp, pp=pp)
    check_layout(config, layout, batch, seq, microbatches, sequence_parallel)
    tracing = measure_memory and not tracemalloc.is_tracing()
    if tracing:
        tracemalloc.start()
    if measure_memory:
        tracemalloc.reset_peak()
    try:
        grid = ProcessGrid(comm, dp=dp, tp=tp, pp=pp)
        trainer = HybridTrainer(grid, config, tf.init_params(config, seed=seed, dtype=dtype), lr=lr,
                                microbatches=microbatches, sequence_parallel=sequence_parallel)
        start = {k: g.bytes_sent for k, g in _groups(grid).items()}
        losses = [trainer.step(*local_batch(s, batch, seq, grid.coords.dp, dp, seed)) for s in range(steps)]
        sent = {k: g.bytes_sent - start[k] for k, g in _groups(grid).items()}
        peak = tracemalloc.get_traced_memory()[1] if measure_memory else None
    finally:
        if tracing:
            tracemalloc.stop()
    return HybridResult(comm.rank, grid.coords, losses, trainer.step_seconds, trainer.shards, peak, sent)


def _groups(grid: ProcessGrid) -> dict[str, Communicator]:
    """The counted communicators of ``grid`` (those with ``bytes_sent``), by name."""
    named = {"world": grid.world, "tp": grid.tp_group, "dp": grid.dp_group, "pp": grid.pp_group,
             "embedding": grid.embedding_group}
    return {k: g for k, g in named.items() if g is not None and hasattr(g, "bytes_sent")}


def step_comm_bytes(config: tf.GPTConfig, layout: GridLayout, coords, batch: int, seq: int, microbatches: int,
                    itemsize: int = 8) -> dict[str, int]:
    """Bytes the rank at ``coords`` sends per step on each group, ring collectives, no sequence parallelism.

    Exact when the ring's chunks are equal (``tp`` and ``dp`` of 1 or 2, or sizes they divide).
    """
    C, t, s, last = config.n_embd, layout.tp, coords.pp, layout.pp - 1
    b = batch // (layout.dp * microbatches)
    per_micro = len(stage_layers(config, layout.pp, s)) * tpm.layer_comm_bytes(b, seq, C, t, itemsize)["total"]
    if s == 0:
        per_micro += embedding_comm_bytes(b, seq, C, t, itemsize)["total"]
    if s == last:  # the loss's three allreduces of b T values, and f's allreduce of the head's input gradient
        per_micro += cross_entropy_comm_bytes(b, seq, t, itemsize)["total"] + 2 * (t - 1) * b * seq * C * itemsize // t
    activation = b * seq * C * itemsize
    pp_bytes = microbatches * activation * ((s < last) + (s > 0))
    held = sum(int(np.prod(shape)) for shape in _shard_shapes(config, layout, s))
    dp_bytes = 2 * (layout.dp - 1) * held * itemsize // layout.dp
    wte = padded_vocab(config.vocab_size, t) // t * C
    embedding = wte * itemsize if layout.pp > 1 and s in (0, last) else 0  # a ring of two: each sends half twice
    return {"tp": microbatches * per_micro, "pp": pp_bytes, "dp": dp_bytes, "embedding": embedding}


def _shard_shapes(config: tf.GPTConfig, layout: GridLayout, stage: int) -> list[tuple[int, ...]]:
    """Shapes of one TP rank's parameters on ``stage`` (every TP rank's are the same shapes)."""
    params = {n: np.empty(shape, dtype=np.uint8) for n, shape in tf.param_shapes(config).items()}
    shards = tpm.shard_model(params, config, 0, layout.tp)
    return [shards[n].shape for n in stage_param_names(config, layout.pp, stage)]
