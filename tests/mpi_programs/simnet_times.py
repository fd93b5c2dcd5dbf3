"""Run under mpiexec: simulated times of a fixed scenario; tests/test_simnet.py runs it on threads too.

``scenario(comm)`` takes one rank's real communicator, wraps it in ``SimulatedNetwork``s
and returns that rank's virtual clock after every step, with its traffic counts. Virtual
time depends only on the order of events on each rank, so MPI ranks must give exactly
the numbers thread ranks give. Under mpiexec rank 0 prints every rank's result as one JSON list.
"""
import json

import numpy as np

from reference_impl.comm import allreduce
from reference_impl.comm.simnet import SimulatedNetwork


def scenario(inner) -> dict:
    readings = []
    for profile in ("10GbE", "IB-NDR"):
        comm = SimulatedNetwork(inner, profile)
        n = comm.size
        for count in (1024 * n, 7, 100_003):  # even chunks, uneven chunks, a large odd size
            x = np.arange(count, dtype=np.float32) + comm.rank
            out = allreduce(comm, x, algorithm="ring")
            expected = n * np.arange(count, dtype=np.float32) + n * (n - 1) / 2
            if not np.array_equal(out, expected):
                raise AssertionError(f"rank {comm.rank}: wrong sum for {count} elements on {profile}")
            readings.append(comm.now())
        comm.advance(1e-4 * comm.rank)  # ranks arrive at the barrier at different times
        comm.barrier()
        readings.append(comm.now())
        # Incast: every other rank sends 64 KiB to rank 0, which receives in rank order.
        buf = np.zeros(16 * 1024, dtype=np.float32)
        if comm.rank == 0:
            for source in range(1, n):
                comm.recv(buf, source, tag=5)
        else:
            comm.send(buf + comm.rank, 0, tag=5)
        readings.append(comm.now())
        readings += [comm.messages_sent, comm.bytes_sent, comm.messages_received, comm.bytes_received]
    return {"rank": inner.rank, "readings": readings}


if __name__ == "__main__":
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator

    every_rank = MPI.COMM_WORLD.gather(scenario(MPICommunicator()), root=0)
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps(every_rank), flush=True)
