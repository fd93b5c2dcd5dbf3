"""Feature columns: how raw features (numbers, strings, ids) become model inputs.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

The names follow TensorFlow's ``tf.feature_column``. A column reads one key (or several)
from a batch ``features: dict[str, array]`` and produces either

* a **dense** float block ``(batch, width)`` that an MLP can take (``numeric_column``,
  ``indicator_column``, ``embedding_column`` once its table is looked up), or
* **categorical ids** ``(batch,)`` int64 with a ``num_buckets`` (or ``None`` when
  unbounded) that a linear model or an embedding indexes into.

Categorical columns differ in how a raw value becomes an id:

==========================================  ======================================  =========================
column                                      raw value -> id                         buckets
==========================================  ======================================  =========================
``bucketized_column(numeric, boundaries)``  index of the interval it falls in       ``len(boundaries) + 1``
``categorical_column_with_vocabulary_list`` its position in the list; unknown values ``len(vocab) + oov``
                                            hash into ``num_oov_buckets``
``categorical_column_with_hash_bucket``     ``hash(value) % hash_bucket_size``      fixed; collisions
``crossed_column(columns, size)``           ``hash(id_1, ..., id_k) % size``        fixed; collisions
``dynamic_categorical_column``              ``hash(value)`` as a raw 64-bit id      ``None``: a sparse table
==========================================  ======================================  =========================

The dynamic column (N003-Q4) needs neither a vocabulary nor a bucket count: every value
keeps its own 64-bit id (two values share one only if their 64-bit hashes collide, about
``n**2 / 2**65`` pairs among ``n`` values) and an ``embedding_column`` over it stores its
rows in a sparse table that grows as ids appear (``reference_impl.ps``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..ps.hashing import splitmix64

_CROSS_SALT = np.int64(0x2545F4914F6CDD1D)


def fingerprint64(values: Any, what: str = "feature") -> np.ndarray:
    """A 64-bit id for every raw value: integers are mixed by SplitMix64, strings by BLAKE2b.

    The same value gets the same id on every machine and in every process (Python's own
    ``hash`` of a string is salted per process, so it cannot be used).
    """
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return splitmix64(arr).view(np.int64)
    if arr.dtype.kind in "US" or arr.dtype == object:
        out = np.empty(arr.shape, dtype=np.int64)
        flat = out.reshape(-1)
        for i, v in enumerate(arr.reshape(-1).tolist()):
            if not isinstance(v, (str, bytes)):
                raise TypeError(f"{what}: expected strings or integers, got {type(v).__name__} {v!r}")
            data = v.encode() if isinstance(v, str) else v
            flat[i] = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)
        return out
    raise TypeError(f"{what}: categorical values must be strings or integers, got dtype {arr.dtype}")


def _get(features: dict[str, Any], key: str) -> np.ndarray:
    if key not in features:
        raise KeyError(f"feature column {key!r} not in the features; they have {sorted(features)}")
    return np.asarray(features[key])


class CategoricalColumn:
    """Base of columns that produce int64 ids: ``ids(features)`` and ``num_buckets``."""

    name: str
    num_buckets: int | None

    def ids(self, features: dict[str, Any]) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class NumericColumn:
    """A float feature of ``shape`` values per example, optionally normalised by ``(x - mean) / std``."""

    key: str
    shape: int = 1
    mean: float = 0.0
    std: float = 1.0

    @property
    def name(self) -> str:
        return self.key

    @property
    def width(self) -> int:
        return self.shape

    def dense(self, features: dict[str, Any]) -> np.ndarray:
        raw = _get(features, self.key)
        if raw.dtype.kind not in "iuf":
            raise TypeError(f"numeric_column {self.key!r}: expected numbers, got dtype {raw.dtype}")
        x = raw.astype(np.float64).reshape(len(raw), -1)
        if x.shape[1] != self.shape:
            raise ValueError(f"numeric_column {self.key!r}: expected {self.shape} value(s) per "
                             f"example, got {x.shape[1]}")
        return (x - self.mean) / self.std


@dataclass(frozen=True)
class BucketizedColumn(CategoricalColumn):
    """The interval of ``boundaries`` a one-value numeric feature falls in: ``[b_i, b_i+1)``."""

    source: NumericColumn
    boundaries: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.source.shape != 1:
            raise ValueError(f"bucketized_column {self.source.key!r}: source must have shape 1")
        if list(self.boundaries) != sorted(set(self.boundaries)):
            raise ValueError(f"bucketized_column {self.source.key!r}: boundaries must be strictly "
                             f"increasing, got {self.boundaries}")

    @property
    def name(self) -> str:
        return f"{self.source.key}_bucketized"

    @property
    def num_buckets(self) -> int:
        return len(self.boundaries) + 1

    def ids(self, features):
        x = _get(features, self.source.key).reshape(-1)
        if x.dtype.kind not in "iuf":
            raise TypeError(f"bucketized_column {self.source.key!r}: expected numbers, got dtype {x.dtype}")
        return np.searchsorted(np.asarray(self.boundaries), x, side="right").astype(np.int64)


@dataclass(frozen=True)
class VocabularyColumn(CategoricalColumn):
    """Position in a fixed vocabulary; values outside it hash into ``num_oov_buckets`` extra ids."""

    key: str
    vocabulary: tuple[Any, ...]
    num_oov_buckets: int = 1

    def __post_init__(self) -> None:
        if len(set(self.vocabulary)) != len(self.vocabulary):
            raise ValueError(f"categorical_column_with_vocabulary_list {self.key!r}: duplicate entries")
        if self.num_oov_buckets < 1:
            raise ValueError(f"categorical_column_with_vocabulary_list {self.key!r}: "
                             f"num_oov_buckets must be >= 1")

    @property
    def name(self) -> str:
        return self.key

    @property
    def num_buckets(self) -> int:
        return len(self.vocabulary) + self.num_oov_buckets

    def ids(self, features):
        raw = _get(features, self.key).reshape(-1)
        lookup = {v: i for i, v in enumerate(self.vocabulary)}
        values = raw.tolist()
        out = np.array([lookup.get(v, -1) for v in values], dtype=np.int64)
        oov = out < 0
        if oov.any():
            h = fingerprint64(raw[oov], self.key).view(np.uint64) % np.uint64(self.num_oov_buckets)
            out[oov] = len(self.vocabulary) + h.astype(np.int64)
        return out


@dataclass(frozen=True)
class HashBucketColumn(CategoricalColumn):
    """``fingerprint64(value) % hash_bucket_size``: no vocabulary, but distinct values may collide."""

    key: str
    hash_bucket_size: int

    def __post_init__(self) -> None:
        if self.hash_bucket_size < 1:
            raise ValueError(f"categorical_column_with_hash_bucket {self.key!r}: hash_bucket_size must be >= 1")

    @property
    def name(self) -> str:
        return self.key

    @property
    def num_buckets(self) -> int:
        return self.hash_bucket_size

    def ids(self, features):
        h = fingerprint64(_get(features, self.key).reshape(-1), self.key).view(np.uint64)
        return (h % np.uint64(self.hash_bucket_size)).astype(np.int64)


# --8<-- [start:dynamic]
@dataclass(frozen=True)
class DynamicCategoricalColumn(CategoricalColumn):
    """Raw 64-bit ids with no vocabulary and no bucket count: keys into a growing sparse table."""

    key: str

    @property
    def name(self) -> str:
        return self.key

    @property
    def num_buckets(self) -> None:
        return None

    def ids(self, features):
        return fingerprint64(_get(features, self.key).reshape(-1), self.key)
# --8<-- [end:dynamic]


@dataclass(frozen=True)
class CrossedColumn(CategoricalColumn):
    """A hashed cross of several categorical columns: one id per combination of their ids.

    Lets a linear model learn a weight for "this user on this item" that no sum of a user
    weight and an item weight can express (the wide part's memorisation).
    """

    columns: tuple[CategoricalColumn, ...]
    hash_bucket_size: int

    def __post_init__(self) -> None:
        if len(self.columns) < 2:
            raise ValueError("crossed_column: needs at least two columns")
        if self.hash_bucket_size < 1:
            raise ValueError(f"crossed_column: hash_bucket_size must be >= 1, got {self.hash_bucket_size}")

    @property
    def name(self) -> str:
        return "_X_".join(c.name for c in self.columns)

    @property
    def num_buckets(self) -> int:
        return self.hash_bucket_size

    def cross_ids(self, features: dict[str, Any]) -> np.ndarray:
        """The unreduced 64-bit id of each combination (order of columns matters)."""
        return cross_hash([column.ids(features) for column in self.columns])

    def ids(self, features):
        return hash_to_bucket(self.cross_ids(features), self.hash_bucket_size)


# --8<-- [start:cross]
def cross_hash(id_columns: Sequence[np.ndarray]) -> np.ndarray:
    """One well-mixed 64-bit id per row for the combination of the columns' ids.

    Chained, not combined symmetrically: ``h <- splitmix64(h ^ ids)`` column by column from
    a fixed salt, so (a, b) and (b, a) differ, (a, a) is not 0, and every bit of every id
    reaches every bit of the result.
    """
    if len(id_columns) < 2:
        raise ValueError(f"cross_hash: needs at least two columns, got {len(id_columns)}")
    columns = [np.asarray(ids) for ids in id_columns]
    for i, ids in enumerate(columns):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"cross_hash: column {i} must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        if len(ids) != len(columns[0]):
            raise ValueError(f"cross_hash: column {i} has {len(ids)} rows, column 0 has {len(columns[0])}")
    h = np.full(len(columns[0]), _CROSS_SALT, dtype=np.int64)
    for ids in columns:
        ids = ids.view(np.int64) if ids.dtype == np.uint64 else ids.astype(np.int64)  # same 64 bits
        h = splitmix64(h ^ ids).view(np.int64)
    return h


def hash_to_bucket(hashes: np.ndarray, num_buckets: int) -> np.ndarray:
    """Bucket ``hash mod num_buckets``, taking the 64 bits as *unsigned* (so never negative)."""
    return (np.asarray(hashes).view(np.uint64) % np.uint64(num_buckets)).astype(np.int64)
# --8<-- [end:cross]


@dataclass(frozen=True)
class IndicatorColumn:
    """A one-hot block ``(batch, num_buckets)`` of a bounded categorical column."""

    categorical: CategoricalColumn

    def __post_init__(self) -> None:
        if self.categorical.num_buckets is None:
            raise ValueError(f"indicator_column {self.categorical.name!r}: a dynamic column has no fixed "
                             f"width; use an embedding_column")

    @property
    def name(self) -> str:
        return f"{self.categorical.name}_indicator"

    @property
    def width(self) -> int:
        return int(self.categorical.num_buckets)

    def dense(self, features):
        ids = self.categorical.ids(features)
        out = np.zeros((len(ids), self.width))
        out[np.arange(len(ids)), ids] = 1.0
        return out


@dataclass(frozen=True)
class EmbeddingColumn:
    """A ``dimension``-wide embedding of a categorical column; the model owns the table.

    A bounded column gets a dense table of ``num_buckets`` rows; a dynamic one (no
    ``num_buckets``) a sparse table keyed by its raw ids.
    """

    categorical: CategoricalColumn
    dimension: int

    def __post_init__(self) -> None:
        if self.dimension < 1:
            raise ValueError(f"embedding_column {self.categorical.name!r}: dimension must be >= 1")

    @property
    def name(self) -> str:
        return f"{self.categorical.name}_embedding"

    @property
    def width(self) -> int:
        return self.dimension


def numeric_column(key: str, shape: int = 1, mean: float = 0.0, std: float = 1.0) -> NumericColumn:
    return NumericColumn(key, shape, mean, std)


def bucketized_column(source: NumericColumn, boundaries: Sequence[float]) -> BucketizedColumn:
    return BucketizedColumn(source, tuple(float(b) for b in boundaries))


def categorical_column_with_vocabulary_list(key: str, vocabulary: Sequence[Any],
                                            num_oov_buckets: int = 1) -> VocabularyColumn:
    return VocabularyColumn(key, tuple(vocabulary), num_oov_buckets)


def categorical_column_with_hash_bucket(key: str, hash_bucket_size: int) -> HashBucketColumn:
    return HashBucketColumn(key, hash_bucket_size)


def dynamic_categorical_column(key: str) -> DynamicCategoricalColumn:
    return DynamicCategoricalColumn(key)


def crossed_column(columns: Sequence[CategoricalColumn | str], hash_bucket_size: int) -> CrossedColumn:
    """Cross columns (a string key means a dynamic column over that key)."""
    cols = tuple(dynamic_categorical_column(c) if isinstance(c, str) else c for c in columns)
    return CrossedColumn(cols, hash_bucket_size)


def indicator_column(categorical: CategoricalColumn) -> IndicatorColumn:
    return IndicatorColumn(categorical)


def embedding_column(categorical: CategoricalColumn, dimension: int) -> EmbeddingColumn:
    return EmbeddingColumn(categorical, dimension)


def collision_rate(n_values: int, buckets: int, seed: int = 0) -> float:
    """Measured fraction of ``n_values`` distinct values that share a bucket with another value."""
    values = np.random.default_rng(seed).choice(2**62, n_values, replace=False)
    ids = HashBucketColumn("x", buckets).ids({"x": values})
    _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    return float(np.mean(counts[inverse] > 1))


def expected_collision_rate(n_values: int, buckets: int) -> tuple[float, float]:
    """Mean and standard deviation of ``collision_rate`` for a uniform hash: (p, sd).

    A value shares its bucket unless the other n - 1 all miss it: p = 1 - (1 - 1/m)^(n-1), the
    mean of the fraction by linearity. Two values i, j both share when they land together
    (1/m), or apart with each bucket also hit by one of the other n - 2 values; so
    Var(count) = n p (1 - p) + n (n - 1) (P(i and j) - p^2), and sd = sqrt(Var) / n.
    With few expected collisions the measured fraction is a small count over n: at
    n = 1000, m = 100,000 about C(n, 2) / m = 5 colliding pairs, sd 0.0044 around p = 0.0099.
    """
    n, m = n_values, buckets
    miss = 1 - 1 / m
    p = 1 - miss ** (n - 1)
    both = 1 / m + (1 - 1 / m) * (1 - 2 * miss ** (n - 2) + (1 - 2 / m) ** (n - 2))
    var = n * p * (1 - p) + n * (n - 1) * (both - p * p)
    return p, float(np.sqrt(max(var, 0.0))) / n
