"""A parameter server: holds one chunk of every dense variable and one shard of every table.

The server answers its workers in rounds: one request from each live worker, in rank
order, then the next round. Two ways to apply pushes:

* ``sync=True`` (BSP, aggregate then apply): within a round every worker must send the
  same request; gradients pushed in the round are summed and applied once at its end, so
  the next round's pulls see one update made from all workers' gradients. With each
  worker pushing ``(local examples / global batch)``-scaled gradients, this is exactly
  single-process training on the global batch.
* ``sync=False`` (asynchronous): every push is applied as soon as it arrives, so a
  worker's next pull reflects whatever pushes came before it (its own and others').

Bad pushes (ids never pulled, NaN gradients) are refused with a reply code before any
row changes; the worker raises. A server that dies shows up on the workers as a
``CommError`` naming it, at the communicator's timeout at the latest.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..comm import Communicator, chunk_bounds
from .cluster import (BAD_GRADIENT, OK, OP_NAMES, PULL_DENSE, PULL_SPARSE, PUSH_DENSE, PUSH_SPARSE,
                      REPLY_TAG, REQUEST_TAG, STOP, UNKNOWN_IDS, ClusterSpec, ModelSpec)
from .sparse_table import SparseTable


class ParameterServer:
    """Server ``comm.rank`` of ``cluster``: call ``serve()`` until every worker has stopped."""

    def __init__(self, comm: Communicator, cluster: ClusterSpec, model: ModelSpec, sync: bool = True):
        cluster.check(comm)
        if comm.rank not in cluster.servers:
            raise ValueError(f"rank {comm.rank} is a worker, not a server, in {cluster}")
        self.comm, self.cluster, self.model, self.sync = comm, cluster, model, sync
        s = comm.rank
        self.bounds = []
        self.dense: list[np.ndarray] = []
        self.dense_slots: list[dict[str, np.ndarray]] = []
        self.dense_steps: list[int] = []
        for var in model.dense:
            lo, hi = chunk_bounds(var.initial.size, cluster.n_servers)[s]
            self.bounds.append((lo, hi))
            self.dense.append(np.array(var.initial, dtype=np.float64).ravel()[lo:hi].copy())
            self.dense_slots.append(var.optimizer.init_slots((hi - lo,)))
            self.dense_steps.append(0)
        self.tables = [SparseTable(v.dim, v.optimizer, v.init_scale, v.seed, f"{v.name}@server{s}")
                       for v in model.sparse]
        self.requests_served = 0

    def serve(self) -> "ParameterServer":
        """Answer requests until all workers sent STOP; returns self (for inspection in tests)."""
        live = list(self.cluster.workers)
        header = np.zeros(3, dtype=np.int64)
        while live:
            pending: dict[tuple[int, int], list[Any]] = {}
            round_ops = []
            for w in live:
                self.comm.recv(header, w, REQUEST_TAG)
                op, var, n = (int(v) for v in header)
                round_ops.append((w, op, var))
                if op == STOP:
                    continue
                self._handle(w, op, var, n, pending)
                self.requests_served += 1
            if self.sync and len({(op, var) for _, op, var in round_ops}) > 1:
                detail = ", ".join(f"rank {w}: {OP_NAMES.get(op, op)}({var})" for w, op, var in round_ops)
                raise RuntimeError(f"server rank {self.comm.rank}: synchronous round with different "
                                   f"requests from the workers ({detail}); every worker must run the "
                                   f"same steps")
            for (op, var), parts in pending.items():
                self._apply(op, var, parts)
            live = [w for w, op, _ in round_ops if op != STOP]
        return self

    def _handle(self, w: int, op: int, var: int, n: int, pending: dict) -> None:
        comm = self.comm
        if op == PULL_DENSE:
            comm.send(self.dense[var], w, REPLY_TAG)
        elif op == PUSH_DENSE:
            grad = np.empty_like(self.dense[var])
            comm.recv(grad, w, REQUEST_TAG)
            code = OK if np.all(np.isfinite(grad)) else BAD_GRADIENT
            comm.send(np.array([code], dtype=np.int64), w, REPLY_TAG)
            if code == OK:
                self._push_or_defer(op, var, grad, pending)
        elif op == PULL_SPARSE:
            ids = np.empty(n, dtype=np.int64)
            if n:
                comm.recv(ids, w, REQUEST_TAG)
            comm.send(self.tables[var].pull(ids), w, REPLY_TAG)
        elif op == PUSH_SPARSE:
            table = self.tables[var]
            ids, grads = np.empty(n, dtype=np.int64), np.empty((n, table.dim))
            if n:
                comm.recv(ids, w, REQUEST_TAG)
                comm.recv(grads, w, REQUEST_TAG)
            code = OK
            if not np.all(np.isfinite(grads)):
                code = BAD_GRADIENT
            else:
                try:
                    table.rows_of(ids, create=False)
                except KeyError:
                    code = UNKNOWN_IDS
            comm.send(np.array([code], dtype=np.int64), w, REPLY_TAG)
            if code == OK and n:
                self._push_or_defer(op, var, (ids, grads), pending)
        else:
            raise RuntimeError(f"server rank {comm.rank}: unknown request op {op} from rank {w}")

    def _push_or_defer(self, op: int, var: int, payload: Any, pending: dict) -> None:
        if self.sync:
            pending.setdefault((op, var), []).append(payload)
        else:
            self._apply(op, var, [payload])

    def _apply(self, op: int, var: int, parts: list[Any]) -> None:
        """Apply the sum of the pushed gradients once: dense chunk or table rows."""
        if op == PUSH_DENSE:
            self.dense_steps[var] += 1
            self.model.dense[var].optimizer.apply(self.dense[var], np.sum(parts, axis=0),
                                                  self.dense_slots[var], self.dense_steps[var])
        else:
            ids = np.concatenate([p[0] for p in parts])
            grads = np.concatenate([p[1] for p in parts])
            unique, where = np.unique(ids, return_inverse=True)
            summed = np.zeros((len(unique), grads.shape[1]))
            np.add.at(summed, where, grads)
            self.tables[var].push(unique, summed)
