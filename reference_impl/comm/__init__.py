"""Communicators (thread ranks, MPI ranks) and the collectives built on them."""
from .allreduce import ALGORITHMS, OPS, allreduce, chunk_bounds, ring_allgather, ring_reduce_scatter
from .communicator import (
    CommError,
    Communicator,
    CountingCommunicator,
    ThreadCommunicator,
    itemsize,
    run_threads,
)
from .mpi import MPICommunicator

__all__ = [
    "ALGORITHMS", "OPS", "CommError", "Communicator", "CountingCommunicator", "MPICommunicator",
    "ThreadCommunicator", "allreduce", "chunk_bounds", "itemsize", "ring_allgather",
    "ring_reduce_scatter", "run_threads",
]
