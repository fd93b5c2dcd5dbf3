"""``sparse_segment_sum``: sum rows of ``data`` per segment id, as one C kernel.

The kernel behind "sum duplicate embedding gradients before a push": a batch looks up the
same embedding row several times, so its gradient has one row per lookup; summing the rows
that share an id leaves one row per unique id to send to the parameter server.  The NumPy
composition is ``out = zeros((num_segments, d)); np.add.at(out, segment_ids, data)``.

The gradient is a gather: every input row receives the output gradient of its segment.
"""
from __future__ import annotations

from typing import Any

import reference_impl.graph as graph
from reference_impl.graph import ShapeError

from .op import Attr, CustomOp, Input


FLAGS = ("-O3",)  # GCC vectorises these inner loops at -O3, not at -O2

# --8<-- [start:segment_sum]
def _shape(shapes: list, attrs: dict) -> tuple | None:
    data, ids = shapes
    if attrs["num_segments"] < 0:
        raise ShapeError(f"num_segments must be >= 0, got {attrs['num_segments']}")
    if data is not None and ids is not None and None not in (data[0], ids[0]) and data[0] != ids[0]:
        raise ShapeError(f"data has {data[0]} rows but segment_ids has {ids[0]} entries")
    return None if data is None else (attrs["num_segments"], data[1])


def _grad(op: Any, g: Any) -> list:
    return [graph.gather(g, op.inputs[1]), None]


SparseSegmentSum = CustomOp(
    "SparseSegmentSum",
    [Input("data", "T", ndim=2, layout="strided"), Input("segment_ids", "int64", ndim=1)],
    _shape, attrs=[Attr("num_segments", "int")], symbol="sparse_segment_sum",
    source_file="sparse_segment_sum.c", grad=_grad, flags=FLAGS).register()


def sparse_segment_sum(data: Any, segment_ids: Any, num_segments: int, name: str | None = None) -> Any:
    """``out[s] = sum(data[i] for i where segment_ids[i] == s)``, shape ``[num_segments, d]``."""
    return SparseSegmentSum(data, segment_ids, num_segments=num_segments, name=name)
# --8<-- [end:segment_sum]
