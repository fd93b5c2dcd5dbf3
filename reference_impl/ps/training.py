"""One model trained three ways: in one process, with parameter servers, and hybrid.

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
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..comm import Communicator, allreduce
from .client import PSClient
from .cluster import ClusterSpec, DenseVariable, ModelSpec, SparseVariable, SubCommunicator
from .embedding import embedding_lookup, embedding_lookup_grad, sparse_table_pull, sparse_table_push
from .optimizers import SGD, Optimizer
from .server import ParameterServer
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


def train_step(store: Any, ids: np.ndarray, labels: np.ndarray, scale: float) -> float:
    """Pull, forward, backward, push: one step on one worker's share of the batch."""
    table = store.table("emb")
    temp = sparse_table_pull(table, ids)
    w, b = store.pull_dense("w"), store.pull_dense("b")
    loss_sum, d_emb, dw, db = loss_and_grads(embedding_lookup(temp), w, b, labels, scale)
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


def run_ps_rank(comm: Communicator, cluster: ClusterSpec, model: ModelSpec, ids: np.ndarray,
                labels: np.ndarray, steps: int, global_batch: int, sync: bool = True,
                dense: str = "ps", probe_ids: np.ndarray | None = None) -> Any:
    """What every rank of a PS job runs: servers serve, workers train ``steps`` steps.

    ``dense="ps"`` keeps dense variables on the servers, ``"allreduce"`` replicates them on
    the workers (``HybridStore``). A worker returns its final dense values and the rows of
    ``probe_ids`` (pulled after training); a server returns its ``ParameterServer``.
    """
    if comm.rank in cluster.servers:
        return ParameterServer(comm, cluster, model, sync=sync).serve()
    if dense not in ("ps", "allreduce"):
        raise ValueError(f"run_ps_rank: dense must be 'ps' or 'allreduce', got {dense!r}")
    client = PSClient(comm, cluster, model)
    store: Any = client
    if dense == "allreduce":
        store = HybridStore(client, SubCommunicator(comm, cluster.workers))
    worker = cluster.workers.index(comm.rank)
    for step in range(steps):
        part = batch_slice(step, global_batch, len(ids), worker, cluster.n_workers)
        train_step(store, ids[part], labels[part], 1.0 / global_batch)
    result = {name: store.pull_dense(name) for name in ("w", "b")}
    if probe_ids is not None:
        result["rows"] = store.table("emb").pull(probe_ids)
    client.stop()
    return result
