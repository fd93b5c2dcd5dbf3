"""Run under mpiexec: rank 1 passes one element more; the job must fail fast with a clear error."""
import numpy as np

from reference_impl.comm import MPICommunicator, allreduce

comm = MPICommunicator()
allreduce(comm, np.ones(8 + (comm.rank == 1), np.float32))
print("UNREACHABLE: mismatched allreduce returned", flush=True)
