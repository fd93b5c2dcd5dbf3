"""The engine's own collectives, as the reference a test program checks ours against.

Under ``mpiexec`` they are the MPI library's (mpi4py's ``Allreduce``, ``Reduce_scatter``,
``Reduce``, ``Allgatherv``, ``Bcast``); under ``torchrun`` they are torch.distributed's
(``all_reduce``, ``reduce_scatter``, ``reduce``, ``all_gather``, ``broadcast``) on the same
process group. ``mean`` is a sum divided by the rank count, as in the lab's collectives.
Imported by the programs beside it (their folder is ``sys.path[0]`` when they run).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from reference_impl.comm.engines import engine_of


def _inner(comm: Any) -> Any:
    while hasattr(comm, "inner"):
        comm = comm.inner
    return comm


class LibraryReference:
    """Reference results for ``comm`` from the library under it (``library.engine``: "mpi" or "torch")."""

    def __init__(self, comm: Any):
        self.comm = _inner(comm)
        self.engine = engine_of(self.comm)
        self.p = self.comm.size
        if self.engine == "mpi":
            from mpi4py import MPI

            self.MPI, self.world = MPI, self.comm.comm
            self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN, "mean": MPI.SUM}
        elif self.engine == "torch":
            import torch
            import torch.distributed as dist

            self.torch, self.dist, self.group = torch, dist, self.comm.group
            R = dist.ReduceOp
            self.ops = {"sum": R.SUM, "prod": R.PRODUCT, "max": R.MAX, "min": R.MIN, "mean": R.SUM}
        else:
            raise ValueError(f"no library under {type(comm).__name__}")

    def _finish(self, op: str, y: Any) -> Any:
        return y / self.p if op == "mean" else y

    def allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        out = np.array(x)  # a copy: the library reduces it in place (torch) or into it (MPI)
        if self.engine == "mpi":
            self.world.Allreduce(x, out, op=self.ops[op])
        elif out.size:
            self.dist.all_reduce(self.torch.from_numpy(out), op=self.ops[op], group=self.group)
        return self._finish(op, out)

    def reduce_scatter(self, x: np.ndarray, counts: list[int], op: str = "sum") -> np.ndarray:
        r = self.comm.rank
        mine = np.empty(counts[r], x.dtype)
        if self.engine == "mpi":
            self.world.Reduce_scatter(x, mine, recvcounts=counts, op=self.ops[op])
        else:
            starts = np.concatenate([[0], np.cumsum(counts)])
            pieces = [self.torch.from_numpy(np.array(x[starts[i]:starts[i + 1]])) for i in range(self.p)]
            self.dist.reduce_scatter(self.torch.from_numpy(mine), pieces, op=self.ops[op], group=self.group)
        return self._finish(op, mine)

    def reduce(self, x: np.ndarray, root: int, op: str = "sum") -> np.ndarray | None:
        mine = self.comm.rank == root
        if self.engine == "mpi":
            at_root = np.empty_like(x) if mine else None
            self.world.Reduce(x, at_root, op=self.ops[op], root=root)
        else:
            at_root = np.array(x)
            if x.size:
                self.dist.reduce(self.torch.from_numpy(at_root), self.dist.get_global_rank(self.group, root),
                                 op=self.ops[op], group=self.group)
        return self._finish(op, at_root) if mine else None

    def allgatherv(self, piece: np.ndarray, sizes: list[int]) -> np.ndarray:
        if self.engine == "mpi":
            gathered = np.empty(sum(sizes), piece.dtype)
            self.world.Allgatherv(piece, [gathered, sizes])
            return gathered
        # torch's all_gather takes pieces of one size: pad every piece to the largest, then trim
        width = max(sizes)
        padded = np.zeros(width, piece.dtype)
        padded[: piece.size] = piece
        slots = [self.torch.zeros(width, dtype=self.torch.from_numpy(padded).dtype) for _ in range(self.p)]
        if width:
            self.dist.all_gather(slots, self.torch.from_numpy(padded), group=self.group)
        return np.concatenate([s.numpy()[:n] for s, n in zip(slots, sizes)])

    def broadcast(self, x: np.ndarray, root: int) -> np.ndarray:
        theirs = np.array(x)
        if self.engine == "mpi":
            self.world.Bcast(theirs, root=root)
        elif theirs.size:
            self.dist.broadcast(self.torch.from_numpy(theirs), self.dist.get_global_rank(self.group, root),
                                group=self.group)
        return theirs

    def total(self, count: int) -> int:
        """The sum of an integer over the ranks (the programs' count of checks)."""
        return int(self.allreduce(np.array([count], dtype=np.int64))[0])

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's picklable ``value`` on rank 0 (the library's object gather)."""
        if self.engine == "mpi":
            return self.world.gather(value, root=0)
        out = [None] * self.p if self.comm.rank == 0 else None
        self.dist.gather_object(value, out, dst=self.dist.get_global_rank(self.group, 0), group=self.group)
        return out
