"""recv_any: receive from whichever rank sent first, on thread ranks and under mpiexec."""
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import CommError, CountingCommunicator, run_threads
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.ps import SubCommunicator

ROOT = Path(__file__).resolve().parent.parent


def _chain(comm, order, wrap):
    """Ranks in ``order`` send to rank 0 one after the other (a token enforces the order)."""
    comm = wrap(comm)
    token = np.zeros(1, dtype=np.int8)
    if comm.rank == 0:
        got = []
        buf = np.empty(2)
        for _ in range(len(order) + 1):
            got.append((comm.recv_any(buf, tag=5), buf.copy()))
        return got
    position = order.index(comm.rank)
    if position > 0:
        comm.recv(token, order[position - 1], tag=9)
    comm.send(np.array([comm.rank, 0.0]), 0, tag=7)  # another tag: recv_any(tag=5) must skip it
    comm.send(np.array([comm.rank, 0.0]), 0, tag=5)
    if comm.rank == order[0]:
        comm.send(np.array([comm.rank, 1.0]), 0, tag=5)  # its second message comes after its first
    if position + 1 < len(order):
        comm.send(token, order[position + 1], tag=9)
    return None


@pytest.mark.parametrize("wrap", [lambda c: c, CountingCommunicator], ids=["threads", "counting"])
def test_recv_any_takes_messages_in_the_order_they_were_sent(wrap):
    order = [3, 1, 4, 2]
    got = run_threads(5, _chain, order, wrap, timeout=10)[0]
    assert [s for s, _ in got] == [3, 3, 1, 4, 2]
    assert [tuple(v) for _, v in got] == [(3, 0), (3, 1), (1, 0), (4, 0), (2, 0)]


def test_recv_any_times_out_naming_any_rank():
    def body(comm):
        if comm.rank == 0:
            start = time.monotonic()
            with pytest.raises(CommError, match="rank 0: no message from any rank with tag 3 after 0.3 s"):
                comm.recv_any(np.empty(1), tag=3)
            return time.monotonic() - start
        return 0.0

    assert run_threads(2, body, timeout=0.3)[0] < 2.0


def test_recv_any_refuses_a_buffer_of_the_wrong_shape():
    def body(comm):
        if comm.rank == 1:
            comm.send(np.zeros(3), 0, tag=1)
            return None
        with pytest.raises(CommError, match="message from rank 1 \\(tag 1\\) has shape \\(3,\\)"):
            comm.recv_any(np.empty(2), tag=1)
        return "ok"

    assert run_threads(2, body, timeout=5)[0] == "ok"


def test_a_communicator_without_recv_any_says_so():
    def body(comm):
        with pytest.raises(NotImplementedError, match="SubCommunicator has no receive-from-any"):
            SubCommunicator(comm, [0, 1]).recv_any(np.empty(1))
        return "ok"

    assert run_threads(2, body, timeout=5) == ["ok", "ok"]


def test_recv_any_under_mpiexec():
    run = subprocess.run(mpiexec_command(4, str(ROOT / "tests" / "mpi_programs" / "recv_any.py")),
                         capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK recv_any on 4 ranks" in run.stdout, run.stdout + run.stderr
