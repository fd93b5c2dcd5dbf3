"""``bias_add_relu``: ``max(x + b, 0)`` in one pass, with its gradient as a second C kernel.

The NumPy composition ``np.maximum(x + b, 0)`` walks the data twice and allocates a
temporary for ``x + b``; the fused kernel reads ``x`` once and writes ``y`` once.  The
gradient uses the forward output: ``dx = g * (y > 0)`` (kernel ``BiasAddReluGrad``) and
``db = dx.sum(axis=0)`` (the built-in ``reduce_sum``).
"""
from __future__ import annotations

from typing import Any

import reference_impl.graph as graph
from reference_impl.graph import ShapeError

from .op import CustomOp, Input


FLAGS = ("-O3",)  # GCC vectorises these inner loops at -O3, not at -O2

def _shape(shapes: list, attrs: dict) -> tuple | None:
    x, b = shapes
    if x is not None and b is not None and None not in (x[1], b[0]) and x[1] != b[0]:
        raise ShapeError(f"x has {x[1]} columns but bias has {b[0]} entries")
    return x


def _grad_shape(shapes: list, attrs: dict) -> tuple | None:
    g, y = shapes
    if g is not None and y is not None and len(g) == len(y) and any(
            a is not None and b is not None and a != b for a, b in zip(g, y)):
        raise ShapeError(f"gradient shape {g} differs from output shape {y}")
    return g if g is not None else y


BiasAddReluGrad = CustomOp(
    "BiasAddReluGrad",
    [Input("grad", "T", ndim=2, layout="strided"), Input("y", "T", ndim=2, layout="strided")],
    _grad_shape, symbol="bias_add_relu_grad", source_file="bias_add_relu.c", flags=FLAGS).register()


def _grad(op: Any, g: Any) -> list:
    dx = BiasAddReluGrad(g, op.outputs[0])
    return [dx, graph.reduce_sum(dx, axis=0)]


BiasAddRelu = CustomOp(
    "BiasAddRelu",
    [Input("x", "T", ndim=2, layout="strided"), Input("bias", "T", ndim=1)],
    _shape, symbol="bias_add_relu", source_file="bias_add_relu.c", grad=_grad, flags=FLAGS).register()


def bias_add_relu(x: Any, bias: Any, name: str | None = None) -> Any:
    """``max(x + bias, 0)`` for ``x`` of shape ``[n, d]`` and ``bias`` of shape ``[d]``."""
    return BiasAddRelu(x, bias, name=name)
