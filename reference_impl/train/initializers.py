"""Weight initialisers: how the first values of a variable are drawn, and why their scale matters.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

A layer ``y = x W`` with ``fan_in`` inputs of variance ``v_x`` and weights of variance ``v_w``
gives outputs of variance ``fan_in * v_w * v_x`` (independent, zero-mean terms add their
variances).  Stack 50 layers and that factor is raised to the 50th power: below 1 the signal
vanishes, above 1 it explodes.  The variance-scaling initialisers pick ``v_w`` to make it 1:

* **Glorot/Xavier**: ``v_w = 2 / (fan_in + fan_out)``, a compromise between keeping the forward
  variance (``1/fan_in``) and the backward variance (``1/fan_out``); right for tanh/linear units;
* **He**: ``v_w = 2 / fan_in``; ReLU zeroes half of its inputs, halving the second moment, and
  the 2 puts it back.

A uniform distribution on ``[-a, a]`` has variance ``a^2 / 3``, so the uniform variants use
``a = sqrt(3 v_w)``.  ``Orthogonal`` keeps every singular value at 1 (norms are preserved
exactly for linear layers).  Each initialiser is a callable ``init(shape, dtype) -> ndarray``
seeded at construction, and ``variable(init, shape)`` makes a graph ``Variable`` from one,
so the same seed gives the same weights on every machine (replicas must start equal).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

import reference_impl.graph as g


def compute_fans(shape: Sequence[int]) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight of ``shape``, as TensorFlow counts them.

    A matrix ``(fan_in, fan_out)`` is read directly; a convolution kernel
    ``(k_h, k_w, in, out)`` multiplies both by its receptive field ``k_h * k_w``; a vector
    (a bias) has ``fan_in = fan_out = its length``.
    """
    shape = tuple(int(d) for d in shape)
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive


def _check_shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise ValueError(f"{name}: shape must be a tuple of non-negative ints, got {shape}")
    return tuple(int(d) for d in shape)


class Initializer:
    """Base class: ``init(shape, dtype="float32")`` returns a new array of that shape.

    Each call advances the initialiser's own generator, so two variables built from one
    initialiser get different (but reproducible) values.
    """

    def __init__(self, seed: int | None = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def sample(self, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must define sample(shape)")

    def __call__(self, shape: Sequence[int], dtype: str = "float32") -> np.ndarray:
        shape = _check_shape(type(self).__name__, shape)
        if np.dtype(dtype).kind != "f":
            raise ValueError(f"{type(self).__name__}: needs a floating-point dtype, got {dtype}")
        return np.asarray(self.sample(shape), dtype=np.float64).astype(dtype)


class Zeros(Initializer):
    """All zeros: right for biases; wrong for weights (every unit computes the same thing)."""

    def sample(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape)


class Constant(Initializer):
    """Every element equal to ``value``."""

    def __init__(self, value: float, seed: int | None = 0) -> None:
        super().__init__(seed)
        self.value = float(value)

    def sample(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, self.value)


class RandomUniform(Initializer):
    """Uniform on ``[minval, maxval)``: variance ``(maxval - minval)^2 / 12``."""

    def __init__(self, minval: float = -0.05, maxval: float = 0.05, seed: int | None = 0) -> None:
        super().__init__(seed)
        if not minval < maxval:
            raise ValueError(f"RandomUniform: need minval < maxval, got {minval} and {maxval}")
        self.minval, self.maxval = float(minval), float(maxval)

    def sample(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.rng.uniform(self.minval, self.maxval, shape)


class RandomNormal(Initializer):
    """Normal with the given ``mean`` and ``stddev``."""

    def __init__(self, mean: float = 0.0, stddev: float = 0.05, seed: int | None = 0) -> None:
        super().__init__(seed)
        if not stddev >= 0:
            raise ValueError(f"RandomNormal: stddev must be >= 0, got {stddev}")
        self.mean, self.stddev = float(mean), float(stddev)

    def sample(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.mean + self.stddev * self.rng.standard_normal(shape)


# A standard normal cut to [-2, 2] keeps this share of its variance (used to undo the shrinkage).
TRUNCATED_VARIANCE = 0.7737413035499232


class TruncatedNormal(Initializer):
    """Normal, but values more than 2 standard deviations from the mean are drawn again.

    No weight starts far out in a tail, where a tanh or sigmoid unit would be saturated.
    The cut removes some spread: the result's standard deviation is ``0.8796 * stddev``.
    """

    def __init__(self, mean: float = 0.0, stddev: float = 0.05, seed: int | None = 0) -> None:
        super().__init__(seed)
        if not stddev >= 0:
            raise ValueError(f"TruncatedNormal: stddev must be >= 0, got {stddev}")
        self.mean, self.stddev = float(mean), float(stddev)

    def sample(self, shape: tuple[int, ...]) -> np.ndarray:
        z = self.rng.standard_normal(shape)
        bad = np.abs(z) > 2
        while bad.any():  # each pass redraws about 4.6 % of what is left
            z[bad] = self.rng.standard_normal(int(bad.sum()))
            bad = np.abs(z) > 2
        return self.mean + self.stddev * z


# --8<-- [start:variance_scaling]
class VarianceScaling(Initializer):
    """Zero-mean weights of variance ``scale / n``, with ``n`` from ``mode``.

    ``mode`` is ``"fan_in"``, ``"fan_out"`` or ``"fan_avg"`` (``(fan_in + fan_out) / 2``);
    ``distribution`` is ``"normal"``, ``"truncated_normal"`` (its stddev divided by 0.8796 so
    the variance is still ``scale / n``) or ``"uniform"`` (on ``[-sqrt(3 scale / n), +...]``).
    """

    def __init__(self, scale: float = 1.0, mode: str = "fan_in", distribution: str = "truncated_normal",
                 seed: int | None = 0) -> None:
        super().__init__(seed)
        if not scale > 0:
            raise ValueError(f"VarianceScaling: scale must be > 0, got {scale}")
        if mode not in ("fan_in", "fan_out", "fan_avg"):
            raise ValueError(f"VarianceScaling: mode must be fan_in, fan_out or fan_avg, got {mode!r}")
        if distribution not in ("normal", "truncated_normal", "uniform"):
            raise ValueError("VarianceScaling: distribution must be normal, truncated_normal or uniform, "
                             f"got {distribution!r}")
        self.scale, self.mode, self.distribution = float(scale), mode, distribution

    def variance(self, shape: Sequence[int]) -> float:
        """The variance this initialiser gives a weight of ``shape``."""
        fan_in, fan_out = compute_fans(shape)
        n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[self.mode]
        return self.scale / max(n, 1)

    def sample(self, shape: tuple[int, ...]) -> np.ndarray:
        var = self.variance(shape)
        if self.distribution == "uniform":
            limit = math.sqrt(3 * var)
            return self.rng.uniform(-limit, limit, shape)
        if self.distribution == "normal":
            return math.sqrt(var) * self.rng.standard_normal(shape)
        std = math.sqrt(var / TRUNCATED_VARIANCE)
        return TruncatedNormal(0.0, std, seed=int(self.rng.integers(2**63))).sample(shape)


def GlorotUniform(seed: int | None = 0) -> VarianceScaling:
    """Glorot/Xavier uniform: variance ``2 / (fan_in + fan_out)``."""
    return VarianceScaling(1.0, "fan_avg", "uniform", seed)


def GlorotNormal(seed: int | None = 0) -> VarianceScaling:
    """Glorot/Xavier normal (truncated, rescaled): variance ``2 / (fan_in + fan_out)``."""
    return VarianceScaling(1.0, "fan_avg", "truncated_normal", seed)


def HeUniform(seed: int | None = 0) -> VarianceScaling:
    """He/Kaiming uniform: variance ``2 / fan_in``, for ReLU layers."""
    return VarianceScaling(2.0, "fan_in", "uniform", seed)


def HeNormal(seed: int | None = 0) -> VarianceScaling:
    """He/Kaiming normal (truncated, rescaled): variance ``2 / fan_in``, for ReLU layers."""
    return VarianceScaling(2.0, "fan_in", "truncated_normal", seed)
# --8<-- [end:variance_scaling]


class Orthogonal(Initializer):
    """A (semi-)orthogonal matrix times ``gain``: every singular value equals ``gain``.

    The weight is viewed as a matrix ``(prod(shape[:-1]), shape[-1])``.  The Q factor of the QR
    decomposition of a Gaussian matrix is orthogonal; multiplying each column by the sign of
    R's diagonal makes it uniformly distributed over orthogonal matrices (Mezzadri, 2007).
    """

    def __init__(self, gain: float = 1.0, seed: int | None = 0) -> None:
        super().__init__(seed)
        self.gain = float(gain)

    def sample(self, shape: tuple[int, ...]) -> np.ndarray:
        if len(shape) < 2:
            raise ValueError(f"Orthogonal: needs a shape of rank >= 2, got {shape}")
        rows, cols = math.prod(shape[:-1]), shape[-1]
        a = self.rng.standard_normal((max(rows, cols), min(rows, cols)))
        q, r = np.linalg.qr(a)
        q = q * np.sign(np.diag(r))
        if rows < cols:
            q = q.T
        return self.gain * q.reshape(shape)


INITIALIZERS = {
    "zeros": Zeros, "constant": Constant, "uniform": RandomUniform, "normal": RandomNormal,
    "truncated_normal": TruncatedNormal, "glorot_uniform": GlorotUniform, "glorot_normal": GlorotNormal,
    "he_uniform": HeUniform, "he_normal": HeNormal, "orthogonal": Orthogonal,
}


def get_initializer(name: str, **kwargs: float) -> Initializer:
    """An initialiser by its name in ``INITIALIZERS`` (``get_initializer("he_normal", seed=1)``)."""
    if name not in INITIALIZERS:
        raise ValueError(f"unknown initialiser {name!r}; known: {', '.join(INITIALIZERS)}")
    return INITIALIZERS[name](**kwargs)


def variable(initializer: Initializer, shape: Sequence[int], name: str | None = None,
             dtype: str = "float32", trainable: bool = True) -> g.Variable:
    """A graph ``Variable`` of ``shape`` whose initial value is drawn by ``initializer``.

    The draw happens now, in NumPy; the value is stored in the graph as the variable's
    initial constant, and ``global_variables_initializer()`` assigns it in each Session.
    """
    return g.Variable(initializer(shape, dtype), name=name, trainable=trainable)
