"""Training data for the data-parallel examples: a seeded synthetic data set and its shards.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

No data set ships with the packages this project installs, and nothing may be downloaded at
run time, so the examples train on a seeded generator: ``n_classes`` Gaussian clusters in
``n_features`` dimensions, overlapping enough that the loss keeps falling for many steps.
The same seed gives the same bytes on every machine.

Data parallelism splits every global batch into ``size`` equal shards, one per rank
(``shard``). Equal shards matter: each rank averages its loss over its own shard, and the
allreduce averages over ranks, which equals the mean over the global batch only when every
shard has the same number of samples.
"""
from __future__ import annotations

import numpy as np


def synthetic_classification(
    n_samples: int, n_features: int, n_classes: int, seed: int = 0, dtype: type = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: ``n_samples`` points of ``n_features`` floats and integer labels in ``[0, n_classes)``."""
    if n_samples < 1 or n_features < 1 or n_classes < 2:
        raise ValueError(
            f"synthetic_classification: need n_samples >= 1, n_features >= 1 and n_classes >= 2, "
            f"got {n_samples}, {n_features}, {n_classes}"
        )
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_classes, n_features)) * 1.5
    y = rng.integers(0, n_classes, size=n_samples)
    x = centres[y] + rng.standard_normal((n_samples, n_features))
    return x.astype(dtype), y.astype(np.int64)


def batch_indices(n_samples: int, batch_size: int, step: int, seed: int = 0) -> np.ndarray:
    """The sample indices of global batch ``step``: a seeded shuffle per epoch, cut in order.

    Every rank calls this with the same arguments and gets the same global batch, then keeps
    its own shard of it; no rank needs to tell another which samples it uses.
    """
    if not 0 < batch_size <= n_samples:
        raise ValueError(f"batch_indices: batch_size must be in 1..{n_samples}, got {batch_size}")
    per_epoch = n_samples // batch_size
    epoch, k = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n_samples)
    return order[k * batch_size:(k + 1) * batch_size]


def shard(x: np.ndarray, y: np.ndarray, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s contiguous, equal share of the global batch ``(x, y)``."""
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"shard: x has {n} samples but y has {y.shape[0]}")
    if not 0 <= rank < size:
        raise ValueError(f"shard: rank {rank} is outside 0..{size - 1}")
    if n % size:
        raise ValueError(
            f"shard: the global batch of {n} samples does not split evenly over {size} ranks; "
            "use a global batch size that is a multiple of the rank count"
        )
    per = n // size
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
