"""``MPICommunicator``: the ``Communicator`` interface on real processes, through mpi4py.

Arrays travel with mpi4py's buffer-based calls (``Send``/``Recv``/``Sendrecv``, capital
letters): the bytes go straight from one array's memory to the other's, with no pickling.
Run a program that uses it with ``mpiexec -n 4 python -m mpi4py program.py``: the
``-m mpi4py`` runner turns an uncaught exception on any rank into ``MPI_Abort``, so the job
fails fast instead of leaving the other ranks waiting forever.
"""
from __future__ import annotations

from typing import Any

from .communicator import CommError, Communicator


class MPICommunicator(Communicator):
    """A ``Communicator`` over an mpi4py communicator (``MPI.COMM_WORLD`` by default)."""

    def __init__(self, comm: Any = None):
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        self.comm.Send(buf, dest=dest, tag=tag)

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(source, "source")
        status = self._MPI.Status()
        self._guard(lambda: self.comm.Recv(buf, source=source, tag=tag, status=status), buf, source)
        self._check_count(status, buf, source)

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        self._check_peer(source, "source")
        status = self._MPI.Status()
        self._guard(
            lambda: self.comm.Sendrecv(
                sendbuf, dest=dest, sendtag=tag, recvbuf=recvbuf, source=source, recvtag=tag,
                status=status,
            ),
            recvbuf,
            source,
        )
        self._check_count(status, recvbuf, source)

    def barrier(self) -> None:
        self.comm.Barrier()

    def _guard(self, call: Any, buf: Any, source: int) -> None:
        """Turn MPI's truncation error (message longer than the buffer) into a clear CommError."""
        try:
            call()
        except self._MPI.Exception as exc:
            if exc.Get_error_class() == self._MPI.ERR_TRUNCATE:
                raise CommError(
                    f"rank {self.rank}: message from rank {source} is longer than the receive "
                    f"buffer of {buf.size} elements ({buf.dtype})"
                ) from None
            raise

    def _check_count(self, status: Any, buf: Any, source: int) -> None:
        """A shorter message than the buffer is legal in MPI; for our collectives it is a bug."""
        got = status.Get_count(self._MPI.BYTE)
        if got != buf.nbytes:
            raise CommError(
                f"rank {self.rank}: message from rank {source} has {got} bytes, but the receive "
                f"buffer holds {buf.size} elements of {buf.dtype} ({buf.nbytes} bytes)"
            )


def mpiexec_command(n_ranks: int, *program: str) -> list[str]:
    """The command that runs ``python -m mpi4py PROGRAM...`` on ``n_ranks`` MPI processes.

    ``mpiexec`` comes from the ``mpich`` wheel installed next to this Python, so the
    interpreter and the MPI library always match; ``-m mpi4py`` makes an uncaught exception
    on one rank abort the whole job instead of hanging the others.
    """
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
    if mpiexec is None:
        raise FileNotFoundError(
            "mpiexec not found: install the project (make test does) so the 'mpich' wheel provides it"
        )
    return [mpiexec, "-n", str(n_ranks), sys.executable, "-m", "mpi4py", *program]
