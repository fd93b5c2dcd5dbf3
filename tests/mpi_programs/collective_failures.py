"""Run under mpiexec: one rank breaks a collective's contract; the job must fail fast and say so.

Usage: collective_failures.py CASE COLLECTIVE, where CASE is

* ``length``: the last rank passes one element more than the others;
* ``dtype``: rank 1 passes int32 where the others pass float32 (same size in bytes, so MPI's
  own size check cannot see it);
* ``skip``: the last rank never calls the collective (it sleeps), so the others must give
  up after $LAB_COMM_TIMEOUT seconds;

and COLLECTIVE is ``allreduce:<algorithm>``, ``reduce_scatter``, ``allgather``,
``broadcast`` or ``reduce``. A rank whose own messages all fitted may return before the
job is aborted (it prints "returned on rank R"); what matters is that at least one rank
detects the mismatch, so the job as a whole never completes with a wrong answer.
"""
import sys
import time

import numpy as np

from reference_impl.comm import MPICommunicator, allgather, allreduce, broadcast, reduce, reduce_scatter

case, collective = sys.argv[1], sys.argv[2]
comm = MPICommunicator()
last = comm.rank == comm.size - 1
n, dtype = 8, np.float32
if case == "length" and last:
    n += 1
if case == "dtype" and comm.rank == 1:
    dtype = np.int32
if case == "skip" and last:
    time.sleep(120)  # never joins; the other ranks' error aborts the job long before this ends
    sys.exit(0)

x = np.ones(n, dtype)
name, _, algorithm = collective.partition(":")
if name == "allreduce":
    allreduce(comm, x, algorithm=algorithm)
elif name == "reduce_scatter":
    reduce_scatter(comm, x)
elif name == "allgather":
    allgather(comm, x)
elif name == "broadcast":
    broadcast(comm, x, root=0)
elif name == "reduce":
    reduce(comm, x, root=0)
else:
    raise SystemExit(f"unknown collective {collective!r}")
print(f"returned on rank {comm.rank}", flush=True)
comm.barrier()  # reached by every rank only if no rank detected the mismatch
if comm.rank == 0:
    print(f"UNREACHABLE: {collective} completed on every rank despite the {case} mismatch", flush=True)
