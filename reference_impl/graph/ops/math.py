"""Arithmetic: elementwise binary and unary ops, matmul, reductions, and the helper ops
their gradients are built from (``sum_to`` undoes broadcasting, ``broadcast_like`` undoes a
reduction)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..registry import NO_GRADIENT, ShapeError, register
from .array import transpose
from .dispatch import (FLOATS, _axes, _binary_infer, _compare_infer, _float_unary_infer, _norm_axis,
                       _reduce_infer, _same_dtype, _unary_infer, apply_op)
from .state import as_tensor


# ---------------------------------------------------------------- gradient helper ops
def _sum_to(x: np.ndarray, shape: tuple) -> np.ndarray:
    """Undo broadcasting: sum ``x`` down to ``shape`` (leading axes, then size-1 axes)."""
    if x.shape == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, d in enumerate(shape) if d == 1 and x.shape[i + lead] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape) if axes else x.reshape(shape)


register("SumToShapeOf", lambda s, d, a: (s[1], d[0]), lambda xs, a, st: _sum_to(xs[0], xs[1].shape),
         grad=lambda op, g: [broadcast_like(g, op.inputs[0]), None])


def sum_to(g: Any, x: Any) -> Any:
    """``g`` summed down to the shape of ``x`` (skipped when the static shapes already agree)."""
    if g.shape is not None and g.shape == x.shape and None not in g.shape:
        return g
    return apply_op("SumToShapeOf", [g, x])


def _broadcast_like_kernel(xs: list, a: dict, st: dict) -> np.ndarray:
    g, x = xs
    if a["axis"] is not None or not a["keepdims"]:
        axes = _axes(a["axis"], x.ndim)
        if not a["keepdims"]:
            g = np.expand_dims(g, axes)
    out = np.broadcast_to(g, x.shape)
    if a["mean"]:
        out = out * (np.asarray(g).size / max(x.size, 1))
    return out


def _broadcast_like_grad(op: Any, g: Any) -> list:
    f = reduce_mean if op.attrs["mean"] else reduce_sum
    return [f(g, op.attrs["axis"], op.attrs["keepdims"]), None]


register("BroadcastLike", lambda s, d, a: (s[1], d[0]), _broadcast_like_kernel, grad=_broadcast_like_grad)


def broadcast_like(g: Any, x: Any, axis: Any = None, keepdims: bool = True, mean: bool = False) -> Any:
    """Inverse of a reduction: put back the reduced ``axis`` of ``x`` and broadcast ``g`` over it.

    With ``mean`` the result is divided by the number of elements each output summed.
    """
    return apply_op("BroadcastLike", [g, x], {"axis": _norm_axis(axis), "keepdims": keepdims, "mean": mean})


register("OnesLike", _unary_infer, lambda xs, a, s: np.ones_like(xs[0]), grad=NO_GRADIENT)


def ones_like(x: Any) -> Any:
    return apply_op("OnesLike", [as_tensor(x)])


register("Cast", lambda s, d, a: (s[0], a["dtype"]), lambda xs, a, s: xs[0].astype(a["dtype"]),
         grad=lambda op, g: [cast(g, op.inputs[0].dtype) if op.inputs[0].dtype in FLOATS else None])
register("GreaterEqual", _compare_infer, lambda xs, a, s: xs[0] >= xs[1], grad=NO_GRADIENT)
register("Equal", _compare_infer, lambda xs, a, s: xs[0] == xs[1], grad=NO_GRADIENT)


def cast(x: Any, dtype: str) -> Any:
    return apply_op("Cast", [as_tensor(x)], {"dtype": np.dtype(dtype).name})


def greater_equal(x: Any, y: Any) -> Any:
    return apply_op("GreaterEqual", [as_tensor(x), as_tensor(y)])


def equal(x: Any, y: Any) -> Any:
    return apply_op("Equal", [as_tensor(x), as_tensor(y)])


# ---------------------------------------------------------------- elementwise binary ops
def _bin(type: str, kernel: Any, grad: Any) -> None:
    register(type, _binary_infer, lambda xs, a, s: kernel(xs[0], xs[1]), grad=grad)


_bin("Add", np.add, lambda op, g: [sum_to(g, op.inputs[0]), sum_to(g, op.inputs[1])])
_bin("Sub", np.subtract, lambda op, g: [sum_to(g, op.inputs[0]), sum_to(neg(g), op.inputs[1])])
_bin("Mul", np.multiply, lambda op, g: [sum_to(g * op.inputs[1], op.inputs[0]),
                                        sum_to(g * op.inputs[0], op.inputs[1])])
_bin("RealDiv", np.divide, lambda op, g: [
    sum_to(g / op.inputs[1], op.inputs[0]),
    sum_to(neg(g) * op.inputs[0] / square(op.inputs[1]), op.inputs[1])])
_bin("Pow", np.power, lambda op, g: [
    sum_to(g * op.inputs[1] * pow(op.inputs[0], op.inputs[1] - 1), op.inputs[0]),
    sum_to(g * op.outputs[0] * log(op.inputs[0]), op.inputs[1])])


def _maximum_grad(op: Any, g: Any) -> list:
    x, y = op.inputs
    mask = cast(greater_equal(x, y), g.dtype)  # ties send the gradient to x, as TensorFlow does
    return [sum_to(g * mask, x), sum_to(g * (1 - mask), y)]


_bin("Maximum", np.maximum, _maximum_grad)


def add(x: Any, y: Any, name: str | None = None) -> Any:
    return apply_op("Add", [as_tensor(x), as_tensor(y)], name=name)


def sub(x: Any, y: Any, name: str | None = None) -> Any:
    return apply_op("Sub", [as_tensor(x), as_tensor(y)], name=name)


def mul(x: Any, y: Any, name: str | None = None) -> Any:
    return apply_op("Mul", [as_tensor(x), as_tensor(y)], name=name)


def div(x: Any, y: Any, name: str | None = None) -> Any:
    return apply_op("RealDiv", [as_tensor(x), as_tensor(y)], name=name)


def pow(x: Any, y: Any, name: str | None = None) -> Any:
    return apply_op("Pow", [as_tensor(x), as_tensor(y)], name=name)


def maximum(x: Any, y: Any, name: str | None = None) -> Any:
    return apply_op("Maximum", [as_tensor(x), as_tensor(y)], name=name)


# ---------------------------------------------------------------- elementwise unary ops
def _relu_grad_kernel(xs: list, a: dict, s: dict) -> np.ndarray:
    return xs[0] * (xs[1] > 0)


register("ReluGrad", lambda s, d, a: (s[0], _same_dtype(d)), _relu_grad_kernel,
         grad=lambda op, g: [relu_grad(g, op.inputs[1]), None])


def relu_grad(g: Any, x: Any) -> Any:
    """``g`` where ``x > 0``, else 0: the gradient of relu, as one op."""
    return apply_op("ReluGrad", [g, x])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1)  # no overflow for large |x|


_UNARY = {
    "Neg": (_unary_infer, np.negative, lambda op, g: [neg(g)]),
    "Exp": (_float_unary_infer, np.exp, lambda op, g: [g * op.outputs[0]]),
    "Log": (_float_unary_infer, np.log, lambda op, g: [g / op.inputs[0]]),
    "Tanh": (_float_unary_infer, np.tanh, lambda op, g: [g * (1 - square(op.outputs[0]))]),
    "Sigmoid": (_float_unary_infer, _sigmoid, lambda op, g: [g * op.outputs[0] * (1 - op.outputs[0])]),
    "Relu": (_unary_infer, lambda x: np.maximum(x, 0), lambda op, g: [relu_grad(g, op.inputs[0])]),
    "Square": (_unary_infer, np.square, lambda op, g: [g * (2 * op.inputs[0])]),
    "Sqrt": (_float_unary_infer, np.sqrt, lambda op, g: [g * 0.5 / op.outputs[0]]),
}


def _unary_kernel(fn: Any) -> Any:
    return lambda xs, a, s: fn(xs[0])


for _t, (_inf, _k, _g) in _UNARY.items():
    register(_t, _inf, _unary_kernel(_k), grad=_g)


def neg(x: Any, name: str | None = None) -> Any: return apply_op("Neg", [as_tensor(x)], name=name)
def exp(x: Any, name: str | None = None) -> Any: return apply_op("Exp", [as_tensor(x)], name=name)
def log(x: Any, name: str | None = None) -> Any: return apply_op("Log", [as_tensor(x)], name=name)
def tanh(x: Any, name: str | None = None) -> Any: return apply_op("Tanh", [as_tensor(x)], name=name)
def sigmoid(x: Any, name: str | None = None) -> Any: return apply_op("Sigmoid", [as_tensor(x)], name=name)
def relu(x: Any, name: str | None = None) -> Any: return apply_op("Relu", [as_tensor(x)], name=name)
def square(x: Any, name: str | None = None) -> Any: return apply_op("Square", [as_tensor(x)], name=name)
def sqrt(x: Any, name: str | None = None) -> Any: return apply_op("Sqrt", [as_tensor(x)], name=name)


# ---------------------------------------------------------------- matmul
def _matmul_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    a, b = shapes
    dt = _same_dtype(dtypes)
    if a is None or b is None:
        return None, dt
    if len(a) != 2 or len(b) != 2:
        raise ShapeError(f"needs two matrices (rank 2), got ranks {len(a)} and {len(b)}")
    if a[1] is not None and b[0] is not None and a[1] != b[0]:
        raise ShapeError(f"inner dimensions differ: {a[1]} vs {b[0]}")
    return (a[0], b[1]), dt


register("MatMul", _matmul_infer, lambda xs, a, s: xs[0] @ xs[1], grad=lambda op, g: [
    matmul(g, transpose(op.inputs[1])), matmul(transpose(op.inputs[0]), g)])


def matmul(a: Any, b: Any, name: str | None = None) -> Any:
    """Matrix product of two rank-2 tensors."""
    return apply_op("MatMul", [as_tensor(a), as_tensor(b)], name=name)


# ---------------------------------------------------------------- reductions
register("Sum", _reduce_infer, lambda xs, a, s: np.sum(xs[0], axis=_axes(a["axis"], xs[0].ndim),
                                                       keepdims=a["keepdims"]),
         grad=lambda op, g: [broadcast_like(g, op.inputs[0], op.attrs["axis"], op.attrs["keepdims"])])
register("Mean", _reduce_infer, lambda xs, a, s: np.mean(xs[0], axis=_axes(a["axis"], xs[0].ndim),
                                                         keepdims=a["keepdims"]),
         grad=lambda op, g: [broadcast_like(g, op.inputs[0], op.attrs["axis"], op.attrs["keepdims"], mean=True)])


def _max_grad(op: Any, g: Any) -> list:
    x, ax, kd = op.inputs[0], op.attrs["axis"], op.attrs["keepdims"]
    mask = cast(equal(x, broadcast_like(op.outputs[0], x, ax, kd)), g.dtype)
    count = broadcast_like(reduce_sum(mask, ax, True), x, ax, True)
    return [broadcast_like(g, x, ax, kd) * mask / count]  # ties share the gradient equally


register("Max", _reduce_infer, lambda xs, a, s: np.max(xs[0], axis=_axes(a["axis"], xs[0].ndim),
                                                       keepdims=a["keepdims"]), grad=_max_grad)


def reduce_sum(x: Any, axis: Any = None, keepdims: bool = False, name: str | None = None) -> Any:
    return apply_op("Sum", [as_tensor(x)], {"axis": _norm_axis(axis), "keepdims": bool(keepdims)}, name=name)


def reduce_mean(x: Any, axis: Any = None, keepdims: bool = False, name: str | None = None) -> Any:
    return apply_op("Mean", [as_tensor(x)], {"axis": _norm_axis(axis), "keepdims": bool(keepdims)}, name=name)


def reduce_max(x: Any, axis: Any = None, keepdims: bool = False, name: str | None = None) -> Any:
    return apply_op("Max", [as_tensor(x)], {"axis": _norm_axis(axis), "keepdims": bool(keepdims)}, name=name)
