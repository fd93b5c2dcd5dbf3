"""Run under mpiexec: alltoall (both algorithms) and alltoallv must equal MPI_Alltoall(v) bit for bit.

Same inputs to both; random floats and integers, so any reordering or mix-up shows.
Rank 0 prints ``OK <n> comparisons on <p> ranks`` with the total over all ranks.
"""
import numpy as np
from mpi4py import MPI

from reference_impl.comm import ALLTOALL_ALGORITHMS, MPICommunicator, alltoall, alltoallv

world = MPI.COMM_WORLD
comm = MPICommunicator(world)
p, r = comm.size, comm.rank
rng = np.random.default_rng(2000 + r)
shared = np.random.default_rng(11)  # the same stream on every rank: the count matrix agrees
checked = 0


def same(got, expected, what):
    global checked
    if got.dtype != expected.dtype or got.shape != expected.shape or got.tobytes() != expected.tobytes():
        raise AssertionError(f"rank {r}: {what} differs from MPI: {got} != {expected}")
    checked += 1


def sample(shape, dtype):
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-(1 << 40), 1 << 40, size=shape).astype(dtype)


for dtype in [np.float32, np.int64]:
    for m in [0, 1, 1000]:
        x = sample((p, m), dtype)
        expected = np.empty_like(x)
        world.Alltoall(x, expected)
        for algorithm in ALLTOALL_ALGORITHMS:
            same(alltoall(comm, x, algorithm=algorithm), expected, f"alltoall[{algorithm}] m={m} {dtype.__name__}")

    counts = shared.integers(0, 50, size=(p, p))  # counts[src, dst]
    counts[shared.random((p, p)) < 0.25] = 0  # some empty blocks
    send_counts, recv_counts = counts[r, :], counts[:, r]
    blocks = [sample(int(c), dtype) for c in send_counts]
    send = np.concatenate(blocks) if blocks else np.empty(0, dtype)
    recv = np.empty(int(recv_counts.sum()), dtype)
    send_displ = np.concatenate([[0], np.cumsum(send_counts)[:-1]])
    recv_displ = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    world.Alltoallv([send, (send_counts, send_displ)], [recv, (recv_counts, recv_displ)])
    expected_blocks = [recv[recv_displ[i]:recv_displ[i] + recv_counts[i]] for i in range(p)]
    for got in (alltoallv(comm, blocks), alltoallv(comm, blocks, recv_counts=recv_counts)):
        same(np.concatenate(got), recv, f"alltoallv {dtype.__name__}")
        for i in range(p):
            if got[i].shape != expected_blocks[i].shape:
                raise AssertionError(f"rank {r}: alltoallv block {i} has shape {got[i].shape}")

total = world.reduce(checked, op=MPI.SUM, root=0)
if r == 0:
    print(f"OK {total} comparisons on {p} ranks")
