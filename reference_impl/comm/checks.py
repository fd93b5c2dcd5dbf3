"""Input checks shared by the collectives, and what a disagreement between ranks looks like.

A collective is a contract: every rank must call it, with arrays of agreed sizes and the
same dtype. A rank cannot see the other ranks' arguments, so a broken contract shows up
only as a message that does not fit the buffer meant for it (the communicators check the
shape and dtype of every receive) or as a peer that never answers (their timeouts).
``explain_mismatch`` turns that low-level error into one that names the collective, the
rank, and what this rank passed.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from ..backend import namespace_of
from .communicator import CommError, Communicator
from .ops import OPS


def check_input(comm: Communicator, x: Any, op: str | None, who: str) -> ModuleType:
    """The array namespace of ``x``, after checking ``x`` is an array and ``op`` suits its dtype.

    ``who`` names the collective in the error (``"allreduce"``), which also says which
    rank the bad input was passed on. ``op=None`` means the collective does not reduce.
    """
    try:
        xp = namespace_of(x)
    except TypeError as exc:
        raise TypeError(f"{who} on rank {comm.rank}: {exc}") from None
    if op is not None and op not in OPS:
        raise ValueError(f"{who}: unknown op {op!r}; expected one of {OPS}")
    if op == "mean" and not xp.isdtype(x.dtype, ("real floating", "complex floating")):
        raise TypeError(f"{who} on rank {comm.rank}: op='mean' needs a floating dtype, got {x.dtype}")
    return xp


class explain_mismatch:
    """Re-raise a ``CommError`` from inside the ``with`` block with the collective's name and this rank's input.

    ``rule`` says what every rank must agree on, e.g. ``"the same dtype"`` for allgather;
    ``algorithm`` is named too when the collective has several. A class rather than a
    ``contextlib.contextmanager`` generator: it wraps every collective call, and entering a
    generator-based manager costs several times more.
    """

    __slots__ = ("comm", "who", "x", "rule", "algorithm")

    def __init__(self, comm: Communicator, who: str, x: Any,
                 rule: str = "the same number of elements and the same dtype", algorithm: str | None = None):
        self.comm, self.who, self.x, self.rule, self.algorithm = comm, who, x, rule, algorithm

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, traceback: Any) -> bool:
        if not isinstance(exc, CommError):
            return False
        n_elements = 1
        for d in self.x.shape:
            n_elements *= d
        raise CommError(
            f"{self.who} on rank {self.comm.rank} (input of {n_elements} elements, {self.x.dtype}"
            f"{'' if self.algorithm is None else f', algorithm {self.algorithm!r}'}): {exc}. "
            f"Every rank must call {self.who} with {self.rule}."
        ) from exc
