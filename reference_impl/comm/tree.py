"""Binomial trees: reduce to a root, broadcast from a root, and allreduce as the two in a row.

Number the ranks relative to the root, ``v = (rank - root) % p``. In the binomial tree the
parent of ``v`` is ``v`` with its lowest set bit cleared, so rank ``v`` has children
``v + 1, v + 2, v + 4, ...`` below its lowest set bit, and the tree is ``ceil(log2 p)``
levels deep for any ``p``, a power of two or not.

* **Broadcast**: in round ``k`` every rank that already has the data sends it ``2**k``
  further on, so the set of ranks holding it doubles each round: ``ceil(log2 p)`` rounds of
  the whole array. The root sends in every round, ``ceil(log2 p) * N`` bytes in all.
* **Reduce**: the same tree backwards. A rank waits for its children (nearest first),
  combines their partial results into its own, and sends one array to its parent.

The tree allreduce (reduce to rank 0, then broadcast from it) needs ``2 ceil(log2 p)``
steps, like Rabenseifner's algorithm, but every step moves the whole array and the root's
link carries ``ceil(log2 p)`` arrays each way: it loses to recursive doubling on short
messages and to the ring on long ones. It is here because reduce and broadcast are
collectives of their own, and because NCCL's trees show what fixes it: pipelining the array
in small pieces down two complementary trees (docs/concepts/allreduce-algorithms.md).
"""
from __future__ import annotations

from typing import Any

from ..backend import namespace_of
from .checks import check_input, explain_mismatch
from .communicator import Communicator
from .ops import combine, finish


# --8<-- [start:tree]
def binomial_reduce(comm: Communicator, buf: Any, op: str, root: int = 0) -> None:
    """Reduce every rank's ``buf`` into the root's ``buf``; the other ranks' ``buf`` is scratch."""
    p, v = comm.size, (comm.rank - root) % comm.size
    xp = namespace_of(buf)
    incoming = None
    bit = 1
    while bit < p:
        if v & bit:  # my lowest set bit: all my children have reported, pass the result up
            comm.send(buf, (v - bit + root) % p)
            return
        if v + bit < p:
            if incoming is None:
                incoming = xp.empty_like(buf)
            comm.recv(incoming, (v + bit + root) % p)
            combine(op, xp, buf, incoming)
        bit *= 2


def binomial_broadcast(comm: Communicator, buf: Any, root: int = 0) -> None:
    """Copy the root's ``buf`` into every other rank's ``buf`` (same shape and dtype)."""
    p, v = comm.size, (comm.rank - root) % comm.size
    bit = 1
    while bit < p:  # find my parent: my lowest set bit (the root has none)
        if v & bit:
            comm.recv(buf, (v - bit + root) % p)
            break
        bit *= 2
    bit //= 2
    while bit >= 1:  # then pass it on to my children, farthest first
        if v + bit < p:
            comm.send(buf, (v + bit + root) % p)
        bit //= 2


def tree_allreduce(comm: Communicator, x: Any, out: Any, op: str = "sum") -> None:
    """Allreduce 1-D ``x`` into 1-D ``out``: binomial reduce to rank 0, then binomial broadcast."""
    out[...] = x
    binomial_reduce(comm, out, op, root=0)
    binomial_broadcast(comm, out, root=0)
# --8<-- [end:tree]


def _check_root(comm: Communicator, root: int, who: str) -> None:
    if not 0 <= root < comm.size:
        raise ValueError(f"{who} on rank {comm.rank}: root {root} is outside 0..{comm.size - 1}")


def broadcast(comm: Communicator, x: Any, root: int = 0) -> Any:
    """Every rank gets the root's ``x``: written into ``x`` on the other ranks, and returned.

    As in ``MPI_Bcast``, the non-root ranks pass a buffer of the root's shape and dtype,
    which is overwritten. Binomial tree: ``ceil(log2 p)`` rounds of the whole array.
    """
    check_input(comm, x, None, "broadcast")
    _check_root(comm, root, "broadcast")
    with explain_mismatch(comm, "broadcast", x, f"an array of root {root}'s size and dtype"):
        binomial_broadcast(comm, x, root)
    return x


def reduce(comm: Communicator, x: Any, root: int = 0, op: str = "sum") -> Any | None:
    """Reduce ``x`` over all ranks with ``op``: the root gets the result, the others ``None``.

    ``x`` is not modified; the result has its shape and dtype. Binomial tree:
    ``ceil(log2 p)`` rounds, every rank but the root sends its (partial) result once.
    """
    xp = check_input(comm, x, op, "reduce")
    _check_root(comm, root, "reduce")
    buf = xp.asarray(xp.reshape(x, (-1,)), copy=True)
    with explain_mismatch(comm, "reduce", x):
        binomial_reduce(comm, buf, op, root)
    if comm.rank != root:
        return None
    return xp.reshape(finish(op, buf, comm.size), tuple(x.shape))
