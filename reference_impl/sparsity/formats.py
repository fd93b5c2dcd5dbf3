"""Sparse matrix formats and their kernels, in NumPy: CSR and BSR.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

**CSR** (compressed sparse row) stores a matrix ``A`` (m×k) as three arrays: ``data`` (the
non-zeros, row by row), ``indices`` (the column of each) and ``indptr`` (row ``i`` is
``data[indptr[i]:indptr[i+1]]``). ``A @ x`` reads every non-zero once *plus its index*, and
gathers ``x`` at scattered positions: per non-zero, 4 bytes of value + 4 of index + an
irregular load, against 4 bytes and a regular load for a dense matrix. That is why a
generic CSR kernel needs few non-zeros to win.

**BSR** (block sparse row) stores ``r×c`` tiles instead of scalars: one index per tile, and a
dense little product per tile. With structured (block) pruning it keeps most of the dense
kernel's regularity.

A layer ``y = x @ W`` (W is k_in × k_out) uses the transpose, ``A = Wᵀ``: each output is one row
of ``A``; ``csr.matmul(X)`` computes ``A @ X`` for a k×b block of inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


# --8<-- [start:csr]
def _segment_sum(products: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Sum ``products[indptr[i]:indptr[i+1]]`` for each row i (empty rows give 0)."""
    out = np.zeros((len(indptr) - 1,) + products.shape[1:], dtype=products.dtype)
    nonempty = indptr[:-1] < indptr[1:]
    if nonempty.any():  # starts of non-empty rows increase strictly; each segment runs to the next
        out[nonempty] = np.add.reduceat(products, indptr[:-1][nonempty], axis=0)
    return out


@dataclass
class CSR:
    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def from_dense(cls, a: np.ndarray) -> "CSR":
        if a.ndim != 2:
            raise ValueError(f"CSR holds a matrix, got shape {a.shape}")
        rows, cols = np.nonzero(a)
        indptr = np.zeros(a.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=a.shape[0]), out=indptr[1:])
        return cls(a[rows, cols], cols.astype(np.int32), indptr, tuple(a.shape))

    @property
    def nnz(self) -> int:
        return int(self.data.size)

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=self.data.dtype)
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
        out[rows, self.indices] = self.data
        return out

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """``A @ x`` for a vector (k,) or a block of columns (k, b)."""
        if x.shape[0] != self.shape[1]:
            raise ValueError(f"CSR matmul: matrix is {self.shape}, operand has shape {x.shape}")
        gathered = x[self.indices]
        products = gathered * (self.data if x.ndim == 1 else self.data[:, None])
        return _segment_sum(products, self.indptr)

    def nbytes(self) -> int:
        return self.data.nbytes + self.indices.nbytes + self.indptr.nbytes
# --8<-- [end:csr]


@dataclass
class BSR:
    blocks: np.ndarray   # (number of stored tiles, r, c)
    indices: np.ndarray  # block column of each tile
    indptr: np.ndarray   # over block rows
    shape: tuple[int, int]

    @classmethod
    def from_dense(cls, a: np.ndarray, block: tuple[int, int]) -> "BSR":
        r, c = block
        if a.ndim != 2 or a.shape[0] % r or a.shape[1] % c:
            raise ValueError(f"BSR block {block} does not tile a matrix of shape {a.shape}")
        tiles = a.reshape(a.shape[0] // r, r, a.shape[1] // c, c).transpose(0, 2, 1, 3)
        brow, bcol = np.nonzero(np.abs(tiles).sum(axis=(2, 3)))
        indptr = np.zeros(tiles.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(brow, minlength=tiles.shape[0]), out=indptr[1:])
        return cls(np.ascontiguousarray(tiles[brow, bcol]), bcol.astype(np.int32), indptr, tuple(a.shape))

    @property
    def block(self) -> tuple[int, int]:
        return self.blocks.shape[1], self.blocks.shape[2]

    def to_dense(self) -> np.ndarray:
        r, c = self.block
        tiles = np.zeros((self.shape[0] // r, self.shape[1] // c, r, c), dtype=self.blocks.dtype)
        brow = np.repeat(np.arange(len(self.indptr) - 1), np.diff(self.indptr))
        tiles[brow, self.indices] = self.blocks
        return tiles.transpose(0, 2, 1, 3).reshape(self.shape)

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """``A @ x`` for a vector (k,) or a block of columns (k, b): a small dense product per tile."""
        if x.shape[0] != self.shape[1]:
            raise ValueError(f"BSR matmul: matrix is {self.shape}, operand has shape {x.shape}")
        r, c = self.block
        xb = x.reshape(self.shape[1] // c, c, -1)[self.indices]  # (tiles, c, b)
        products = self.blocks @ xb                              # (tiles, r, b)
        out = _segment_sum(products, self.indptr)                # (block rows, r, b)
        return out.reshape(self.shape[0], *x.shape[1:])

    def nbytes(self) -> int:
        return self.blocks.nbytes + self.indices.nbytes + self.indptr.nbytes
