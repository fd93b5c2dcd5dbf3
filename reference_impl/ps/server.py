"""A parameter server: holds one chunk of every dense variable and one shard of every table.

NumPy-only: a parameter server's tables live in host memory; other arrays are refused by name.

The server takes requests in the order they arrive (``recv_any``), so a fast worker is
never queued behind a slow one. What it does with them is the consistency rule:

* ``bsp`` and ``backup`` (clocked rounds): every request carries the worker's step
  number (``clock``). Pushes are buffered per worker until the worker sends ``CLOCK``
  ("my step is done"). The first ``n - b`` workers whose ``CLOCK`` arrives for the
  current step are summed and applied together; a ``CLOCK`` for a step already applied
  is late, and that worker's buffered gradients are dropped and counted. A pull for step
  ``c`` is answered once step ``c - 1`` is applied. ``b = 0`` is BSP.
* ``consistency=None, sync=True`` (the original contract: BSP by rounds, workers need no
  clock): the same BSP, with every request a step of its own that the server ends for the
  worker, as if a ``CLOCK`` followed it. A step is then one request from each live worker,
  and every worker must send the same request; a worker's next request that arrives
  before the step is applied waits for it.
* ``asp`` and ``ssp`` (vector clock): pushes are applied the moment they arrive; the
  server keeps each worker's clock (from its ``CLOCK`` messages) in an ``SSPClock`` and
  answers a pull at clock ``c`` only when the slowest worker's clock is at least
  ``c - s``: every update of steps before ``c - s`` is then in what the worker reads.
  Meanwhile it keeps serving the others, so the slow worker can catch up.
* ``easgd``: served like ``asp``; the variables are the *centre*, changed only by the
  workers' elastic ``ADD`` requests (no optimiser), see ``training.py``.

With gradients pushed ``(local examples / global batch)``-scaled, BSP in either form is
exactly single-process training on the global batch. Bad pushes (ids never pulled, NaN
gradients) are refused with a reply code before any row changes; the worker raises. A
server that dies shows up on the workers as a ``CommError`` naming it, at the
communicator's timeout at the latest.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..comm import Communicator, chunk_bounds
from .cluster import (ADD_DENSE, ADD_SPARSE, BAD_GRADIENT, CLOCK, DATA_TAG, HEADER, OK, OP_NAMES, PULL_DENSE,
                      PULL_SPARSE, PUSH_DENSE, REPLY_TAG, REQUEST_TAG, STOP, UNKNOWN_IDS, ClusterSpec,
                      Consistency, ModelSpec)
from .sparse_table import SparseTable
from .ssp_clock import SSPClock

PULLS, ADDS = (PULL_DENSE, PULL_SPARSE), (ADD_DENSE, ADD_SPARSE)


def add_to_rows(table: SparseTable, ids: np.ndarray, delta: np.ndarray) -> None:
    """``table[ids] += delta`` with no optimiser (EASGD's elastic move); ids must exist."""
    table.values[table.rows_of(ids, create=False)] += delta


class ParameterServer:
    """Server ``comm.rank`` of ``cluster``: call ``serve()`` until every worker has stopped.

    After ``serve()``: ``reads`` has one ``(worker, clock, clocks of all workers)`` per
    answered pull (asynchronous rules) or ``(worker, clock, steps applied)`` (clocked
    rounds); ``rounds`` the workers whose gradients each applied step used; ``dropped``
    the ``(worker, step)`` of every gradient dropped as late. ``observer``, if set, is
    called with the server after every request it handles (a benchmark's snapshots).
    """

    def __init__(self, comm: Communicator, cluster: ClusterSpec, model: ModelSpec, sync: bool = True,
                 consistency: Consistency | None = None):
        cluster.check(comm)
        if comm.rank not in cluster.servers:
            raise ValueError(f"rank {comm.rank} is a worker, not a server, in {cluster}")
        self.comm, self.cluster, self.model = comm, cluster, model
        self.by_rounds = consistency is None and sync  # BSP without clocks: each request is a step
        if consistency is None:
            consistency = Consistency("bsp") if sync else Consistency("asp")
        self.sync, self.consistency = consistency.synchronous, consistency
        self.required = cluster.n_workers - consistency.dropped_per_step(cluster.n_workers)
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
        self.clock = SSPClock(cluster.n_workers, consistency.bound)  # asynchronous rules
        self.version = 0  # clocked rounds: steps applied so far
        self.buffered: dict[int, list[tuple[int, int, Any]]] = {}  # worker -> pushes of its open step
        self.accepted: dict[int, list[tuple[int, int, Any]]] = {}  # in-time workers of the open step
        self.deferred: list[tuple[int, int, int, int, Any]] = []  # pulls not yet allowed
        self.early: dict[int, np.ndarray] = {}  # by rounds: a worker's header for the next step
        self.requested: dict[int, tuple[int, int]] = {}  # by rounds: each worker's (op, var) this step
        self.reads: list[tuple[int, int, Any]] = []
        self.rounds: list[list[int]] = []
        self.dropped: list[tuple[int, int]] = []
        self.observer: Callable[[ParameterServer], None] | None = None

    def serve(self) -> ParameterServer:
        """Answer requests until all workers sent STOP; returns self (for inspection in tests)."""
        live = set(self.cluster.workers)
        header = np.zeros(HEADER, dtype=np.int64)
        while live:
            w = self.comm.recv_any(header, REQUEST_TAG)
            op, var, n, clock = (int(v) for v in header)
            if self.by_rounds:
                self.early[w] = header.copy()
                self._serve_early(live)
            elif op == STOP:
                live.discard(w)
                self.clock.clocks[self._index(w)] = math.inf  # a finished worker holds nobody back
                self._close_round_if_complete(len(live))
            elif op == CLOCK:
                self._clock(w, clock, len(live))
            else:
                self._request(w, op, var, n, clock)
                self.requests_served += 1
            self._answer_ready_pulls()
            if self.observer is not None:
                self.observer(self)
        return self

    def _index(self, w: int) -> int:
        return w - self.cluster.n_servers

    # ---------------------------------------------------------------- the rules

    def _request(self, w: int, op: int, var: int, n: int, clock: int) -> None:
        payload = self._receive_payload(w, op, var, n)
        if op in PULLS:
            self.deferred.append((w, op, var, clock, payload))
            return
        code = self._check(op, var, payload)
        self.comm.send(np.array([code], dtype=np.int64), w, REPLY_TAG)
        if code != OK:
            return
        if op in ADDS:
            self._add(op, var, payload)
        elif self.sync:
            self.buffered.setdefault(w, []).append((op, var, payload))
        else:
            self._apply(op, var, [payload])

    # --8<-- [start:rules]
    def _clock(self, w: int, step: int, n_live: int) -> None:
        """Worker ``w`` finished ``step``; reply with the step it should do next."""
        if not self.sync:
            self.clock.clocks[self._index(w)] = step + 1
            self.comm.send(np.array([step + 1], dtype=np.int64), w, REPLY_TAG)
            return
        if step > self.version:
            raise RuntimeError(f"server rank {self.comm.rank}: rank {w} finished step {step} but only "
                               f"{self.version} steps are applied; a worker must pull before it pushes")
        pushes = self.buffered.pop(w, [])
        if step == self.version and w not in self.accepted:
            self.accepted[w] = pushes
            self._close_round_if_complete(n_live)
        else:  # the step was applied without this worker: its gradient is stale
            self.dropped.append((w, step))
        self.comm.send(np.array([max(step + 1, self.version)], dtype=np.int64), w, REPLY_TAG)

    def _close_round_if_complete(self, n_live: int) -> None:
        """Enough in-time workers (``n - b``, or all still live): apply their summed step."""
        if not self.sync or not self.accepted or len(self.accepted) < min(self.required, n_live):
            return
        used = sorted(self.accepted)
        self._apply_summed([(w, p) for w in used for p in self.accepted[w]])
        self.rounds.append(used)
        self.accepted = {}
        self.version += 1

    def _may_read(self, clock: int) -> bool:
        """May a pull by a worker at ``clock`` be answered now? (SSP: ``SSPClock.can_read``'s rule)."""
        if self.sync:
            return self.version >= clock
        return clock - self.clock.slowest() <= self.clock.staleness
    # --8<-- [end:rules]

    def _answer_ready_pulls(self) -> None:
        waiting = []
        for w, op, var, clock, payload in self.deferred:
            if not self._may_read(clock):
                waiting.append((w, op, var, clock, payload))
                continue
            seen = self.version if self.sync else tuple(self.clock.clocks)
            self.reads.append((w, clock, seen))
            self._answer_pull(w, op, var, payload)
        self.deferred = waiting

    # ---------------------------------------------------------------- BSP by rounds (no clocks)

    def _serve_early(self, live: set[int]) -> None:
        """Take each waiting request whose worker has none in the current step yet: it is that
        worker's request of this step, which then ends (its pushes are accepted, as a ``CLOCK``
        would); once every live worker's is in, check they agree and close the step."""
        while (w := next((v for v in self.early if v not in self.accepted), None)) is not None:
            op, var, n, _ = (int(v) for v in self.early.pop(w))
            self.requested[w] = (op, var)
            if op != STOP:
                self._request(w, op, var, n, self.version)
                self._answer_ready_pulls()  # a pull of the open step is answered at once
                self.requests_served += 1
            self.accepted[w] = self.buffered.pop(w, [])
            if len(self.accepted) < len(live):
                continue
            if len(set(self.requested.values())) > 1:
                detail = ", ".join(f"rank {v}: {OP_NAMES.get(o, o)}({i})"
                                   for v, (o, i) in sorted(self.requested.items()))
                raise RuntimeError(f"server rank {self.comm.rank}: synchronous round with different "
                                   f"requests from the workers ({detail}); every worker must run the "
                                   f"same steps")
            self._close_round_if_complete(len(live))
            live -= {v for v, (o, _) in self.requested.items() if o == STOP}
            self.requested = {}

    # ---------------------------------------------------------------- messages and updates

    def _receive_payload(self, w: int, op: int, var: int, n: int) -> Any:
        comm = self.comm
        if op not in OP_NAMES or op in (STOP, CLOCK):
            raise RuntimeError(f"server rank {comm.rank}: unknown request op {op} from rank {w}")
        if op == PULL_DENSE:
            return None
        if op in (PUSH_DENSE, ADD_DENSE):
            grad = np.empty_like(self.dense[var])
            comm.recv(grad, w, DATA_TAG)
            return grad
        ids = np.empty(n, dtype=np.int64)
        if n:
            comm.recv(ids, w, DATA_TAG)
        if op == PULL_SPARSE:
            return ids
        rows = np.empty((n, self.tables[var].dim))
        if n:
            comm.recv(rows, w, DATA_TAG)
        return ids, rows

    def _answer_pull(self, w: int, op: int, var: int, ids: Any) -> None:
        if op == PULL_DENSE:
            self.comm.send(self.dense[var], w, REPLY_TAG)
        else:
            self.comm.send(self.tables[var].pull(ids), w, REPLY_TAG)

    def _check(self, op: int, var: int, payload: Any) -> int:
        """The reply code of a push or add: refused pushes change nothing."""
        if op in (PUSH_DENSE, ADD_DENSE):
            return OK if np.all(np.isfinite(payload)) else BAD_GRADIENT
        ids, rows = payload
        if not np.all(np.isfinite(rows)):
            return BAD_GRADIENT
        try:
            self.tables[var].rows_of(ids, create=False)
        except KeyError:
            return UNKNOWN_IDS
        return OK

    def _add(self, op: int, var: int, payload: Any) -> None:
        if op == ADD_DENSE:
            self.dense[var] += payload
        elif len(payload[0]):
            add_to_rows(self.tables[var], *payload)

    def _apply_summed(self, pushes: list[tuple[int, tuple[int, int, Any]]]) -> None:
        """Sum the pushes of one step per variable (in the order given) and apply each once."""
        parts: dict[tuple[int, int], list[Any]] = {}
        for _, (op, var, payload) in pushes:
            parts.setdefault((op, var), []).append(payload)
        for (op, var), payloads in parts.items():
            self._apply(op, var, payloads)

    def _apply(self, op: int, var: int, parts: list[Any]) -> None:
        """Apply the sum of the pushed gradients once: dense chunk or table rows."""
        if op == PUSH_DENSE:
            self.dense_steps[var] += 1
            self.model.dense[var].optimizer.apply(self.dense[var], np.sum(parts, axis=0),
                                                  self.dense_slots[var], self.dense_steps[var])
            return
        ids = np.concatenate([p[0] for p in parts])
        if len(ids) == 0:
            return
        grads = np.concatenate([p[1] for p in parts])
        unique, where = np.unique(ids, return_inverse=True)
        summed = np.zeros((len(unique), grads.shape[1]))
        np.add.at(summed, where, grads)
        self.tables[var].push(unique, summed)
