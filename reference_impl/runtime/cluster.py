"""``ClusterSpec``: which rank of the communicator runs which task (``/job:worker/task:1``).

Rank 0 is the master (and the client that lives with it); every other rank runs one task,
which in this runtime has one device, ``CPU:0``.  ``ClusterSpec({"worker": [1, 2], "ps": [3]})``
says ranks 1 and 2 are worker tasks 0 and 1 and rank 3 is parameter-server task 0.
"""
from __future__ import annotations

from ..graph import DeviceSpec, PlacementError, canonical

MASTER_RANK = 0


class ClusterSpec:
    """Jobs → the ranks of their tasks, in task order."""

    def __init__(self, jobs: dict[str, list[int]]) -> None:
        self.jobs = {job: list(ranks) for job, ranks in jobs.items()}
        self._rank: dict[str, int] = {}
        for job, ranks in self.jobs.items():
            for task, rank in enumerate(ranks):
                if rank == MASTER_RANK:
                    raise ValueError(f"rank {MASTER_RANK} is the master; it cannot run /job:{job}/task:{task}")
                device = DeviceSpec(job, task).to_string()
                if rank in self._rank.values():
                    raise ValueError(f"rank {rank} is given two tasks; each rank runs one task")
                self._rank[device] = rank

    @staticmethod
    def workers(n: int) -> "ClusterSpec":
        """``n`` worker tasks on ranks 1..n."""
        return ClusterSpec({"worker": list(range(1, n + 1))})

    @property
    def devices(self) -> list[str]:
        return list(self._rank)

    @property
    def size(self) -> int:
        """How many ranks the cluster needs: the master plus one per task."""
        return 1 + len(self._rank)

    def rank_of(self, device: str) -> int:
        device = canonical(device)
        if device not in self._rank:
            raise PlacementError(f"device {device} is not in the cluster (tasks: {', '.join(self._rank)})")
        return self._rank[device]

    def device_of(self, rank: int) -> str:
        for device, r in self._rank.items():
            if r == rank:
                return device
        raise ValueError(f"rank {rank} runs no task of the cluster")
