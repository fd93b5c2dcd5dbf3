"""Run under mpiexec (or torchrun): data-parallel training with a communication thread.

Checks inside the job: MPI allows a communication thread (under MPI); "overlap", "end" and
"per_tensor" end with the same parameters (bit for bit on 2 ranks, to rounding beyond);
the averaged gradient equals the library's own allreduce (MPI's or torch.distributed's) of the local gradients divided by the rank
count; and in overlap mode the first allreduce started before backward ended. Rank 0
prints the digest of the trained parameters, so the test can compare separate runs.
"""
import sys

import numpy as np
from library_reference import LibraryReference

from reference_impl.comm.engines import world_communicator
from reference_impl.train.data import batch_indices, shard, synthetic_classification
from reference_impl.train.data_parallel import DataParallelTrainer, train
from reference_impl.train.determinism import max_abs_diff, params_digest
from reference_impl.train.mlp import init_mlp, loss_and_grads

comm = world_communicator()
library = LibraryReference(comm)
n = comm.size
if library.engine == "mpi":
    assert library.MPI.Query_thread() >= library.MPI.THREAD_SERIALIZED, library.MPI.Query_thread()

widths = (64, 512, 512, 512, 10)
runs = {m: train(comm, widths=widths, steps=12, global_batch=128 * n, mode=m, bucket_bytes=16384)
        for m in ("overlap", "end", "per_tensor")}
for m, r in runs.items():
    d = max_abs_diff(r.params, runs["overlap"].params)
    if n == 2 and d != 0.0:
        raise AssertionError(f"rank {comm.rank}: mode {m} differs from overlap by {d} on 2 ranks")
    if d > 1e-5:
        raise AssertionError(f"rank {comm.rank}: mode {m} differs from overlap by {d}")

# The averaged gradient against the library's own allreduce of the same local gradients.
x_all, y_all = synthetic_classification(512, widths[0], widths[-1], seed=5)
params = init_mlp(widths, seed=6)
x, y = shard(*(a[batch_indices(512, 16 * n, 0, seed=5)] for a in (x_all, y_all)), comm.rank, n)
_, local = loss_and_grads(params, x, y)
with DataParallelTrainer(comm, [p.copy() for p in params], mode="overlap", bucket_bytes=8192) as t:
    t.step(x, y)
    for g_local, g_avg in zip(local, t.averaged_grads()):
        expected = library.allreduce(g_local, "mean")
        if not np.allclose(g_avg, expected, rtol=1e-5, atol=1e-7):
            raise AssertionError(f"rank {comm.rank}: averaged gradient differs from the library's allreduce / {n}")

early = sum(tr.comm_started_before_backward_end for tr in runs["overlap"].traces)
late = sum(tr.buckets[0].start >= tr.backward_end for tr in runs["end"].traces)
digests = library.gather(params_digest(runs["overlap"].params))
if comm.rank == 0:
    if len(set(digests)) != 1:
        raise AssertionError(f"replicas diverged: {digests}")
    level = library.MPI.Query_thread() if library.engine == "mpi" else "torch"
    print(f"thread_level {level} early {early}/12 late {late}/12")
    print(f"DIGEST {digests[0]}")
sys.stdout.flush()
