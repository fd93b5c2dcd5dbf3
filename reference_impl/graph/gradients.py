"""Symbolic reverse-mode differentiation: ``gradients(ys, xs)`` adds gradient nodes to the graph.

The algorithm, in the order the code does it:

1. keep only the ops that lie on a path from some ``x`` to some ``y`` (others get no gradient);
2. visit those ops in reverse topological order (the graph's creation order, reversed), so an
   op is visited only after every op that consumes its output;
3. at each op, sum the gradient contributions its output received from all its consumers
   (one tensor used twice, as with shared weights, gets the sum of both uses), then call the
   op's registered gradient function to get one contribution per input.

Broadcasting is undone inside the gradient functions (``sum_to``).  The result is a list of
graph tensors; ``Session.run`` evaluates them like any other tensor.
"""
from __future__ import annotations

from typing import Any, Sequence

from .core import GraphError, Operation, Tensor
from .ops import FLOATS, add, as_tensor, ones_like
from .registry import get_op_def


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


# --8<-- [start:gradients]
def gradients(ys: Any, xs: Any, grad_ys: Any = None) -> list[Tensor | None]:
    """d(sum of ys)/d x for each x, as new graph tensors (``None`` where no path connects them).

    ``grad_ys`` are the gradients flowing into each y (ones by default).
    """
    ys = [as_tensor(y) for y in _as_list(ys)]
    xs = [as_tensor(x) for x in _as_list(xs)]
    for t in ys + xs:
        if not isinstance(t, Tensor):
            raise GraphError(f"gradients: expected graph tensors, got {type(t).__name__}")
    graph = ys[0].graph
    if any(t.graph is not graph for t in ys + xs):
        raise GraphError("gradients: ys and xs must all belong to the same graph")
    if grad_ys is None:
        grad_ys = [None] * len(ys)
    grad_ys = _as_list(grad_ys)
    if len(grad_ys) != len(ys):
        raise GraphError(f"gradients: {len(grad_ys)} grad_ys for {len(ys)} ys")

    # 1. ops reachable forward from xs and backward from ys
    consumers: dict[Operation, list[Operation]] = {}
    for op in graph.operations:
        for t in op.inputs:
            consumers.setdefault(t.op, []).append(op)
    forward: set[Operation] = set()
    stack = [x.op for x in xs]
    while stack:
        op = stack.pop()
        if op not in forward:
            forward.add(op)
            stack.extend(consumers.get(op, []))
    between: set[Operation] = set()
    stack = [y.op for y in ys]
    while stack:
        op = stack.pop()
        if op in forward and op not in between:
            between.add(op)
            stack.extend(t.op for t in op.inputs)

    # 2-3. reverse topological walk, summing contributions per tensor
    contributions: dict[Tensor, list[Tensor]] = {}
    with graph.as_default():
        for y, gy in zip(ys, grad_ys):
            contributions.setdefault(y, []).append(ones_like(y) if gy is None else as_tensor(gy))
        x_set = set(xs)
        for op in reversed(graph.operations):
            if op not in between or not op.outputs:
                continue
            out = op.outputs[0]
            if out not in contributions or (op.inputs == [] and out in x_set):
                continue
            if not any(t.op in between for t in op.inputs):
                continue  # a source op (an x itself): nothing further back
            fn = get_op_def(op.type).grad
            if fn is None:
                raise GraphError(f"gradients: op {op.name!r} of type {op.type!r} has no gradient "
                                 "function, and it lies on a path from xs to ys")
            g = _sum(contributions[out])
            for t, gi in zip(op.inputs, fn(op, g)):
                if gi is not None and t.op in between and t.dtype in FLOATS:
                    contributions.setdefault(t, []).append(gi)
        return [_sum(contributions[x]) if x in contributions else None for x in xs]
# --8<-- [end:gradients]


def _sum(terms: Sequence[Tensor]) -> Tensor:
    total = terms[0]
    for t in terms[1:]:
        total = add(total, t)
    return total
