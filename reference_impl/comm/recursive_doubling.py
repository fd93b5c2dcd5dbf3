"""Recursive doubling: allreduce in ``log2(p)`` exchanges of the whole array.

At step ``k = 0, 1, ...`` rank ``r`` swaps its whole partial result with rank
``r XOR 2**k`` and combines the two. After step ``k`` each rank holds the reduction over a
group of ``2**(k + 1)`` ranks (the ranks that agree with it on every bit above ``k``), so
after ``log2(p)`` steps every rank holds the reduction over all of them. Both partners of a
pair compute ``a (op) b`` from the same two arrays, so every rank ends with bit-identical
results, floats included.

Fewest possible steps (``log2 p``, one ``alpha`` each), but every step moves the whole
array: ``log2(p) * N`` bytes per rank, against the ring's ``2 (p - 1) / p * N``. That makes
it the algorithm of choice for short messages, where latency dominates, and a poor one for
long messages (the comparison is in docs/concepts/allreduce-algorithms.md).

**Rank counts that are not a power of two** are folded first. With ``p2`` the largest power
of two ``<= p``, each of the ``p - p2`` *extra* ranks ``r >= p2`` sends its array to partner
``r - p2``, which combines it into its own, and then waits; ranks ``0 .. p2 - 1`` run the
exchanges; at the end each partner sends the result back to its extra rank. That costs two
more whole-array messages on the partners' critical path, whatever ``p - p2`` is.
Rabenseifner's algorithm (rabenseifner.py) uses the same fold.
"""
from __future__ import annotations

from typing import Any

from ..backend import namespace_of
from .communicator import Communicator
from .ops import combine


def largest_power_of_two(p: int) -> int:
    """The largest power of two ``<= p`` (``p >= 1``): how many ranks the exchanges use."""
    return 1 << (p.bit_length() - 1)


# --8<-- [start:recursive_doubling]
def fold_in(comm: Communicator, out: Any, op: str) -> bool:
    """Fold the extra ranks into their partners; True if this rank takes part in the exchanges.

    Extra rank ``r >= p2`` sends ``out`` to ``r - p2``; that partner combines it into its
    own ``out``. Call ``fold_out`` with the same arguments once the exchanges are done.
    """
    p2, r = largest_power_of_two(comm.size), comm.rank
    if r >= p2:
        comm.send(out, r - p2)
        return False
    if r + p2 < comm.size:
        incoming = namespace_of(out).empty_like(out)
        comm.recv(incoming, r + p2)
        combine(op, namespace_of(out), out, incoming)
    return True


def fold_out(comm: Communicator, out: Any) -> None:
    """Give every extra rank the finished result: partner ``r`` sends it to ``r + p2``."""
    p2, r = largest_power_of_two(comm.size), comm.rank
    if r >= p2:
        comm.recv(out, r - p2)
    elif r + p2 < comm.size:
        comm.send(out, r + p2)


def recursive_doubling_allreduce(comm: Communicator, x: Any, out: Any, op: str = "sum") -> None:
    """Allreduce 1-D ``x`` into 1-D ``out``: ``log2(p2)`` whole-array exchanges, plus the fold."""
    xp = namespace_of(x)
    out[...] = x
    if fold_in(comm, out, op):
        p2, r = largest_power_of_two(comm.size), comm.rank
        incoming = xp.empty_like(out)
        distance = 1
        while distance < p2:
            partner = r ^ distance
            comm.sendrecv(out, partner, incoming, partner)
            combine(op, xp, out, incoming)
            distance *= 2
    fold_out(comm, out)
# --8<-- [end:recursive_doubling]
