"""Run under mpiexec or torchrun: every collective, algorithm and op must equal the library's own exactly.

The library is the engine's (``library_reference``): MPI's under ``mpiexec``, torch.distributed's
under ``torchrun``; the text below names MPI's calls.

allreduce (each algorithm, and "auto") against MPI_Allreduce, reduce_scatter against
MPI_Reduce_scatter with chunk_bounds' counts, allgather against MPI_Allgatherv on pieces
of different sizes, broadcast against MPI_Bcast and reduce against MPI_Reduce from every
root. Integer-valued inputs, so every result must match bit for bit.
"""
import numpy as np
from library_reference import LibraryReference

from reference_impl.comm import ALGORITHMS, allgather, allreduce, broadcast, chunk_bounds, reduce, reduce_scatter
from reference_impl.comm.engines import world_communicator

comm = world_communicator()
library = LibraryReference(comm)
p, r = comm.size, comm.rank
rng = np.random.default_rng(1000 + r)
shared = np.random.default_rng(7)  # the same stream on every rank: sizes and roots all agree
OPS = ("sum", "prod", "max", "min", "mean")
checked = 0


def same(got, expected, what):
    global checked
    if got is None or got.dtype != expected.dtype or not np.array_equal(got, expected):
        raise AssertionError(f"rank {r}: {what} differs from the {library.engine} library: {got} != {expected}")
    checked += 1


for length in [0, 1, p - 1, 7, 1000, 40001]:
    for dtype in [np.float32, np.float64, np.int32, np.int64]:
        for op in OPS:
            if op == "mean" and not np.issubdtype(dtype, np.floating):
                continue
            high = 3 if op == "prod" else 1000
            x = rng.integers(-high, high, size=length).astype(dtype)
            what = f"{op} of {length} {dtype.__name__}"
            expected = library.allreduce(x, op)
            for algorithm in ALGORITHMS:
                same(allreduce(comm, x, algorithm=algorithm, op=op), expected, f"allreduce[{algorithm}] {what}")

            counts = [hi - lo for lo, hi in chunk_bounds(length, p)]
            same(reduce_scatter(comm, x, op=op), library.reduce_scatter(x, counts, op), f"reduce_scatter {what}")

            root = int(shared.integers(0, p))
            at_root = library.reduce(x, root, op)
            got = reduce(comm, x, root=root, op=op)
            if r == root:
                same(got, at_root, f"reduce to {root} {what}")
            elif got is not None:
                raise AssertionError(f"rank {r}: reduce to {root} returned {got} on a non-root rank")

        sizes = [int(s) for s in shared.integers(0, length + 2, size=p)]
        piece = rng.integers(-1000, 1000, size=sizes[r]).astype(dtype)
        same(allgather(comm, piece), library.allgatherv(piece, sizes), f"allgather of {sizes} {dtype.__name__}")

        root = int(shared.integers(0, p))
        data = rng.integers(-1000, 1000, size=length).astype(dtype)
        same(broadcast(comm, data, root=root), library.broadcast(data, root), f"broadcast from {root} of {length} {dtype.__name__}")

total = library.total(checked)
if r == 0:
    print(f"OK {total} comparisons on {p} ranks", flush=True)
