"""Shape manipulation: reshape, transpose, concat and gather (the embedding lookup), and the
two row operations sparse updates are made of (``segment_sum``, ``scatter_rows``).

The kernels are array-API code (``xp`` is the inputs' namespace). The standard has no
scatter-add (NumPy's ``np.add.at``) and no assignment through an index array, so the row
operations are built from sorting, ``searchsorted``, ``take`` and ``where``: what a GPU
library does without atomics.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...backend import namespace_of
from ..registry import ShapeError, like_input, register
from .dispatch import INTS, _axes, _same_dtype, apply_op
from .state import as_tensor


# ---------------------------------------------------------------- shape manipulation
def _reshape_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    target = list(attrs["shape"])
    if target.count(-1) > 1:
        raise ShapeError(f"at most one -1 in the target shape, got {target}")
    s = shapes[0]
    known = s is not None and None not in s
    size = int(np.prod(s)) if known else None
    rest = int(np.prod([d for d in target if d != -1]))
    if -1 in target:
        if size is not None:
            if rest == 0 or size % rest:
                raise ShapeError(f"cannot reshape {s} to {target}")
            target[target.index(-1)] = size // rest
        else:
            target[target.index(-1)] = None
    elif size is not None and size != rest:
        raise ShapeError(f"cannot reshape {s} ({size} elements) to {target} ({rest} elements)")
    return tuple(target), dtypes[0]


def _reshape_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    return namespace_of(inputs[0]).reshape(inputs[0], tuple(attrs["shape"]))


def _reshape_grad(op: Any, grad: Any) -> list:
    return [reshape_like(grad, op.inputs[0])]


def _reshape_like_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    x, like = inputs
    return namespace_of(x).reshape(x, tuple(like.shape))


def _reshape_like_grad(op: Any, grad: Any) -> list:
    return [reshape_like(grad, op.inputs[0]), None]


register("Reshape", infer=_reshape_infer, kernel=_reshape_kernel, grad=_reshape_grad)
register("ReshapeLike", infer=like_input(shape_of=1, dtype_of=0), kernel=_reshape_like_kernel,
         grad=_reshape_like_grad)


def reshape(x: Any, shape: Sequence[int], name: str | None = None) -> Any:
    return apply_op("Reshape", [as_tensor(x)], {"shape": [int(d) for d in shape]}, name=name)


def reshape_like(x: Any, like: Any) -> Any:
    """``x`` reshaped to the run-time shape of ``like``."""
    return apply_op("ReshapeLike", [x, like])


def _transpose_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    s, perm = shapes[0], attrs["perm"]
    if s is None:
        return None, dtypes[0]
    perm = list(range(len(s)))[::-1] if perm is None else perm
    if sorted(perm) != list(range(len(s))):
        raise ShapeError(f"perm {perm} is not a permutation of the {len(s)} axes")
    return tuple(s[p] for p in perm), dtypes[0]


def _transpose_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    x, perm = inputs[0], attrs["perm"]
    return namespace_of(x).permute_dims(x, tuple(range(x.ndim))[::-1] if perm is None else tuple(perm))


def _transpose_grad(op: Any, grad: Any) -> list:
    perm = op.attrs["perm"]  # the inverse permutation puts the axes back
    return [transpose(grad, None if perm is None else [int(i) for i in np.argsort(perm)])]


register("Transpose", infer=_transpose_infer, kernel=_transpose_kernel, grad=_transpose_grad)


def transpose(x: Any, perm: Sequence[int] | None = None, name: str | None = None) -> Any:
    return apply_op("Transpose", [as_tensor(x)], {"perm": None if perm is None else [int(p) for p in perm]},
                    name=name)


def _concat_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    dt = _same_dtype(dtypes)
    if any(s is None for s in shapes):
        return None, dt
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1:
        raise ShapeError(f"inputs have different ranks {sorted(ranks)}")
    rank = ranks.pop()
    ax = _axes(attrs["axis"], rank)[0]
    out = list(shapes[0])
    for s in shapes[1:]:
        for i in range(rank):
            if i == ax:
                out[i] = None if out[i] is None or s[i] is None else out[i] + s[i]
            elif None not in (out[i], s[i]) and out[i] != s[i]:
                raise ShapeError(f"dimension {i} differs ({out[i]} vs {s[i]}) outside the concat axis {ax}")
    return tuple(out), dt


def _concat_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    return namespace_of(*inputs).concat(inputs, axis=attrs["axis"])


def _concat_grad(op: Any, grad: Any) -> list:
    """Input ``i`` gets its own slice of the gradient along the concat axis."""
    return [apply_op("ConcatSlice", [grad, *op.inputs], {"axis": op.attrs["axis"], "index": i})
            for i in range(len(op.inputs))]


def _concat_slice_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return shapes[1 + attrs["index"]], dtypes[0]


def _concat_slice_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    g, parts = inputs[0], inputs[1:]
    ax = attrs["axis"] % g.ndim
    start = sum(p.shape[ax] for p in parts[: attrs["index"]])
    idx = [slice(None)] * g.ndim
    idx[ax] = slice(start, start + parts[attrs["index"]].shape[ax])
    return g[tuple(idx)]


register("Concat", infer=_concat_infer, kernel=_concat_kernel, grad=_concat_grad)
register("ConcatSlice", infer=_concat_slice_infer, kernel=_concat_slice_kernel)  # used only inside gradients


def concat(values: Sequence[Any], axis: int, name: str | None = None) -> Any:
    return apply_op("Concat", [as_tensor(v) for v in values], {"axis": int(axis)}, name=name)


def _gather_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    p, i = shapes
    if dtypes[1] not in INTS:
        raise ShapeError(f"indices must be integers, got {dtypes[1]}")
    if p is None or i is None:
        return None, dtypes[0]
    if len(p) < 1:
        raise ShapeError("params must have rank at least 1")
    return tuple(i) + tuple(p[1:]), dtypes[0]


def _gather_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    params, indices = inputs
    xp = namespace_of(params, indices)  # the standard's take wants 1-D indices: flatten, then reshape
    rows = xp.take(params, xp.reshape(indices, (-1,)), axis=0)
    return xp.reshape(rows, tuple(indices.shape) + tuple(params.shape[1:]))


def _gather_grad(op: Any, grad: Any) -> list:
    params, indices = op.inputs
    return [apply_op("GatherGrad", [grad, indices, params]), None]


def _gather_grad_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    g, idx, params = inputs
    xp = namespace_of(g, idx)
    ids = xp.reshape(idx, (-1,))
    rows, sums = segment_sum(xp.reshape(g, (ids.shape[0],) + tuple(params.shape[1:])), ids)
    # repeated ids add up (the embedding row was used twice); rows never looked up get zeros
    return scatter_rows(xp.zeros(tuple(params.shape), dtype=g.dtype), rows, sums)


# ---------------------------------------------------------------- row operations
def segment_sum(values: Any, ids: Any) -> tuple[Any, Any]:
    """The distinct ``ids`` (sorted) and, for each, the sum of the rows of ``values`` it labels.

    Rows are added in the order they come, as ``np.add.at`` adds them, so NumPy gives the
    same bits as a sequential loop: round ``k`` adds every id's ``k``-th occurrence, so there
    are as many rounds as the most repeated id has rows.
    """
    xp = namespace_of(values, ids)
    unique = xp.sort(xp.unique_values(ids))  # unique_values' order is unspecified
    if ids.shape[0] == 0:
        return unique, xp.zeros((0,) + tuple(values.shape[1:]), dtype=values.dtype)
    order = xp.argsort(ids, stable=True)  # each id's rows together, in their original order
    sorted_ids, rows = xp.take(ids, order), xp.take(values, order, axis=0)
    start = xp.searchsorted(sorted_ids, unique)
    count = xp.searchsorted(sorted_ids, unique, side="right") - start
    sums = xp.take(rows, start, axis=0)
    trailing = (unique.shape[0],) + (1,) * (values.ndim - 1)
    for k in range(1, int(xp.max(count))):
        present = xp.reshape(count > k, trailing)
        kth = xp.take(rows, xp.clip(start + k, max=ids.shape[0] - 1), axis=0)
        sums = xp.where(present, sums + kth, sums)
    return unique, sums


def scatter_rows(base: Any, rows: Any, values: Any) -> Any:
    """A copy of ``base`` with row ``rows[i]`` replaced by ``values[i]`` (the last one wins
    where a row repeats, as NumPy's ``base[rows] = values`` does).

    Each row of ``base`` looks itself up in the sorted ``rows`` (``searchsorted``) and takes
    its new value if it is there: the standard's way to assign through an index array.
    """
    xp = namespace_of(base, rows, values)
    if rows.shape[0] == 0:
        return xp.asarray(base, copy=True)
    order = xp.argsort(rows, stable=True)
    sorted_rows = xp.take(rows, order)
    every_row = xp.arange(base.shape[0], dtype=rows.dtype)
    last = xp.clip(xp.searchsorted(sorted_rows, every_row, side="right") - 1, min=0)
    written = xp.reshape(xp.take(sorted_rows, last) == every_row, (base.shape[0],) + (1,) * (base.ndim - 1))
    values = xp.astype(xp.broadcast_to(values, (rows.shape[0],) + tuple(base.shape[1:])), base.dtype, copy=False)
    new = xp.take(values, xp.take(order, last), axis=0)
    return xp.where(written, new, base)


register("Gather", infer=_gather_infer, kernel=_gather_kernel, grad=_gather_grad)
register("GatherGrad", infer=like_input(shape_of=2, dtype_of=0), kernel=_gather_grad_kernel)


def gather(params: Any, indices: Any, name: str | None = None) -> Any:
    """Rows ``indices`` of ``params`` (an embedding lookup); the gradient is a dense scatter-add."""
    return apply_op("Gather", [as_tensor(params), as_tensor(indices)], name=name)
