"""Run under mpiexec: every collective, algorithm and op must equal the MPI library's own exactly.

allreduce (each algorithm, and "auto") against MPI_Allreduce, reduce_scatter against
MPI_Reduce_scatter with chunk_bounds' counts, allgather against MPI_Allgatherv on pieces
of different sizes, broadcast against MPI_Bcast and reduce against MPI_Reduce from every
root. Integer-valued inputs, so every result must match bit for bit.
"""
import numpy as np
from mpi4py import MPI

from reference_impl.comm import (
    ALGORITHMS, MPICommunicator, allgather, allreduce, broadcast, chunk_bounds, reduce, reduce_scatter,
)

world = MPI.COMM_WORLD
comm = MPICommunicator(world)
p, r = comm.size, comm.rank
rng = np.random.default_rng(1000 + r)
shared = np.random.default_rng(7)  # the same stream on every rank: sizes and roots all agree
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN, "mean": MPI.SUM}
checked = 0


def same(got, expected, what):
    global checked
    if got is None or got.dtype != expected.dtype or not np.array_equal(got, expected):
        raise AssertionError(f"rank {r}: {what} differs from MPI: {got} != {expected}")
    checked += 1


for length in [0, 1, p - 1, 7, 1000, 40001]:
    for dtype in [np.float32, np.float64, np.int32, np.int64]:
        for op, mpi_op in MPI_OPS.items():
            if op == "mean" and not np.issubdtype(dtype, np.floating):
                continue
            high = 3 if op == "prod" else 1000
            x = rng.integers(-high, high, size=length).astype(dtype)
            what = f"{op} of {length} {dtype.__name__}"
            expected = np.empty_like(x)
            world.Allreduce(x, expected, op=mpi_op)
            if op == "mean":
                expected /= p
            for algorithm in ALGORITHMS:
                same(allreduce(comm, x, algorithm=algorithm, op=op), expected, f"allreduce[{algorithm}] {what}")

            counts = [hi - lo for lo, hi in chunk_bounds(length, p)]
            mine = np.empty(counts[r], dtype)
            world.Reduce_scatter(x, mine, recvcounts=counts, op=mpi_op)
            if op == "mean":
                mine /= p
            same(reduce_scatter(comm, x, op=op), mine, f"reduce_scatter {what}")

            root = int(shared.integers(0, p))
            at_root = np.empty_like(x) if r == root else None
            world.Reduce(x, at_root, op=mpi_op, root=root)
            got = reduce(comm, x, root=root, op=op)
            if r == root:
                same(got, at_root / p if op == "mean" else at_root, f"reduce to {root} {what}")
            elif got is not None:
                raise AssertionError(f"rank {r}: reduce to {root} returned {got} on a non-root rank")

        sizes = [int(s) for s in shared.integers(0, length + 2, size=p)]
        piece = rng.integers(-1000, 1000, size=sizes[r]).astype(dtype)
        gathered = np.empty(sum(sizes), dtype)
        world.Allgatherv(piece, [gathered, sizes])
        same(allgather(comm, piece), gathered, f"allgather of {sizes} {dtype.__name__}")

        root = int(shared.integers(0, p))
        data = rng.integers(-1000, 1000, size=length).astype(dtype)
        theirs = data.copy()
        world.Bcast(theirs, root=root)
        same(broadcast(comm, data, root=root), theirs, f"broadcast from {root} of {length} {dtype.__name__}")

total = world.allreduce(checked)
if r == 0:
    print(f"OK {total} comparisons on {p} ranks")
