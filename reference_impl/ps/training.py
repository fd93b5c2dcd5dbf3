"""One model trained three ways: in one process, with parameter servers, and hybrid.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

The model is the smallest one that has both kinds of variables: each example is a row of
``n_fields`` feature ids; their embeddings (a sparse table ``emb`` of ``dim`` columns) are
summed and scored by a dense vector ``w`` plus a bias ``b``::

    logit = sum_f emb[id_f] . w + b,      loss = mean log-loss(sigmoid(logit), label)

``train_step`` is written once against a *store* (``pull_dense``, ``push_dense``,
``table``), and the store decides where variables live:

* ``LocalStore``: everything in this process (the single-process baseline);
* ``PSClient``: everything on server ranks (ParameterServerStrategy);
* ``HybridStore``: sparse rows on servers, dense variables replicated on the workers and
  updated after an all-reduce among them (the sparse-aware split of N003-Q7).

A worker pushes gradients scaled by ``1 / global_batch``, so the servers' synchronous sum
over workers is the mean gradient of the global batch.

``run_ps_rank`` also runs every consistency rule on real ranks (``Consistency``): BSP and
backup workers (rounds the servers close; with ``b`` backups each worker's batch is
``global_batch / (n + b)`` and the ``n`` gradients used make one global batch), ASP and
SSP (pushes applied on arrival, reads gated by the servers' vector clock), and EASGD
(each worker trains a local replica and every ``tau`` steps moves it and the servers'
centre towards each other). ``Pace`` injects a straggler: every step's compute is padded
to ``step_time`` seconds, one worker's to ``slowdown`` times that. ``staleness_probe_rank``
is the instrumented job the tests use to see what every read contained.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..comm import Communicator, allreduce
from .client import PSClient
from .cluster import ClusterSpec, Consistency, DenseVariable, ModelSpec, SparseVariable, SubCommunicator
from .embedding import embedding_lookup, embedding_lookup_grad, sparse_table_pull, sparse_table_push
from .optimizers import SGD, Optimizer
from .server import ParameterServer, add_to_rows
from .sparse_table import ShardedSparseTable


def model_spec(dim: int = 4, dense_optimizer: Optimizer | None = None,
               sparse_optimizer: Optimizer | None = None, seed: int = 0) -> ModelSpec:
    """The variables: table ``emb`` (``dim`` columns), dense ``w`` (``dim``) and ``b`` (1)."""
    return ModelSpec(
        dense=[DenseVariable("w", np.full(dim, 1.0 / np.sqrt(dim)), dense_optimizer or SGD(0.5)),
               DenseVariable("b", np.zeros(1), dense_optimizer or SGD(0.5))],
        sparse=[SparseVariable("emb", dim, sparse_optimizer or SGD(0.5), init_scale=0.05, seed=seed)],
    )


def loss_and_grads(emb: np.ndarray, w: np.ndarray, b: np.ndarray, labels: np.ndarray, scale: float):
    """``(loss_sum, d_emb, dw, db)`` for embeddings ``emb`` of shape (batch, fields, dim).

    Gradients are of ``scale * sum of per-example losses``.
    """
    pooled = emb.sum(axis=1)
    logits = pooled @ w + b[0]
    loss_sum = float(np.sum(np.logaddexp(0.0, logits) - labels * logits))
    g = (1.0 / (1.0 + np.exp(-logits)) - labels) * scale
    d_emb = np.broadcast_to(g[:, None, None] * w[None, None, :], emb.shape)
    return loss_sum, d_emb, pooled.T @ g, np.array([g.sum()])


def train_step(store: Any, ids: np.ndarray, labels: np.ndarray, scale: float,
               compute: Callable[[], None] | None = None) -> float:
    """Pull, forward, backward, push: one step on one worker's share of the batch.

    ``compute`` runs between the pulls and the pushes (``Pace`` pads it to a step time),
    so a slow worker's gradient is computed from parameters read before its delay.
    """
    table = store.table("emb")
    temp = sparse_table_pull(table, ids)
    w, b = store.pull_dense("w"), store.pull_dense("b")
    loss_sum, d_emb, dw, db = loss_and_grads(embedding_lookup(temp), w, b, labels, scale)
    if compute is not None:
        compute()
    sparse_table_push(table, temp, embedding_lookup_grad(temp, d_emb))
    store.push_dense("w", dw)
    store.push_dense("b", db)
    return loss_sum


class LocalStore:
    """All variables in this process: dense arrays with their optimisers, a sharded table."""

    def __init__(self, model: ModelSpec, n_shards: int = 1, tables: bool = True):
        self.model = model
        self.dense = {v.name: np.array(v.initial, dtype=np.float64) for v in model.dense}
        self.slots = {v.name: v.optimizer.init_slots(v.initial.shape) for v in model.dense}
        self.steps = {v.name: 0 for v in model.dense}
        self.tables = {v.name: ShardedSparseTable(n_shards, v.dim, v.optimizer, v.init_scale, v.seed, v.name)
                       for v in model.sparse} if tables else {}

    def pull_dense(self, name: str) -> np.ndarray:
        return self.dense[name].copy()

    def push_dense(self, name: str, grad: np.ndarray) -> None:
        self.steps[name] += 1
        opt = self.model.dense[self.model.dense_index(name)].optimizer
        opt.apply(self.dense[name], grad, self.slots[name], self.steps[name])

    def table(self, name: str) -> ShardedSparseTable:
        return self.tables[name]


class HybridStore(LocalStore):
    """Sparse tables on the servers; dense variables replicated here and all-reduced among workers."""

    def __init__(self, client: PSClient, workers: Communicator):
        super().__init__(client.model, tables=False)  # the tables live on the servers
        self.client, self.workers = client, workers

    def push_dense(self, name: str, grad: np.ndarray) -> None:
        super().push_dense(name, allreduce(self.workers, np.asarray(grad, dtype=np.float64)))

    def table(self, name: str):
        return self.client.table(name)


def batch_slice(step: int, global_batch: int, n_examples: int, worker: int, n_workers: int) -> slice:
    """Worker ``worker``'s share of the global batch of ``step`` (the data wraps around)."""
    if global_batch % n_workers:
        raise ValueError(f"global batch {global_batch} does not split over {n_workers} workers")
    per = global_batch // n_workers
    start = (step * global_batch + worker * per) % n_examples
    if start + per > n_examples:
        raise ValueError(f"{n_examples} examples are not a multiple of the batch {global_batch}")
    return slice(start, start + per)


def train_local(model: ModelSpec, ids: np.ndarray, labels: np.ndarray, steps: int,
                global_batch: int, n_shards: int = 1) -> LocalStore:
    """The single-process baseline: ``steps`` steps of ``global_batch`` examples."""
    store = LocalStore(model, n_shards)
    for step in range(steps):
        part = batch_slice(step, global_batch, len(ids), 0, 1)
        train_step(store, ids[part], labels[part], 1.0 / global_batch)
    return store


@dataclass(frozen=True)
class Pace:
    """An injected straggler: each step's compute takes at least ``step_time`` seconds, and
    worker ``straggler``'s (an index among the workers) ``slowdown`` times as long as that
    or as its own compute, whichever is longer (``step_time=0``: ``slowdown`` x its compute)."""

    step_time: float = 0.0
    straggler: int | None = None
    slowdown: float = 3.0

    def pad(self, worker: int, started: float) -> None:
        """Sleep until the step that began at ``started`` has taken its time."""
        now = time.monotonic()
        target = self.step_time
        if worker == self.straggler:
            target = max(self.step_time, now - started) * self.slowdown
        left = started + target - now
        if left > 0:
            time.sleep(left)


def run_ps_rank(comm: Communicator, cluster: ClusterSpec, model: ModelSpec, ids: np.ndarray,
                labels: np.ndarray, steps: int, global_batch: int, sync: bool = True,
                dense: str = "ps", probe_ids: np.ndarray | None = None,
                consistency: Consistency | None = None, pace: Pace | None = None) -> Any:
    """What every rank of a PS job runs: servers serve, workers train ``steps`` steps.

    ``dense="ps"`` keeps dense variables on the servers, ``"allreduce"`` replicates them on
    the workers (``HybridStore``; BSP only). Without ``consistency``, ``sync`` picks the
    original clock-free BSP or ASP; with it, the servers and workers follow that rule. A
    worker returns its final dense values, the rows of ``probe_ids`` (pulled after
    training), and ``steps_done`` (gradients it computed); a server returns its
    ``ParameterServer``.
    """
    if comm.rank in cluster.servers:
        return ParameterServer(comm, cluster, model, sync=sync, consistency=consistency).serve()
    if dense not in ("ps", "allreduce"):
        raise ValueError(f"run_ps_rank: dense must be 'ps' or 'allreduce', got {dense!r}")
    if dense == "allreduce" and consistency is not None and consistency.rule != "bsp":
        raise ValueError(f"run_ps_rank: dense='allreduce' is synchronous; it cannot follow {consistency.rule!r}")
    pace = pace or Pace()
    client = PSClient(comm, cluster, model)
    store: Any = client
    if dense == "allreduce":
        store = HybridStore(client, SubCommunicator(comm, cluster.workers))
    worker = cluster.workers.index(comm.rank)
    n = cluster.n_workers
    if consistency is not None and consistency.rule == "easgd":
        done = _easgd_steps(client, ids, labels, steps, global_batch, worker, n, consistency, pace)
    else:
        clocked = consistency is not None  # the servers number the steps (backup may skip some)
        used = n - (consistency.dropped_per_step(n) if clocked else 0)
        scale = 1.0 / (global_batch // n * used)  # the gradients of one applied step: one global batch
        done = 0
        while (step := client.clock if clocked else done) < steps:
            started = time.monotonic()
            part = batch_slice(step, global_batch, len(ids), worker, n)
            train_step(store, ids[part], labels[part], scale, lambda t=started: pace.pad(worker, t))
            done += 1
            if clocked:
                client.tick()
    result = {name: store.pull_dense(name) for name in ("w", "b")}
    if probe_ids is not None:
        result["rows"] = store.table("emb").pull(probe_ids)
    result["steps_done"] = done
    client.stop()
    return result


def _easgd_steps(client: PSClient, ids: np.ndarray, labels: np.ndarray, steps: int, global_batch: int,
                 worker: int, n: int, rule: Consistency, pace: Pace) -> int:
    """Local SGD on a replica; every ``tau`` steps (and after the last) an elastic exchange."""
    local = LocalStore(client.model)  # x_i, starting where the centre starts
    per = global_batch // n
    touched: set[int] = set()
    for step in range(steps):
        started = time.monotonic()
        part = batch_slice(step, global_batch, len(ids), worker, n)
        train_step(local, ids[part], labels[part], 1.0 / per, lambda t=started: pace.pad(worker, t))
        touched.update(np.unique(ids[part]).tolist())
        if (step + 1) % rule.tau == 0 or step == steps - 1:
            touched_ids = {"emb": np.array(sorted(touched), dtype=np.int64)}
            elastic_exchange(client, local.dense, local.tables, touched_ids, rule.alpha)
            touched.clear()
    return steps


def elastic_exchange(client: PSClient, dense: dict[str, np.ndarray], tables: dict[str, ShardedSparseTable],
                     ids: dict[str, np.ndarray], alpha: float) -> None:
    """EASGD's exchange: ``d = alpha (x_i - centre)``; ``x_i -= d``; ``centre += d``.

    ``dense`` and ``tables`` (one shard each) are this worker's replica, changed in place. Every dense
    variable moves whole; a table moves only the rows in ``ids[name]`` (the rows this
    worker touched since its last exchange: the others did not change here). The centre
    may have moved between the pull and the add: the add is still exact.
    """
    if any(t.n_shards != 1 for t in tables.values()):
        raise ValueError("elastic_exchange: a worker's replica tables must have one shard each")
    for v in client.model.dense:
        centre = client.pull_dense(v.name)
        d = alpha * (dense[v.name] - centre)
        dense[v.name] -= d
        client.add_dense(v.name, d)
    for v in client.model.sparse:
        rows = ids.get(v.name, np.zeros(0, dtype=np.int64))
        remote = client.table(v.name)
        centre = remote.pull(rows)
        d = alpha * (tables[v.name].pull(rows) - centre)
        add_to_rows(tables[v.name].shards[0], rows, -d)
        remote.add(rows, d)


def staleness_probe_rank(comm: Communicator, cluster: ClusterSpec, consistency: Consistency, steps: int,
                         pace: Pace | None = None) -> Any:
    """An instrumented job that shows what each read saw, independently of the servers' clocks.

    The only variable is ``count`` (one entry per worker, plain SGD with rate 1): at each
    step worker ``i`` pulls it, computes (paced), and pushes ``-e_i``, so ``count[j]`` is
    the number of worker ``j``'s steps applied to what was read. A worker returns
    ``{"reads": [(its clock, count read), ...], "steps_done"}``; a server its
    ``ParameterServer``. Under SSP(s) every read at clock ``c`` must have ``count >= c - s``.
    """
    model = ModelSpec(dense=[DenseVariable("count", np.zeros(cluster.n_workers), SGD(1.0))])
    if comm.rank in cluster.servers:
        return ParameterServer(comm, cluster, model, consistency=consistency).serve()
    pace = pace or Pace()
    client = PSClient(comm, cluster, model)
    worker = cluster.workers.index(comm.rank)
    one_hot = -np.eye(cluster.n_workers)[worker]
    reads, done = [], 0
    while client.clock < steps:
        started = time.monotonic()
        reads.append((client.clock, client.pull_dense("count")))
        pace.pad(worker, started)
        client.push_dense("count", one_hot)
        done += 1
        client.tick()
    client.stop()
    return {"reads": reads, "steps_done": done}
