"""sparse_table_pull / sparse_table_push and the temporary embedding matrix.

NumPy-only: a parameter server's tables live in host memory; other arrays are refused by name.

A batch of feature ids touches a handful of rows of a table that may hold billions. The
worker therefore never materialises the table; for each batch it builds a *temporary
embedding matrix* holding just the rows this batch uses, and the model runs ordinary
dense code against it::

    ids (batch)   [7, 42, 7, 9, 42]
    unique        [7, 9, 42]            -> pulled from their shards, once each
    local_index   [0, 2, 0, 1, 2]       -> position of each id in the unique list
    matrix        (3, dim)              -> the temporary embedding matrix
    forward       matrix[local_index]   -> an ordinary gather, shape (batch, dim)
    backward      d_matrix[local_index[i]] += d_out[i] for every i (a scatter-add)
                                        -> duplicates summed: row 7 gets two contributions
    push          (unique, d_matrix)    -> one gradient row per unique id

Memory and traffic scale with the number of *unique ids in the batch*, never with the
vocabulary; an id appearing 1000 times in a batch travels once each way.

``table`` is anything with ``pull(unique_ids) -> rows`` and ``push(unique_ids, grads)``:
a ``ShardedSparseTable`` in this process or a ``PSClient`` table on server ranks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .hashing import as_ids


class RowStore(Protocol):
    """What sparse_table_pull/push need from a table: rows by unique id, gradients by unique id."""

    def pull(self, ids: np.ndarray) -> np.ndarray: ...

    def push(self, ids: np.ndarray, grads: np.ndarray) -> None: ...


@dataclass
class TemporaryEmbedding:
    """The rows one batch uses: ``matrix[i]`` is the row of ``unique_ids[i]``.

    ``local_index`` has the batch's shape and maps every id occurrence to its row of
    ``matrix``, so ``matrix[local_index]`` is the embedding of the batch.
    """

    unique_ids: np.ndarray
    local_index: np.ndarray
    matrix: np.ndarray


# --8<-- [start:pullpush]
def dedupe(ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(unique_ids, local_index)`` with ``unique_ids[local_index] == ids`` (any batch shape)."""
    ids = as_ids(ids)
    unique_ids, local_index = np.unique(ids.ravel(), return_inverse=True)
    return unique_ids, local_index.reshape(ids.shape)


def sparse_table_pull(table: RowStore, ids: Any) -> TemporaryEmbedding:
    """Dedupe ``ids``, pull each unique row once, and return the temporary embedding matrix."""
    unique_ids, local_index = dedupe(ids)
    return TemporaryEmbedding(unique_ids, local_index, table.pull(unique_ids))


def embedding_lookup(temp: TemporaryEmbedding) -> np.ndarray:
    """The forward pass: an ordinary gather, ``(*batch_shape, dim)``."""
    return temp.matrix[temp.local_index]


def embedding_lookup_grad(temp: TemporaryEmbedding, d_out: np.ndarray) -> np.ndarray:
    """The backward pass of the gather: the gradient of ``temp.matrix``, duplicates summed."""
    dim = temp.matrix.shape[1]
    expected = (*temp.local_index.shape, dim)
    if d_out.shape != expected:
        raise ValueError(f"embedding_lookup_grad: d_out has shape {d_out.shape}, expected {expected}")
    # A scatter-add: d_matrix[local[i]] += d_out[i]. np.bincount does it in one C loop over
    # the flat index local * dim + column (the same sums, in the same order, as
    # np.add.at(d_matrix, local, d_out), which is several times slower on rows).
    flat = (temp.local_index.reshape(-1, 1) * dim + np.arange(dim)).ravel()
    sums = np.bincount(flat, weights=d_out.ravel(), minlength=temp.matrix.size)
    return sums.reshape(temp.matrix.shape).astype(temp.matrix.dtype, copy=False)


def sparse_table_push(table: RowStore, temp: TemporaryEmbedding, d_matrix: np.ndarray) -> None:
    """Push the temporary matrix's gradient back: one row per unique id."""
    if d_matrix.shape != temp.matrix.shape:
        raise ValueError(
            f"sparse_table_push: gradient shape {d_matrix.shape} does not match the temporary "
            f"matrix {temp.matrix.shape}"
        )
    table.push(temp.unique_ids, d_matrix)
# --8<-- [end:pullpush]
