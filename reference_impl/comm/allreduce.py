"""``allreduce``: every rank ends with the element-wise reduction of every rank's array.

One entry point, four algorithms, each in its own module because each is its own idea
(and ``"library"``, which hands the call to the MPI or torch.distributed collective):

    algorithm            module                 steps            bytes sent per rank
    ring                 ring.py                2 (p - 1)        2 (p - 1) / p * N
    recursive_doubling   recursive_doubling.py  log2 p           log2(p) * N
    rabenseifner         rabenseifner.py        2 log2 p         2 (p - 1) / p * N
    tree                 tree.py                2 ceil(log2 p)   up to ceil(log2 p) * N

(steps and bytes for a power of two ``p``; the other rank counts add a fold, see
recursive_doubling.py). ``algorithm="auto"`` asks the α–β–γ cost model
(``cost_model.best_allreduce``) which one is predicted fastest for this message size and
rank count, as MPI libraries do with their built-in thresholds. Every algorithm gives
results exactly equal to NumPy's for integer-valued data; float sums may differ in the last
bits between algorithms, because each adds in its own order.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from .checks import check_input, explain_mismatch
from .communicator import Communicator, itemsize
from .cost_model import LinkParams, best_allreduce
from .ops import finish
from .rabenseifner import rabenseifner_allreduce
from .recursive_doubling import recursive_doubling_allreduce
from .ring import ring_allreduce
from .tree import tree_allreduce

IMPLEMENTATIONS: dict[str, Callable[[Communicator, Any, Any, str], None]] = {
    "ring": ring_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "rabenseifner": rabenseifner_allreduce,
    "tree": tree_allreduce,
}
ALGORITHMS = (*IMPLEMENTATIONS, "auto")
# "library" is no algorithm of ours: it hands the whole call to the engine's own collective
# (MPICommunicator: MPI_Allreduce; TorchCommunicator: torch.distributed.all_reduce), the peer
# every algorithm here is measured against. A communicator without one (thread ranks, the
# simulated network, a generic SplitCommunicator, a CountingCommunicator, whose count would
# miss the library's traffic) raises NotImplementedError naming itself.
LIBRARY = "library"

# The link that "auto" assumes: ranks as processes on one multi-core host, exchanging
# NumPy arrays through MPICommunicator and the MPI library's shared memory. The numbers
# come from this project's own measurement, docs/assets/bench/allreduce.json (2 ranks,
# 2-core machine): alpha from the ring's 8-byte time, 23 us for its 2 (p - 1) = 2 steps,
# so about 11 us per step, almost all of it Python, mpi4py and NumPy call overhead (the MPI
# library's own allreduce of 8 bytes takes 5 us); gamma from timing NumPy's in-place
# float32 add on 4 MiB arrays, about 0.1 ns/byte; beta from the ring's 4 MiB time, 0.91 ms,
# which is N * beta + N / 2 * gamma (2 (p - 1) / p * N = N bytes sent, N / 2 reduced), so
# beta = 0.22 - 0.05 = 0.17 ns/byte. Another network has other numbers (e.g. 5 us and
# 0.08 ns/byte for 100 Gb/s InfiniBand with a compiled stack): pass link= to describe it.
AUTO_LINK = LinkParams(alpha=11e-6, beta=0.17e-9, gamma=0.1e-9)


# --8<-- [start:choose]
@functools.lru_cache(maxsize=4096)  # a training loop asks the same few questions every step
def choose_algorithm(n_bytes: int, n_ranks: int, link: LinkParams = AUTO_LINK) -> str:
    """The algorithm the cost model predicts fastest for ``n_bytes`` per rank on ``n_ranks``.

    Depends only on values every rank agrees on (the message size and the rank count), so
    all ranks pick the same algorithm without talking to each other. Ranks that disagree on
    the size may pick different algorithms; the job then fails on a message that does not
    fit or, at worst, at the communicator's timeout.
    """
    return best_allreduce(n_bytes, n_ranks, link, tuple(IMPLEMENTATIONS))


def allreduce(
    comm: Communicator,
    x: Any,
    algorithm: str = "ring",
    op: str = "sum",
    out: Any = None,
    link: LinkParams | None = None,
) -> Any:
    """Reduce ``x`` element-wise over all ranks with ``op``; every rank gets the result.

    ``x`` is any array with the same number of elements and dtype on every rank; it is not
    modified. The result has ``x``'s shape and dtype. ``out``, like MPI's receive buffer,
    is an optional 1-D array of ``x``'s size and dtype (not sharing memory with ``x``) to
    hold the result, so a training loop can reuse one buffer every step. ``algorithm`` is
    one of ``ALGORITHMS`` or ``"library"`` (the engine's own collective); with ``"auto"``, ``link`` (default ``AUTO_LINK``) describes the
    network the choice is made for. ``op`` is one of sum, prod, max, min, mean (floating
    dtypes only). A rank whose input does not match the others' raises ``CommError``.
    """
    if algorithm not in ALGORITHMS and algorithm != LIBRARY:
        raise ValueError(f"allreduce: unknown algorithm {algorithm!r}; expected one of {(*ALGORITHMS, LIBRARY)}")
    xp = check_input(comm, x, op, "allreduce")
    flat = xp.reshape(x, (-1,))
    n_elements = flat.shape[0]
    if out is None:
        out = xp.empty((n_elements,), dtype=x.dtype)
    elif out is x or tuple(out.shape) != (n_elements,) or out.dtype != x.dtype:
        raise ValueError(
            f"allreduce on rank {comm.rank}: out must be a separate 1-D array of {n_elements} "
            f"{x.dtype} elements, got shape {tuple(out.shape)} and dtype {out.dtype}"
        )
    if algorithm == "auto":
        algorithm = choose_algorithm(n_elements * itemsize(x), comm.size, link or AUTO_LINK)
    with explain_mismatch(comm, "allreduce", x, algorithm=algorithm):
        if algorithm == LIBRARY:
            comm.library_allreduce(flat, out, op)
        else:
            IMPLEMENTATIONS[algorithm](comm, flat, out, op)
    return xp.reshape(finish(op, out, comm.size), tuple(x.shape))
# --8<-- [end:choose]
