"""The index of a sparse table shard: 64-bit id -> row number, a whole batch at a time.

NumPy-only: a parameter server's tables live in host memory; other arrays are refused by name.

A shard must answer "which row holds id x?" for every id of a batch, and add the ids it
has never seen. The choices, measured in NumPy:

* a Python ``dict``: one interpreter round trip per id, slow for a batch;
* one sorted key array and ``np.searchsorted``: a whole-batch lookup in one C call, but
  adding ids means shifting every later key, so each batch of new ids costs O(ids held);
  with a few hundred thousand rows that copy alone takes longer than the batch's work;
* a hash table with vectorised probing: O(1) per id, but each probing round is a dozen
  NumPy calls, several times slower than one ``searchsorted`` at these sizes.

This index keeps **two sorted runs**, the idea behind log-structured merge trees (LevelDB,
Bigtable): a large ``main`` run and a small ``recent`` run. A lookup searches ``main``
with ``np.searchsorted`` and, for the ids it lacks, ``recent``. New ids are merged into
``recent``, which costs O(len(recent)); when ``recent`` outgrows
``max(MIN_RECENT, RECENT_FACTOR * sqrt(len(main)))`` it is merged into ``main`` at
O(len(main)). Between two such merges about ``sqrt(len(main))`` ids arrive, so the merges
cost O(sqrt(rows held)) per new id, and a batch that brings no new id copies nothing.
While ``main`` holds fewer than ``SMALL_MAIN`` ids, new ids are merged straight into it:
copying a few thousand keys costs less than the NumPy calls of a second search.
"""
from __future__ import annotations

import math

import numpy as np

MIN_RECENT = 1024
RECENT_FACTOR = 16
SMALL_MAIN = 16384  # below this many ids, new ids go straight into main


class RowIndex:
    """``id -> row`` for int64 ids: ``find`` (any ids) and ``insert`` (ids not yet present)."""

    def __init__(self) -> None:
        empty = np.zeros(0, dtype=np.int64)
        self.main_keys, self.main_rows = empty, empty  # sorted by key
        self.recent_keys, self.recent_rows = empty, empty  # sorted by key, small

    def __len__(self) -> int:
        return len(self.main_keys) + len(self.recent_keys)

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id (``ids`` 1-D, any order, repeats allowed); ``-1`` if absent."""
        rows = _search(self.main_keys, self.main_rows, ids)
        if len(self.recent_keys):
            absent = rows < 0
            if absent.any():
                rows[absent] = _search(self.recent_keys, self.recent_rows, ids[absent])
        return rows

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Add ``ids`` (distinct, none already present) with their ``rows``."""
        if (ids[1:] <= ids[:-1]).any():
            order = np.argsort(ids)
            ids, rows = ids[order], rows[order]
        self.insert_sorted(ids, rows)

    def insert_sorted(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """``insert`` for ids already sorted (what ``np.unique`` gives), without the check."""
        if len(self.main_keys) < SMALL_MAIN:  # copying a small main costs less than searching two runs
            self.main_keys, self.main_rows = _merge(self.main_keys, self.main_rows, ids, rows)
            return
        self.recent_keys, self.recent_rows = _merge(self.recent_keys, self.recent_rows, ids, rows)
        if len(self.recent_keys) > max(MIN_RECENT, RECENT_FACTOR * math.isqrt(len(self.main_keys))):
            self.main_keys, self.main_rows = _merge(self.main_keys, self.main_rows,
                                                    self.recent_keys, self.recent_rows)
            self.recent_keys, self.recent_rows = self.recent_keys[:0], self.recent_rows[:0]

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, rows)`` of every entry, sorted by id."""
        return _merge(self.main_keys, self.main_rows, self.recent_keys, self.recent_rows)

    @property
    def nbytes(self) -> int:
        return int(self.main_keys.nbytes + self.main_rows.nbytes
                   + self.recent_keys.nbytes + self.recent_rows.nbytes)


def _search(keys: np.ndarray, rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``rows[i]`` where ``keys[i] == id`` for each id, else ``-1`` (``keys`` sorted)."""
    if len(keys) == 0:
        return np.full(len(ids), -1, dtype=np.int64)
    pos = keys.searchsorted(ids)
    np.minimum(pos, len(keys) - 1, out=pos)  # an id past the last key compares with the last key
    return np.where(keys[pos] == ids, rows[pos], -1)


def _merge(keys: np.ndarray, rows: np.ndarray, new_keys: np.ndarray,
           new_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted runs with no key in common merged into one: each new key lands at its
    search position in ``keys``, shifted right by the new keys before it."""
    dest = keys.searchsorted(new_keys) + np.arange(len(new_keys))
    is_new = np.zeros(len(keys) + len(new_keys), dtype=bool)
    is_new[dest] = True
    merged_keys = np.empty(len(is_new), dtype=np.int64)
    merged_rows = np.empty(len(is_new), dtype=np.int64)
    merged_keys[dest], merged_rows[dest] = new_keys, new_rows
    merged_keys[~is_new], merged_rows[~is_new] = keys, rows
    return merged_keys, merged_rows
