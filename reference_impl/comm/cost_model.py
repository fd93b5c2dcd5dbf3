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


def ring_allreduce(n_bytes: float, p: int, c: LinkParams) -> float:
    """2(p-1) steps of n/p bytes: bandwidth-optimal, latency linear in p."""
    if p == 1:
        return 0.0
    return 2 * (p - 1) * c.alpha + 2 * (p - 1) / p * n_bytes * c.beta + (p - 1) / p * n_bytes * c.gamma


def recursive_doubling_allreduce(n_bytes: float, p: int, c: LinkParams) -> float:
    """log2(p) exchanges of the whole array: fewest steps, most bytes."""
    if p == 1:
        return 0.0
    k = int(math.log2(_pow2_below(p)))
    return k * (c.alpha + n_bytes * c.beta + n_bytes * c.gamma) + _fold(n_bytes, p, c)


def rabenseifner_allreduce(n_bytes: float, p: int, c: LinkParams) -> float:
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


def tree_allreduce(n_bytes: float, p: int, c: LinkParams) -> float:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast: 2 ceil(log2 p) full messages."""
    if p == 1:
        return 0.0
    k = math.ceil(math.log2(p))
    return k * (c.alpha + n_bytes * c.beta + n_bytes * c.gamma) + k * (c.alpha + n_bytes * c.beta)


ALLREDUCE_TIME = {
    "ring": ring_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "rabenseifner": rabenseifner_allreduce,
    "tree": tree_allreduce,
}


def ring_reduce_scatter(n_bytes: float, p: int, c: LinkParams) -> float:
    """p-1 steps of n/p bytes, each followed by a reduction of what arrived."""
    return (p - 1) * (c.alpha + n_bytes / p * (c.beta + c.gamma))


def ring_allgather(n_bytes: float, p: int, c: LinkParams) -> float:
    """p-1 steps of n/p bytes (``n_bytes`` is the size of the gathered result)."""
    return (p - 1) * (c.alpha + n_bytes / p * c.beta)


def binomial_broadcast(n_bytes: float, p: int, c: LinkParams) -> float:
    """ceil(log2 p) rounds; the set of ranks holding the data doubles each round."""
    return math.ceil(math.log2(p)) * (c.alpha + n_bytes * c.beta) if p > 1 else 0.0


def binomial_reduce(n_bytes: float, p: int, c: LinkParams) -> float:
    """ceil(log2 p) rounds of send-and-reduce towards the root."""
    return math.ceil(math.log2(p)) * (c.alpha + n_bytes * (c.beta + c.gamma)) if p > 1 else 0.0


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
