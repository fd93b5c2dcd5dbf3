"""Run under mpiexec or torchrun: the communicator of the engine that started it, checked directly.

1. ``allreduce(..., algorithm="library")`` (the engine's own collective) equals NumPy's reduction
   of every rank's input (each rank rebuilds all inputs from their seeds) for every op and dtype,
   on the world and on both halves of a ``split`` (each half reduces over its own members only),
   and for a strided input.
2. ``split`` orders ranks by key: the sub-communicator's ranks follow the keys given.
3. ``recv_any`` returns the sender, and every sender's message arrives.
4. Under torchrun only: torch tensors and non-contiguous arrays travel; a message of another dtype
   or size fails at once with a ``CommError`` naming the sender and both sides; a tensor on a
   device gloo cannot serve fails before anything is sent; and, last (gloo closes the connection
   after it), a receive from a peer that never sends gives up after the timeout, naming the peer.
Rank 0 prints one OK line per part. Run it last in a job: the timeout closes a connection.
"""
import time

import numpy as np

from reference_impl.comm import CommError, allreduce
from reference_impl.comm.engines import engine_of, world_communicator

comm = world_communicator()
p, r = comm.size, comm.rank
engine = engine_of(comm)
DTYPES = (np.float32, np.float64, np.int32, np.int64)
REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean}


def inputs(rank, length, dtype, op, seed):
    high = 3 if op == "prod" else 1000
    return np.random.default_rng([seed, rank]).integers(-high, high, size=length).astype(dtype)


def check_library(c, members, seed):
    checked = 0
    for length in (0, 1, 7, 1000, 65537):
        for dtype in DTYPES:
            for op, reduce in REDUCE.items():
                if op == "mean" and not np.issubdtype(dtype, np.floating):
                    continue
                every = np.stack([inputs(m, length, dtype, op, seed) for m in members]) if length else None
                got = allreduce(c, inputs(members[c.rank], length, dtype, op, seed), algorithm="library", op=op)
                want = np.zeros(0, dtype) if every is None else reduce(every, axis=0).astype(dtype)
                if got.dtype != want.dtype or not np.allclose(got, want, rtol=1e-6):
                    raise AssertionError(f"rank {r}: library {op} of {length} {dtype.__name__} on {members}: "
                                         f"{got[:4]} != {want[:4]}")
                checked += 1
    return checked


n_world = check_library(comm, list(range(p)), seed=1)
strided = allreduce(comm, np.arange(40.0)[::2] * (r + 1), algorithm="library", op="max")
assert np.array_equal(strided, np.arange(40.0)[::2] * p), strided
half = comm.split(r % 2, key=-r)  # two groups, each in reverse rank order
members = sorted((m for m in range(p) if m % 2 == r % 2), reverse=True)
assert half.size == len(members) and half.rank == members.index(r), (r, half.rank, members)
n_half = check_library(half, members, seed=2)
comm.barrier()
if r == 0:
    print(f"OK library allreduce: {n_world} on the world, {n_half} on a split of {half.size} ({engine})", flush=True)
    print(f"OK split ordered by key on {p} ranks", flush=True)

if r == 0:
    seen = set()
    for _ in range(p - 1):
        got = np.empty(3, np.int64)
        source = comm.recv_any(got, tag=7)
        assert np.all(got == source) and source not in seen, (source, got)
        seen.add(source)
    print(f"OK recv_any heard ranks {sorted(seen)}", flush=True)
else:
    comm.send(np.full(3, r, np.int64), 0, tag=7)
comm.barrier()

if engine == "torch":
    import torch
    import torch.distributed as dist

    peer = 1 - r if r < 2 else None
    if peer is not None:
        # a tensor and a strided array out, a strided tensor and array in
        out = np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2] * (r + 1)
        grid = torch.zeros(8, 3, dtype=torch.float64)[::2]
        comm.sendrecv(out, peer, grid, peer, tag=3)
        assert np.array_equal(grid.numpy(), np.arange(20.0).reshape(4, 5)[:, ::2] * (peer + 1)), grid
        back = np.zeros((4, 3))
        comm.sendrecv(torch.arange(12, dtype=torch.float64).reshape(4, 3) * (r + 1), peer, back, peer, tag=4)
        assert np.array_equal(back, np.arange(12.0).reshape(4, 3) * (peer + 1)), back

        # a wrong dtype, then a wrong size: the receiver fails at once; the payload is drained raw
        if r == 0:
            for sent in (np.ones(8, np.float32), np.ones(9, np.float32)):
                comm.send(sent, 1, tag=5)
        else:
            for want, words in ((np.empty(8, np.int32), ("holds float32 data (32 bytes)", "8 elements of int32")),
                                (np.empty(8, np.float32), ("(36 bytes)", "8 elements of float32 (32 bytes)"))):
                start = time.monotonic()
                try:
                    comm.recv(want, 0, tag=5)
                except CommError as exc:
                    text = str(exc)
                    assert "message from rank 0 (tag 5)" in text and all(w in text for w in words), text
                    assert time.monotonic() - start < comm.timeout / 2, "a mismatch waited for the timeout"
                else:
                    raise AssertionError("a mismatched message was accepted")
                dist.recv(torch.empty(want.nbytes + (4 if want.dtype == np.float32 else 0), dtype=torch.uint8),
                          group_src=0, tag=5, group=comm.group)
            print("OK mismatched dtype and size fail at once", flush=True)

        # a device gloo cannot serve fails before anything is posted
        try:
            comm.send(torch.empty(2, device="meta"), peer)
        except ValueError as exc:
            assert "gloo carries CPU data" in str(exc) and "meta" in str(exc), exc
        else:
            raise AssertionError("a meta tensor was accepted")
    comm.barrier()
    if r == 0:
        print("OK tensors, strided buffers, device check", flush=True)
        comm.timeout = 0.5
        start = time.monotonic()
        try:
            comm.recv(np.empty(1), 1, tag=9)
        except CommError as exc:
            waited = time.monotonic() - start
            assert "still waiting for a message from rank 1 (tag 9) after 0.5 s" in str(exc), exc
            print(f"OK timeout named rank 1 after {waited:.1f} s", flush=True)
        else:
            raise AssertionError("a receive with no sender returned")
    elif r == 1:
        time.sleep(1.5)  # alive, but silent, while rank 0 waits (an exit would close the connection at once)
