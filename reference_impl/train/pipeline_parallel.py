"""Pipeline (model) parallelism: an MLP split by layers over ranks, micro-batches, GPipe and 1F1B.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Data parallelism copies the whole model to every rank; when the model does not fit on
one device, split it instead. *Model parallelism by layers* gives rank ``s`` a contiguous
block of layers (a *stage*): the activations flow forward from stage to stage, the
gradients flow back. Done naively, one batch at a time, only one stage works at any
moment. *Pipelining* cuts the batch into ``m`` micro-batches so the stages work on
different micro-batches at once (GPipe). What is left idle is the *bubble*: with ``p``
stages of equal cost, the first stage waits ``p - 1`` slots for the pipeline to fill and
the last one ``p - 1`` slots while it drains, out of ``m + p - 1`` slots in all::

    bubble fraction = (p - 1) / (m + p - 1)

The schedules differ in *when* the backward passes run, which decides memory:

* **GPipe**: all ``m`` forwards, then all ``m`` backwards. Every stage holds the
  activations of all ``m`` micro-batches at the peak.
* **1F1B** (PipeDream-Flush, Megatron-LM): stage ``s`` runs ``p - s - 1`` warm-up forwards,
  then alternates one forward and one backward, then drains. A micro-batch's activations
  are freed as soon as its backward ran, so stage ``s`` holds at most ``p - s`` of them:
  the same bubble, with activation memory bounded by ``p`` instead of ``m``.

Both compute exactly the gradient of the whole batch (the micro-batch gradients are summed
before the update, and each micro-batch loss is divided by ``m``), so the result equals
the single-rank model's up to rounding; the tests check it to 1e-6.

**Measuring the bubble.** Each rank keeps a *virtual clock*: an op starts when its rank is
free and its input has arrived (the sender's clock travels with every message), and lasts
either one unit (``op_cost="unit"``: 1 for a forward, 2 for a backward) or its measured
duration (``op_cost="measured"``) in CPU time of the rank's thread (``time.thread_time``, so
time the OS gave to other processes is not counted; run BLAS single-threaded for this). The
bubble is then the idle share of ``p x makespan``. The clock makes the measurement independent of how the OS shares the
cores among the thread ranks, while the schedule, the messages and the waits are the real
ones executed here.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..comm.communicator import Communicator
from .mlp import backward, cross_entropy, forward

SCHEDULES = ("gpipe", "1f1b")
# Measured op durations are taken one op at a time: thread ranks share the cores (and the GIL),
# and an op timed while other ranks compute would be slowed by them.
_TIMING_LOCK = threading.Lock()


class _NoLock:
    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass


_NO_LOCK = _NoLock()
Op = tuple[str, int]  # ("F" or "B", micro-batch index)


# --------------------------------------------------------------------------- schedules


def gpipe_schedule(p: int, m: int) -> list[list[Op]]:
    """Per stage, the ops in order: every forward, then every backward (micro-batches ascending)."""
    _check_pm(p, m)
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


# --8<-- [start:one_f_one_b]
def one_f_one_b_schedule(p: int, m: int) -> list[list[Op]]:
    """Per stage, the 1F1B order: ``min(p - s - 1, m)`` warm-up forwards, then F/B pairs, then the remaining B."""
    _check_pm(p, m)
    stages = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        ops: list[Op] = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", i) for i in range(m - warmup, m)]
        stages.append(ops)
    return stages
# --8<-- [end:one_f_one_b]


def schedule_for(name: str, p: int, m: int) -> list[list[Op]]:
    if name == "gpipe":
        return gpipe_schedule(p, m)
    if name == "1f1b":
        return one_f_one_b_schedule(p, m)
    raise ValueError(f"unknown pipeline schedule {name!r}; expected one of {SCHEDULES}")


def bubble_fraction(p: int, m: int) -> float:
    """The predicted idle share of a pipeline of ``p`` equal stages and ``m`` micro-batches."""
    _check_pm(p, m)
    return (p - 1) / (m + p - 1)


def _check_pm(p: int, m: int) -> None:
    if int(p) != p or int(m) != m or p < 1 or m < 1:
        raise ValueError(f"pipeline: need p >= 1 stages and m >= 1 micro-batches, got p={p}, m={m}")


def simulate(schedule: list[list[Op]], t_forward: float | list[float] = 1.0,
             t_backward: float | list[float] = 2.0) -> dict[str, Any]:
    """Run ``schedule`` on paper: every op's start and end time, the makespan and the bubble fraction.

    F(s, i) waits for F(s-1, i); B(s, i) for B(s+1, i) (and for F(s, i), earlier on the same
    stage); each stage runs its ops in its list order. Costs are one number for every stage
    or one per stage (e.g. measured medians). Raises if the schedule deadlocks.
    """
    p = len(schedule)
    tf = [float(t_forward)] * p if np.isscalar(t_forward) else [float(t) for t in t_forward]
    tb = [float(t_backward)] * p if np.isscalar(t_backward) else [float(t) for t in t_backward]
    if len(tf) != p or len(tb) != p:
        raise ValueError(f"simulate: need one forward and one backward cost per stage ({p}), got {len(tf)}, {len(tb)}")
    done: dict[tuple[str, int, int], float] = {}
    position = [0] * p
    clock = [0.0] * p
    timeline: list[list[tuple[str, int, float, float]]] = [[] for _ in range(p)]
    remaining = sum(len(ops) for ops in schedule)
    while remaining:
        progressed = False
        for s in range(p):
            while position[s] < len(schedule[s]):
                kind, i = schedule[s][position[s]]
                if kind not in ("F", "B"):
                    raise ValueError(f"schedule: stage {s} has op {(kind, i)!r}; ops are ('F', i) or ('B', i)")
                if kind == "F":
                    need = ("F", s - 1, i) if s > 0 else None  # the activation from the stage before
                else:
                    need = ("B", s + 1, i) if s < p - 1 else None  # the gradient from the stage after
                if kind == "B" and ("F", s, i) not in done:
                    raise ValueError(f"schedule: stage {s} runs B{i} before F{i}")
                if need is not None and need not in done:
                    break
                start = max(clock[s], done[need] if need else 0.0)
                end = start + (tf[s] if kind == "F" else tb[s])
                done[(kind, s, i)] = clock[s] = end
                timeline[s].append((kind, i, start, end))
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {s: schedule[s][position[s]] for s in range(p) if position[s] < len(schedule[s])}
            raise ValueError(f"schedule deadlocks: stages wait on each other at {stuck}")
    makespan = max(clock)
    busy = sum(end - start for ops in timeline for _, _, start, end in ops)
    return {"makespan": makespan, "bubble": 1.0 - busy / (p * makespan), "timeline": timeline}


# --------------------------------------------------------------------------- one stage


def split_layers(n_layers: int, p: int) -> list[range]:
    """Contiguous, balanced blocks of layer indices, one per stage (earlier stages get the extra layer)."""
    if not 1 <= p <= n_layers:
        raise ValueError(f"split_layers: cannot split {n_layers} layers over {p} stages (need 1 <= p <= layers)")
    base, extra = divmod(n_layers, p)
    bounds = np.cumsum([0] + [base + (s < extra) for s in range(p)])
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass
class StageResult:
    """What one rank of a pipeline step returns."""

    rank: int
    layers: range
    grads: list[np.ndarray]  # [dW, db] for each of this stage's layers, summed over micro-batches
    loss: float | None  # the batch loss (last stage only)
    busy: float  # virtual time this stage computed
    finish: float  # virtual time its last op ended
    peak_stashed: int  # most micro-batches whose activations were held at once
    peak_stash_bytes: int  # ... and their bytes
    param_bytes: int
    timeline: list[tuple[str, int, float, float]] = field(default_factory=list)


def pipeline_step(
    comm: Communicator,
    params: list[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    n_micro: int,
    schedule: str = "1f1b",
    op_cost: str = "unit",
) -> StageResult:
    """One forward+backward of the MLP ``params`` (``[W0, b0, ...]``) on ``(x, y)``, pipelined over ``comm``'s ranks.

    Rank ``s`` uses only its own layers' parameters (``split_layers``), the input only on
    rank 0 and the labels only on the last rank. Returns this stage's gradients.
    """
    if op_cost not in ("unit", "measured"):
        raise ValueError(f"pipeline_step: op_cost must be 'unit' or 'measured', got {op_cost!r}")
    p, s = comm.size, comm.rank
    n_layers = len(params) // 2
    layers = split_layers(n_layers, p)[s]
    if x.shape[0] % n_micro:
        raise ValueError(f"pipeline_step on rank {s}: batch of {x.shape[0]} does not split into {n_micro} "
                         "equal micro-batches")
    mb = x.shape[0] // n_micro
    ops = schedule_for(schedule, p, n_micro)[s]
    dtype = params[0].dtype
    stage = [params[i] for l in layers for i in (2 * l, 2 * l + 1)]  # [W, b] of this stage's layers
    grads = [np.zeros_like(w) for w in stage]
    stash: dict[int, list[np.ndarray]] = {}  # micro-batch -> inputs of each layer (what backward needs)
    dlogits: dict[int, np.ndarray] = {}
    loss = 0.0
    clock = busy = 0.0
    peak, peak_bytes = 0, 0
    timeline = []
    stamp = np.zeros(1)

    def recv(shape: tuple[int, ...], source: int, i: int) -> tuple[np.ndarray, float]:
        buf = np.empty(shape, dtype)
        comm.recv(buf, source, tag=2 * i)
        comm.recv(stamp, source, tag=2 * i + 1)
        return buf, float(stamp[0])

    def send(buf: np.ndarray, dest: int, i: int, at: float) -> None:
        comm.send(buf, dest, tag=2 * i)
        comm.send(np.array([at]), dest, tag=2 * i + 1)

    # --8<-- [start:execute]
    for kind, i in ops:
        if kind == "F":
            if s == 0:
                h, ready = x[i * mb:(i + 1) * mb], 0.0
            else:
                h, ready = recv((mb, stage[0].shape[0]), s - 1, i)
            timing = _TIMING_LOCK if op_cost == "measured" else _NO_LOCK
            timing.acquire()
            t0 = time.thread_time()
            h, stash[i] = forward(stage, h, relu_last=s < p - 1)  # the MLP's forward on this stage's layers
            if s == p - 1:
                loss_i, d = cross_entropy(h, y[i * mb:(i + 1) * mb])
                loss += loss_i / n_micro
                dlogits[i] = d / n_micro  # the batch loss is the mean of the micro-batch losses
            cost = 1.0 if op_cost == "unit" else time.thread_time() - t0
            timing.release()
        else:
            if s == p - 1:
                delta, ready = dlogits.pop(i), 0.0
            else:
                delta, ready = recv((mb, stage[-2].shape[1]), s + 1, i)
            timing = _TIMING_LOCK if op_cost == "measured" else _NO_LOCK
            timing.acquire()
            t0 = time.thread_time()
            # the MLP's backward on this stage's layers; after stage 0 it goes on to the input
            for k, g in backward(stage, stash.pop(i), delta, input_grad=s > 0):
                if k is None:
                    delta = g  # d loss / d (pre-activation of the previous stage's last layer)
                else:
                    grads[k] += g
            cost = 2.0 if op_cost == "unit" else time.thread_time() - t0
            timing.release()
        start = max(clock, ready)
        clock = start + cost
        busy += cost
        timeline.append((kind, i, start, clock))
        if kind == "F" and s < p - 1:
            send(h, s + 1, i, clock)
        if kind == "B" and s > 0:
            send(delta, s - 1, i, clock)
        held = sum(a.nbytes for acts in stash.values() for a in acts)
        if len(stash) > peak or held > peak_bytes:
            peak, peak_bytes = max(peak, len(stash)), max(peak_bytes, held)
    # --8<-- [end:execute]
    param_bytes = sum(w.nbytes for w in stage)
    return StageResult(s, layers, grads, loss if s == p - 1 else None, busy, clock, peak, peak_bytes,
                       param_bytes, timeline)


def measured_bubble(results: list[StageResult]) -> float:
    """Idle share of ``p x makespan`` over the stages of one pipeline step (all ranks' results)."""
    makespan = max(r.finish for r in results)
    return 1.0 - sum(r.busy for r in results) / (len(results) * makespan)


def median_cost_bubble(results: list[StageResult], schedule: str) -> float:
    """The bubble of ``schedule`` replayed with each stage's *median* measured forward and backward time.

    Thread CPU time already leaves out the time the OS gave to other processes, but single
    ops still come out slow now and then (the first ones fault pages in and find cold caches),
    and on the virtual clock one slow op delays every stage behind it. The median keeps each
    stage's real cost, including the imbalance between stages, without those outliers.
    """
    tf = [float(np.median([e - s for k, _, s, e in r.timeline if k == "F"])) for r in results]
    tb = [float(np.median([e - s for k, _, s, e in r.timeline if k == "B"])) for r in results]
    m = sum(1 for k, _, _, _ in results[0].timeline if k == "F")
    return simulate(schedule_for(schedule, len(results), m), tf, tb)["bubble"]


def data_parallel_memory(params: list[np.ndarray], x_local: np.ndarray) -> dict[str, int]:
    """Bytes one data-parallel rank holds for the same MLP: every parameter, every gradient, and the
    activations backward needs for its local batch ``x_local`` (measured by running the forward)."""
    _, activations = forward(params, x_local)
    param_bytes = sum(p.nbytes for p in params)
    return {"param_bytes": param_bytes, "grad_bytes": param_bytes,
            "activation_bytes": sum(a.nbytes for a in activations)}
