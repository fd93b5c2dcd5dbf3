"""Ring allreduce: every rank ends with the element-wise reduction of every rank's array.

The array is cut into ``n`` chunks (one per rank; sizes differ by at most one element).
Two phases of ``n - 1`` steps each, every rank sending to its right neighbour and
receiving from its left one at every step:

1. **reduce-scatter**: at step ``s`` rank ``r`` sends chunk ``r - s`` and adds the chunk
   ``r - s - 1`` it receives into its own copy. After ``n - 1`` steps rank ``r`` holds the
   complete reduction of chunk ``r + 1``.
2. **allgather**: the complete chunks travel once more round the ring, each received
   chunk overwriting the stale copy, until every rank has every complete chunk.

Each rank sends ``2 (n - 1)`` chunks, i.e. ``2 (n - 1) / n`` times the array: within a
factor ``(n - 1) / n`` of the minimum any algorithm needs, whatever ``n`` is. That is why
its cost for large arrays is ``2 (n - 1) / n * N / bandwidth`` and does not grow with the
number of ranks (see docs/concepts/allreduce-vs-parameter-servers.md).

Only array API standard calls touch the data, so the same code runs on NumPy, CuPy and
``array_api_strict``. One assumption goes beyond the standard: a message is received
straight into a slice of the output (``out[lo:hi]``), which needs slicing to return a view.
NumPy, CuPy and array_api_strict all do; it saves a copy of every chunk at every step.
"""
from __future__ import annotations

from typing import Any

from ..backend import namespace_of
from .communicator import CommError, Communicator

ALGORITHMS = ("ring",)
OPS = ("sum", "prod", "max", "min", "mean")


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


def _reduce_into(op: str, xp: Any, out: Any, lo: int, hi: int, mine: Any) -> None:
    """``out[lo:hi] = out[lo:hi] (op) mine``; sum and prod in place, with no temporary."""
    if op in ("sum", "mean"):
        out[lo:hi] += mine
    elif op == "prod":
        out[lo:hi] *= mine
    elif op == "max":
        out[lo:hi] = xp.maximum(out[lo:hi], mine)
    else:
        out[lo:hi] = xp.minimum(out[lo:hi], mine)


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
        _reduce_into(op, xp, out, rlo, rhi, x[rlo:rhi])


def ring_allgather(comm: Communicator, out: Any, bounds: list[tuple[int, int]]) -> None:
    """Phase 2: starting from complete chunk ``rank + 1``, receive every other complete chunk."""
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        (slo, shi), (rlo, rhi) = bounds[(r + 1 - s) % n], bounds[(r - s) % n]
        comm.sendrecv(out[slo:shi], right, out[rlo:rhi], left)


def allreduce(
    comm: Communicator, x: Any, algorithm: str = "ring", op: str = "sum", out: Any = None
) -> Any:
    """Reduce ``x`` element-wise over all ranks with ``op``; every rank gets the result.

    ``x`` is any array with the same number of elements and dtype on every rank; it is not
    modified. The result has ``x``'s shape and dtype. ``out``, like MPI's receive buffer,
    is an optional 1-D array of ``x``'s size and dtype (not sharing memory with ``x``) to
    hold the result, so a training loop can reuse one buffer every step. Integer-valued data
    gives results exactly equal to NumPy's; float sums may differ in the last bits because
    the ring adds in a different order.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"allreduce: unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    if op not in OPS:
        raise ValueError(f"allreduce: unknown op {op!r}; expected one of {OPS}")
    try:
        xp = namespace_of(x)
    except TypeError as exc:
        raise TypeError(f"allreduce on rank {comm.rank}: {exc}") from None
    if op == "mean" and not xp.isdtype(x.dtype, ("real floating", "complex floating")):
        raise TypeError(f"allreduce on rank {comm.rank}: op='mean' needs a floating dtype, got {x.dtype}")

    flat = xp.reshape(x, (-1,))
    n_elements = flat.shape[0]
    if out is None:
        out = xp.empty((n_elements,), dtype=x.dtype)
    elif out is x or tuple(out.shape) != (n_elements,) or out.dtype != x.dtype:
        raise ValueError(
            f"allreduce on rank {comm.rank}: out must be a separate 1-D array of {n_elements} "
            f"{x.dtype} elements, got shape {tuple(out.shape)} and dtype {out.dtype}"
        )
    bounds = chunk_bounds(n_elements, comm.size)
    if comm.size == 1:
        out[0:n_elements] = flat
    try:
        ring_reduce_scatter(comm, flat, out, bounds, op)
        ring_allgather(comm, out, bounds)
    except CommError as exc:
        raise CommError(
            f"allreduce on rank {comm.rank} (input of {n_elements} elements, {x.dtype}): {exc}. "
            "Every rank must pass the same number of elements and the same dtype."
        ) from exc
    result = xp.reshape(out, tuple(x.shape))
    if op == "mean":
        result = result / comm.size
    return result
