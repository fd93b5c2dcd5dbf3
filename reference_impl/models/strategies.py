"""Wide & Deep on several workers, every strategy in one place: parameter servers with an
all-reduced MLP, mirrored replicas, and every variable on the servers under any consistency rule.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

``ps_rank`` is what every rank of a parameter-server job runs. Servers hold every sparse table of the model
(the wide weights and each embedding, with their optimisers' per-row state) and apply
pushes synchronously; workers run ``fit`` on their part of every global batch, pull and
push rows through ``PSClient``, and all-reduce the small dense MLP's gradients among
themselves (the split of N003-Q7). Because servers sum each round's pushes before
applying them and every worker scales its gradients by ``1 / global batch``, training
follows single-process ``fit`` on the same batches up to floating-point rounding.

``mirrored_rank`` is the other strategy (MultiWorkerMirroredStrategy): no servers; every
worker keeps a full replica of every table (``MirroredTable``), the sparse gradients
(ids and rows) are all-gathered so that every worker applies the same update, and the
dense gradients are all-reduced. It follows the same single-process run, but every worker
stores every row and receives every other worker's gradient rows.

``rule_rank`` keeps *every* variable on the servers (the tables, and the MLP's weights and
biases as dense variables with the model's own optimiser), so the servers' rule governs the
whole model (``reference_impl.ps.server``); ``ps_rank`` all-reduces the MLP among the
workers instead, and an all-reduce waits for every worker, so only BSP makes sense there:

* ``bsp`` / ``backup``: a step's gradients are applied together once ``n - b`` workers
  have finished it; a backup worker that arrives late has its gradient dropped and jumps
  to the current step;
* ``asp`` / ``ssp``: applied on arrival; under SSP a read waits while the reader is more
  than ``s`` steps ahead of the slowest worker;
* ``easgd``: each worker trains a full local replica and every ``tau`` steps moves it and
  the servers' centre towards each other (``ps.training.elastic_exchange``).

A worker's step ``k`` under ``rule_rank`` is global batch ``k`` of the same shuffled epochs
``fit`` draws, split over the workers; the learnt model is evaluated from the servers (the
centre, for EASGD) by the first worker after all workers have finished.
``python -m reference_impl.train wide_deep --strategy local|ps|mirrored [--consistency RULE]``
runs them.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..comm import Communicator, allgather, allreduce
from ..ps import (ClusterSpec, Consistency, DenseVariable, ModelSpec, ParameterServer, PSClient, SparseVariable,
                  SubCommunicator, as_ids)
from ..ps.training import Pace, elastic_exchange
from .wide_deep import WideDeep, fit, local_table


# --8<-- [start:ps_rank]
def ps_rank(comm: Communicator, cluster: ClusterSpec, build: Callable[..., WideDeep],
            features: dict[str, np.ndarray], labels: np.ndarray, test_features: dict[str, np.ndarray],
            test_labels: np.ndarray, epochs: int = 1, batch: int = 256, seed: int = 0,
            sync: bool = True, progress: Callable[[], None] | None = None) -> Any:
    """Train ``build(tables=..., reduce=...)`` on ``cluster``; workers return test metrics.

    ``sync=False`` makes the servers apply every push on arrival (ASP for the tables; the
    all-reduced MLP stays synchronous). ``progress`` is called after each step of the
    first worker.

    ``build`` must make the same model on every rank (same columns, optimisers and seed).
    A server returns its ``ParameterServer``; a worker returns ``{"auc", "logloss",
    "history", "ids_sent"}``.
    """
    spec = ModelSpec(sparse=build().table_specs)  # a throw-away local model names the tables
    if comm.rank in cluster.servers:
        return ParameterServer(comm, cluster, spec, sync=sync).serve()
    client = PSClient(comm, cluster, spec)
    workers = SubCommunicator(comm, cluster.workers)
    model = build(tables=lambda v: client.table(v.name),
                  reduce=lambda g: allreduce(workers, np.ascontiguousarray(g, dtype=np.float64)))
    history = fit(model, features, labels, epochs=epochs, batch=batch, seed=seed,
                  worker=workers.rank, n_workers=workers.size, progress=progress if workers.rank == 0 else None)
    result = {**model.evaluate(test_features, test_labels), "history": history, "ids_sent": client.ids_sent}
    client.stop()
    return result
# --8<-- [end:ps_rank]


class MirroredTable:
    """A full replica of a sparse table on this worker, kept equal to the other workers'.

    ``push`` all-gathers every worker's (ids, gradient rows), sums the rows of each id over
    workers, and applies that sum here: every replica sees the same update. Rows another
    worker created are created here first (initial values depend only on the id).
    """

    def __init__(self, spec: SparseVariable, workers: Communicator):
        self.local, self.workers, self.dim = local_table(spec), workers, spec.dim
        self.rows_received = 0  # gradient rows that came from the other workers

    def pull(self, ids: np.ndarray) -> np.ndarray:
        return self.local.pull(ids)

    def push(self, ids: np.ndarray, grads: np.ndarray) -> None:
        ids = as_ids(ids)
        all_ids = allgather(self.workers, np.ascontiguousarray(ids))
        all_grads = allgather(self.workers, np.ascontiguousarray(grads, dtype=np.float64)).reshape(-1, self.dim)
        self.rows_received += len(all_ids) - len(ids)
        unique, where = np.unique(all_ids, return_inverse=True)
        summed = np.zeros((len(unique), self.dim))
        np.add.at(summed, where, all_grads)
        self.local.pull(unique)
        self.local.push(unique, summed)


def mirrored_rank(comm: Communicator, build: Callable[..., WideDeep], features: dict[str, np.ndarray],
                  labels: np.ndarray, test_features: dict[str, np.ndarray], test_labels: np.ndarray,
                  epochs: int = 1, batch: int = 256, seed: int = 0,
                  progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """Train ``build(tables=..., reduce=...)`` with every rank a worker holding full replicas."""
    tables: list[MirroredTable] = []

    def make(spec: SparseVariable) -> MirroredTable:
        tables.append(MirroredTable(spec, comm))
        return tables[-1]

    model = build(tables=make, reduce=lambda g: allreduce(comm, np.ascontiguousarray(g, dtype=np.float64)))
    history = fit(model, features, labels, epochs=epochs, batch=batch, seed=seed,
                  worker=comm.rank, n_workers=comm.size, progress=progress if comm.rank == 0 else None)
    return {**model.evaluate(test_features, test_labels), "history": history,
            "rows_stored": sum(len(t.local) for t in tables),
            "rows_received": sum(t.rows_received for t in tables)}


# --------------------------------------------------------------------------- every variable on the servers


class ServerDense:
    """One of the MLP's parameters, held by the servers: what ``WideDeep.train_step`` needs
    of a dense parameter (``value``, ``apply(grad)``), with ``apply`` a push."""

    def __init__(self, client: PSClient, name: str):
        self.client, self.name = client, name
        self.value = client.pull_dense(name)

    def refresh(self) -> None:
        """Read the servers' current value (at this worker's clock: SSP may make it wait)."""
        self.value = self.client.pull_dense(name=self.name)

    def apply(self, grad: np.ndarray) -> None:
        self.client.push_dense(self.name, grad)


class TouchedRows:
    """A local table that remembers which ids were pulled since ``take()``: the rows an
    EASGD worker must exchange with the centre."""

    def __init__(self, table: Any):
        self.table, self.ids = table, set()

    def pull(self, ids: np.ndarray) -> np.ndarray:
        self.ids.update(np.asarray(ids).ravel().tolist())
        return self.table.pull(ids)

    def push(self, ids: np.ndarray, grads: np.ndarray) -> None:
        self.table.push(ids, grads)

    def take(self) -> np.ndarray:
        ids, self.ids = np.array(sorted(self.ids), dtype=np.int64), set()
        return ids


def dense_parameters(model: WideDeep) -> dict[str, Any]:
    """The model's dense parameters by name (``layer0.w``, ``layer0.b``, ..., ``bias``)."""
    named = {}
    for i, (w, b) in enumerate(model.layers):
        named[f"layer{i}.w"], named[f"layer{i}.b"] = w, b
    named["bias"] = model.bias
    return named


def server_model(model: WideDeep, client: PSClient) -> None:
    """Rewire ``model`` so that every variable lives on the servers of ``client``."""
    server = {name: ServerDense(client, name) for name in dense_parameters(model)}
    model.layers = [(server[f"layer{i}.w"], server[f"layer{i}.b"]) for i in range(len(model.layers))]
    model.bias = server["bias"]
    model.wide = client.table("wide") if model.wide is not None else None
    model.embeddings = {name: client.table(name) for name in model.embeddings}


def rule_rank(comm: Communicator, cluster: ClusterSpec, build: Callable[..., WideDeep],
              features: dict[str, np.ndarray], labels: np.ndarray, test_features: dict[str, np.ndarray],
              test_labels: np.ndarray, rule: Consistency, epochs: int = 1, batch: int = 256, seed: int = 0,
              pace: Pace | None = None, progress: Callable[[], None] | None = None) -> Any:
    """Train ``build()`` on ``cluster`` under ``rule``. A server returns its ``ParameterServer``;
    the first worker ``{"auc", "logloss", "steps_done", "examples_computed"}``, the others
    ``{"steps_done", "examples_computed"}``. ``progress`` is called after each of the last
    worker's steps."""
    template = build()  # same columns, initial values and optimisers on every rank
    spec = ModelSpec(dense=[DenseVariable(name, p.value.copy(), p.optimizer)
                            for name, p in dense_parameters(template).items()],
                     sparse=template.table_specs)
    if comm.rank in cluster.servers:
        return ParameterServer(comm, cluster, spec, consistency=rule).serve()
    pace = pace or Pace()
    client = PSClient(comm, cluster, spec)
    worker, n = cluster.workers.index(comm.rank), cluster.n_workers
    rng = np.random.default_rng(seed)
    orders = [rng.permutation(len(labels)) for _ in range(epochs)]
    per_epoch = -(-len(labels) // batch)
    total = epochs * per_epoch
    used = n - rule.dropped_per_step(n)

    def my_part(k: int) -> tuple[np.ndarray, int]:
        """Worker ``worker``'s examples of global step ``k``, and the global batch size."""
        order = orders[k // per_epoch]
        start = (k % per_epoch) * batch
        whole = order[start:start + batch]
        return np.array_split(whole, n)[worker], len(whole)

    steps_done = examples = 0
    if rule.rule == "easgd":
        replicas: dict[str, TouchedRows] = {}

        def make(v: Any) -> TouchedRows:
            replicas[v.name] = TouchedRows(local_table(v))
            return replicas[v.name]

        model = build(tables=make)  # a full local replica, starting where the centre starts
        local_dense = {name: p.value for name, p in dense_parameters(model).items()}
        for k in range(total):
            started, (idx, _) = time.monotonic(), my_part(k)
            model.train_step({c: v[idx] for c, v in features.items()}, labels[idx])
            pace.pad(worker, started)
            if (k + 1) % rule.tau == 0 or k == total - 1:
                ids = {name: r.take() for name, r in replicas.items()}
                elastic_exchange(client, local_dense, {name: r.table for name, r in replicas.items()}, ids,
                                 rule.alpha)
            steps_done, examples = steps_done + 1, examples + len(idx)
            if progress is not None and worker == n - 1:
                progress()
        model = build()
    else:
        model = build()
        server_model(model, client)
        while client.clock < total:
            started, (idx, whole) = time.monotonic(), my_part(client.clock)
            for p in dense_parameters(model).values():
                p.refresh()
            model.train_step({c: v[idx] for c, v in features.items()}, labels[idx],
                             global_batch=max(1, round(whole * used / n)))
            pace.pad(worker, started)
            client.tick()
            steps_done, examples = steps_done + 1, examples + len(idx)
            if progress is not None and worker == n - 1:
                progress()
    SubCommunicator(comm, cluster.workers).barrier()  # every worker's updates are in
    result: dict[str, Any] = {"steps_done": steps_done, "examples_computed": examples}
    if worker == 0:
        server_model(model, client)
        for p in dense_parameters(model).values():
            p.refresh()
        result.update(model.evaluate(test_features, test_labels))
    SubCommunicator(comm, cluster.workers).barrier()  # nobody stops the servers before it is done
    client.stop()
    return result
