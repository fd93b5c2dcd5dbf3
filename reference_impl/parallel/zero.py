"""ZeRO stages 1, 2 and 3 (FSDP): data parallelism that stops keeping N copies of everything.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

**The idea.** Plain data parallelism (stage 0) keeps on each of N ranks the whole model state:
the parameters (Ψ values), their gradients (Ψ) and Adam's two moments (2Ψ), and averages the
gradients with an allreduce. Only the gradient needs the rank's own batch; the rest is the
same on every rank. ZeRO (Rajbhandari et al., SC'20, arXiv:1910.02054) keeps 1/N of it each:

* stage 1 (P_os): rank r runs Adam only on its slice r of the flattened parameters, so it
  keeps only that slice's moments; the updated slices are then all-gathered;
* stage 2 (P_os+g): rank r keeps only its slice of the averaged gradient too: each layer's
  gradients are reduce-scattered as backward yields them and the full-size copy is freed;
* stage 3 (P_os+g+p, PyTorch FSDP's FULL_SHARD, Zhao et al., VLDB'23, arXiv:2304.11277):
  rank r keeps only its slice of the parameters; a layer's parameters are all-gathered just
  before its forward and again before its backward, and freed after (``fsdp.py``).

Communication. An allreduce is a reduce-scatter followed by an all-gather, ``(N-1)/N`` of the
data each. Stages 1 and 2 keep the reduce-scatter (each rank only needs its averaged slice)
and replace the all-gather of gradients by one of updated parameters: the same ``2Ψ(N-1)/N``
as stage 0's allreduce (the paper's section 7.2.1). Stage 1 reduce-scatters after backward
(the brief's "gradient allreduce" whose all-gather half nobody would read); stage 2 per layer,
during backward. Stage 3 all-gathers parameters twice a step and reduce-scatters once:
``3Ψ(N-1)/N``. ``comm_elements`` gives the exact per-rank count a step sends, padding included.

Layout (FSDP's FlatParameter; DeepSpeed's flat partitioned groups). Each layer of
``transformer.layers`` owns a *unit*: its parameters concatenated into one flat vector of
``numel`` values, padded with zeros to ``N * shard`` values, ``shard = ceil(numel / N)``.
Rank r owns ``[r * shard, (r + 1) * shard)``. Every stage, stage 0 included, uses this one
layout and the lab's ring collectives on it, so every chunk has the same size and the bytes
sent are exactly the formulas above with Ψ replaced by ``Ψ_pad = Σ N * shard``. The padding
is zero, gets zero gradient and stays zero under Adam; the memory accounting counts it.

Adam on a slice of a flat vector is Adam on those elements: it is element-wise, so stages
1-3 compute the same update as stage 0 up to the order the ring adds the ranks' gradients.

Memory per rank (``zero_memory``). Persistent, in values: parameters ``Ψ_pad`` (stage 3:
``Ψ_pad/N``), gradients ``Ψ_pad`` (stages 2-3: ``Ψ_pad/N``), Adam ``2Ψ_pad`` (stages 1-3:
``2Ψ_pad/N``), and for N > 1 one communication buffer the size of the largest unit (the ring's
reduce-scatter needs a full-size output; DeepSpeed's reduce bucket plays this part). On top:
the step's activations and temporaries (``memory.step_phases``) and the full-size pieces a
stage holds for a while: stage 2 one layer's packed gradients, stage 3 the gathered layers
and packed gradients (``fsdp.transient_phases`` lists them phase by phase). How it is
checked: thread ranks share one process, so no allocator can tell their bytes apart; instead
``tests/mpi_programs/zero_train.py memory`` runs one MPI process per rank (groups of 8, 4, 2, 1
split from 8 processes) and each process traces itself with ``tracemalloc`` from before the
model is built, so its peak over a step is every NumPy and Python allocation of that rank:
persistent arrays, activations, temporaries, gathered units, packed gradients. (MPI's own C
buffers are invisible to it; on one host the ring sends straight from the arrays.) The
prediction is within 3% for stages 0-2 and stage 3 without prefetch; with prefetch it is a
worst case, 1-8% above the measurement, because whether the previous layer's reduce-scatter
has ended when the next layer's fullest moment comes is a race between two threads.

Checkpoints (``save_sharded``/``load_sharded``) use ``train/checkpoint.py`` unchanged: each
rank writes its own unpadded slices (parameters and both moments) to its own directory
``rank-R-of-N/`` (the layout of torch.distributed.checkpoint's SHARDED_STATE_DICT), each one
atomic; a step is complete when all N directories hold it. Loading at another N (or another
stage: the format does not depend on the stage) reads the old slices that overlap the new
ones. The real systems: DeepSpeed's ``runtime/zero/stage_1_and_2.py`` and ``stage3.py``,
PyTorch's ``torch/distributed/fsdp``. What they add: mixed precision, gradient accumulation,
bucketing several layers per collective, CUDA streams instead of a thread.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..backend import require_numpy
from ..comm.communicator import CommError, Communicator
from ..comm.ring import ring_allgather, ring_allreduce, ring_reduce_scatter
from ..train import checkpoint as ckpt
from ..train.data_parallel import CommThread, check_thread_support
from . import corpus, fsdp
from . import transformer as tf
from .adam import Adam

_MODULE = "reference_impl.parallel.zero"  # NumPy-only: other arrays are refused, naming it

STAGES = (0, 1, 2, 3)


# ------------------------------------------------------------------ the flat, padded layout
@dataclass(frozen=True)
class Unit:
    """One layer's own parameters as one flat vector, padded to ``ranks * shard`` values."""

    name: str
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    numel: int
    shard: int  # values per rank, ceil(numel / ranks)
    ranks: int

    @property
    def padded(self) -> int:
        return self.shard * self.ranks

    def span(self, rank: int) -> tuple[int, int]:
        """The real (unpadded) values rank ``rank`` owns: ``[lo, hi)`` of the flat vector."""
        lo = min(rank * self.shard, self.numel)
        return lo, min(lo + self.shard, self.numel)

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """``{parameter name: view}`` into a full (gathered) flat vector of this unit."""
        return {n: flat[o:o + math.prod(s)].reshape(s) for n, s, o in zip(self.names, self.shapes, self.offsets)}

    def pack(self, arrays: dict[str, np.ndarray], dtype) -> np.ndarray:
        """The padded flat vector of ``arrays`` (this unit's names)."""
        flat = np.zeros(self.padded, dtype)
        for n, o in zip(self.names, self.offsets):
            a = arrays[n]
            flat[o:o + a.size] = a.reshape(-1)
        return flat


def flat_units(config: tf.GPTConfig, ranks: int) -> list[Unit]:
    """The units, one per layer of ``transformer.layers`` (in forward order), for ``ranks`` ranks."""
    shapes = tf.param_shapes(config)
    units = []
    for layer in tf.layers(config):
        sizes = [math.prod(shapes[n]) for n in layer.owns]
        offsets = tuple(int(o) for o in np.cumsum([0] + sizes[:-1]))
        numel = sum(sizes)
        units.append(Unit(layer.name, layer.owns, tuple(shapes[n] for n in layer.owns), offsets, numel,
                          -(-numel // ranks), ranks))
    return units


def padded_params(config: tf.GPTConfig, ranks: int) -> int:
    """Ψ_pad: Ψ plus the padding that makes every unit a multiple of ``ranks``."""
    return sum(u.padded for u in flat_units(config, ranks))


# --8<-- [start:comm]
def comm_elements(config: tf.GPTConfig, stage: int, ranks: int) -> int:
    """Values one rank sends in one step: ``2 (N-1) Σ shard`` for stages 0-2, ``3 (N-1) Σ shard`` for 3.

    ``Σ shard = Ψ_pad / N``, so these are ``2 Ψ_pad (N-1)/N`` and ``3 Ψ_pad (N-1)/N``: a ring
    collective on a padded unit sends ``N - 1`` chunks of ``shard`` values per phase."""
    shards = sum(u.shard for u in flat_units(config, ranks))
    return (3 if stage == 3 else 2) * (ranks - 1) * shards
# --8<-- [end:comm]


def _ring_bounds(unit: Unit) -> list[tuple[int, int]]:
    """Chunk bounds for ring.py's phases so that rank r completes chunk r (they finish on r + 1)."""
    bounds = [(r * unit.shard, (r + 1) * unit.shard) for r in range(unit.ranks)]
    return bounds[-1:] + bounds[:-1]


# ------------------------------------------------------------------ the trainer
class ZeroTrainer:
    """Data-parallel Adam on one rank with ZeRO ``stage`` 0-3; ``step`` takes this rank's micro-batch.

    ``params`` (full, identical on every rank, e.g. ``transformer.init_params``) is copied
    into the flat layout; a stage-3 rank keeps only its slices. ``prefetch`` (stage 3 only)
    runs the all-gathers and reduce-scatters on a communication thread, one layer ahead of
    the computation; off, every collective runs in order on the training thread. Use as a
    context manager (or call ``close``) so the communication thread stops.
    """

    def __init__(self, comm: Communicator, config: tf.GPTConfig, params: dict[str, np.ndarray], *,
                 stage: int = 3, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, prefetch: bool = True):
        require_numpy(_MODULE, *params.values())
        if stage not in STAGES:
            raise ValueError(f"ZeroTrainer on rank {comm.rank}: stage must be one of {STAGES}, got {stage!r}")
        dtypes = {p.dtype for p in params.values()}
        if len(dtypes) != 1 or not np.issubdtype(next(iter(dtypes)), np.floating):
            raise TypeError(f"ZeroTrainer on rank {comm.rank}: parameters must share one floating dtype, "
                            f"got {sorted(map(str, dtypes))}")
        self.comm, self.config, self.stage, self.prefetch = comm, config, stage, prefetch
        self.dtype = next(iter(dtypes))
        self.units = {u.name: u for u in flat_units(config, comm.size)}
        self.opt = Adam(lr, betas, eps)
        self.steps = 0  # steps taken, for error messages and checkpoints
        r = comm.rank
        own = {n: slice(r * u.shard, (r + 1) * u.shard) for n, u in self.units.items()}
        if stage < 3:  # full parameters; rank r's slice is a view into them
            self.flat = {n: u.pack(params, self.dtype) for n, u in self.units.items()}
            self.params = {k: v for n, u in self.units.items() for k, v in u.views(self.flat[n]).items()}
            self.shard = {n: self.flat[n][own[n]] for n in self.units}
        else:
            self.shard = {n: u.pack(params, self.dtype)[own[n]].copy() for n, u in self.units.items()}
        if stage < 2:  # full gradients; stage 1 reduce-scatters into rank r's slice of them
            self.gflat = {n: np.zeros(u.padded, self.dtype) for n, u in self.units.items()}
            self.gshard = {n: self.gflat[n][own[n]] for n in self.units}
        else:
            self.gshard = {n: np.zeros(u.shard, self.dtype) for n, u in self.units.items()}
        largest = max(u.padded for u in self.units.values())
        self.scratch = np.empty(largest, self.dtype) if comm.size > 1 else None  # the ring's output buffer
        self.opt.init_state(self.flat if stage == 0 else self.shard)
        self.comm_thread: CommThread | None = None
        if stage == 3 and prefetch:
            check_thread_support(comm)
            # longer than one collective's own timeout, so the collective's error (naming the peer) comes first
            self.comm_thread = CommThread(r, timeout=2 * comm.timeout + 5)
        self.step_seconds: list[float] = []

    # -- collectives on one unit, their errors naming the rank, the step and the layer
    def _labelled(self, what: str, layer: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except CommError as exc:
            raise CommError(f"rank {self.comm.rank}: step {self.steps}: {what} of layer {layer!r} failed: {exc}") \
                from exc

    def gather_unit(self, name: str, phase: str) -> np.ndarray:
        """A new full flat vector of unit ``name``, all-gathered from every rank's slice (stage 3)."""
        unit, r = self.units[name], self.comm.rank
        full = np.empty(unit.padded, self.dtype)
        full[r * unit.shard:(r + 1) * unit.shard] = self.shard[name]
        self._labelled(f"all-gather ({phase})", name, lambda: ring_allgather(self.comm, full, _ring_bounds(unit)))
        return full

    def reduce_scatter_unit(self, name: str, packed: np.ndarray) -> None:
        """Sum ``packed`` (a full gradient vector) over ranks into this rank's gradient slice."""
        unit, r = self.units[name], self.comm.rank
        lo, hi = r * unit.shard, (r + 1) * unit.shard
        if self.comm.size == 1:
            self.gshard[name][...] = packed[lo:hi]
            return
        out = self.scratch[:unit.padded]
        self._labelled("reduce-scatter (backward)", name,
                       lambda: ring_reduce_scatter(self.comm, packed, out, _ring_bounds(unit)))
        self.gshard[name][...] = out[lo:hi]

    def _allgather_in_place(self, name: str, full: np.ndarray, what: str) -> None:
        """Fill ``full`` (whose slice ``rank`` is current) with every rank's slice."""
        if self.comm.size > 1:
            self._labelled(what, name, lambda: ring_allgather(self.comm, full, _ring_bounds(self.units[name])))

    def wait(self) -> None:
        """Wait for the communication thread; raise the failed collective's own (labelled) error."""
        try:
            self.comm_thread.wait()
        except CommError as exc:
            raise (exc.__cause__ if isinstance(exc.__cause__, CommError) else exc) from None

    # -- one step
    # --8<-- [start:step]
    def step(self, tokens: np.ndarray, targets: np.ndarray) -> float:
        """Forward, backward, gradient reduction and Adam on this rank's micro-batch; its mean loss."""
        require_numpy(_MODULE, tokens, targets)
        t0 = time.perf_counter()
        loss = fsdp.fsdp_step(self, tokens, targets) if self.stage == 3 else self._replicated_step(tokens, targets)
        N = self.comm.size
        grads = self.gflat if self.stage == 0 else self.gshard
        for g in grads.values():
            g /= N  # the sum over ranks becomes the mean over the global batch
        self.opt.step(self.flat if self.stage == 0 else self.shard, grads)
        if self.stage in (1, 2):
            for name in self.units:
                self._allgather_in_place(name, self.flat[name], "all-gather (after the optimizer step)")
        self.steps += 1
        self.step_seconds.append(time.perf_counter() - t0)
        return loss
    # --8<-- [end:step]

    def _replicated_step(self, tokens: np.ndarray, targets: np.ndarray) -> float:
        """Stages 0-2: every rank has the full parameters; gradients leave backward layer by layer."""
        loss, cache = tf.forward(self.params, tokens, targets, self.config)
        for layer, grads in tf.backward_layers(self.params, cache, self.config):
            unit = self.units[layer]
            if self.stage < 2:  # into the full gradient vector, reduced after backward
                for n, v in unit.views(self.gflat[layer]).items():
                    v[...] = grads[n]
                grads.clear()  # the generator still refers to the dict: empty it to free the arrays
            else:  # reduce-scatter now; the full-size copy dies here
                packed = unit.pack(grads, self.dtype)
                grads.clear()
                self.reduce_scatter_unit(layer, packed)
                del packed
        del cache
        for name, unit in self.units.items():
            if self.stage == 1:
                self.reduce_scatter_unit(name, self.gflat[name])
            elif self.stage == 0 and self.comm.size > 1:
                out = self.scratch[:unit.padded]
                self._labelled("allreduce (after backward)", name,
                               lambda: ring_allreduce(self.comm, self.gflat[name], out))
                self.gflat[name][...] = out
        return loss

    # -- the whole model, and checkpoints
    def full_params(self) -> dict[str, np.ndarray]:
        """A full copy of every parameter (a collective in stage 3: every rank must call it)."""
        out = {}
        for name, unit in self.units.items():
            full = self.gather_unit(name, "full_params") if self.stage == 3 else self.flat[name]
            out.update({k: v.copy() for k, v in unit.views(full).items()})
        return out

    def close(self) -> None:
        if self.comm_thread is not None:
            self.comm_thread.close()
            self.comm_thread = None

    def __enter__(self) -> "ZeroTrainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------ sharded checkpoints
def _rank_dir(directory: Path, rank: int, ranks: int) -> Path:
    return directory / f"rank-{rank:05d}-of-{ranks:05d}"


def save_sharded(trainer: ZeroTrainer, directory, keep_last: int = 3) -> Path:
    """Every rank writes its own unpadded slices (parameters, Adam moments) for step ``trainer.steps``.

    A collective (a barrier at the end): the step is complete once every rank has committed."""
    t, r, N = trainer, trainer.comm.rank, trainer.comm.size
    state: dict[str, np.ndarray] = {"adam_step": np.int64(t.opt.t), "ranks": np.int64(N),
                                    "numel": np.array([u.numel for u in t.units.values()], np.int64)}
    for name, unit in t.units.items():
        lo, hi = unit.span(r)
        m, v = t.opt.state[name]
        own = slice(r * unit.shard, r * unit.shard + hi - lo) if t.stage == 0 else slice(0, hi - lo)
        state[f"param/{name}"] = t.shard[name][:hi - lo]
        state[f"exp_avg/{name}"], state[f"exp_avg_sq/{name}"] = m[own], v[own]
    path = ckpt.save_checkpoint(_rank_dir(Path(directory), r, N), state, t.steps, keep_last=keep_last)
    t.comm.barrier()
    return path


def _complete_layouts(directory: Path) -> list[tuple[int, int]]:
    """``(step, ranks)`` saved by every rank of a job, newest step first."""
    found: dict[int, dict[int, set[int]]] = {}
    for d in directory.glob("rank-*-of-*"):
        rank, ranks = (int(x) for x in d.name[len("rank-"):].split("-of-"))
        for step in (int(m.group(1)) for p in d.iterdir() if (m := ckpt.MANIFEST_RE.match(p.name))):
            found.setdefault(ranks, {}).setdefault(step, set()).add(rank)
    return sorted(((s, n) for n, steps in found.items() for s, rs in steps.items() if len(rs) == n), reverse=True)


def load_sharded(trainer: ZeroTrainer, directory) -> int:
    """Restore the newest complete sharded checkpoint in ``directory`` into ``trainer``; return its step.

    The checkpoint may come from another rank count or stage. Each rank reads only the old
    ranks' files whose slices overlap its own. A collective for stages 0-2 (they all-gather
    the full parameters, and stage 0 the full moments)."""
    t, r = trainer, trainer.comm.rank
    directory = Path(directory)
    layouts = _complete_layouts(directory)
    if not layouts:
        raise ckpt.CheckpointError(f"{directory}: no sharded checkpoint that every rank of a job committed")
    step, old_n = layouts[0]
    old_units = flat_units(t.config, old_n)
    cache: dict[int, dict[str, np.ndarray]] = {}

    def old_state(k: int) -> dict[str, np.ndarray]:
        if k not in cache:
            cache[k] = ckpt.load_checkpoint(_rank_dir(directory, k, old_n), step=step)[0]
            numel = [u.numel for u in t.units.values()]
            if list(cache[k]["numel"]) != numel:
                raise ckpt.ModelMismatchError(
                    f"{directory}: checkpoint of step {step} holds units of {list(cache[k]['numel'])} values "
                    f"({list(t.units)}); this trainer's model has {numel}: a different model configuration")
        return cache[k]

    for (name, unit), old in zip(t.units.items(), old_units):
        lo, hi = unit.span(r)
        m, v = t.opt.state[name]
        base = r * unit.shard if t.stage == 0 else 0  # where rank r's slice starts in the arrays below
        for k in range(old_n):
            olo, ohi = old.span(k)
            a, b = max(lo, olo), min(hi, ohi)
            if a >= b:
                continue
            saved = old_state(k)
            src, dst = slice(a - olo, b - olo), slice(a - lo, b - lo)
            t.shard[name][dst] = saved[f"param/{name}"][src]
            m[base + dst.start:base + dst.stop] = saved[f"exp_avg/{name}"][src]
            v[base + dst.start:base + dst.stop] = saved[f"exp_avg_sq/{name}"][src]
    if not cache:  # this rank owns nothing but padding: still check the model against rank 0's file
        old_state(0)
    t.opt.t = int(old_state(0)["adam_step"])
    t.steps = step
    if t.stage < 3:
        for name in t.units:
            t._allgather_in_place(name, t.flat[name], "all-gather (checkpoint load)")
            if t.stage == 0:
                for moment in t.opt.state[name]:
                    t._allgather_in_place(name, moment, "all-gather (checkpoint load)")
    return step


# ------------------------------------------------------------------ training runs
def global_batch(step: int, batch: int, seq: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step``: ``batch`` windows of the corpus, the same on every rank."""
    return corpus.get_batch(corpus.data(), batch, seq, np.random.default_rng([seed, step]))


def local_batch(step: int, batch: int, seq: int, rank: int, ranks: int, seed: int = 0):
    """Rank ``rank``'s rows of the global batch (``batch`` must be a multiple of ``ranks``)."""
    if batch % ranks:
        raise ValueError(f"global batch {batch} is not divisible by {ranks} ranks")
    tokens, targets = global_batch(step, batch, seq, seed)
    rows = slice(rank * batch // ranks, (rank + 1) * batch // ranks)
    return tokens[rows], targets[rows]


def reference_train(config: tf.GPTConfig, steps: int, batch: int, seq: int, *, lr: float = 1e-3,
                    dtype=np.float64, seed: int = 0) -> dict[str, np.ndarray]:
    """Plain single-process Adam on the whole global batch: what every stage must reproduce."""
    params = tf.init_params(config, seed=seed, dtype=dtype)
    opt = Adam(lr)
    for s in range(steps):
        _, grads = tf.loss_and_grads(params, *global_batch(s, batch, seq, seed), config)
        opt.step(params, grads)
    return params


@dataclass
class RunResult:
    params: dict[str, np.ndarray]  # full parameters after the run (gathered)
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)


def train(comm: Communicator, config: tf.GPTConfig, *, stage: int, steps: int, batch: int, seq: int,
          lr: float = 1e-3, dtype=np.float64, seed: int = 0, prefetch: bool = True,
          start: int = 0, trainer: ZeroTrainer | None = None) -> RunResult:
    """Train for steps ``start .. steps-1`` on the global batches, each rank on its rows of each."""
    own = trainer is None
    t = trainer or ZeroTrainer(comm, config, tf.init_params(config, seed=seed, dtype=dtype), stage=stage,
                               lr=lr, prefetch=prefetch)
    try:
        losses = [t.step(*local_batch(s, batch, seq, comm.rank, comm.size, seed)) for s in range(start, steps)]
        return RunResult(t.full_params(), losses, list(t.step_seconds))
    finally:
        if own:
            t.close()


# ------------------------------------------------------------------ memory accounting, padding counted
def zero_memory(config: tf.GPTConfig, batch: int, seq: int, *, stage: int, ranks: int, prefetch: bool = True,
                itemsize: int = 4) -> dict[str, float]:
    """Predicted bytes one rank of ``ZeroTrainer`` holds: its persistent arrays and its step's peak.

    Persistent values (padding counted): parameters, gradients, Adam's moments and the ring's
    output buffer, as the module docstring says. The step adds, at its fullest moment
    (``fsdp.transient_phases``): the activations and temporaries of ``memory.step_phases``,
    the full-size gradients backward still holds (the tied ``wte`` gradient from the head to
    the embedding, the layer being produced), and the stage's full-size pieces (packed
    gradients, gathered units). ``peak = persistent + transient``.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    units = flat_units(config, ranks)
    psi_pad = sum(u.padded for u in units)
    shards = sum(u.shard for u in units)
    params = shards if stage == 3 else psi_pad
    grads = shards if stage >= 2 else psi_pad
    state = 2 * (psi_pad if stage == 0 else shards)
    buffer = max(u.padded for u in units) if ranks > 1 else 0
    phases = fsdp.transient_phases(config, batch, seq, stage=stage, ranks=ranks, prefetch=prefetch)
    phase = max(phases, key=phases.get)
    persistent = params + grads + state + buffer
    return {"parameters": itemsize * params, "gradients": itemsize * grads, "optimizer_state": itemsize * state,
            "buffer": itemsize * buffer, "persistent": itemsize * persistent,
            "transient": itemsize * phases[phase], "peak": itemsize * (persistent + phases[phase]),
            "phase": phase, "psi_pad": psi_pad}
