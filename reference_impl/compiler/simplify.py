"""Algebraic simplification: rewrite ops whose result is already known to be one of their inputs.

NumPy-only: the compiler's targets are NumPy source and C compiled for host memory.

The rules, each valid only when the result has the same static shape and dtype as the
input it is replaced by (``x * ones(...)`` that *broadcasts* x to a larger shape is kept):

* ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``, ``x / 1``, ``x ** 1``  →  ``x``
* ``-(-x)``  →  ``x``;  ``identity(x)``  →  ``x`` (identity chains disappear)
* ``transpose(transpose(x, p), q)``  →  one transpose with the composed permutation, or
  ``x`` itself when the two cancel.

Such ops are common after freezing and autodiff (a scale that was a variable set to 1, an
identity inserted for naming). An op named in ``keep`` is never removed: if it simplifies
away it becomes an ``Identity`` of its replacement, so fetches stay valid.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from reference_impl.graph import Graph, Operation, Tensor
from reference_impl.graph.rewrite import copy_op


def _is_const(t: Tensor, value: float) -> bool:
    return t.op.type == "Const" and bool(np.all(t.op.attrs["value"] == value))


def _same_type(a: Tensor, b: Tensor) -> bool:
    return a.shape is not None and a.shape == b.shape and a.dtype == b.dtype


def _full_perm(perm: list | None, rank: int) -> list[int]:
    return list(range(rank))[::-1] if perm is None else list(perm)


def _replacement(op: Operation, ins: list[Tensor]) -> Tensor | tuple[Tensor, list[int]] | None:
    """The tensor ``op`` reduces to, a (tensor, perm) for a merged transpose, or None."""
    out = op.outputs[0] if op.outputs else None
    t = op.type
    candidates: list[Tensor] = []
    if t == "Identity":
        candidates = [ins[0]]
    elif t == "Mul":
        candidates = [ins[0]] if _is_const(ins[1], 1) else [ins[1]] if _is_const(ins[0], 1) else []
    elif t == "Add":
        candidates = [ins[0]] if _is_const(ins[1], 0) else [ins[1]] if _is_const(ins[0], 0) else []
    elif t in ("Sub", "RealDiv", "Pow"):
        candidates = [ins[0]] if _is_const(ins[1], 0 if t == "Sub" else 1) else []
    elif t == "Neg" and ins[0].op.type == "Neg":
        candidates = [ins[0].op.inputs[0]]
    elif t == "Transpose" and ins[0].op.type == "Transpose" and out is not None and out.shape is not None:
        inner = ins[0].op
        x = inner.inputs[0]
        rank = len(out.shape)
        p, q = _full_perm(inner.attrs["perm"], rank), _full_perm(op.attrs["perm"], rank)
        composed = [p[i] for i in q]
        if composed == list(range(rank)):
            candidates = [x]
        else:
            return x, composed
    for c in candidates:
        if out is not None and _same_type(c, out):
            return c
    return None


def algebraic_simplification(graph: Graph, keep: Iterable[str] = ()) -> Graph:
    """A copy with the rules above applied (in one forward sweep, so chains collapse fully).

    Inputs of removed ops that nothing else reads stay in the graph until dead-code removal.
    """
    keep = set(keep)
    new, tmap, omap = Graph(), {}, {}
    for op in graph.operations:
        if op.control_inputs or not op.outputs:
            copy_op(new, op, tmap, omap)
            continue
        ins = [tmap[t] for t in op.inputs]
        rep = _replacement(op, ins)
        if rep is None:
            copy_op(new, op, tmap, omap)
        elif isinstance(rep, tuple):  # two transposes merged into one
            copy_op(new, op, tmap, omap, inputs=[rep[0]], attrs={"perm": rep[1]})
        elif op.name in keep:
            copy_op(new, op, tmap, omap, type="Identity", inputs=[rep], attrs={})
        else:
            tmap[op.outputs[0]] = rep
    return new
