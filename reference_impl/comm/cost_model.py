"""The α–β–γ cost model of collectives (Hockney's model, as in Thakur, Rabenseifner & Gropp).

A message of ``m`` bytes between two ranks costs ``alpha + m * beta`` seconds; reducing
``m`` bytes locally costs ``m * gamma``. Each rank can send one message and receive one
at the same time (full duplex). With those three numbers the time of every collective
algorithm has a closed form in the message size ``n_bytes`` (per rank) and the rank count
``p``; comparing the forms says which algorithm wins where (``best_allreduce``).

Non-powers of two: recursive doubling and Rabenseifner first *fold* the ``p - p2`` extra
ranks into partners (``p2`` is the largest power of two ``<= p``): one full-size message and
reduction before, one full-size message after, which is the ``extra`` term below.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class LinkParams:
    """alpha: seconds per message; beta: seconds per byte; gamma: seconds per byte reduced."""

    alpha: float
    beta: float
    gamma: float = 0.0

    @classmethod
    def from_bandwidth(cls, latency_s: float, bandwidth_Bps: float, gamma: float = 0.0) -> "LinkParams":
        """Build from a latency and a link bandwidth in bytes per second (beta = 1 / bandwidth)."""
        return cls(latency_s, 1.0 / bandwidth_Bps, gamma)


def _pow2_below(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def _fold(n_bytes: float, p: int, c: LinkParams) -> float:
    """Cost of folding the ranks beyond the largest power of two in and back out (0 if none)."""
    if p == _pow2_below(p):
        return 0.0
    return 2 * (c.alpha + n_bytes * c.beta) + n_bytes * c.gamma


def ring_allreduce_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """2(p-1) steps of n/p bytes: bandwidth-optimal, latency linear in p."""
    if p == 1:
        return 0.0
    return 2 * (p - 1) * c.alpha + 2 * (p - 1) / p * n_bytes * c.beta + (p - 1) / p * n_bytes * c.gamma


def recursive_doubling_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """log2(p) exchanges of the whole array: fewest steps, most bytes."""
    if p == 1:
        return 0.0
    k = int(math.log2(_pow2_below(p)))
    return k * (c.alpha + n_bytes * c.beta + n_bytes * c.gamma) + _fold(n_bytes, p, c)


def rabenseifner_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """Recursive-halving reduce-scatter + recursive-doubling allgather: 2 log2(p) steps, ring's bytes."""
    if p == 1:
        return 0.0
    p2 = _pow2_below(p)
    k = int(math.log2(p2))
    return (
        2 * k * c.alpha
        + 2 * (p2 - 1) / p2 * n_bytes * c.beta
        + (p2 - 1) / p2 * n_bytes * c.gamma
        + _fold(n_bytes, p, c)
    )


def tree_allreduce_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast: 2 ceil(log2 p) full messages."""
    if p == 1:
        return 0.0
    k = math.ceil(math.log2(p))
    return k * (c.alpha + n_bytes * c.beta + n_bytes * c.gamma) + k * (c.alpha + n_bytes * c.beta)


ALLREDUCE_TIME = {
    "ring": ring_allreduce_time,
    "recursive_doubling": recursive_doubling_time,
    "rabenseifner": rabenseifner_time,
    "tree": tree_allreduce_time,
}


def ring_reduce_scatter_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """p-1 steps of n/p bytes, each followed by a reduction of what arrived."""
    return (p - 1) * (c.alpha + n_bytes / p * (c.beta + c.gamma))


def ring_allgather_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """p-1 steps of n/p bytes (``n_bytes`` is the size of the gathered result)."""
    return (p - 1) * (c.alpha + n_bytes / p * c.beta)


def binomial_broadcast_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """ceil(log2 p) rounds; the set of ranks holding the data doubles each round."""
    return math.ceil(math.log2(p)) * (c.alpha + n_bytes * c.beta) if p > 1 else 0.0


def binomial_reduce_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """ceil(log2 p) rounds of send-and-reduce towards the root."""
    return math.ceil(math.log2(p)) * (c.alpha + n_bytes * (c.beta + c.gamma)) if p > 1 else 0.0


def pairwise_alltoall_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """Pairwise-exchange all-to-all: p-1 steps of n/p bytes (``n_bytes``: a rank's whole send buffer)."""
    return (p - 1) * (c.alpha + n_bytes / p * c.beta) if p > 1 else 0.0


def bruck_alltoall_time(n_bytes: float, p: int, c: LinkParams) -> float:
    """Bruck's all-to-all: ceil(log2 p) steps; step k sends the b_k blocks whose index has bit k set.

    Exactly ``ceil(log2 p) * alpha + sum_k b_k * (n_bytes / p) * beta`` with
    ``b_k = |{i < p : bit k of i is 1}|``; for p a power of two b_k = p / 2, which gives
    Thakur et al.'s ``log2(p) * (alpha + n_bytes / 2 * beta)``.
    """
    if p <= 1:
        return 0.0
    steps, blocks, bit = 0, 0, 1
    while bit < p:
        steps += 1
        blocks += sum(1 for i in range(p) if i & bit)
        bit *= 2
    return steps * c.alpha + blocks * n_bytes / p * c.beta


def allreduce_time(algorithm: str, n_bytes: float, p: int, c: LinkParams) -> float:
    """Predicted seconds for ``algorithm`` to allreduce ``n_bytes`` per rank on ``p`` ranks."""
    if algorithm not in ALLREDUCE_TIME:
        raise ValueError(f"no cost model for allreduce algorithm {algorithm!r}; known: {sorted(ALLREDUCE_TIME)}")
    if p < 1 or n_bytes < 0:
        raise ValueError(f"need p >= 1 ranks and n_bytes >= 0, got p={p}, n_bytes={n_bytes}")
    return ALLREDUCE_TIME[algorithm](n_bytes, p, c)


def best_allreduce(n_bytes: float, p: int, c: LinkParams, candidates: tuple[str, ...] = tuple(ALLREDUCE_TIME)) -> str:
    """The candidate with the smallest predicted time (ties go to the earlier candidate)."""
    return min(candidates, key=lambda a: allreduce_time(a, n_bytes, p, c))


# --------------------------------------------------------------------------- fitting
# --8<-- [start:fitting]
#
# The closed forms above need numbers. A ping-pong between two ranks measures the time
# ``t(m)`` of one message of ``m`` bytes; the model says ``t = alpha + m * beta``, a straight
# line whose intercept is the latency and whose slope is the inverse bandwidth. Timing a
# local reduction the same way gives ``gamma`` as the slope of a second line.
#
# The sizes of a sweep span many decades (8 B to 64 MiB), and so do the times. Ordinary
# least squares on the seconds would let the few largest messages decide everything: an
# error of 1 % at 64 MiB is thousands of times the whole latency, so the intercept would be
# noise (often negative). We minimise *relative* errors instead, sum((t_i - fit_i) / t_i)^2,
# which weighs every point alike: dividing row i of the least-squares system by t_i does it.


@dataclass(frozen=True)
class LineFit:
    """``y ≈ intercept + slope * x``, fitted to minimise relative errors, and how well it fits.

    ``r_squared`` is the usual coefficient of determination on the raw values. When the
    sizes span decades it is close to 1 for almost any line through the largest points, so
    read ``relative_residuals`` too: ``(measured - fitted) / fitted`` for every point.
    """

    intercept: float
    slope: float
    r_squared: float
    relative_residuals: tuple[float, ...]

    def predict(self, x: float) -> float:
        return self.intercept + self.slope * x

    @property
    def max_relative_error(self) -> float:
        """The worst point's ``|measured - fitted| / fitted``."""
        return max(abs(r) for r in self.relative_residuals)


@dataclass(frozen=True)
class FittedLinkParams(LinkParams):
    """``LinkParams`` measured by fitting a ping-pong sweep; ``fit`` says how well the line fits."""

    fit: LineFit | None = None


def fit_line(xs: Sequence[float], ys: Sequence[float], what: str = "line") -> LineFit:
    """Least-squares line through ``(xs, ys)`` minimising relative errors (see above).

    ``what`` names the fit in error messages. Needs as many ``ys`` as ``xs``, at least two
    distinct ``xs`` (non-negative and finite) and ``ys`` that are positive and finite.
    """
    import numpy as np

    if len(xs) != len(ys):
        raise ValueError(f"fit {what}: got {len(xs)} sizes but {len(ys)} times; they must pair up")
    x = np.asarray(xs, dtype=np.float64).reshape(-1)
    y = np.asarray(ys, dtype=np.float64).reshape(-1)
    bad_sizes = x[~(np.isfinite(x) & (x >= 0))]
    if bad_sizes.size:
        raise ValueError(f"fit {what}: sizes must be finite and >= 0, got {bad_sizes[:5].tolist()}")
    bad_times = y[~(np.isfinite(y) & (y > 0))]
    if bad_times.size:
        raise ValueError(f"fit {what}: times must be finite and > 0 seconds, got {bad_times[:5].tolist()}")
    if len(np.unique(x)) < 2:
        raise ValueError(f"fit {what}: need at least two distinct sizes to fit a line, got {np.unique(x).tolist()}")

    # Row i of [1, x_i] @ [intercept, slope] = y_i, divided by y_i: relative errors.
    design = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    fitted = intercept + slope * x
    total = float(np.sum((y - y.mean()) ** 2))
    r_squared = 1.0 - float(np.sum((y - fitted) ** 2)) / total if total > 0 else 1.0
    relative = tuple(float(r) for r in (y - fitted) / np.where(fitted != 0, fitted, np.inf))
    return LineFit(float(intercept), float(slope), r_squared, relative)


def fit_alpha_beta(sizes_bytes: Sequence[float], seconds: Sequence[float]) -> FittedLinkParams:
    """Fit ``t = alpha + m * beta`` to one-way message times (half a ping-pong round trip).

    Returns ``LinkParams`` (``gamma`` 0; see ``fit_gamma``) that also carry the ``fit``.
    A negative intercept or slope means the data are not a latency plus a bandwidth (too
    few sizes, or sizes that are all latency-bound or all bandwidth-bound with noise): that
    raises ``ValueError`` rather than returning a link no cost formula can use.
    """
    line = fit_line(sizes_bytes, seconds, "alpha-beta")
    if line.intercept < 0 or line.slope <= 0:
        raise ValueError(
            f"fit alpha-beta: the best line has alpha = {line.intercept:.3g} s and beta = "
            f"{line.slope:.3g} s/byte, but a latency must be >= 0 and a time per byte > 0; "
            "measure sizes from a few bytes (latency-bound) to several MiB (bandwidth-bound)"
        )
    return FittedLinkParams(alpha=line.intercept, beta=line.slope, fit=line)


def fit_gamma(sizes_bytes: Sequence[float], seconds: Sequence[float]) -> float:
    """Seconds per byte of a local reduction: the slope of reduction time against size.

    The intercept (the fixed cost of one call into the array library) has no place in the
    α–β–γ model, which charges it to ``alpha``; only the slope is returned.
    """
    line = fit_line(sizes_bytes, seconds, "gamma")
    if line.slope <= 0:
        raise ValueError(
            f"fit gamma: reduction time does not grow with size (slope {line.slope:.3g} s/byte); "
            "time reductions of at least a few MiB"
        )
    return line.slope
# --8<-- [end:fitting]
