"""The stale-synchronous-parallel clock: a vector of per-worker step counts with a bound.

Worker ``i``'s clock is the number of steps it has finished (its pushes so far). Under SSP
with staleness bound ``s`` a worker at clock ``c`` may start step ``c`` (read the
parameters) only while the slowest worker's clock is at least ``c - s``: then every
update from steps ``< c - s`` of *every* worker is already in what it reads, so what it
reads is at most ``s`` clocks stale. ``s = 0`` is BSP (everyone in lock step, though
updates are still applied one push at a time); ``s = inf`` is fully asynchronous (ASP).

``can_read`` is the check an event-driven simulation uses; ``wait_to_read`` is the same
rule for real threads: it blocks until the slowest worker catches up, and times out
with an error naming the worker everyone is waiting for, instead of hanging.
"""
from __future__ import annotations

import math
import threading


# --8<-- [start:clock]
class SSPClock:
    """Per-worker clocks and the rule that no worker runs more than ``staleness`` ahead."""

    def __init__(self, n_workers: int, staleness: float):
        if n_workers < 1:
            raise ValueError(f"SSPClock: need at least one worker, got {n_workers}")
        if not staleness >= 0:
            raise ValueError(f"SSPClock: staleness must be >= 0 (or math.inf), got {staleness}")
        self.clocks = [0] * n_workers
        self.staleness = staleness
        self._cond = threading.Condition()

    def slowest(self) -> int:
        """The smallest clock: the step the slowest worker is on."""
        return min(self.clocks)

    def can_read(self, worker: int) -> bool:
        """May ``worker`` start its next step now? (``clock - slowest <= staleness``)."""
        return self.clocks[worker] - self.slowest() <= self.staleness

    def tick(self, worker: int) -> None:
        """``worker`` finished a step (its gradient is pushed): advance its clock, wake waiters."""
        with self._cond:
            self.clocks[worker] += 1
            self._cond.notify_all()

    def wait_to_read(self, worker: int, timeout: float = 30.0) -> int:
        """Block until ``worker`` may read; return the slowest clock seen when it may."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.can_read(worker), timeout):
                lag = min(range(len(self.clocks)), key=self.clocks.__getitem__)
                raise TimeoutError(
                    f"SSP: worker {worker} at clock {self.clocks[worker]} waited {timeout:g} s for "
                    f"worker {lag} (clock {self.clocks[lag]}) to come within {self.staleness} clocks"
                )
            return self.slowest()
# --8<-- [end:clock]

    def __repr__(self) -> str:
        bound = "inf" if math.isinf(self.staleness) else self.staleness
        return f"SSPClock(clocks={self.clocks}, staleness={bound})"
