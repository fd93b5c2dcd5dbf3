"""``MPICommunicator``: the ``Communicator`` interface on real processes, through mpi4py.

Arrays travel with mpi4py's buffer-based calls (capital letters): the bytes go straight
from one array's memory to the other's, with no pickling. Run a program that uses it with
``mpiexec -n 4 python -m mpi4py program.py``: the ``-m mpi4py`` runner turns an uncaught
exception on any rank into ``MPI_Abort``, so the whole job ends instead of leaving the
other ranks waiting forever.

``recv_any`` is MPI's receive from ``ANY_SOURCE``: the first matching message from any
rank, and the rank it came from (``Status.Get_source``).

``split`` is ``Comm.Split``: the sub-communicators of a process grid are real MPI
communicators, each with its own context id, exactly what MPI-based frameworks build
(Megatron-LM's ``torch.distributed.new_group`` does the same with NCCL communicators).

Two things MPI itself does not do, added here so that a broken collective fails fast with
a message that names the ranks involved:

* **A deadline on every blocking call.** MPI's blocking ``Recv`` waits forever for a peer
  that never sends. Here every call posts nonblocking requests (``Isend``/``Irecv``/
  ``Ibarrier``) and polls them until ``timeout`` seconds have passed (default: the
  ``LAB_COMM_TIMEOUT`` environment variable, else 60 s), then raises ``CommError``. Polling
  spins for the first ``SPIN_S`` seconds, so a short message costs about what a blocking
  call costs, then yields the CPU between polls, and after ``YIELD_S`` sleeps between
  them, so a rank waiting for a slow peer does not take the core that peer needs.
* **The dtype travels with the message.** MPI matches messages by source and tag and
  checks only that they fit, so a float32 array received into an int32 buffer of the same
  size arrives as garbage without any error. Here the tag on the wire carries a dtype code
  in its low ``DTYPE_BITS`` bits: a receive only matches a message of its own dtype, and a
  waiting receive that finds a message of another dtype raises ``CommError`` within about a
  millisecond (it probes every ``DTYPE_CHECK_S``, not on every poll, which would slow every
  receive).
"""
from __future__ import annotations

import os
import time
from typing import Any

from .communicator import DEFAULT_TIMEOUT_S, CommError, Communicator, split_key

TIMEOUT_ENV = "LAB_COMM_TIMEOUT"
SPIN_S = 5e-6  # poll without pause this long (a short message on one host takes a few us);
# spinning longer starves the peer we wait for when there are more ranks than cores
YIELD_S = 0.1  # then give the CPU away between polls; after this, sleep SLEEP_S per poll
SLEEP_S = 5e-4
DTYPE_CHECK_S = 1e-3  # probe for a message of the wrong dtype at most this often: an Iprobe per
# poll costs a few microseconds each time, and a wrong dtype only needs to fail fast, not at once
DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)
DTYPE_BITS = 5  # codes 1..len(DTYPES); 0 for any other dtype


def timeout_from_env() -> float:
    """Seconds a blocking call may wait: ``$LAB_COMM_TIMEOUT`` if set, else 60."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return value


_codes: dict[Any, int] = {}  # dtype -> code; str(dtype) is too slow to run per message


def _dtype_code(buf: Any) -> int:
    code = _codes.get(buf.dtype)
    if code is None:
        name = str(buf.dtype)
        code = _codes[buf.dtype] = DTYPES.index(name) + 1 if name in DTYPES else 0
    return code


def _dtype_name(code: int) -> str:
    return DTYPES[code - 1] if 1 <= code <= len(DTYPES) else "another dtype"


class MPICommunicator(Communicator):
    """A ``Communicator`` over an mpi4py communicator (``MPI.COMM_WORLD`` by default).

    ``timeout`` bounds every blocking call in seconds (default ``timeout_from_env()``).
    """

    def __init__(self, comm: Any = None, timeout: float | None = None):
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.timeout = timeout_from_env() if timeout is None else float(timeout)
        self._max_tag = self.comm.Get_attr(MPI.TAG_UB) >> DTYPE_BITS

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        request = self.comm.Isend(buf, dest=dest, tag=self._wire_tag(tag, buf))
        self._wait(send=request, dest=dest, sendbuf=buf, tag=tag)

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(source, "source")
        request = self.comm.Irecv(buf, source=source, tag=self._wire_tag(tag, buf))
        self._wait(receive=request, source=source, recvbuf=buf, tag=tag)

    def recv_any(self, buf: Any, tag: int = 0) -> int:
        """``MPI.ANY_SOURCE``: the first matching message from any rank; returns its source."""
        any_source = self._MPI.ANY_SOURCE
        request = self.comm.Irecv(buf, source=any_source, tag=self._wire_tag(tag, buf))
        return self._wait(receive=request, source=any_source, recvbuf=buf, tag=tag)

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        self._check_peer(source, "source")
        receive = self.comm.Irecv(recvbuf, source=source, tag=self._wire_tag(tag, recvbuf))
        send = self.comm.Isend(sendbuf, dest=dest, tag=self._wire_tag(tag, sendbuf))
        self._wait(send, receive, dest, sendbuf, source, recvbuf, tag)

    def barrier(self) -> None:
        self._wait(send=self.comm.Ibarrier())

    def split(self, color: int | None, key: int | None = None) -> "MPICommunicator | None":
        """``MPI_Comm_split`` itself (``Comm.Split``): a new MPI communicator with its own context id,
        so its messages can never match this one's; wrapped with the same ``timeout``.

        ``color=None`` is ``MPI.UNDEFINED`` (the rank gets ``None``); ``key=None`` counts as 0,
        ties broken by rank here, as MPI does. ``Comm.Split`` itself blocks without a deadline
        (MPI has no nonblocking split), like any MPI communicator constructor.
        """
        key = split_key(self, color, key)
        child = self.comm.Split(self._MPI.UNDEFINED if color is None else color, key)
        if child == self._MPI.COMM_NULL:
            return None
        return MPICommunicator(child, timeout=self.timeout)

    def library_allreduce(self, x: Any, out: Any, op: str) -> None:
        """``MPI_Allreduce`` itself (mpi4py's ``Allreduce``) with the matching ``MPI_Op``; ``mean`` is
        ``MPI_SUM`` here and ``allreduce`` divides afterwards.

        A nonblocking ``Iallreduce`` polled like every other call here, so it is bounded by
        ``timeout`` too; MPI's own ``Allreduce`` waits forever for a rank that never joins.
        """
        MPI = self._MPI
        mpi_op = {"sum": MPI.SUM, "mean": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
        if out.size == 0:
            return
        if not x.flags.c_contiguous:  # a strided view (x[::2]): MPI's buffer must be one block
            x = x.copy()
        self._wait(send=self.comm.Iallreduce(x, out, op=mpi_op), collective="MPI_Allreduce")

    def _wire_tag(self, tag: int, buf: Any) -> int:
        if not 0 <= tag <= self._max_tag:
            raise ValueError(f"rank {self.rank}: tag {tag} is outside 0..{self._max_tag}")
        return (tag << DTYPE_BITS) | _dtype_code(buf)

    def _wait(
        self, send: Any = None, receive: Any = None, dest: int | None = None, sendbuf: Any = None,
        source: int | None = None, recvbuf: Any = None, tag: int = 0, collective: str = "the barrier",
    ) -> int | None:
        """Poll ``send`` and ``receive`` (either may be None) until both are done or time is up.

        A barrier passes its request as ``send`` with no ``dest``. Returns the rank the
        message came from (what ``recv_any`` needs), or None when there was no receive.
        """
        status = self._MPI.Status()
        start = time.monotonic()
        came_from = None
        next_dtype_check = SPIN_S
        while True:
            try:
                if send is not None and send.Test():
                    send = None
                if receive is not None and receive.Test(status):
                    came_from = status.Get_source()
                    self._check_count(status, recvbuf, came_from)
                    receive = None
            except self._MPI.Exception as exc:
                self._raise_truncated(exc, recvbuf, source)
            if send is None and receive is None:
                return came_from
            waited = time.monotonic() - start
            if waited < SPIN_S:
                continue
            if receive is not None and waited >= next_dtype_check:
                self._check_dtype(receive, recvbuf, source, tag)
                next_dtype_check = waited + DTYPE_CHECK_S
            if waited > self.timeout:
                self._give_up(send, receive, dest, sendbuf, source, tag, collective)
            if waited < YIELD_S:
                os.sched_yield()
            else:
                time.sleep(SLEEP_S)

    def _give_up(self, send: Any, receive: Any, dest: Any, sendbuf: Any, source: Any, tag: int,
                 collective: str = "the barrier") -> None:
        """Raise the timeout error, naming what is still pending: which peer, which direction."""
        pending = []
        if receive is not None:
            receive.Cancel()
            pending.append(f"a message from {self._who(source)} (tag {tag})")
        if send is not None:
            pending.append(f"the other ranks to enter {collective}" if dest is None
                           else f"rank {dest} to take {sendbuf.nbytes} bytes (tag {tag})")
        raise CommError(
            f"rank {self.rank}: still waiting for {' and '.join(pending)} after {self.timeout:g} s "
            f"(a peer that failed, never joined, or is in another collective; set {TIMEOUT_ENV} "
            f"to wait longer)"
        )

    def _who(self, source: Any) -> str:
        return "any rank" if source == self._MPI.ANY_SOURCE else f"rank {source}"

    def _check_dtype(self, receive: Any, buf: Any, source: int, tag: int) -> None:
        """A pending message from ``source`` with our tag but another dtype code: fail now."""
        probe = self._MPI.Status()
        if not self.comm.Iprobe(source=source, tag=self._MPI.ANY_TAG, status=probe):
            return
        wire = probe.Get_tag()
        if wire >> DTYPE_BITS == tag and wire & ((1 << DTYPE_BITS) - 1) != _dtype_code(buf):
            receive.Cancel()
            raise CommError(
                f"rank {self.rank}: message from rank {probe.Get_source()} (tag {tag}) holds "
                f"{_dtype_name(wire & ((1 << DTYPE_BITS) - 1))} data "
                f"({probe.Get_count(self._MPI.BYTE)} bytes), but the receive buffer holds "
                f"{buf.size} elements of {buf.dtype}"
            )

    def _raise_truncated(self, exc: Exception, buf: Any, source: int | None) -> None:
        """Turn MPI's truncation error (message longer than the buffer) into a clear CommError."""
        if exc.Get_error_class() == self._MPI.ERR_TRUNCATE:
            raise CommError(
                f"rank {self.rank}: message from {self._who(source)} is longer than the receive "
                f"buffer of {buf.size} elements ({buf.dtype}, {buf.nbytes} bytes)"
            ) from None
        raise exc

    def _check_count(self, status: Any, buf: Any, source: int | None) -> None:
        """A shorter message than the buffer is legal in MPI; for our collectives it is a bug."""
        got = status.Get_count(self._MPI.BYTE)
        if got != buf.nbytes:
            raise CommError(
                f"rank {self.rank}: message from rank {source} has {got} bytes, but the receive "
                f"buffer holds {buf.size} elements of {buf.dtype} ({buf.nbytes} bytes)"
            )


def mpiexec_command(n_ranks: int, *program: str) -> list[str]:
    """The command that runs ``python -m mpi4py PROGRAM...`` on ``n_ranks`` MPI processes here.

    ``mpiexec`` comes from the ``mpich`` wheel installed next to this Python, so the
    interpreter and the MPI library always match; ``-m mpi4py`` makes an uncaught exception
    on one rank abort the whole job instead of hanging the others. The line is built by
    ``launch.Launcher`` (which also starts jobs through Slurm or a host file).
    """
    from .launch import Launcher, wheel_mpiexec

    return Launcher((wheel_mpiexec(),)).command(n_ranks, *program)
