"""Wide & Deep on several workers: parameter servers, or mirrored replicas and all-reduce.

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
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..comm import Communicator, allgather, allreduce
from ..ps import ClusterSpec, ModelSpec, ParameterServer, PSClient, SparseVariable, SubCommunicator, as_ids
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
