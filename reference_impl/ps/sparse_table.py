"""Sparse tables: embedding rows keyed by 64-bit ids, created on first pull, sharded by hash.

A dense embedding variable needs ``vocabulary x dim`` floats up front, and the
vocabulary must be known. Recommender ids (users, items, crossed features) number in the
billions, most of them seen once, so a sparse table stores only the rows it has seen:

* a ``SparseTable`` is one shard: a map ``id -> row`` into a growing array of rows,
  plus the optimiser's state for those rows and a per-row update count;
* a new id gets its row on first pull, from ``uniform_from_ids`` (a pure function of the
  id and the table's seed), so it does not matter which shard creates it or when;
* a push may only name rows that exist; it is checked whole before any row changes, so a
  bad push raises and leaves the table untouched;
* ``ShardedSparseTable`` spreads ids over shards with ``shard_of`` (a mixed hash), in one
  process. ``reference_impl.ps.client`` does the same across server ranks.
"""
from __future__ import annotations

import numpy as np

from .hashing import as_ids, group_by_shard, uniform_from_ids
from .optimizers import SGD, Optimizer


class SparseTable:
    """One shard of a sparse embedding table: ``pull(ids)`` and ``push(ids, grads)``."""

    def __init__(self, dim: int, optimizer: Optimizer | None = None, init_scale: float = 0.05,
                 seed: int = 0, name: str = "table"):
        if dim < 1:
            raise ValueError(f"SparseTable {name!r}: dim must be >= 1, got {dim}")
        self.dim, self.name, self.seed, self.init_scale = dim, name, seed, init_scale
        self.optimizer = optimizer if optimizer is not None else SGD()
        self.keys = np.zeros(0, dtype=np.int64)  # ids seen, sorted
        self.rows = np.zeros(0, dtype=np.int64)  # rows[i]: the row of keys[i] in self.values
        self.values = np.zeros((16, dim))
        self.slots = self.optimizer.init_slots((16, dim))
        self.updates = np.zeros(16, dtype=np.int64)  # per-row step count (Adam's t)

    def __len__(self) -> int:
        return len(self.keys)

    def initial_rows(self, ids: np.ndarray) -> np.ndarray:
        """The value a row has before any update: a function of (id, seed) only."""
        return self.init_scale * uniform_from_ids(ids, self.dim, self.seed)

    def _grow(self, need: int) -> None:
        cap = len(self.values)
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        extra = cap - len(self.values)
        self.values = np.concatenate([self.values, np.zeros((extra, self.dim))])
        fresh = self.optimizer.init_slots((extra, self.dim))
        self.slots = {k: np.concatenate([v, fresh[k]]) for k, v in self.slots.items()}
        self.updates = np.concatenate([self.updates, np.zeros(extra, dtype=np.int64)])

    def rows_of(self, ids: np.ndarray, create: bool) -> np.ndarray:
        """Row numbers of ``ids``; new ids get rows (``create``) or raise ``KeyError``.

        The index is two arrays sorted by id (``keys`` and their ``rows``), searched with
        ``np.searchsorted``: a vectorised dictionary that costs O(log n) per id and no
        Python loop. New ids are merged in, in sorted order, and get the next free rows.
        """
        pos = np.searchsorted(self.keys, ids)
        found = pos < len(self.keys)
        found[found] = self.keys[pos[found]] == ids[found]
        if not found.all():
            if not create:
                missing = ids[~found]
                raise KeyError(
                    f"sparse table {self.name!r}: push for {len(missing)} id(s) never pulled, "
                    f"e.g. {missing[0]}; nothing was updated"
                )
            missing = ids[~found]
            out = np.empty(len(ids), dtype=np.int64)
            out[found] = self.rows[pos[found]]  # existing ids keep their rows; only positions shift
            new = np.unique(missing)
            start = len(self.keys)
            self._grow(start + len(new))
            self.values[start:start + len(new)] = self.initial_rows(new)
            at = np.searchsorted(self.keys, new)
            self.keys = np.insert(self.keys, at, new)
            self.rows = np.insert(self.rows, at, np.arange(start, start + len(new)))
            out[~found] = start + np.searchsorted(new, missing)  # new ids got rows in sorted order
            return out
        return self.rows[pos]

    def pull(self, ids: np.ndarray) -> np.ndarray:
        """A copy of the rows of ``ids`` (``(len(ids), dim)``), creating new ones."""
        rows = self.rows_of(as_ids(ids), create=True)  # may grow (replace) self.values
        return self.values[rows]

    def push(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """Apply ``grads[i]`` to row ``ids[i]`` with the optimiser; ids must be unique and pulled."""
        ids = as_ids(ids)
        grads = np.asarray(grads)
        if grads.shape != (len(ids), self.dim):
            raise ValueError(
                f"sparse table {self.name!r}: push of {len(ids)} ids needs gradients of shape "
                f"{(len(ids), self.dim)}, got {grads.shape}"
            )
        if not np.all(np.isfinite(grads)):
            raise ValueError(f"sparse table {self.name!r}: push contains NaN or inf gradients")
        rows = self.rows_of(ids, create=False)
        if len(np.unique(rows)) != len(rows):
            raise ValueError(f"sparse table {self.name!r}: push names an id twice; sum duplicates first")
        self.updates[rows] += 1
        w = self.values[rows]
        state = {k: v[rows] for k, v in self.slots.items()}
        self.optimizer.apply(w, grads, state, self.updates[rows])
        self.values[rows] = w
        for k, v in state.items():
            self.slots[k][rows] = v

    def nbytes(self) -> int:
        """Bytes held for rows and optimiser state (grows with rows seen, not vocabulary)."""
        return int(self.values.nbytes + sum(v.nbytes for v in self.slots.values()) + self.updates.nbytes
                   + self.keys.nbytes + self.rows.nbytes)


class ShardedSparseTable:
    """A sparse table split over ``n_shards`` ``SparseTable`` shards in this process."""

    def __init__(self, n_shards: int, dim: int, optimizer: Optimizer | None = None,
                 init_scale: float = 0.05, seed: int = 0, name: str = "table"):
        self.n_shards, self.dim, self.name = n_shards, dim, name
        self.shards = [SparseTable(dim, optimizer, init_scale, seed, f"{name}/shard{s}")
                       for s in range(n_shards)]

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    def pull(self, ids: np.ndarray) -> np.ndarray:
        ids = as_ids(ids)
        if self.n_shards == 1:  # nothing to route
            return self.shards[0].pull(ids)
        order, bounds = group_by_shard(ids, self.n_shards)
        out = np.empty((len(ids), self.dim))
        for shard, (lo, hi) in zip(self.shards, bounds):
            out[order[lo:hi]] = shard.pull(ids[order[lo:hi]])
        return out

    def push(self, ids: np.ndarray, grads: np.ndarray) -> None:
        ids = as_ids(ids)
        grads = np.asarray(grads)
        if self.n_shards == 1:  # the shard checks the whole push before changing anything
            return self.shards[0].push(ids, grads)
        if grads.shape != (len(ids), self.dim):
            raise ValueError(f"sparse table {self.name!r}: gradients of shape {grads.shape} for "
                             f"{len(ids)} ids of dim {self.dim}")
        if not np.all(np.isfinite(grads)):
            raise ValueError(f"sparse table {self.name!r}: push contains NaN or inf gradients")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"sparse table {self.name!r}: push names an id twice; sum duplicates first")
        order, bounds = group_by_shard(ids, self.n_shards)
        for shard, (lo, hi) in zip(self.shards, bounds):  # check all shards before changing any
            shard.rows_of(ids[order[lo:hi]], create=False)
        for shard, (lo, hi) in zip(self.shards, bounds):
            shard.push(ids[order[lo:hi]], grads[order[lo:hi]])
