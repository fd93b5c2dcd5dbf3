"""Consistency models under a straggler: BSP, ASP, SSP, backup workers and EASGD, simulated.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

How workers and servers agree on the parameters decides two things that pull in
opposite directions: how long a step waits (for the slowest worker, for nobody, or for
nobody more than ``s`` steps behind) and how stale the parameters a gradient was computed
from are (staleness = updates applied between a worker's read and its push). This module
trains one real model under each rule and a *simulated* clock, so the trade-off can be
measured without the noise of a shared machine:

* a worker step takes ``1`` time unit (times a small random jitter); a persistent
  straggler takes ``slowdown`` units every step, a transient one only now and then;
  communication is free, so only waiting is charged;
* **bsp**: all ``n`` workers read, compute, and their gradients are applied together; the
  step ends when the slowest worker ends. Every model moves the parameters by ``lr`` per
  worker-batch gradient, so BSP applies ``lr`` times the *sum* of the ``n`` gradients
  (the linear scaling rule: ``n`` times the rate for an ``n`` times larger batch);
* **asp**: each push is applied the moment it arrives; nobody waits;
* **ssp**: as asp, but a worker may start a step only while ``SSPClock`` allows it;
* **backup**: ``n + b`` workers start each step; the first ``n`` gradients are summed
  and applied as in BSP and the ``b`` latecomers are dropped (Chen et al., "Revisiting
  distributed synchronous SGD", 2016);
* **easgd**: every worker trains its own copy and every ``tau`` local steps moves it and
  the centre copy towards each other by ``alpha`` of their difference (Zhang, Choromanska
  and LeCun, 2015); the loss is the centre's.

The model trained is any ``Problem``; the pages use ``models.hashed_logreg.HashedLogReg``,
logistic regression over a click log's ids hashed into ``n_buckets`` weights, so a copy of
the parameters is one small array (EASGD keeps one per worker).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .ssp_clock import SSPClock

MODELS = ("bsp", "asp", "ssp", "backup", "easgd")


class Problem(Protocol):
    """What ``simulate`` trains: a parameter vector, a stochastic gradient, a test loss
    (``reference_impl.models.hashed_logreg.HashedLogReg`` is the one the pages measure)."""

    def init(self) -> np.ndarray: ...

    def grad(self, w: np.ndarray) -> np.ndarray: ...

    def test_loss(self, w: np.ndarray) -> float: ...


@dataclass
class Run:
    """One simulated training run: the loss curve against simulated time, and what happened."""

    model: str
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)  # per applied gradient
    reads: list[tuple[int, int, int]] = field(default_factory=list)  # (worker, its clock, slowest clock)
    used: list[list[int]] = field(default_factory=list)  # backup: workers whose gradients were applied
    dropped: int = 0
    final_weights: np.ndarray | None = None  # the parameters the losses were last measured on

    def record(self, t: float, loss: float) -> None:
        self.times.append(t)
        self.losses.append(loss)

    def time_to(self, target: float) -> float:
        """Simulated time at which the test loss first reached ``target`` (inf if never)."""
        for t, loss in zip(self.times, self.losses):
            if loss <= target:
                return t
        return math.inf

    def mean_loss(self, start: float, end: float) -> float:
        """Mean test loss recorded between simulated times ``start`` and ``end``: a level the
        curve sits at, not its luckiest dip, so a slower run of the same training reaches it."""
        window = [loss for t, loss in zip(self.times, self.losses) if start <= t <= end]
        if not window:
            raise ValueError(f"Run.mean_loss: {self.model} recorded no loss between t={start} and t={end}")
        return float(np.mean(window))


def step_times(rng: np.random.Generator, n: int, straggler: int | None, slowdown: float,
               straggle_prob: float = 0.0) -> np.ndarray:
    """How long each of ``n`` workers takes for one step: ~1 unit (5% jitter); worker
    ``straggler`` always takes ``slowdown`` times longer, and any worker does so with
    probability ``straggle_prob`` (a transient hiccup: a GC pause, a noisy neighbour)."""
    t = np.exp(rng.normal(0.0, 0.05, n))
    if straggler is not None:
        t[straggler] *= slowdown
    t[rng.random(n) < straggle_prob] *= slowdown
    return t


def simulate(model: str, problem: Problem, n_workers: int = 4, horizon: float = 200.0,
             lr: float = 1.0, straggler: int | None = 0, slowdown: float = 3.0,
             straggle_prob: float = 0.0, staleness: float = 4, backups: int = 1, tau: int = 4,
             alpha: float = 0.25, seed: int = 0) -> Run:
    """Train under ``model`` until simulated time ``horizon``; see the module docstring."""
    if model not in MODELS:
        raise ValueError(f"simulate: unknown consistency model {model!r}; expected one of {MODELS}")
    if n_workers < 1:
        raise ValueError(f"simulate: need at least one worker, got {n_workers}")
    rng = np.random.default_rng(seed)
    run = Run(model)
    w = problem.init()
    run.record(0.0, problem.test_loss(w))
    if model in ("bsp", "backup"):
        total = n_workers + (backups if model == "backup" else 0)
        t = 0.0
        while t < horizon:
            times = step_times(rng, total, straggler, slowdown, straggle_prob)
            first = np.argsort(times, kind="stable")[:n_workers]
            t += float(times[first[-1]])
            w -= lr * np.sum([problem.grad(w) for _ in first], axis=0)
            run.used.append(sorted(first.tolist()))
            run.dropped += total - n_workers
            run.staleness.extend([0] * n_workers)
            run.record(t, problem.test_loss(w))
        run.final_weights = w
        return run
    if model == "easgd":
        return _easgd(problem, run, w, rng, n_workers, horizon, lr, straggler, slowdown,
                      straggle_prob, tau, alpha)
    return _async(problem, run, w, rng, n_workers, horizon, lr, straggler, slowdown, straggle_prob,
                  math.inf if model == "asp" else staleness)


def _async(problem, run, w, rng, n, horizon, lr, straggler, slowdown, straggle_prob, staleness) -> Run:
    """ASP (``staleness = inf``) and SSP: pushes applied on arrival, reads gated by the clock."""
    clock = SSPClock(n, staleness)
    version = 0  # updates applied so far
    events: list[tuple[float, int, int, np.ndarray]] = []  # (finish time, worker, version read, grad)
    waiting: list[int] = []

    def start(worker: int, now: float) -> None:
        run.reads.append((worker, clock.clocks[worker], clock.slowest()))
        dt = float(step_times(rng, n, straggler, slowdown, straggle_prob)[worker])
        heapq.heappush(events, (now + dt, worker, version, problem.grad(w)))

    for i in range(n):
        start(i, 0.0)
    while events:
        now, worker, read_version, g = heapq.heappop(events)
        if now > horizon:
            break
        w -= lr * g
        run.staleness.append(version - read_version)
        version += 1
        clock.tick(worker)
        run.record(now, problem.test_loss(w))
        waiting.append(worker)
        for i in list(waiting):
            if clock.can_read(i):
                waiting.remove(i)
                start(i, now)
    run.final_weights = w
    return run


def _easgd(problem, run, center, rng, n, horizon, lr, straggler, slowdown, straggle_prob, tau, alpha) -> Run:
    """Asynchronous EASGD: local SGD steps; every ``tau`` steps an elastic exchange with the centre."""
    local = [center.copy() for _ in range(n)]
    steps = [0] * n
    events = [(float(step_times(rng, n, straggler, slowdown, straggle_prob)[i]), i) for i in range(n)]
    heapq.heapify(events)
    while events:
        now, i = heapq.heappop(events)
        if now > horizon:
            break
        local[i] -= lr * problem.grad(local[i])
        steps[i] += 1
        if steps[i] % tau == 0:
            diff = alpha * (local[i] - center)
            local[i] -= diff
            center += diff
            run.record(now, problem.test_loss(center))
        heapq.heappush(events, (now + float(step_times(rng, n, straggler, slowdown, straggle_prob)[i]), i))
    run.final_weights = center
    return run
