"""Reduction operators: the local, element-wise half of every reducing collective.

A collective moves arrays between ranks; whenever two partial results meet on one rank
they are combined with the reduction operator. The operators here are those of MPI
(``MPI_SUM``, ``MPI_PROD``, ``MPI_MAX``, ``MPI_MIN``) plus ``mean``, which is a sum
divided by the rank count once at the end. All of them are associative and commutative,
which is what lets each algorithm combine partial results in its own order: the order
changes floating-point rounding, never the result of integer-valued data.

Only array API standard calls touch the data, so collectives built on these helpers run
on NumPy, CuPy and ``array_api_strict`` alike.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

OPS = ("sum", "prod", "max", "min", "mean")


def combine(op: str, xp: ModuleType, acc: Any, incoming: Any) -> None:
    """``acc = acc (op) incoming``, written into ``acc`` (often a slice of a larger buffer).

    Sum and product run in place with no temporary; ``mean`` sums here, and ``finish``
    divides by the rank count once at the end.
    """
    if op in ("sum", "mean"):
        acc += incoming
    elif op == "prod":
        acc *= incoming
    elif op == "max":
        acc[...] = xp.maximum(acc, incoming)
    else:
        acc[...] = xp.minimum(acc, incoming)


def finish(op: str, result: Any, n_ranks: int) -> Any:
    """Apply what is left of ``op`` after the reduction: ``mean`` divides by the rank count."""
    if op == "mean":
        result /= n_ranks
    return result
