"""Tensor fusion: which gradients travel together in one allreduce.

A ring allreduce of ``m`` bytes on ``p`` ranks costs ``2(p-1) alpha + 2(p-1)/p m beta``.
The latency part does not depend on ``m``, so reducing 1000 tensors of 4 KiB one by one
pays it 1000 times; packing them into a few large *buckets* pays it a few times. Buckets
are filled in the order backward produces gradients (last layer first), so the first
bucket is complete, and can be sent, while backward is still working on earlier layers.
Horovod calls this the fusion buffer, PyTorch DDP ``bucket_cap_mb``.

The same plan is used by the data-parallel trainer (``reference_impl.train.data_parallel``)
and by the cluster simulator (``cluster_sim``), so a simulated step ships exactly the
buckets a measured one does.
"""
from __future__ import annotations

import numbers


# --8<-- [start:plan_buckets]
def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Group tensors, in the order backward produces them, into buckets of about ``bucket_bytes``.

    ``sizes`` are the tensors' sizes in bytes, in production order (last layer first). Each
    tensor joins the open bucket; the bucket closes as soon as it holds ``bucket_bytes`` or
    more. So every bucket but the last holds at least ``bucket_bytes``, a tensor of
    ``bucket_bytes`` or more closes its bucket at once (it may share it with smaller tensors
    that came before it), and ``bucket_bytes = 0`` gives one bucket per tensor. Returns the
    buckets as lists of positions into ``sizes``.
    """
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, numbers.Integral) or bucket_bytes < 0:
        raise ValueError(f"plan_buckets: bucket_bytes must be an integer >= 0, got {bucket_bytes!r}")
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0]
    if bad:
        raise ValueError(f"plan_buckets: tensor sizes must be integers >= 0 (bytes), got {bad[0]!r}")
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for position, nbytes in enumerate(sizes):
        current.append(position)
        filled += nbytes
        if filled >= bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets
# --8<-- [end:plan_buckets]
