"""Communicators (thread ranks, MPI ranks) and the collectives built on them."""
from .allreduce import ALGORITHMS, AUTO_LINK, allreduce, choose_algorithm
from .alltoall import ALLTOALL_ALGORITHMS, alltoall, alltoallv
from .ops import OPS
from .rabenseifner import rabenseifner_allreduce
from .recursive_doubling import recursive_doubling_allreduce
from .ring import allgather, chunk_bounds, reduce_scatter, ring_allgather, ring_allreduce, ring_reduce_scatter
from .tree import broadcast, reduce, tree_allreduce
from .communicator import (
    CommError,
    Communicator,
    CountingCommunicator,
    ThreadCommunicator,
    itemsize,
    run_threads,
)
from .mpi import MPICommunicator
from .bucketing import plan_buckets
from .cluster_sim import Layer, SimStep, simulate_step
from .simnet import INTERCONNECTS, Interconnect, SimulatedNetwork
from .calibrate import calibrate, pingpong, reduction_time

__all__ = [
    "ALGORITHMS", "OPS", "CommError", "Communicator", "CountingCommunicator", "MPICommunicator",
    "ThreadCommunicator", "allreduce", "chunk_bounds", "itemsize", "ring_allgather",
    "ring_reduce_scatter", "run_threads",
    "AUTO_LINK", "allgather", "broadcast", "choose_algorithm", "rabenseifner_allreduce",
    "recursive_doubling_allreduce", "reduce", "reduce_scatter", "ring_allreduce", "tree_allreduce",
    "INTERCONNECTS", "Interconnect", "SimulatedNetwork", "calibrate", "pingpong", "reduction_time",
    "Layer", "SimStep", "plan_buckets", "simulate_step",
    "ALLTOALL_ALGORITHMS", "alltoall", "alltoallv",
]
