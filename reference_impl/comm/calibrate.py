"""Measure α, β and γ on the communicator you have, so the cost model predicts *your* times.

* ``pingpong``: ranks 0 and 1 bounce a message of ``m`` bytes back and forth; half of a
  round trip is the one-way time ``t(m)`` of the α–β model. Each size gets warm-up round
  trips first (first-touch page faults, connection set-up and lazy initialisation inside
  the MPI library would otherwise land in the first timing), then ``repeats`` timed round
  trips, of which the median is kept: one descheduled rank spoils a mean, not a median.
* ``reduction_time``: the time of ``a += b`` on arrays of ``m`` bytes, the work a ring
  step does on what it received; its slope against ``m`` is γ.
* ``calibrate``: both sweeps, both fits (``cost_model.fit_alpha_beta`` and ``fit_gamma``),
  the same ``LinkParams`` returned on every rank.

Every function takes a ``clock``: ``time.perf_counter`` for real time, or the ``now`` of a
``SimulatedNetwork`` (``simnet.py``) to read the simulated time, in which case calibration
recovers the simulated link's α and β exactly.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from types import ModuleType
from typing import Any, Callable, Sequence

from .communicator import Communicator
from .cost_model import FittedLinkParams, fit_alpha_beta, fit_gamma

PINGPONG_SIZES = tuple(2**k for k in range(3, 25))  # 8 B .. 16 MiB
REDUCTION_SIZES = tuple(2**k for k in range(16, 25))  # 64 KiB .. 16 MiB: above the call overhead
PINGPONG_TAG = 301  # any tag works; a small one suits every Communicator


def _check_sizes(sizes: Sequence[int], what: str) -> list[int]:
    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 0 for s in sizes):
        raise ValueError(f"{what}: sizes must be a non-empty list of byte counts >= 0, got {sizes}")
    return sizes


# --8<-- [start:pingpong]
def pingpong(
    comm: Communicator,
    sizes: Sequence[int],
    repeats: int = 20,
    warmup: int = 3,
    clock: Callable[[], float] = time.perf_counter,
    xp: ModuleType | None = None,
) -> list[float] | None:
    """One-way message time per size (median of ``repeats`` half round trips), on rank 0.

    Ranks 0 and 1 take part; rank 0 returns the times, rank 1 returns ``None`` after
    echoing every message, and any other rank returns ``None`` at once (it has nothing to
    do). Messages are arrays of ``uint8`` from ``xp`` (NumPy unless given).
    """
    if comm.size < 2:
        raise ValueError(f"pingpong needs at least 2 ranks, the communicator has {comm.size}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"pingpong: need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    sizes = _check_sizes(sizes, "pingpong")
    if comm.rank > 1:
        return None
    if xp is None:
        import numpy as xp

    peer = 1 - comm.rank
    times: list[float] = []
    for m in sizes:
        buf = xp.zeros((m,), dtype=xp.uint8)
        halves = []
        for i in range(warmup + repeats):
            if comm.rank == 0:
                t0 = clock()
                comm.send(buf, peer, PINGPONG_TAG)
                comm.recv(buf, peer, PINGPONG_TAG)
                if i >= warmup:
                    halves.append((clock() - t0) / 2)
            else:
                comm.recv(buf, peer, PINGPONG_TAG)
                comm.send(buf, peer, PINGPONG_TAG)
        if comm.rank == 0:
            times.append(statistics.median(halves))
    return times if comm.rank == 0 else None
# --8<-- [end:pingpong]


def reduction_time(
    xp: ModuleType,
    sizes: Sequence[int],
    repeats: int = 10,
    warmup: int = 2,
    dtype: Any = None,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] | None = None,
) -> list[float]:
    """Median seconds of the in-place reduction ``a += b`` on arrays of ``m`` bytes, per size.

    ``dtype`` defaults to ``xp.float32``; a size that is not a multiple of its item size is
    rounded down. On a GPU namespace pass ``sync`` (e.g. a device synchronise) so that the
    clock reads the end of the work, not the end of its launch.
    """
    sizes = _check_sizes(sizes, "reduction_time")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"reduction_time: need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    dtype = xp.float32 if dtype is None else dtype
    item = xp.finfo(dtype).bits // 8 if xp.isdtype(dtype, "real floating") else xp.iinfo(dtype).bits // 8
    times = []
    for m in sizes:
        a = xp.ones((m // item,), dtype=dtype)
        b = xp.ones((m // item,), dtype=dtype)
        samples = []
        for i in range(warmup + repeats):
            t0 = clock()
            a += b
            if sync is not None:
                sync()
            if i >= warmup:
                samples.append(clock() - t0)
        times.append(statistics.median(samples))
    return times


def _share_from_rank0(comm: Communicator, values: list[float] | None, count: int) -> list[float]:
    """Every rank gets rank 0's ``values`` (rank 0 sends to each rank in turn)."""
    import numpy as np

    buf = np.asarray(values if comm.rank == 0 else [0.0] * count, dtype=np.float64)
    if comm.rank == 0:
        for dest in range(1, comm.size):
            comm.send(buf, dest, PINGPONG_TAG + 1)
    else:
        comm.recv(buf, 0, PINGPONG_TAG + 1)
    return buf.tolist()


# --8<-- [start:calibrate]
def calibrate(
    comm: Communicator,
    sizes: Sequence[int] = PINGPONG_SIZES,
    repeats: int = 20,
    reduction_sizes: Sequence[int] = REDUCTION_SIZES,
    clock: Callable[[], float] = time.perf_counter,
    xp: ModuleType | None = None,
) -> FittedLinkParams:
    """Measure and fit α and β (ping-pong between ranks 0 and 1) and γ (rank 0's reduction).

    Call it on every rank: all get the same ``FittedLinkParams``. ``reduction_sizes=()``
    skips γ (it stays 0), which is what a simulated network wants: its clock only moves
    for messages, so a reduction takes no simulated time.
    """
    if xp is None:
        import numpy as xp
    sizes = _check_sizes(sizes, "calibrate")
    one_way = pingpong(comm, sizes, repeats=repeats, clock=clock, xp=xp)
    gamma_s = None
    if comm.rank == 0 and reduction_sizes:
        gamma_s = reduction_time(xp, reduction_sizes, repeats=max(3, repeats // 2))
    shared = _share_from_rank0(comm, None if comm.rank else one_way + (gamma_s or []),
                               len(sizes) + (len(reduction_sizes) if reduction_sizes else 0))
    link = fit_alpha_beta(sizes, shared[: len(sizes)])
    if reduction_sizes:
        link = dataclasses.replace(link, gamma=fit_gamma(reduction_sizes, shared[len(sizes):]))
    return link
# --8<-- [end:calibrate]
