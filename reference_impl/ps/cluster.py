"""Who is who in a parameter-server job, what it stores, and the messages between them.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Ranks ``0 .. n_servers-1`` are servers and the rest are workers (TensorFlow's ``ps`` and
``worker`` jobs). Every rank builds the same ``ModelSpec``: the dense variables (each
flattened and split into ``n_servers`` contiguous chunks, one per server) and the sparse
tables (rows spread over servers by ``shard_of``), each with its server-side optimiser.

A request is a header ``int64[4] = (op, variable index, n, clock)`` on ``REQUEST_TAG``,
then its payload on ``DATA_TAG``; a reply follows on ``REPLY_TAG``. Messages on a
``Communicator`` need a receive buffer of the right size, so every variable-length payload
is announced by the ``n`` of its header. Headers have a tag of their own so that a server
can take the next request from whichever worker sent one first (``recv_any``) without
ever mistaking a payload for a header. ``clock`` is the number of steps the worker has
finished: the vector clock of SSP and the step number of BSP and backup workers travel
on every request.

``Consistency`` names the rule the servers and workers follow (BSP, ASP, SSP, backup
workers, EASGD); see ``server.py`` for what each rule makes the servers do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..comm import Communicator
from .optimizers import SGD, Optimizer

REQUEST_TAG, REPLY_TAG, DATA_TAG = 11, 12, 13
HEADER = 4  # int64 fields of a request header: op, variable, n, clock
PULL_DENSE, PUSH_DENSE, PULL_SPARSE, PUSH_SPARSE, STOP, CLOCK, ADD_DENSE, ADD_SPARSE = range(1, 9)
OP_NAMES = {PULL_DENSE: "pull_dense", PUSH_DENSE: "push_dense", PULL_SPARSE: "pull_sparse",
            PUSH_SPARSE: "push_sparse", STOP: "stop", CLOCK: "clock", ADD_DENSE: "add_dense",
            ADD_SPARSE: "add_sparse"}
OK, UNKNOWN_IDS, BAD_GRADIENT = 0, 1, 2  # push reply codes
RULES = ("bsp", "asp", "ssp", "backup", "easgd")


@dataclass(frozen=True)
class Consistency:
    """A consistency rule and its knobs; every rank of a job passes the same one.

    ``staleness`` is SSP's bound ``s`` (``math.inf`` is ASP); ``backups`` is ``b`` of
    backup workers (the last ``b`` of the workers' gradients in each step are dropped;
    ``b = 0`` is BSP); ``tau`` and ``alpha`` are EASGD's exchange period and elastic
    coefficient.
    """

    rule: str = "bsp"
    staleness: float = 4
    backups: int = 1
    tau: int = 4
    alpha: float = 0.25

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"Consistency: unknown rule {self.rule!r}; expected one of {RULES}")
        if not self.staleness >= 0 or self.backups < 0 or self.tau < 1 or not 0 <= self.alpha <= 1:
            raise ValueError(f"Consistency({self.rule!r}): need staleness >= 0, backups >= 0, tau >= 1 and "
                             f"0 <= alpha <= 1, got {self.staleness}, {self.backups}, {self.tau}, {self.alpha}")

    @property
    def synchronous(self) -> bool:
        """BSP and backup workers: steps are numbered rounds that the servers close."""
        return self.rule in ("bsp", "backup")

    @property
    def bound(self) -> float:
        """How many clocks a reader may be ahead of the slowest worker (asynchronous rules)."""
        return self.staleness if self.rule == "ssp" else math.inf

    def dropped_per_step(self, n_workers: int) -> int:
        """``b``: how many of the ``n_workers`` gradients of a step are not waited for."""
        b = self.backups if self.rule == "backup" else 0
        if b >= n_workers:
            raise ValueError(f"Consistency: {b} backup workers leave none of the {n_workers} workers to wait for")
        return b


@dataclass
class DenseVariable:
    """A dense variable: its name, initial value (every rank passes the same) and optimiser."""

    name: str
    initial: np.ndarray
    optimizer: Optimizer = field(default_factory=SGD)


@dataclass
class SparseVariable:
    """A sparse table: rows of ``dim`` floats keyed by int64 ids, created on first pull."""

    name: str
    dim: int
    optimizer: Optimizer = field(default_factory=SGD)
    init_scale: float = 0.05
    seed: int = 0


@dataclass
class ModelSpec:
    """The variables of a model, in an order every rank agrees on."""

    dense: list[DenseVariable] = field(default_factory=list)
    sparse: list[SparseVariable] = field(default_factory=list)

    def dense_index(self, name: str) -> int:
        return _index_of(self.dense, name, "dense variable")

    def sparse_index(self, name: str) -> int:
        return _index_of(self.sparse, name, "sparse table")


def _index_of(items: list[Any], name: str, kind: str) -> int:
    for i, item in enumerate(items):
        if item.name == name:
            return i
    raise KeyError(f"unknown {kind} {name!r}; the model has {[it.name for it in items]}")


@dataclass(frozen=True)
class ClusterSpec:
    """``n_servers`` server ranks first, then ``n_workers`` worker ranks."""

    n_servers: int
    n_workers: int

    def __post_init__(self) -> None:
        if self.n_servers < 1 or self.n_workers < 1:
            raise ValueError(f"ClusterSpec: need at least one server and one worker, got "
                             f"{self.n_servers} servers and {self.n_workers} workers")

    @property
    def size(self) -> int:
        return self.n_servers + self.n_workers

    @property
    def servers(self) -> list[int]:
        return list(range(self.n_servers))

    @property
    def workers(self) -> list[int]:
        return list(range(self.n_servers, self.size))

    def check(self, comm: Communicator) -> None:
        if comm.size != self.size:
            raise ValueError(f"rank {comm.rank}: the cluster has {self.n_servers} servers + "
                             f"{self.n_workers} workers = {self.size} ranks, but the job has {comm.size}")


class SubCommunicator(Communicator):
    """The workers alone as a communicator: rank ``i`` here is global rank ``ranks[i]``.

    Lets workers all-reduce dense gradients among themselves (the collectives expect
    ranks ``0..size-1``) while the servers keep serving the sparse tables.
    """

    def __init__(self, comm: Communicator, ranks: list[int]):
        if comm.rank not in ranks:
            raise ValueError(f"rank {comm.rank} is not in the group {ranks}")
        self.comm, self.ranks = comm, list(ranks)
        self.rank, self.size = self.ranks.index(comm.rank), len(ranks)

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        self.comm.send(buf, self.ranks[dest], tag)

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(source, "source")
        self.comm.recv(buf, self.ranks[source], tag)

    def barrier(self) -> None:
        """Everyone reports to group rank 0, which then releases everyone."""
        token = np.zeros(1, dtype=np.int8)
        if self.rank == 0:
            for r in range(1, self.size):
                self.recv(token, r, tag=99)
            for r in range(1, self.size):
                self.send(token, r, tag=99)
        else:
            self.send(token, 0, tag=99)
            self.recv(token, 0, tag=99)
