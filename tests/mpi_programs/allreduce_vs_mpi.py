"""Run under mpiexec: our ring allreduce must equal the MPI library's own Allreduce exactly."""
import numpy as np
from mpi4py import MPI

from reference_impl.comm import MPICommunicator, allreduce

world = MPI.COMM_WORLD
comm = MPICommunicator(world)
rng = np.random.default_rng(1000 + comm.rank)
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
checked = 0
for length in [0, 1, comm.size - 1, 7, 1000, 65537]:
    for dtype in [np.float32, np.float64, np.int32, np.int64]:
        for op, mpi_op in MPI_OPS.items():
            high = 3 if op == "prod" else 1000
            x = rng.integers(-high, high, size=length).astype(dtype)
            expected = np.empty_like(x)
            world.Allreduce(x, expected, op=mpi_op)
            got = allreduce(comm, x, op=op)
            if not np.array_equal(got, expected):
                raise AssertionError(f"rank {comm.rank}: {op} of {length} {dtype.__name__} differs from MPI")
            checked += 1
total = world.allreduce(checked)
if comm.rank == 0:
    print(f"OK {total} comparisons on {comm.size} ranks")
