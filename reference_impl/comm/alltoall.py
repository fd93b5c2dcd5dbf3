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
  with one ``sendrecv``. When ``p`` is a power of two, step ``s`` pairs rank ``r`` with rank
  ``r XOR s`` instead, both ways: the same ``p - 1`` steps, but each is ``p / 2`` separate
  swaps rather than one long cycle, so a pair finishes as soon as its two ranks run (which
  matters when ranks share cores). This is Thakur et al.'s rule and MPICH's
  ``MPIR_Alltoall_intra_pairwise`` (src/mpi/coll/alltoall/alltoall_intra_pairwise.c).
  Every block travels once, straight to its owner: each rank sends ``(p - 1) / p`` of its
  buffer, the minimum, in ``p - 1`` messages. With ``N`` the whole send buffer of a rank,
  in bytes::

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
Like ``MPI_Alltoall``'s ``recvbuf``, ``out=`` lets a caller reuse one receive buffer every
step: a fresh 64 MiB array costs a page fault per 4 KiB page on first touch, which on one
host takes about as long as the whole exchange. One speed rule, kept apart in ``_send_rows`` and
``_recv_rows``: a buffer that is already one C-ordered run of memory is sent from, and
received into, as it is; only a strided view (or a namespace that cannot tell, such as
array_api_strict) is copied into a contiguous array first. ``python -m benchmarks
model_parallel`` measures both against the MPI library's own ``MPI_Alltoall(v)``.
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


# --8<-- [start:pairwise]
def pairwise_peers(p: int, r: int, s: int) -> tuple[int, int]:
    """Step ``s`` (1..p-1) of the pairwise exchange on rank ``r``: (rank sent to, rank received from).

    ``r XOR s`` both ways when ``p`` is a power of two, else ``(r + s, r - s) mod p``.
    """
    if p & (p - 1) == 0:
        return r ^ s, r ^ s
    return (r + s) % p, (r - s) % p


def _pairwise(comm: Communicator, send: Any, out: Any) -> None:
    """``out[i] = (rank i's send[r])`` for 2-D ``send``/``out`` of shape ``(p, m)``."""
    p, r = comm.size, comm.rank
    out[r, ...] = send[r, ...]
    for s in range(1, p):
        dest, source = pairwise_peers(p, r, s)
        comm.sendrecv(send[dest, ...], dest, out[source, ...], source)
# --8<-- [end:pairwise]


# --8<-- [start:bruck]
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
# --8<-- [end:bruck]


def alltoall(comm: Communicator, x: Any, algorithm: str = "pairwise", out: Any = None) -> Any:
    """``MPI_Alltoall``: ``x`` has shape ``(p, m, ...)``, block ``j`` goes to rank ``j``.

    Returns an array of ``x``'s shape and dtype whose block ``i`` came from rank ``i``: ``out``
    if given (like MPI's ``recvbuf``: a separate array of ``x``'s shape and dtype, reused
    across calls), else a new one. Every rank must pass the same shape and dtype.
    ``algorithm``: ``"pairwise"`` or ``"bruck"``.
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
    if out is None:
        out = xp.empty(tuple(x.shape), dtype=x.dtype)
    elif out is x or tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
        raise ValueError(
            f"alltoall on rank {comm.rank}: out must be a separate array of x's shape {tuple(x.shape)} and "
            f"dtype {x.dtype}, got shape {tuple(out.shape)} and dtype {out.dtype}"
        )
    # 2-D (p, m) and contiguous: every block is then a contiguous row that MPI can send as it is.
    send = _send_rows(xp, x, p)
    recv, received_in_place = _recv_rows(xp, out, p)
    with explain_mismatch(comm, "alltoall", x, algorithm=algorithm):
        if algorithm == "pairwise":
            _pairwise(comm, send, recv)
        else:
            _bruck(comm, xp, send, recv)
    if not received_in_place:
        out[...] = xp.reshape(recv, tuple(x.shape))
    return out


def alltoallv(
    comm: Communicator,
    blocks: Sequence[Any],
    recv_counts: Sequence[int] | None = None,
    out: Sequence[Any] | None = None,
) -> list[Any]:
    """``MPI_Alltoallv``: ``blocks[j]`` (1-D, any length, one dtype for all) goes to rank ``j``.

    Returns the list of ``p`` 1-D arrays received, ``[i]`` from rank ``i``. The receive counts
    are exchanged first (a pairwise all-to-all of ``int64`` counts) unless the caller knows
    them: ``recv_counts`` (elements expected from each rank, as MPI's ``recvcounts``), or
    ``out``, ``p`` 1-D arrays of the blocks' dtype to receive into (their lengths are the
    counts; like MPI's ``recvbuf``, they can be reused across calls).
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
    if out is not None:
        out = list(out)
        if len(out) != p or any(o.ndim != 1 or o.dtype != dtype for o in out):
            raise ValueError(
                f"alltoallv on rank {r}: out must be {p} 1-D arrays of dtype {dtype}, got "
                f"{[(tuple(o.shape), str(o.dtype)) for o in out]}"
            )
        sizes = [int(o.shape[0]) for o in out]
        if recv_counts is not None and [int(c) for c in recv_counts] != sizes:
            raise ValueError(
                f"alltoallv on rank {r}: recv_counts {list(recv_counts)} disagree with the lengths of out, {sizes}"
            )
        recv_counts = sizes
    if recv_counts is None:
        mine = xp.asarray([[b.shape[0]] for b in blocks], dtype=xp.int64)
        theirs = xp.empty_like(mine)
        with explain_mismatch(comm, "alltoallv", blocks[0], "the same dtype"):
            _pairwise(comm, mine, theirs)
        recv_counts = [int(theirs[i, 0]) for i in range(p)]
    elif len(recv_counts) != p:
        raise ValueError(f"alltoallv on rank {r}: recv_counts must list {p} counts, got {list(recv_counts)}")
    if out is None:
        out = [xp.empty((int(recv_counts[i]),), dtype=dtype) for i in range(p)]
    out[r][...] = blocks[r]
    with explain_mismatch(comm, "alltoallv", blocks[0], "the same dtype (and matching counts)"):
        for s in range(1, p):
            dest, source = pairwise_peers(p, r, s)
            recv, received_in_place = _recv_rows(xp, out[source], None)
            comm.sendrecv(_send_rows(xp, blocks[dest], None), dest, recv, source)
            if not received_in_place:
                out[source][...] = recv
    return out


# ----------------------------------------------------------------- speed: no copy of a contiguous buffer
# Not part of the algorithms: MPI (and our communicators) send one contiguous run of memory,
# so a block must be one. These skip the copy that guarantees it when the array already is,
# and skip NumPy's Python-level ``reshape`` wrapper too: after a large exchange has pushed
# the interpreter out of the CPU caches, each such call costs microseconds, which at 1 MiB
# is a visible share of the whole all-to-all (the benchmark measured it).


def _contiguous_as(a: Any, shape: tuple[int, ...]) -> Any:
    """``a`` viewed with ``shape`` if it is one C-ordered run of memory, else None.

    NumPy and CuPy report that in ``a.flags``; the array API has no way to ask, so an array
    without ``flags`` (array_api_strict) gets None and the copying path, always correct.
    """
    flags = getattr(a, "flags", None)
    if flags is None or not flags.c_contiguous:
        return None
    return a if a.shape == shape else a.reshape(shape)  # a view: C-ordered memory moves no byte


def _send_rows(xp: Any, a: Any, p: int | None) -> Any:
    """``a`` as a contiguous array to send from: ``(p, m)`` rows (block ``j`` is row ``j``), or
    1-D when ``p`` is None. A view of ``a`` when it is already contiguous, else a copy."""
    shape = _rows_shape(a, p)
    view = _contiguous_as(a, shape)
    if view is not None:
        return view
    send = xp.empty(shape, dtype=a.dtype)
    send[...] = xp.reshape(a, shape)
    return send


def _recv_rows(xp: Any, a: Any, p: int | None) -> tuple[Any, bool]:
    """A contiguous array to receive into, shaped like ``_send_rows``'s, and whether it is ``a``
    itself (a view of it); if not, the caller copies it into ``a`` afterwards."""
    shape = _rows_shape(a, p)
    view = _contiguous_as(a, shape)
    if view is not None:
        return view, True
    return xp.empty(shape, dtype=a.dtype), False


def _rows_shape(a: Any, p: int | None) -> tuple[int, ...]:
    return (_elements(a),) if p is None else (p, _elements(a) // p)


def _elements(x: Any) -> int:
    n = 1
    for d in x.shape:
        n *= d
    return n
