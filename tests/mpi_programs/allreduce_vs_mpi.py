"""Run under mpiexec (or torchrun): our ring allreduce must equal the library's own allreduce exactly."""
import numpy as np
from library_reference import LibraryReference

from reference_impl.comm import allreduce
from reference_impl.comm.engines import world_communicator

comm = world_communicator()
library = LibraryReference(comm)
rng = np.random.default_rng(1000 + comm.rank)
checked = 0
for length in [0, 1, comm.size - 1, 7, 1000, 65537]:
    for dtype in [np.float32, np.float64, np.int32, np.int64]:
        for op in ("sum", "prod", "max", "min"):
            high = 3 if op == "prod" else 1000
            x = rng.integers(-high, high, size=length).astype(dtype)
            expected = library.allreduce(x, op)
            got = allreduce(comm, x, op=op)
            if not np.array_equal(got, expected):
                raise AssertionError(f"rank {comm.rank}: {op} of {length} {dtype.__name__} differs from the library")
            checked += 1
total = library.total(checked)
if comm.rank == 0:
    print(f"OK {total} comparisons on {comm.size} ranks", flush=True)
