"""Rabenseifner's allreduce: recursive-halving reduce-scatter, then recursive-doubling allgather.

The ring's two phases, each done in ``log2(p)`` steps instead of ``p - 1``
(Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005). With the array cut into ``p``
chunks (``chunk_bounds``), rank ``r`` is responsible for chunk ``r``:

1. **Reduce-scatter by recursive halving.** Each rank starts responsible for all ``p``
   chunks. At each step it pairs with the rank whose number differs in the highest bit not
   yet used, sends the half of its current block the partner will keep, receives the half
   it keeps, and combines. The block halves every step: ``N/2 + N/4 + ... + N/p`` bytes
   sent, and after ``log2(p)`` steps rank ``r`` holds the complete reduction of chunk ``r``.
2. **Allgather by recursive doubling.** The same pairs in reverse order: each rank sends
   the complete block it has and receives the partner's, so the block doubles every step
   until every rank holds every chunk; the same ``(p - 1) / p * N`` bytes again.

That is the ring's ``2 (p - 1) / p * N`` bytes per rank (bandwidth-optimal) in
``2 log2(p)`` steps instead of ``2 (p - 1)``: the best of both for long messages when ``p``
is large. Rank counts that are not a power of two are folded first, exactly as in
recursive doubling (``fold_in`` / ``fold_out``): the extra ranks' whole arrays make two
extra full-size messages, which is why MPI libraries treat non-powers of two separately.
"""
from __future__ import annotations

from typing import Any

from ..backend import namespace_of
from .communicator import Communicator
from .ops import combine
from .recursive_doubling import fold_in, fold_out, largest_power_of_two
from .ring import chunk_bounds


def _span(bounds: list[tuple[int, int]], first: int, count: int) -> tuple[int, int]:
    """Element range ``(lo, hi)`` of the ``count`` consecutive chunks starting at ``first``."""
    return bounds[first][0], bounds[first + count - 1][1]


# --8<-- [start:rabenseifner]
def halving_reduce_scatter(comm: Communicator, out: Any, bounds: list[tuple[int, int]], op: str) -> None:
    """Recursive halving among ranks ``0 .. p2 - 1``: afterwards chunk ``rank`` of ``out`` is complete.

    ``bounds`` cuts ``out`` into ``p2`` chunks. The partner of step ``half`` is
    ``rank XOR half``, with ``half = p2/2, p2/4, ..., 1``: the rank with the bit clear keeps
    the lower half of the current block, the other the upper half.
    """
    xp = namespace_of(out)
    r, p2 = comm.rank, len(bounds)
    incoming = xp.empty_like(out)
    first, half = 0, p2 // 2  # the current block is chunks first .. first + 2 * half - 1
    while half >= 1:
        partner = r ^ half
        if r & half:
            keep, give = first + half, first
        else:
            keep, give = first, first + half
        (klo, khi), (glo, ghi) = _span(bounds, keep, half), _span(bounds, give, half)
        comm.sendrecv(out[glo:ghi], partner, incoming[0:khi - klo], partner)
        combine(op, xp, out[klo:khi], incoming[0:khi - klo])
        first, half = keep, half // 2


def doubling_allgather(comm: Communicator, out: Any, bounds: list[tuple[int, int]]) -> None:
    """Recursive doubling among ranks ``0 .. p2 - 1``, starting from complete chunk ``rank``.

    At step ``size = 1, 2, ..., p2/2`` each rank holds ``size`` complete chunks, sends them
    to ``rank XOR size`` and receives that rank's ``size`` chunks straight into ``out``.
    """
    r, p2 = comm.rank, len(bounds)
    size = 1
    while size < p2:
        partner = r ^ size
        (mlo, mhi) = _span(bounds, r - r % size, size)
        (plo, phi) = _span(bounds, partner - partner % size, size)
        comm.sendrecv(out[mlo:mhi], partner, out[plo:phi], partner)
        size *= 2


def rabenseifner_allreduce(comm: Communicator, x: Any, out: Any, op: str = "sum") -> None:
    """Allreduce 1-D ``x`` into 1-D ``out``: halving reduce-scatter, doubling allgather, plus the fold."""
    out[...] = x
    if fold_in(comm, out, op):
        bounds = chunk_bounds(out.shape[0], largest_power_of_two(comm.size))
        halving_reduce_scatter(comm, out, bounds, op)
        doubling_allgather(comm, out, bounds)
    fold_out(comm, out)
# --8<-- [end:rabenseifner]
