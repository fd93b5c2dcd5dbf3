"""The ring: reduce-scatter and allgather in ``n - 1`` neighbour steps each, and allreduce as both.

The array is cut into ``n`` chunks (one per rank; sizes differ by at most one element).
Every rank sends to its right neighbour and receives from its left one at every step:

1. **reduce-scatter**: at step ``s`` rank ``r`` sends chunk ``r - s`` and adds the chunk
   ``r - s - 1`` it receives into its own copy. After ``n - 1`` steps rank ``r`` holds the
   complete reduction of chunk ``r + 1``.
2. **allgather**: the complete chunks travel once more round the ring, each received
   chunk overwriting the stale copy, until every rank has every complete chunk.

Each rank sends ``2 (n - 1)`` chunks, i.e. ``2 (n - 1) / n`` times the array: within a
factor ``(n - 1) / n`` of the minimum any algorithm needs, whatever ``n`` is. That is why
its cost for large arrays is ``2 (n - 1) / n * N / bandwidth`` and does not grow with the
number of ranks (see docs/concepts/allreduce-vs-parameter-servers.md). The price is
``2 (n - 1)`` message latencies, linear in ``n``: the other algorithms (recursive doubling,
Rabenseifner, trees) trade bytes for fewer steps (docs/concepts/allreduce-algorithms.md).

The two phases are also collectives of their own, ``reduce_scatter`` and ``allgather``
(MPI's ``MPI_Reduce_scatter`` and ``MPI_Allgatherv``), at the end of this file.

Only array API standard calls touch the data, so the same code runs on NumPy, CuPy and
``array_api_strict``. One assumption goes beyond the standard: a message is received
straight into a slice of the output (``out[lo:hi]``), which needs slicing to return a view.
NumPy, CuPy and array_api_strict all do; it saves a copy of every chunk at every step.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..backend import namespace_of
from .checks import check_input, explain_mismatch
from .communicator import Communicator
from .ops import combine, finish


def chunk_bounds(n_elements: int, n_ranks: int) -> list[tuple[int, int]]:
    """Split ``range(n_elements)`` into ``n_ranks`` contiguous ``(lo, hi)`` pieces.

    The first ``n_elements % n_ranks`` pieces get one extra element, so sizes differ by at
    most one; pieces may be empty when there are fewer elements than ranks.
    """
    q, extra = divmod(n_elements, n_ranks)
    bounds = []
    for i in range(n_ranks):
        lo = i * q + min(i, extra)
        bounds.append((lo, lo + q + (1 if i < extra else 0)))
    return bounds


# --8<-- [start:ring]
def ring_reduce_scatter(
    comm: Communicator, x: Any, out: Any, bounds: list[tuple[int, int]], op: str = "sum"
) -> None:
    """Phase 1: afterwards ``out``'s chunk ``(rank + 1) % size`` holds the complete reduction.

    ``x`` (this rank's input, 1-D) is only read: the first step sends straight from it, and
    every received partial result lands in ``out`` where this rank's own share is added.
    """
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    xp = namespace_of(x)
    for s in range(n - 1):
        (slo, shi), (rlo, rhi) = bounds[(r - s) % n], bounds[(r - s - 1) % n]
        source = x if s == 0 else out  # after step 0 we forward what we just reduced
        comm.sendrecv(source[slo:shi], right, out[rlo:rhi], left)
        combine(op, xp, out[rlo:rhi], x[rlo:rhi])


def ring_allgather(comm: Communicator, out: Any, bounds: list[tuple[int, int]]) -> None:
    """Phase 2: starting from complete chunk ``rank + 1``, receive every other complete chunk."""
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        (slo, shi), (rlo, rhi) = bounds[(r + 1 - s) % n], bounds[(r - s) % n]
        comm.sendrecv(out[slo:shi], right, out[rlo:rhi], left)


def ring_allreduce(comm: Communicator, x: Any, out: Any, op: str = "sum") -> None:
    """Allreduce 1-D ``x`` into 1-D ``out``: ``2 (n - 1)`` steps of ``N / n`` elements each."""
    bounds = chunk_bounds(x.shape[0], comm.size)
    if comm.size == 1:
        out[...] = x
    ring_reduce_scatter(comm, x, out, bounds, op)
    ring_allgather(comm, out, bounds)
# --8<-- [end:ring]


def _owned_by_rank(bounds: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Relabel the chunks so that the ring's "rank r completes chunk r + 1" becomes chunk r.

    The ring phases finish with rank ``r`` holding chunk ``r + 1`` of the bounds they are
    given; given these bounds, that chunk is ``bounds[r]``, the one MPI assigns to rank r.
    """
    return bounds[-1:] + bounds[:-1]


def reduce_scatter(comm: Communicator, x: Any, op: str = "sum") -> Any:
    """Reduce ``x`` over all ranks and return only this rank's chunk of the result.

    The chunk is ``chunk_bounds(x.size, comm.size)[comm.rank]`` of the flattened array
    (so ranks get sizes that differ by at most one, and empty chunks when there are fewer
    elements than ranks), as ``MPI_Reduce_scatter`` with those counts. Ring algorithm:
    ``n - 1`` steps, ``(n - 1) / n`` of the array sent per rank.
    """
    xp = check_input(comm, x, op, "reduce_scatter")
    flat = xp.reshape(x, (-1,))
    bounds = chunk_bounds(flat.shape[0], comm.size)
    work = xp.empty_like(flat)
    if comm.size == 1:
        work[...] = flat
    with explain_mismatch(comm, "reduce_scatter", x):
        ring_reduce_scatter(comm, flat, work, _owned_by_rank(bounds), op)
    lo, hi = bounds[comm.rank]
    return finish(op, xp.asarray(work[lo:hi], copy=True), comm.size)


def allgather(comm: Communicator, x: Any, sizes: Sequence[int] | None = None) -> Any:
    """Concatenate every rank's (flattened) ``x`` in rank order; every rank gets the result.

    The pieces may differ in size, as in ``MPI_Allgatherv``. Like MPI's ``recvcounts``,
    ``sizes`` (elements per rank) may be given if every rank knows them; otherwise a ring
    allgather of the sizes runs first, which costs ``n - 1`` more (tiny) messages.
    """
    xp = check_input(comm, x, None, "allgather")
    flat = xp.reshape(x, (-1,))
    n, r = comm.size, comm.rank
    if sizes is None:
        counts = xp.zeros((n,), dtype=xp.int64)
        counts[r] = flat.shape[0]
        with explain_mismatch(comm, "allgather", x, "the same dtype"):
            ring_allgather(comm, counts, _owned_by_rank(chunk_bounds(n, n)))
        sizes = [int(counts[i]) for i in range(n)]
    elif len(sizes) != n or sizes[r] != flat.shape[0]:
        raise ValueError(
            f"allgather on rank {r}: sizes={list(sizes)} must list {n} counts with this rank's "
            f"{flat.shape[0]} elements at position {r}"
        )
    bounds, lo = [], 0
    for size in sizes:
        bounds.append((lo, lo + size))
        lo += size
    out = xp.empty((lo,), dtype=flat.dtype)
    out[bounds[r][0]:bounds[r][1]] = flat
    with explain_mismatch(comm, "allgather", x, "the same dtype (and the same sizes, if given)"):
        ring_allgather(comm, out, _owned_by_rank(bounds))
    return out
