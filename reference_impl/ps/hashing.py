"""Which server owns a feature id: a mixed 64-bit hash, then modulo the shard count.

NumPy-only: a parameter server's tables live in host memory; other arrays are refused by name.

Feature ids are arbitrary 64-bit integers (a user id, a hashed URL, a cross of two
columns). Sharding by ``id % n_shards`` is fast but fragile: if the ids share a pattern
(all even, all multiples of the shard count because an upstream system allocates them
that way) every row lands on one server. Mixing the bits first makes the owner depend
on every bit of the id, so any pattern that is not adversarial *to the mixer itself*
spreads evenly. The mixer is SplitMix64's finaliser (Steele, Lea and Flood, 2014): three
xor-shift-multiply rounds, a bijection on 64-bit words, vectorised here with NumPy's
wrapping ``uint64`` arithmetic.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np

from ..backend import require_numpy

# What a GPU or PyTorch array handed to a table is told (the tables live in host memory).
PARAMETER_SERVER = "reference_impl.ps (the parameter-server tables, kept in host memory)"

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(k) for k in (30, 27, 31, 11))
_COLUMN = np.uint64(0x5851F42D4C957F2D)  # odd constant that spreads column numbers (uniform_from_ids)


def as_ids(ids: Any, what: str = "ids") -> np.ndarray:
    """``ids`` as an ``int64`` array, or a ``TypeError``/``ValueError`` saying what is wrong.

    Accepts integer arrays and Python integers that fit in 64 bits (signed or unsigned;
    an unsigned id above 2**63 keeps its bits and reads as a negative ``int64``).
    """
    if type(ids) is np.ndarray and ids.dtype == np.int64:  # the common case, checked first: it is cheap
        return ids
    if isinstance(ids, np.ndarray):
        arr = ids
    else:
        require_numpy(PARAMETER_SERVER, ids)
        try:
            arr = np.asarray(ids)
        except OverflowError:
            raise ValueError(f"{what}: an id does not fit in 64 bits") from None
    if arr.dtype == object:
        flat = arr.ravel().tolist()
        bad = [v for v in flat if not isinstance(v, (int, np.integer)) or not -(2**63) <= v < 2**64]
        if bad:
            raise ValueError(f"{what}: {bad[0]!r} is not an integer id that fits in 64 bits")
        arr = np.array([v & (2**64 - 1) for v in flat], dtype=np.uint64).reshape(arr.shape)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what}: feature ids must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64:
        return arr.view(np.int64)
    return arr.astype(np.int64, copy=False)


# --8<-- [start:splitmix]
def splitmix64(ids: Any) -> np.ndarray:
    """SplitMix64 of every id: a well-mixed ``uint64`` for each ``int64``/``uint64`` input."""
    return _mix(as_ids(ids).view(np.uint64) + _GOLDEN)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's three rounds on a fresh ``uint64`` array ``z``, in place:
    ``z ^= z >> 30; z *= M1; z ^= z >> 27; z *= M2; z ^= z >> 31`` (one scratch array)."""
    t = z >> _S30
    z ^= t
    z *= _M1
    np.right_shift(z, _S27, out=t)
    z ^= t
    z *= _M2
    np.right_shift(z, _S31, out=t)
    z ^= t
    return z


def shard_of(ids: Any, n_shards: int) -> np.ndarray:
    """The shard (0..n_shards-1) that owns each id: ``splitmix64(id) % n_shards``."""
    if n_shards < 1:
        raise ValueError(f"shard_of: n_shards must be >= 1, got {n_shards}")
    return (splitmix64(ids) % np.uint64(n_shards)).astype(np.int64)
# --8<-- [end:splitmix]


def group_by_shard(ids: np.ndarray, n_shards: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``(order, bounds)``: ``ids[order][lo:hi]`` are the ids of shard ``s = bounds.index((lo, hi))``.

    A stable sort by owner, so a client can send each server one contiguous slice and put
    the replies back with ``out[order] = concatenated_replies``.
    """
    owner = shard_of(ids, n_shards)
    if n_shards <= 1 << 16:  # small keys: NumPy's stable sort is then a linear-time radix sort
        owner = owner.astype(np.uint8 if n_shards <= 1 << 8 else np.uint16)
    order = np.argsort(owner, kind="stable")
    edges = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n_shards))]).tolist()
    return order, list(itertools.pairwise(edges))


def load_imbalance(ids: Any, n_shards: int) -> float:
    """max/mean rows per shard: 1.0 is perfect balance, ``n_shards`` is everything on one."""
    counts = np.bincount(shard_of(ids, n_shards), minlength=n_shards)
    return float(counts.max() / counts.mean())


@functools.lru_cache(maxsize=64)
def _column_offsets(dim: int) -> np.ndarray:
    """``column * C + GOLDEN`` for each column (read-only, computed once per width)."""
    cols = np.arange(dim, dtype=np.uint64) * _COLUMN + _GOLDEN
    cols.flags.writeable = False
    return cols


def uniform_from_ids(ids: np.ndarray, dim: int, seed: int) -> np.ndarray:
    """A ``(len(ids), dim)`` array of floats in ``[-1, 1)`` that depends only on (id, column, seed).

    This is how a sparse table initialises a new row: the value is a pure function of the
    id, so it does not matter which shard creates the row, or when, and a dense table built
    with the same function is an exact reference for the sparse one.
    """
    base = splitmix64(as_ids(ids) ^ np.int64(seed))
    # splitmix64(base + column * C) for every column; the + _GOLDEN of splitmix64 is folded
    # into the column offsets (uint64 addition wraps, so the sum is the same), and the
    # rounds run in place: this is the cost of creating a row, so it is kept to few passes.
    bits = _mix(base[:, None] + _column_offsets(dim))
    bits >>= _S11  # the top 53 bits: exactly representable in a float64
    out = np.multiply(bits, 2.0 / 2**53, dtype=np.float64)  # exact: a 53-bit integer times a power of 2
    out -= 1.0
    return out
