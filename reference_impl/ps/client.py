"""The worker's side of a parameter server: pull and push by variable name.

NumPy-only: a parameter server's tables live in host memory; other arrays are refused by name.

``PSClient`` turns a variable name into requests to the servers that hold it: a dense
variable is the concatenation of one chunk per server; a sparse table's ids are grouped
by owner (``group_by_shard``) and each server gets its slice. Every request goes to every
server, even with nothing to say (``n = 0``), so that servers answering in rounds stay in
step. ``client.table(name)`` is a ``RowStore`` for ``sparse_table_pull``/``push``.

Every request carries ``client.clock``, the steps this worker has finished; ``tick()``
ends a step (tells every server, and learns which step to do next: under backup workers
a late worker skips ahead). ``add_dense`` and ``RemoteTable.add`` change the servers'
values without their optimiser: EASGD's elastic move of the centre.

A push is checked here before anything is sent (finite gradients; for a table, only ids
this worker pulled since its last push), so a bad push changes no server. The servers
check again, each its own slice, and refuse with a reply code: the second line of
defence, against a client that skipped the first.
"""
from __future__ import annotations

import numpy as np

from ..comm import Communicator, chunk_bounds
from .cluster import (ADD_DENSE, ADD_SPARSE, BAD_GRADIENT, CLOCK, DATA_TAG, OK, PULL_DENSE, PULL_SPARSE,
                      PUSH_DENSE, PUSH_SPARSE, REPLY_TAG, REQUEST_TAG, STOP, UNKNOWN_IDS, ClusterSpec,
                      ModelSpec)
from ..backend import require_numpy
from .hashing import PARAMETER_SERVER, as_ids, group_by_shard


class PSError(RuntimeError):
    """A server refused a request (unknown ids, bad gradients)."""


class PSClient:
    """Worker ``comm.rank``'s connection to the servers of ``cluster``."""

    def __init__(self, comm: Communicator, cluster: ClusterSpec, model: ModelSpec):
        cluster.check(comm)
        if comm.rank not in cluster.workers:
            raise ValueError(f"rank {comm.rank} is a server, not a worker, in {cluster}")
        self.comm, self.cluster, self.model = comm, cluster, model
        self.ids_sent = 0  # ids this worker sent to servers (pull + push): the sparse traffic
        self.pulled: dict[int, set[int]] = {}  # per table: ids pulled since this worker's last push
        self.clock = 0  # steps finished (or, under backup workers, skipped)

    def _header(self, server: int, op: int, var: int, n: int) -> None:
        self.comm.send(np.array([op, var, n, self.clock], dtype=np.int64), server, REQUEST_TAG)

    def _payload(self, server: int, array: np.ndarray) -> None:
        self.comm.send(np.ascontiguousarray(array), server, DATA_TAG)

    def tick(self) -> int:
        """This worker's step is done (all its pushes acknowledged); returns the next step."""
        for s in self.cluster.servers:
            self._header(s, CLOCK, 0, 0)
        nxt = np.empty(1, dtype=np.int64)
        steps = []
        for s in self.cluster.servers:
            self.comm.recv(nxt, s, REPLY_TAG)
            steps.append(int(nxt[0]))
        self.clock = max(steps)
        return self.clock

    def _check_replies(self, what: str) -> None:
        """Read every server's reply code to a push, then raise if any server refused it."""
        code = np.empty(1, dtype=np.int64)
        refused = []
        for s in self.cluster.servers:
            self.comm.recv(code, s, REPLY_TAG)
            if code[0] != OK:
                reason = {UNKNOWN_IDS: "ids never pulled", BAD_GRADIENT: "NaN or inf gradient"}
                refused.append(f"server rank {s} ({reason.get(int(code[0]), f'code {code[0]}')})")
        if refused:
            raise PSError(f"rank {self.comm.rank}: {what} refused by {', '.join(refused)}; "
                          f"each server left its slice unchanged")

    @staticmethod
    def _check_finite(grad: np.ndarray, what: str, rank: int) -> None:
        if not np.all(np.isfinite(grad)):
            raise PSError(f"rank {rank}: {what} has NaN or inf gradients; nothing was sent")

    def pull_dense(self, name: str) -> np.ndarray:
        i = self.model.dense_index(name)
        initial = self.model.dense[i].initial
        out = np.empty(initial.size)
        bounds = chunk_bounds(initial.size, self.cluster.n_servers)
        for s in self.cluster.servers:
            self._header(s, PULL_DENSE, i, 0)
        for s, (lo, hi) in zip(self.cluster.servers, bounds):
            self.comm.recv(out[lo:hi], s, REPLY_TAG)
        return out.reshape(initial.shape)

    def push_dense(self, name: str, grad: np.ndarray) -> None:
        """Send a gradient; each server applies its chunk with the variable's optimiser."""
        self._send_dense(PUSH_DENSE, name, grad)

    def add_dense(self, name: str, delta: np.ndarray) -> None:
        """Add ``delta`` to the servers' value as it is (no optimiser): EASGD's centre update."""
        self._send_dense(ADD_DENSE, name, delta)

    def _send_dense(self, op: int, name: str, grad: np.ndarray) -> None:
        what = f"{'push' if op == PUSH_DENSE else 'add'}_dense({name!r})"
        i = self.model.dense_index(name)
        initial = self.model.dense[i].initial
        require_numpy(PARAMETER_SERVER, grad)
        grad = np.asarray(grad, dtype=np.float64)
        if grad.shape != initial.shape:
            raise ValueError(f"rank {self.comm.rank}: {what} gradient has shape "
                             f"{grad.shape}, the variable {initial.shape}")
        self._check_finite(grad, what, self.comm.rank)
        flat = grad.ravel()
        bounds = chunk_bounds(initial.size, self.cluster.n_servers)
        for s, (lo, hi) in zip(self.cluster.servers, bounds):
            self._header(s, op, i, hi - lo)
            self._payload(s, flat[lo:hi])
        self._check_replies(what)

    def table(self, name: str) -> RemoteTable:
        return RemoteTable(self, self.model.sparse_index(name))

    def stop(self) -> None:
        """Tell every server this worker is done."""
        for s in self.cluster.servers:
            self._header(s, STOP, 0, 0)


class RemoteTable:
    """A sparse table whose shards live on the servers: ``pull(ids)`` / ``push(ids, grads)``."""

    def __init__(self, client: PSClient, index: int):
        self.client, self.index = client, index
        self.spec = client.model.sparse[index]
        self.dim = self.spec.dim

    def pull(self, ids: np.ndarray) -> np.ndarray:
        c = self.client
        ids = as_ids(ids)
        order, bounds = group_by_shard(ids, c.cluster.n_servers)
        for s, (lo, hi) in zip(c.cluster.servers, bounds):
            c._header(s, PULL_SPARSE, self.index, hi - lo)
            if hi > lo:
                c._payload(s, ids[order[lo:hi]])
            c.ids_sent += hi - lo
        c.pulled.setdefault(self.index, set()).update(ids.tolist())
        out = np.empty((len(ids), self.dim))
        for s, (lo, hi) in zip(c.cluster.servers, bounds):
            rows = np.empty((hi - lo, self.dim))
            c.comm.recv(rows, s, REPLY_TAG)
            out[order[lo:hi]] = rows
        return out

    def push(self, ids: np.ndarray, grads: np.ndarray) -> None:
        c = self.client
        ids = as_ids(ids)
        require_numpy(PARAMETER_SERVER, grads)
        grads = np.asarray(grads, dtype=np.float64)
        if grads.shape != (len(ids), self.dim):
            raise ValueError(f"rank {c.comm.rank}: push to table {self.spec.name!r}: gradients of "
                             f"shape {grads.shape} for {len(ids)} ids of dim {self.dim}")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"rank {c.comm.rank}: push to table {self.spec.name!r} names an id "
                             f"twice; sum duplicates first (sparse_table_push does)")
        what = f"push to table {self.spec.name!r}"
        c._check_finite(grads, what, c.comm.rank)
        pulled = c.pulled.get(self.index, set())
        unknown = [i for i in ids.tolist() if i not in pulled]
        if unknown:
            shown = ("id " if len(unknown) == 1 else "ids ") + ", ".join(str(i) for i in unknown[:5])
            shown += f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise PSError(f"rank {c.comm.rank}: {what} names {len(unknown)} id(s) this worker did "
                          f"not pull since its last push: {shown}; nothing was sent. Every pushed id must "
                          f"have been pulled first in the same step, and a push ends the step: pull the "
                          f"batch's ids, then push all their gradients in one call")
        c.pulled[self.index] = set()
        self._send_rows(PUSH_SPARSE, ids, grads, what)

    def add(self, ids: np.ndarray, delta: np.ndarray) -> None:
        """Add ``delta`` to existing rows as it is (no optimiser): EASGD's centre update."""
        c = self.client
        ids = as_ids(ids)
        delta = np.asarray(delta, dtype=np.float64)
        what = f"add to table {self.spec.name!r}"
        if delta.shape != (len(ids), self.dim) or len(np.unique(ids)) != len(ids):
            raise ValueError(f"rank {c.comm.rank}: {what}: need unique ids and deltas of shape "
                             f"({len(ids)}, {self.dim}), got {delta.shape}")
        c._check_finite(delta, what, c.comm.rank)
        self._send_rows(ADD_SPARSE, ids, delta, what)

    def _send_rows(self, op: int, ids: np.ndarray, rows: np.ndarray, what: str) -> None:
        c = self.client
        order, bounds = group_by_shard(ids, c.cluster.n_servers)
        for s, (lo, hi) in zip(c.cluster.servers, bounds):
            c._header(s, op, self.index, hi - lo)
            if hi > lo:
                c._payload(s, ids[order[lo:hi]])
                c._payload(s, rows[order[lo:hi]])
            c.ids_sent += hi - lo
        c._check_replies(what)
