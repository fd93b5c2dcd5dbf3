"""Neural-network ops: softmax, log-softmax and sparse softmax cross-entropy (array-API
kernels: ``xp`` is the inputs' namespace)."""
from __future__ import annotations

from typing import Any

from ...backend import namespace_of
from ..registry import ShapeError, like_input, register
from .array import reshape
from .dispatch import FLOATS, INTS, _axes, _float_unary_infer, apply_op
from .math import exp, reduce_sum
from .state import as_tensor


# ---------------------------------------------------------------- softmax family
def _softmax(x: Any, axis: int) -> Any:
    xp = namespace_of(x)
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: Any, axis: int) -> Any:
    xp = namespace_of(x)
    z = x - xp.max(x, axis=axis, keepdims=True)
    return z - xp.log(xp.sum(xp.exp(z), axis=axis, keepdims=True))


def _one_hot(labels: Any, like: Any) -> Any:
    """Rows of ``like``'s shape and dtype: 1 at each example's label, 0 elsewhere."""
    xp = namespace_of(labels, like)
    classes = xp.arange(like.shape[-1], dtype=labels.dtype)
    return xp.astype(xp.reshape(labels, (-1, 1)) == xp.reshape(classes, (1, -1)), like.dtype)


def _axis_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    if shapes[0] is not None:
        _axes(attrs["axis"], len(shapes[0]))
    return _float_unary_infer(shapes, dtypes, attrs)


def _softmax_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    return _softmax(inputs[0], attrs["axis"])


def _softmax_grad(op: Any, grad: Any) -> list:
    y = op.outputs[0]  # dL/dx = y * (dL/dy - sum(dL/dy * y))
    return [y * (grad - reduce_sum(grad * y, op.attrs["axis"], keepdims=True))]


def _log_softmax_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    return _log_softmax(inputs[0], attrs["axis"])


def _log_softmax_grad(op: Any, grad: Any) -> list:
    softmax_of_x = exp(op.outputs[0])  # dL/dx = dL/dy - softmax(x) * sum(dL/dy)
    return [grad - softmax_of_x * reduce_sum(grad, op.attrs["axis"], keepdims=True)]


register("Softmax", infer=_axis_infer, kernel=_softmax_kernel, grad=_softmax_grad)
register("LogSoftmax", infer=_axis_infer, kernel=_log_softmax_kernel, grad=_log_softmax_grad)


def softmax(x: Any, axis: int = -1, name: str | None = None) -> Any:
    return apply_op("Softmax", [as_tensor(x)], {"axis": int(axis)}, name=name)


def log_softmax(x: Any, axis: int = -1, name: str | None = None) -> Any:
    return apply_op("LogSoftmax", [as_tensor(x)], {"axis": int(axis)}, name=name)


def _xent_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    logits, labels = shapes
    if dtypes[0] not in FLOATS or dtypes[1] not in INTS:
        raise ShapeError(f"needs float logits and integer labels, got {dtypes[0]} and {dtypes[1]}")
    if logits is not None and len(logits) != 2:
        raise ShapeError(f"logits must be rank 2 [batch, classes], got rank {len(logits)}")
    if labels is not None and len(labels) != 1:
        raise ShapeError(f"labels must be rank 1 [batch], got rank {len(labels)}")
    if logits is not None and labels is not None and None not in (logits[0], labels[0]) and logits[0] != labels[0]:
        raise ShapeError(f"batch sizes differ: logits {logits[0]} vs labels {labels[0]}")
    return (None if logits is None else (logits[0],)), dtypes[0]


def _xent_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    logits, labels = inputs
    xp = namespace_of(logits, labels)
    picked = xp.take_along_axis(_log_softmax(logits, -1), xp.reshape(xp.astype(labels, xp.int64), (-1, 1)), axis=1)
    return -xp.reshape(picked, (-1,))  # each example's -log p(label)


def _xent_grad_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    logits, labels = inputs
    return _softmax(logits, -1) - _one_hot(labels, logits)


def _xent_grad(op: Any, grad: Any) -> list:
    """Per example, (softmax(logits) - onehot(label)) times that example's incoming gradient."""
    return [reshape(grad, [-1, 1]) * apply_op("SparseSoftmaxCrossEntropyGrad", op.inputs), None]


register("SparseSoftmaxCrossEntropyWithLogits", infer=_xent_infer, kernel=_xent_kernel, grad=_xent_grad)
register("SparseSoftmaxCrossEntropyGrad", infer=like_input(shape_of=0, dtype_of=0), kernel=_xent_grad_kernel)


def sparse_softmax_cross_entropy(labels: Any, logits: Any, name: str | None = None) -> Any:
    """Per-example loss ``-log softmax(logits)[label]`` (TF: ..._with_logits)."""
    return apply_op("SparseSoftmaxCrossEntropyWithLogits", [as_tensor(logits), as_tensor(labels)], name=name)
