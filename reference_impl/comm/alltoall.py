"""All-to-all: every rank sends a distinct block to every rank (``MPI_Alltoall`` / ``MPI_Alltoallv``).

Rank ``r`` starts with blocks ``x[0], ..., x[p - 1]``; block ``j`` is meant for rank ``j``.
Afterwards rank ``r``'s block ``i`` is what rank ``i`` had in *its* block ``r``: over all
ranks, the ``p x p`` matrix of blocks is transposed. This is the collective behind
expert-parallel mixture-of-experts (tokens to their experts and back), distributed FFTs and
matrix transposes, and the shuffle of a sharded embedding lookup.

Two algorithms (Thakur, Rabenseifner & Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005, sec. 3.5; MPICH uses Bruck for short messages and
pairwise or "scattered" exchanges for long ones):

* **Pairwise exchange** (``"pairwise"``): ``p - 1`` steps; at step ``s`` rank ``r`` sends
  block ``(r + s) mod p`` to that rank and receives block ``r`` of rank ``(r - s) mod p``
  with one ``sendrecv``. Every block travels once, straight to its owner: each rank sends
  ``(p - 1) / p`` of its buffer, the minimum, in ``p - 1`` messages. With ``N`` the whole
  send buffer of a rank, in bytes::

      T_pairwise = (p - 1) * (alpha + N / p * beta)

  It works for any ``p`` and for uneven blocks, which is why ``alltoallv`` uses it.

* **Bruck** (``"bruck"``; Bruck, Ho, Kipnis, Upfal & Weathersby, "Efficient algorithms
  for all-to-all communications in multiport message-passing systems", IEEE TPDS 8(11),
  1997): ``ceil(log2 p)`` steps, store-and-forward. (1) Rotate locally so that index ``i``
  holds the block for rank ``r + i``. (2) At step ``k`` send every block whose index has bit
  ``k`` set to rank ``r + 2**k`` and receive the same indices from rank ``r - 2**k``: a
  block at index ``i`` moves ``i`` ranks in total, one set bit at a time, so it ends at its
  owner. (3) Undo the rotation (index ``i`` came from rank ``r - i``). Each step sends
  ``b_k = |{i < p : bit k of i is 1}|`` blocks of ``N / p`` bytes::

      T_bruck = ceil(log2 p) * alpha + sum_k b_k * N / p * beta

  For ``p`` a power of two ``b_k = p / 2``, so ``T_bruck = log2(p) * (alpha + N / 2 * beta)``
  (Thakur et al.'s form). For other ``p`` the step count is ``ceil(log2 p)`` and the bytes
  are the exact sum above (e.g. ``p = 3``: ``b = (1, 1)``, ``2 N / 3`` bytes; ``p = 5``:
  ``b = (2, 2, 1)``, ``N``). Fewer messages (``log2 p`` against ``p - 1``) for about
  ``log2(p) / 2`` times the bytes: the short-message algorithm.

Closed forms: ``pairwise_alltoall_time`` and ``bruck_alltoall_time`` in cost_model.py.

``alltoallv`` (uneven blocks, any of them empty) exchanges the counts first, with a pairwise
all-to-all of one ``int64`` per block (``p - 1`` tiny messages), unless the caller passes
``recv_counts`` (as MPI's ``recvcounts``), then runs the pairwise exchange on the data.

Only array API calls touch the data (NumPy, CuPy, array_api_strict); like ring.py, a
message is received straight into a slice of the output, which needs slicing to give views.
"""
from __future__ import annotations

from typing import Any, Sequence

from .checks import check_input, explain_mismatch
from .communicator import Communicator

ALLTOALL_ALGORITHMS = ("pairwise", "bruck")


def bruck_blocks_per_step(p: int) -> list[int]:
    """How many blocks Bruck's step ``k`` sends: the indices ``i < p`` with bit ``k`` set."""
    counts, bit = [], 1
    while bit < p:
        counts.append(sum(1 for i in range(p) if i & bit))
        bit *= 2
    return counts


def _pairwise(comm: Communicator, send: Any, out: Any) -> None:
    """``out[i] = (rank i's send[r])`` for 2-D ``send``/``out`` of shape ``(p, m)``."""
    p, r = comm.size, comm.rank
    out[r, ...] = send[r, ...]
    for s in range(1, p):
        dest, source = (r + s) % p, (r - s) % p
        comm.sendrecv(send[dest, ...], dest, out[source, ...], source)


def _bruck(comm: Communicator, xp: Any, send: Any, out: Any) -> None:
    """Bruck's index algorithm on 2-D ``send``/``out`` of shape ``(p, m)`` (see the module docstring)."""
    p, r = comm.size, comm.rank
    work = xp.empty_like(send)
    for i in range(p):  # (1) index i holds the block for rank r + i
        work[i, ...] = send[(r + i) % p, ...]
    bit = 1
    while bit < p:  # (2) blocks whose index has this bit set move 2**k ranks on
        idx = xp.asarray([i for i in range(p) if i & bit], dtype=xp.int64)
        outgoing = xp.take(work, idx, axis=0)
        incoming = xp.empty_like(outgoing)
        comm.sendrecv(outgoing, (r + bit) % p, incoming, (r - bit) % p)
        for j in range(idx.shape[0]):
            work[int(idx[j]), ...] = incoming[j, ...]
        bit *= 2
    for i in range(p):  # (3) index i came from rank r - i
        out[(r - i) % p, ...] = work[i, ...]


def alltoall(comm: Communicator, x: Any, algorithm: str = "pairwise") -> Any:
    """``MPI_Alltoall``: ``x`` has shape ``(p, m, ...)``, block ``j`` goes to rank ``j``.

    Returns a new array of ``x``'s shape and dtype whose block ``i`` came from rank ``i``.
    Every rank must pass the same shape and dtype. ``algorithm``: ``"pairwise"`` or ``"bruck"``.
    """
    xp = check_input(comm, x, None, "alltoall")
    if algorithm not in ALLTOALL_ALGORITHMS:
        raise ValueError(f"alltoall: unknown algorithm {algorithm!r}; expected one of {ALLTOALL_ALGORITHMS}")
    p = comm.size
    if x.ndim < 1 or x.shape[0] != p:
        raise ValueError(
            f"alltoall on rank {comm.rank}: x must have one block per rank along axis 0, i.e. "
            f"shape ({p}, ...), got shape {tuple(x.shape)}"
        )
    # Contiguous 2-D copies: every block is then a contiguous row that MPI can send as it is.
    send = xp.empty((p, _elements(x) // p if p else 0), dtype=x.dtype)
    send[...] = xp.reshape(x, (p, -1))
    out = xp.empty_like(send)
    with explain_mismatch(comm, "alltoall", x, algorithm=algorithm):
        if algorithm == "pairwise":
            _pairwise(comm, send, out)
        else:
            _bruck(comm, xp, send, out)
    return xp.reshape(out, tuple(x.shape))


def alltoallv(
    comm: Communicator, blocks: Sequence[Any], recv_counts: Sequence[int] | None = None
) -> list[Any]:
    """``MPI_Alltoallv``: ``blocks[j]`` (1-D, any length, one dtype for all) goes to rank ``j``.

    Returns the list of ``p`` 1-D arrays received, ``[i]`` from rank ``i``. The receive counts
    are exchanged first (a pairwise all-to-all of ``int64`` counts) unless ``recv_counts``
    (elements expected from each rank, as MPI's ``recvcounts``) is given.
    """
    p, r = comm.size, comm.rank
    blocks = list(blocks)
    if len(blocks) != p:
        raise ValueError(f"alltoallv on rank {r}: need {p} blocks (one per rank), got {len(blocks)}")
    xp = check_input(comm, blocks[0], None, "alltoallv") if p else None
    dtype = blocks[0].dtype
    for j, b in enumerate(blocks):
        if b.ndim != 1 or b.dtype != dtype:
            raise ValueError(
                f"alltoallv on rank {r}: every block must be 1-D with dtype {dtype}; block {j} has "
                f"shape {tuple(b.shape)} and dtype {b.dtype}"
            )
    if recv_counts is None:
        mine = xp.asarray([[b.shape[0]] for b in blocks], dtype=xp.int64)
        theirs = xp.empty_like(mine)
        with explain_mismatch(comm, "alltoallv", blocks[0], "the same dtype"):
            _pairwise(comm, mine, theirs)
        recv_counts = [int(theirs[i, 0]) for i in range(p)]
    elif len(recv_counts) != p:
        raise ValueError(f"alltoallv on rank {r}: recv_counts must list {p} counts, got {list(recv_counts)}")
    out = [xp.empty((int(recv_counts[i]),), dtype=dtype) for i in range(p)]
    out[r][...] = blocks[r]
    with explain_mismatch(comm, "alltoallv", blocks[0], "the same dtype (and matching counts)"):
        for s in range(1, p):
            dest, source = (r + s) % p, (r - s) % p
            send = xp.empty((blocks[dest].shape[0],), dtype=dtype)  # contiguous, whatever was passed
            send[...] = blocks[dest]
            comm.sendrecv(send, dest, out[source], source)
    return out


def _elements(x: Any) -> int:
    n = 1
    for d in x.shape:
        n *= d
    return n
