"""How every op is added to a graph or run eagerly, the shape-inference helpers the op
families share, and constants (what a Python number or array becomes in either mode).

A front-end function (``matmul``, ``reduce_sum`` …) calls ``apply_op``, which either adds a
node to a graph (graph mode, when an input is a graph ``Tensor`` or no eager context is
active) or runs the kernel now (eager mode), recording it on the tape.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ... import backend
from .. import eager as _eager
from ..core import Graph, GraphError, Operation, Tensor, get_default_graph
from ..registry import NO_GRADIENT, ShapeError, broadcast_shapes, get_op_def, register

FLOATS = ("float16", "float32", "float64")
INTS = ("int32", "int64")


# ---------------------------------------------------------------- dispatch: graph or eager
def _describe(xs: Sequence[Any]) -> str:
    return ", ".join(f"{getattr(x, 'name', 'eager')} {tuple(x.shape) if x.shape is not None else '?'} {x.dtype}"
                     for x in xs)


def _infer(type: str, name: str, inputs: Sequence[Any], attrs: dict) -> tuple:
    try:
        return get_op_def(type).infer([t.shape for t in inputs], [t.dtype for t in inputs], attrs)
    except ShapeError as e:
        raise ShapeError(f"{type} op {name!r}: {e}; inputs: [{_describe(inputs)}]") from None


def _convert(x: Any, like: Any, graph: Graph | None) -> Any:
    """A Python number or NumPy array as a constant (graph) or eager tensor; ``like`` is the
    op's first tensor input, whose dtype a number takes (and, eagerly, whose namespace)."""
    like_dtype = None if like is None else like.dtype
    if isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, (bool, int, float, np.generic, list, tuple)):
        arr = np.asarray(x)
        if like_dtype is not None and arr.dtype.kind in "iuf" and not isinstance(x, (list, tuple)):
            arr = arr.astype(like_dtype)
        elif arr.dtype == np.float64 and not isinstance(x, np.generic):
            arr = arr.astype(like_dtype or "float32")
    else:
        raise GraphError(f"cannot use a {type(x).__name__} as a tensor")
    if graph is None:
        xp = np if like is None else backend.namespace_of(like.value)
        return _eager.EagerTensor(arr if backend.is_numpy(xp) else xp.asarray(arr))
    return constant(arr, graph=graph)


def apply_op(type: str, inputs: Sequence[Any], attrs: dict | None = None, name: str | None = None,
             control_inputs: Sequence[Operation] | None = None) -> Any:
    """Add op ``type`` to a graph, or run it eagerly; returns its output (or the op if none)."""
    attrs = attrs or {}
    is_graph = [isinstance(t, Tensor) for t in inputs]
    is_eager = [isinstance(t, _eager.EagerTensor) for t in inputs]
    if any(is_graph) and any(is_eager):
        raise GraphError(f"{type}: cannot mix graph tensors and eager tensors")
    eager = any(is_eager) or (not any(is_graph) and _eager.executing_eagerly())
    if eager:
        graph = None
    else:
        graph = next((t.graph for t in inputs if isinstance(t, Tensor)), None) or get_default_graph()
    like = next((t for t in inputs if isinstance(t, (Tensor, _eager.EagerTensor))), None)
    inputs = [t if isinstance(t, (Tensor, _eager.EagerTensor)) else _convert(t, like, graph) for t in inputs]
    opdef = get_op_def(type)
    if eager:
        if opdef.stateful:
            raise GraphError(f"{type} is a graph-mode op; in eager mode use Variable methods")
        _infer(type, type, inputs, attrs)
        out = _eager.EagerTensor(opdef.kernel([t.value for t in inputs], attrs, {}))
        _eager.record(type, list(inputs), out, attrs)
        return out
    op_name = graph.unique_name(name or type) if name is None or name in graph._by_name else name
    outputs = [] if opdef.num_outputs == 0 else [_infer(type, op_name, inputs, attrs)]
    op = graph.add_operation(type, list(inputs), attrs, outputs, name=op_name,
                             control_inputs=list(control_inputs or []))
    return op.outputs[0] if op.outputs else op


# ---------------------------------------------------------------- inference helpers
def _same_dtype(dtypes: list[str]) -> str:
    if len(set(dtypes)) != 1:
        raise ShapeError(f"dtypes differ ({', '.join(dtypes)})")
    return dtypes[0]


def _unary_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return shapes[0], dtypes[0]


def _float_unary_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    if dtypes[0] not in FLOATS:
        raise ShapeError(f"needs a floating-point input, got {dtypes[0]}")
    return shapes[0], dtypes[0]


def _binary_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return broadcast_shapes(shapes[0], shapes[1]), _same_dtype(dtypes)


def _compare_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return broadcast_shapes(shapes[0], shapes[1]), (_same_dtype(dtypes) and "bool")


def _axes(axis: Any, rank: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(rank))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise ShapeError(f"axis {a} is out of range for rank {rank}")
        out.append(a % rank)
    return tuple(sorted(set(out)))


def _reduce_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    s = shapes[0]
    if s is None:
        return None, dtypes[0]
    axes = _axes(attrs.get("axis"), len(s))
    if attrs.get("keepdims"):
        return tuple(1 if i in axes else d for i, d in enumerate(s)), dtypes[0]
    return tuple(d for i, d in enumerate(s) if i not in axes), dtypes[0]


def _norm_axis(axis: Any) -> Any:
    if axis is None or isinstance(axis, int):
        return axis
    return [int(a) for a in axis]


# ---------------------------------------------------------------- constants
def _const_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return tuple(attrs["value"].shape), attrs["value"].dtype.name


def _const_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    return attrs["value"]


register("Const", infer=_const_infer, kernel=_const_kernel, grad=NO_GRADIENT)


def constant(value: Any, dtype: str | None = None, name: str | None = None, graph: Graph | None = None) -> Any:
    """A constant tensor holding ``value`` (a copy, so later changes to it do not leak in)."""
    arr = np.array(value, dtype=dtype)
    if dtype is None and arr.dtype == np.float64 and not isinstance(value, np.ndarray):
        arr = arr.astype(np.float32)  # Python floats become float32, as in TensorFlow
    if graph is None and _eager.executing_eagerly():
        return _eager.EagerTensor(arr)
    g = graph or get_default_graph()
    return g.add_operation("Const", [], {"value": arr}, [(arr.shape, arr.dtype.name)],
                           name=g.unique_name(name or "Const")).outputs[0]
