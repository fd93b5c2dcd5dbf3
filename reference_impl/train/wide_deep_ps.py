"""Wide & Deep on real parameter-server ranks under any consistency rule.

``models.strategies.ps_rank`` keeps the small MLP on the workers and all-reduces its
gradients: an all-reduce waits for every worker, so only BSP makes sense there. Here
*every* variable lives on the servers (the tables, and the MLP's weights and biases as
dense variables with the model's own optimiser), so the servers' rule governs the whole
model (``reference_impl.ps.server``):

* ``bsp`` / ``backup``: a step's gradients are applied together once ``n - b`` workers
  have finished it; a backup worker that arrives late has its gradient dropped and jumps
  to the current step;
* ``asp`` / ``ssp``: applied on arrival; under SSP a read waits while the reader is more
  than ``s`` steps ahead of the slowest worker;
* ``easgd``: each worker trains a full local replica and every ``tau`` steps moves it and
  the servers' centre towards each other (``ps.training.elastic_exchange``).

A worker's step ``k`` is global batch ``k`` of the same shuffled epochs ``fit`` draws,
split over the workers. The learner model is evaluated from the servers (the centre, for
EASGD) by the first worker after all workers have finished.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..comm import Communicator
from ..models.wide_deep import WideDeep, local_table
from ..ps import (
    ClusterSpec,
    Consistency,
    DenseVariable,
    ModelSpec,
    ParameterServer,
    PSClient,
    SubCommunicator,
)
from ..ps.training import Pace, elastic_exchange


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
