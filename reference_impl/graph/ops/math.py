"""Arithmetic: elementwise binary and unary ops, matmul, reductions, and the helper ops
their gradients are built from (``sum_to`` undoes broadcasting, ``broadcast_like`` undoes a
reduction).

Each op is a kernel, a shape function and a gradient function, registered once. The kernels
are array-API code: each asks its inputs for their namespace ``xp`` and calls only standard
functions on it, so the same graph runs on NumPy, a GPU or PyTorch tensors (``Session(device=)``). A
gradient function has the shape of TensorFlow's ``@RegisterGradient`` ones: it gets the
forward op (its ``inputs``, ``outputs`` and ``attrs``) and the gradient of the op's output,
and returns one gradient per input, built from the same front-end ops.
"""
from __future__ import annotations

from typing import Any

import math
from typing import Callable

import numpy as np  # only to name dtypes (np.dtype("float32").name); the kernels use xp

from ... import backend
from ...backend import namespace_of
from ..registry import NO_GRADIENT, ShapeError, array_kernel, like_input, register
from .array import transpose
from .dispatch import (FLOATS, _axes, _binary_infer, _compare_infer, _float_unary_infer, _norm_axis,
                       _reduce_infer, _same_dtype, _unary_infer, apply_op)
from .state import as_tensor


# ---------------------------------------------------------------- gradient helper ops
def _sum_to(x: Any, shape: tuple) -> Any:
    """Undo broadcasting: sum ``x`` down to ``shape`` (leading axes, then size-1 axes)."""
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    xp = namespace_of(x)
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, d in enumerate(shape) if d == 1 and x.shape[i + lead] != 1)
    return xp.reshape(xp.sum(x, axis=axes, keepdims=True) if axes else x, shape)


def _sum_to_shape_of_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    grad, like = inputs
    return _sum_to(grad, like.shape)


def _sum_to_shape_of_grad(op: Any, grad: Any) -> list:
    return [broadcast_like(grad, op.inputs[0]), None]


register("SumToShapeOf", infer=like_input(shape_of=1, dtype_of=0), kernel=_sum_to_shape_of_kernel,
         grad=_sum_to_shape_of_grad)


def sum_to(g: Any, x: Any) -> Any:
    """``g`` summed down to the shape of ``x`` (skipped when the static shapes already agree)."""
    if g.shape is not None and g.shape == x.shape and None not in g.shape:
        return g
    return apply_op("SumToShapeOf", [g, x])


def _broadcast_like_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    g, x = inputs
    xp = namespace_of(g, x)
    if not attrs["keepdims"]:  # put the reduced axes back, as size-1 axes
        axes = _axes(attrs["axis"], x.ndim)
        g = xp.reshape(g, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    out = xp.broadcast_to(g, tuple(x.shape))
    if attrs["mean"]:
        out = out * (math.prod(g.shape) / max(math.prod(x.shape), 1))
    return out


def _broadcast_like_grad(op: Any, grad: Any) -> list:
    reduce = reduce_mean if op.attrs["mean"] else reduce_sum
    return [reduce(grad, op.attrs["axis"], op.attrs["keepdims"]), None]


register("BroadcastLike", infer=like_input(shape_of=1, dtype_of=0), kernel=_broadcast_like_kernel,
         grad=_broadcast_like_grad)


def broadcast_like(g: Any, x: Any, axis: Any = None, keepdims: bool = True, mean: bool = False) -> Any:
    """Inverse of a reduction: put back the reduced ``axis`` of ``x`` and broadcast ``g`` over it.

    With ``mean`` the result is divided by the number of elements each output summed.
    """
    return apply_op("BroadcastLike", [g, x], {"axis": _norm_axis(axis), "keepdims": keepdims, "mean": mean})


register("OnesLike", infer=_unary_infer, kernel=array_kernel("ones_like"), grad=NO_GRADIENT)


def ones_like(x: Any) -> Any:
    return apply_op("OnesLike", [as_tensor(x)])


# ---------------------------------------------------------------- casts and comparisons
def _cast_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return shapes[0], attrs["dtype"]


def _cast_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    xp = namespace_of(inputs[0])
    return xp.astype(inputs[0], backend.dtype(xp, attrs["dtype"]))


def _cast_grad(op: Any, grad: Any) -> list:
    x = op.inputs[0]
    return [cast(grad, x.dtype) if x.dtype in FLOATS else None]  # back to the input's precision


register("Cast", infer=_cast_infer, kernel=_cast_kernel, grad=_cast_grad)
register("GreaterEqual", infer=_compare_infer, kernel=array_kernel("greater_equal"), grad=NO_GRADIENT)
register("Equal", infer=_compare_infer, kernel=array_kernel("equal"), grad=NO_GRADIENT)
register("Sign", infer=_unary_infer, kernel=array_kernel("sign"), grad=NO_GRADIENT)


def cast(x: Any, dtype: str) -> Any:
    return apply_op("Cast", [as_tensor(x)], {"dtype": np.dtype(dtype).name})


def greater_equal(x: Any, y: Any) -> Any:
    return apply_op("GreaterEqual", [as_tensor(x), as_tensor(y)])


def equal(x: Any, y: Any) -> Any:
    return apply_op("Equal", [as_tensor(x), as_tensor(y)])


def sign(x: Any, name: str | None = None) -> Any:
    """-1, 0 or 1 by the sign of each element (FTRL's soft threshold uses it); no gradient."""
    return apply_op("Sign", [as_tensor(x)], name=name)


def _all_finite_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    for d in dtypes:
        if d not in FLOATS:
            raise ShapeError(f"needs floating-point inputs, got {d}")
    return (), "bool"


def _all_finite_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    xp = namespace_of(*inputs)
    return xp.asarray(all(bool(xp.all(xp.isfinite(x))) for x in inputs))


# [x1, x2, ...] -> True if every element of every input is finite (dynamic loss scaling's check)
register("AllFinite", infer=_all_finite_infer, kernel=_all_finite_kernel)


def all_finite(tensors: list) -> Any:
    """A boolean scalar: are all elements of ``tensors`` finite (no inf, no NaN)?"""
    return apply_op("AllFinite", [as_tensor(t) for t in tensors])


# ---------------------------------------------------------------- elementwise binary ops
def _add_grad(op: Any, grad: Any) -> list:
    a, b = op.inputs
    return [sum_to(grad, a), sum_to(grad, b)]


def _sub_grad(op: Any, grad: Any) -> list:
    a, b = op.inputs
    return [sum_to(grad, a), sum_to(neg(grad), b)]


def _mul_grad(op: Any, grad: Any) -> list:
    a, b = op.inputs
    return [sum_to(grad * b, a), sum_to(grad * a, b)]


def _real_div_grad(op: Any, grad: Any) -> list:
    a, b = op.inputs
    return [sum_to(grad / b, a), sum_to(neg(grad) * a / square(b), b)]


def _pow_grad(op: Any, grad: Any) -> list:
    a, b = op.inputs
    return [sum_to(grad * b * pow(a, b - 1), a), sum_to(grad * op.outputs[0] * log(a), b)]


def _maximum_grad(op: Any, grad: Any) -> list:
    x, y = op.inputs
    mask = cast(greater_equal(x, y), grad.dtype)  # ties send the gradient to x, as TensorFlow does
    return [sum_to(grad * mask, x), sum_to(grad * (1 - mask), y)]


register("Add", infer=_binary_infer, kernel=array_kernel("add"), grad=_add_grad)
register("Sub", infer=_binary_infer, kernel=array_kernel("subtract"), grad=_sub_grad)
register("Mul", infer=_binary_infer, kernel=array_kernel("multiply"), grad=_mul_grad)
register("RealDiv", infer=_binary_infer, kernel=array_kernel("divide"), grad=_real_div_grad)
register("Pow", infer=_binary_infer, kernel=array_kernel("pow"), grad=_pow_grad)
register("Maximum", infer=_binary_infer, kernel=array_kernel("maximum"), grad=_maximum_grad)


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
def _relu_grad_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return shapes[0], _same_dtype(dtypes)


def _relu_grad_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    grad, x = inputs
    return grad * namespace_of(grad, x).astype(x > 0, grad.dtype)


def _relu_grad_grad(op: Any, grad: Any) -> list:
    return [relu_grad(grad, op.inputs[1]), None]


register("ReluGrad", infer=_relu_grad_infer, kernel=_relu_grad_kernel, grad=_relu_grad_grad)


def relu_grad(g: Any, x: Any) -> Any:
    """``g`` where ``x > 0``, else 0: the gradient of relu, as one op."""
    return apply_op("ReluGrad", [g, x])


def _sigmoid(inputs: list, attrs: dict, state: dict) -> Any:
    x = inputs[0]
    return 0.5 * (namespace_of(x).tanh(0.5 * x) + 1)  # no overflow for large |x|


def _relu(inputs: list, attrs: dict, state: dict) -> Any:
    x = inputs[0]
    xp = namespace_of(x)
    return xp.maximum(x, xp.zeros_like(x))


def _neg_grad(op: Any, grad: Any) -> list:
    return [neg(grad)]


def _exp_grad(op: Any, grad: Any) -> list:
    return [grad * op.outputs[0]]                      # d e^x = e^x


def _log_grad(op: Any, grad: Any) -> list:
    return [grad / op.inputs[0]]                       # d log x = 1 / x


def _tanh_grad(op: Any, grad: Any) -> list:
    return [grad * (1 - square(op.outputs[0]))]        # d tanh x = 1 - tanh² x


def _sigmoid_grad(op: Any, grad: Any) -> list:
    y = op.outputs[0]
    return [grad * y * (1 - y)]                        # d σ(x) = σ(x) (1 - σ(x))


def _relu_grad_fn(op: Any, grad: Any) -> list:
    return [relu_grad(grad, op.inputs[0])]


def _square_grad(op: Any, grad: Any) -> list:
    return [grad * (2 * op.inputs[0])]


def _sqrt_grad(op: Any, grad: Any) -> list:
    return [grad * 0.5 / op.outputs[0]]                # d √x = 1 / (2 √x)


register("Neg", infer=_unary_infer, kernel=array_kernel("negative"), grad=_neg_grad)
register("Exp", infer=_float_unary_infer, kernel=array_kernel("exp"), grad=_exp_grad)
register("Log", infer=_float_unary_infer, kernel=array_kernel("log"), grad=_log_grad)
register("Tanh", infer=_float_unary_infer, kernel=array_kernel("tanh"), grad=_tanh_grad)
register("Sigmoid", infer=_float_unary_infer, kernel=_sigmoid, grad=_sigmoid_grad)
register("Relu", infer=_unary_infer, kernel=_relu, grad=_relu_grad_fn)
register("Square", infer=_unary_infer, kernel=array_kernel("square"), grad=_square_grad)
register("Sqrt", infer=_float_unary_infer, kernel=array_kernel("sqrt"), grad=_sqrt_grad)


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


# --8<-- [start:matmul]
def _matmul_grad(op: Any, grad: Any) -> list:
    a, b = op.inputs                                   # y = a @ b
    return [matmul(grad, transpose(b)),                # dL/da = dL/dy @ bᵀ
            matmul(transpose(a), grad)]                # dL/db = aᵀ @ dL/dy


register("MatMul", infer=_matmul_infer, kernel=array_kernel("matmul"), grad=_matmul_grad)
# --8<-- [end:matmul]


def matmul(a: Any, b: Any, name: str | None = None) -> Any:
    """Matrix product of two rank-2 tensors."""
    return apply_op("MatMul", [as_tensor(a), as_tensor(b)], name=name)


# ---------------------------------------------------------------- reductions
def _reduction_kernel(name: str) -> Callable:
    """The kernel of the standard reduction ``name`` (sum, mean, max) over ``attrs["axis"]``."""
    def kernel(inputs: list, attrs: dict, state: dict) -> Any:
        x = inputs[0]
        return getattr(namespace_of(x), name)(x, axis=_axes(attrs["axis"], x.ndim), keepdims=attrs["keepdims"])
    kernel.__name__ = kernel.__qualname__ = f"reduction_kernel({name})"
    return kernel


def _sum_grad(op: Any, grad: Any) -> list:
    return [broadcast_like(grad, op.inputs[0], op.attrs["axis"], op.attrs["keepdims"])]


def _mean_grad(op: Any, grad: Any) -> list:
    return [broadcast_like(grad, op.inputs[0], op.attrs["axis"], op.attrs["keepdims"], mean=True)]


def _max_grad(op: Any, grad: Any) -> list:
    x, axis, keepdims = op.inputs[0], op.attrs["axis"], op.attrs["keepdims"]
    mask = cast(equal(x, broadcast_like(op.outputs[0], x, axis, keepdims)), grad.dtype)
    count = broadcast_like(reduce_sum(mask, axis, True), x, axis, True)
    return [broadcast_like(grad, x, axis, keepdims) * mask / count]  # ties share the gradient equally


register("Sum", infer=_reduce_infer, kernel=_reduction_kernel("sum"), grad=_sum_grad)
register("Mean", infer=_reduce_infer, kernel=_reduction_kernel("mean"), grad=_mean_grad)
register("Max", infer=_reduce_infer, kernel=_reduction_kernel("max"), grad=_max_grad)


def reduce_sum(x: Any, axis: Any = None, keepdims: bool = False, name: str | None = None) -> Any:
    return apply_op("Sum", [as_tensor(x)], {"axis": _norm_axis(axis), "keepdims": bool(keepdims)}, name=name)


def reduce_mean(x: Any, axis: Any = None, keepdims: bool = False, name: str | None = None) -> Any:
    return apply_op("Mean", [as_tensor(x)], {"axis": _norm_axis(axis), "keepdims": bool(keepdims)}, name=name)


def reduce_max(x: Any, axis: Any = None, keepdims: bool = False, name: str | None = None) -> Any:
    return apply_op("Max", [as_tensor(x)], {"axis": _norm_axis(axis), "keepdims": bool(keepdims)}, name=name)
