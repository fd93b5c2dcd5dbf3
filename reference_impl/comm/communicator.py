"""Point-to-point messaging between ranks: the only thing collectives are built on.

A ``Communicator`` is MPI's view of a job: ``size`` ranks, each knowing its own ``rank``,
exchanging arrays with blocking, buffer-based calls (the receiver supplies an array of
the right shape and dtype, and the message is written into it). Three implementations:

* ``ThreadCommunicator``: ``size`` ranks as threads of one process (``run_threads``);
  fast to start, easy to debug, used by unit tests and the exercises.
* ``MPICommunicator`` (in ``mpi.py``): real processes under ``mpiexec``.
* ``TorchCommunicator`` (in ``torch_dist.py``): real processes under ``torchrun``, over a
  ``torch.distributed`` process group (``engines.world_communicator`` picks one for a program).

``recv_any`` receives from whichever rank sent first (MPI's ``ANY_SOURCE``): what a
server needs to answer requests in the order they arrive instead of in rank order.

``CountingCommunicator`` wraps either and counts what each rank sends, which is how the
tests check an algorithm's traffic (ring allreduce: 2(n-1)/n of the data per rank).

``split(color, key)`` is ``MPI_Comm_split``: a collective over the communicator that cuts it
into sub-communicators, one per ``color``, ranked by ``(key, parent rank)``; ``color=None``
(``MPI_UNDEFINED``) gives ``None``. Every collective runs unchanged on a sub-communicator,
which is how a process grid gives tensor, data and pipeline parallelism each their own
group (``parallel/process_grid.py``). ``MPICommunicator`` uses MPI's own ``Comm.Split``;
every other communicator gets a ``SplitCommunicator`` carried by its own point-to-point
calls. MPI keeps the messages of different communicators apart with a *context id* that
travels with every message next to the tag (MPICH allocates it with an allreduce over a
bit mask of free ids, ``MPIR_Get_contextid_sparse``); here the context id is folded into
the tag, ``wire tag = context * CONTEXT_TAG_SPAN + tag``, and allocated the same way in
miniature: the ranks all-gather their next free id and take the largest, so on every rank
the communicators it belongs to have distinct ids, and a message can only be received on
the communicator it was sent on, ``recv_any`` included.
"""
from __future__ import annotations

import collections
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..backend import namespace_of


class CommError(RuntimeError):
    """A communication failed: a peer died, a receive timed out, or a message did not fit."""


DEFAULT_TIMEOUT_S = 60.0


class Communicator(ABC):
    """Blocking point-to-point messaging among ``size`` ranks (MPI semantics).

    Every blocking call is bounded: after ``timeout`` seconds without its message it raises
    ``CommError`` naming the peer, so a dead or deadlocked rank ends a job instead of hanging it.
    """

    rank: int
    size: int

    @property
    def timeout(self) -> float:
        """Seconds one blocking call may wait before it raises ``CommError``.

        Set by the communicator that waits (``MPICommunicator``, a thread rank of
        ``run_threads``); a communicator that wraps another (``inner``, or a group's ``comm``)
        has the bound of the one it wraps."""
        own = self.__dict__.get("_timeout")
        if own is not None:
            return own
        for attr in ("inner", "comm"):
            wrapped = getattr(self, attr, None)
            if isinstance(wrapped, Communicator):
                return wrapped.timeout
        return DEFAULT_TIMEOUT_S

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = float(seconds)

    @abstractmethod
    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        """Send array ``buf`` to rank ``dest``; ``buf`` may be reused as soon as this returns."""

    @abstractmethod
    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        """Receive the next message from ``source`` with ``tag`` into array ``buf`` (same shape)."""

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int, tag: int = 0) -> None:
        """Send to ``dest`` and receive from ``source`` at once: the step of every ring algorithm."""
        self.send(sendbuf, dest, tag)
        self.recv(recvbuf, source, tag)

    def recv_any(self, buf: Any, tag: int = 0) -> int:
        """Receive the first message with ``tag`` to arrive from any rank into ``buf``; return its source.

        Messages from one source still arrive in send order; among sources, the earliest
        sent message wins. Optional: communicators that cannot do it say so.
        """
        raise NotImplementedError(f"{type(self).__name__} has no receive-from-any (recv_any)")

    @abstractmethod
    def barrier(self) -> None:
        """Return only when every rank has entered the barrier."""

    def library_allreduce(self, x: Any, out: Any, op: str) -> None:
        """Hand a whole allreduce to the engine's own collective (``allreduce(..., algorithm="library")``).

        ``x`` and ``out`` are 1-D with the same size and dtype; ``out`` gets the reduction
        (``mean`` as a sum: ``allreduce`` divides afterwards). Only communicators over a library
        that has collectives (MPI, torch.distributed) can; the others say so.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no library collective to hand an allreduce to (algorithm='library' "
            f"needs an MPICommunicator or a TorchCommunicator); use one of the lab's algorithms"
        )

    def _check_peer(self, peer: int, role: str) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: {role} rank {peer} is outside 0..{self.size - 1}")

    def split(self, color: int | None, key: int | None = None) -> "Communicator | None":
        """``MPI_Comm_split``: the sub-communicator of the ranks that pass the same ``color``.

        A collective: every rank of this communicator must call it (in the same order as
        its other collectives). Ranks in the new communicator are ordered by ``key``, ties
        by their rank here (``key=None`` counts as 0, i.e. keep this order). ``color=None``
        is ``MPI_UNDEFINED``: the rank takes part but joins no group and gets ``None``.
        This generic version works for any communicator, through its send/recv
        (``SplitCommunicator``); ``MPICommunicator`` overrides it with MPI's ``Comm.Split``.
        """
        return split_communicator(self, color, key)


# --------------------------------------------------------------------------- threads


class _ThreadWorld:
    """State shared by the ranks of one ``run_threads`` job: mailboxes, a barrier, an abort flag."""

    def __init__(self, size: int, timeout: float):
        self.size = size
        self.timeout = timeout
        self.cond = threading.Condition()
        # mailbox[(source, dest)] holds (tag, array, serial) in send order: MPI's
        # non-overtaking rule; ``serial`` numbers every send of the job, for recv_any.
        self.mailbox: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque
        )
        self.barrier = threading.Barrier(size)
        self.failed_rank: int | None = None
        self.sent = 0

    def abort(self, rank: int) -> None:
        """Wake every waiting rank so that one rank's failure ends the job instead of hanging it."""
        with self.cond:
            if self.failed_rank is None:
                self.failed_rank = rank
            self.cond.notify_all()
        self.barrier.abort()


class ThreadCommunicator(Communicator):
    """One rank of a job whose ranks are threads of this process (see ``run_threads``)."""

    def __init__(self, world: _ThreadWorld, rank: int):
        self._world = world
        self.rank = rank
        self.size = world.size
        self.timeout = world.timeout  # the job's bound (run_threads' timeout)

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        xp = namespace_of(buf)
        message = xp.asarray(buf, copy=True)  # buffered send: the caller may reuse buf at once
        with self._world.cond:
            self._world.sent += 1
            self._world.mailbox[(self.rank, dest)].append((tag, message, self._world.sent))
            self._world.cond.notify_all()

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(source, "source")
        source, message = self._take([source], tag)
        self._fill(buf, message, source, tag)

    def recv_any(self, buf: Any, tag: int = 0) -> int:
        source, message = self._take(range(self.size), tag)
        self._fill(buf, message, source, tag)
        return source

    def _fill(self, buf: Any, message: Any, source: int, tag: int) -> None:
        if message.shape != buf.shape or message.dtype != buf.dtype:
            raise CommError(
                f"rank {self.rank}: message from rank {source} (tag {tag}) has shape "
                f"{tuple(message.shape)} and dtype {message.dtype}, but the receive buffer has "
                f"shape {tuple(buf.shape)} and dtype {buf.dtype}"
            )
        buf[...] = message

    def _take(self, sources: Any, tag: int) -> tuple[int, Any]:
        """Remove and return ``(source, message)``: the earliest sent message with ``tag``
        from one of ``sources`` (the first match in each mailbox is its oldest)."""
        world = self._world
        boxes = [(s, world.mailbox[(s, self.rank)]) for s in sources]
        who = f"rank {sources[0]}" if len(boxes) == 1 else "any rank"
        deadline = time.monotonic() + world.timeout
        with world.cond:
            while True:
                best = None  # (serial, source, box, index)
                for s, box in boxes:
                    for i, (t, _, serial) in enumerate(box):
                        if t == tag:
                            if best is None or serial < best[0]:
                                best = (serial, s, box, i)
                            break
                if best is not None:
                    _, s, box, i = best
                    message = box[i][1]
                    del box[i]
                    return s, message
                if world.failed_rank is not None:
                    raise CommError(
                        f"rank {self.rank}: gave up waiting for {who} because rank "
                        f"{world.failed_rank} failed"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommError(
                        f"rank {self.rank}: no message from {who} with tag {tag} after "
                        f"{world.timeout:g} s (deadlock, or a peer that never sends)"
                    )
                world.cond.wait(left)

    def barrier(self) -> None:
        try:
            self._world.barrier.wait(self._world.timeout)
        except threading.BrokenBarrierError:
            raise CommError(
                f"rank {self.rank}: barrier broken (a peer failed or did not arrive "
                f"within {self._world.timeout:g} s)"
            ) from None


def run_threads(
    size: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 60.0,
    wrap: Callable[[Communicator], Communicator] | None = None,
) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``size`` thread ranks and return every rank's result, by rank.

    If any rank raises, the others are woken (their pending receives fail), and the first
    failing rank's exception is raised here with a note naming the rank. ``timeout`` bounds
    every blocking call, so a deadlock becomes an error, never a hang. ``wrap`` lets a test
    put a layer around each rank's communicator (e.g. ``CountingCommunicator``).
    """
    if size < 1:
        raise ValueError(f"run_threads needs at least one rank, got size={size}")
    world = _ThreadWorld(size, timeout)
    comms: list[Communicator] = [ThreadCommunicator(world, r) for r in range(size)]
    if wrap is not None:
        comms = [wrap(c) for c in comms]
    results: list[Any] = [None] * size
    errors: dict[int, BaseException] = {}

    def body(rank: int) -> None:
        try:
            results[rank] = fn(comms[rank], *args)
        except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
            errors[rank] = exc
            world.abort(rank)

    threads = [
        threading.Thread(target=body, args=(r,), name=f"rank-{r}", daemon=True)
        for r in range(size)
    ]
    for t in threads:
        t.start()
    # A rank blocked in a receive gives up by itself ``timeout`` after that call began, with
    # an error naming its peer; wait a little longer than that before calling ranks stuck.
    deadline = time.monotonic() + 1.1 * timeout + 0.05
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        world.abort(-1)
        raise TimeoutError(f"run_threads: {', '.join(stuck)} still running after {timeout:g} s")
    if errors:
        first = world.failed_rank if world.failed_rank in errors else min(errors)
        exc = errors[first]
        exc.add_note(f"(raised on rank {first} of {size})")
        raise exc
    return results


# --------------------------------------------------------------------------- counting


def itemsize(x: Any) -> int:
    """Bytes per element of array ``x``.

    NumPy and CuPy dtypes say it directly; the array API standard's dtypes need not, so
    otherwise the namespace is asked (``finfo``/``iinfo``), which is slower but portable.
    """
    known = getattr(x.dtype, "itemsize", None)
    if isinstance(known, int):
        return known
    xp = namespace_of(x)
    if xp.isdtype(x.dtype, "bool"):
        return 1
    info = xp.finfo(x.dtype) if xp.isdtype(x.dtype, ("real floating", "complex floating")) else xp.iinfo(x.dtype)
    bits = info.bits * (2 if xp.isdtype(x.dtype, "complex floating") else 1)
    return bits // 8


class CountingCommunicator(Communicator):
    """Wraps a communicator and counts what this rank sends: messages, elements and bytes."""

    def __init__(self, inner: Communicator):
        self.inner = inner
        self.rank = inner.rank
        self.size = inner.size
        self.messages_sent = 0
        self.elements_sent = 0
        self.bytes_sent = 0
        self.parent: CountingCommunicator | None = None  # set by split: counts go there too

    def _count(self, buf: Any) -> None:
        n = 1
        for d in buf.shape:
            n *= d
        counter: CountingCommunicator | None = self
        while counter is not None:
            counter.messages_sent += 1
            counter.elements_sent += n
            counter.bytes_sent += n * itemsize(buf)
            counter = counter.parent

    def split(self, color: int | None, key: int | None = None) -> "CountingCommunicator | None":
        """Split ``inner`` (MPI's own ``Comm.Split`` when it is an ``MPICommunicator``) and count the child.

        The child is a ``CountingCommunicator`` whose counters hold what this rank sends
        through the child alone; every message it counts is also added to this (the
        parent's) counters, so the parent's totals stay "everything this rank sent", through
        it or any communicator split from it, and a test can read one group's traffic
        (the child's) or the rank's whole traffic (the parent's)."""
        child = self.inner.split(color, key)
        if child is None:
            return None
        counting = CountingCommunicator(child)
        counting.parent = self
        return counting

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._count(buf)
        self.inner.send(buf, dest, tag)

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        self.inner.recv(buf, source, tag)

    def recv_any(self, buf: Any, tag: int = 0) -> int:
        return self.inner.recv_any(buf, tag)

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int, tag: int = 0) -> None:
        self._count(sendbuf)
        self.inner.sendrecv(sendbuf, dest, recvbuf, source, tag)

    def barrier(self) -> None:
        self.inner.barrier()


# --------------------------------------------------------------------------- split

CONTEXT_TAG_SPAN = 1024  # a sub-communicator's tag t travels as context * 1024 + t on its root
SPLIT_BARRIER_TAG = 511  # the generic barrier's tag (SimulatedNetwork's users stay below 512)


def split_key(comm: Communicator, color: Any, key: Any) -> int:
    """Check ``split``'s arguments; return the key (``None`` -> 0)."""
    if color is not None and (isinstance(color, bool) or not isinstance(color, int) or color < 0):
        raise ValueError(f"split on rank {comm.rank}: color must be a non-negative int or None "
                         f"(MPI_UNDEFINED), got {color!r}")
    if key is not None and (isinstance(key, bool) or not isinstance(key, int)):
        raise ValueError(f"split on rank {comm.rank}: key must be an int or None, got {key!r}")
    return 0 if key is None else key


def _context_owner(comm: Communicator) -> Communicator:
    """The innermost communicator under ``comm`` (following ``inner``): it keeps the rank's next free context id,
    so that splits of a wrapper and of what it wraps still draw distinct ids."""
    while isinstance(getattr(comm, "inner", None), Communicator):
        comm = comm.inner
    return comm


def split_communicator(parent: Communicator, color: int | None, key: int | None) -> "SplitCommunicator | None":
    """The generic ``MPI_Comm_split`` (see ``Communicator.split``), on ``parent``'s point-to-point calls.

    1. All-gather ``(color, key, next free context id)`` over ``parent`` (the lab's ring allgather).
    2. The new context id is the largest proposal, and every rank's next free id moves past
       it. Each rank's ids only grow, so the communicators one rank belongs to never share
       an id, whatever the other ranks did in between (MPICH's rule, with a max for its mask).
    3. The members are the ranks of this color, sorted by ``(key, parent rank)``. A split of
       a ``SplitCommunicator`` is carried straight by its root (ranks translated twice), so
       nesting does not nest tags.
    """
    import numpy as np

    from .ring import allgather

    key = split_key(parent, color, key)
    owner = _context_owner(parent)
    proposal = np.array([-1 if color is None else color, key, owner.__dict__.get("_next_context", 1)],
                        dtype=np.int64)
    table = np.asarray(allgather(parent, proposal)).reshape(parent.size, 3)
    context = int(table[:, 2].max())
    owner._next_context = context + 1
    if color is None:
        return None
    members = [r for _, r in sorted((int(table[r, 1]), r) for r in range(parent.size) if table[r, 0] == color)]
    if isinstance(parent, SplitCommunicator):
        return SplitCommunicator(parent.inner, [parent.group[r] for r in members], context)
    return SplitCommunicator(parent, members, context)


class SplitCommunicator(Communicator):
    """Ranks ``group`` of communicator ``inner`` as a communicator of their own, with context id ``context``.

    Rank ``i`` here is rank ``group[i]`` of ``inner``. A message with tag ``t`` (0 <= t <
    ``CONTEXT_TAG_SPAN``) travels on ``inner`` with tag ``context * CONTEXT_TAG_SPAN + t``:
    ``inner``'s own messages (context 0, tags below the span) and every other sub-communicator
    this rank belongs to use other tags, so none can take this one's messages. Made by
    ``Communicator.split``; errors from ``inner`` name ``inner``'s ranks and wire tags.
    """

    def __init__(self, inner: Communicator, group: list[int], context: int):
        if inner.rank not in group:
            raise ValueError(f"rank {inner.rank} is not in the group {list(group)}")
        self.inner = inner
        self.group = tuple(group)
        self.context = context
        self.rank, self.size = self.group.index(inner.rank), len(self.group)
        self._rank_of = {g: i for i, g in enumerate(self.group)}

    def _wire(self, tag: int) -> int:
        if not 0 <= tag < CONTEXT_TAG_SPAN:
            raise ValueError(f"rank {self.rank}: tag {tag} is outside 0..{CONTEXT_TAG_SPAN - 1}, the tags a "
                             f"split communicator passes on (it adds context {self.context} x {CONTEXT_TAG_SPAN})")
        return self.context * CONTEXT_TAG_SPAN + tag

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        self.inner.send(buf, self.group[dest], self._wire(tag))

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(source, "source")
        self.inner.recv(buf, self.group[source], self._wire(tag))

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        self._check_peer(source, "source")
        self.inner.sendrecv(sendbuf, self.group[dest], recvbuf, self.group[source], self._wire(tag))

    def recv_any(self, buf: Any, tag: int = 0) -> int:
        """Only members can send on this context id (see ``split_communicator``), so any match is one of ours."""
        return self._rank_of[self.inner.recv_any(buf, self._wire(tag))]

    def barrier(self) -> None:
        dissemination_barrier(self, SPLIT_BARRIER_TAG)


def dissemination_barrier(comm: Communicator, tag: int) -> None:
    """A barrier of empty messages on ``comm``'s own sendrecv: round k sends to rank + 2^k and
    receives from rank - 2^k, so after ceil(log2 p) rounds every rank has heard, directly or
    not, from every other. Bounded by ``comm``'s timeout, and a missing rank is named."""
    import numpy as np

    empty_out, empty_in = np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.uint8)
    distance = 1
    while distance < comm.size:
        comm.sendrecv(empty_out, (comm.rank + distance) % comm.size,
                      empty_in, (comm.rank - distance) % comm.size, tag)
        distance *= 2
