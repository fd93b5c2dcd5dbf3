"""Shape manipulation: reshape, transpose, concat and gather (the embedding lookup)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..registry import ShapeError, register
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


register("Reshape", _reshape_infer, lambda xs, a, s: xs[0].reshape(a["shape"]),
         grad=lambda op, g: [reshape_like(g, op.inputs[0])])
register("ReshapeLike", lambda s, d, a: (s[1], d[0]), lambda xs, a, s: xs[0].reshape(xs[1].shape),
         grad=lambda op, g: [reshape_like(g, op.inputs[0]), None])


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


def _transpose_grad(op: Any, g: Any) -> list:
    perm = op.attrs["perm"]
    return [transpose(g, None if perm is None else [int(i) for i in np.argsort(perm)])]


register("Transpose", _transpose_infer, lambda xs, a, s: np.transpose(xs[0], a["perm"]), grad=_transpose_grad)


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


def _concat_slice_kernel(xs: list, a: dict, s: dict) -> np.ndarray:
    g, parts = xs[0], xs[1:]
    ax = a["axis"] % g.ndim
    start = sum(p.shape[ax] for p in parts[: a["index"]])
    idx = [slice(None)] * g.ndim
    idx[ax] = slice(start, start + parts[a["index"]].shape[ax])
    return g[tuple(idx)]


register("Concat", _concat_infer, lambda xs, a, s: np.concatenate(xs, axis=a["axis"]), grad=lambda op, g: [
    apply_op("ConcatSlice", [g, *op.inputs], {"axis": op.attrs["axis"], "index": i}) for i in range(len(op.inputs))])
register("ConcatSlice", lambda s, d, a: (s[1 + a["index"]], d[0]), _concat_slice_kernel,
         grad=None)  # used only inside gradients


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


def _gather_grad_kernel(xs: list, a: dict, s: dict) -> np.ndarray:
    g, idx, params = xs
    out = np.zeros(params.shape, dtype=g.dtype)
    np.add.at(out, idx, g)  # repeated ids add up: the embedding row was used twice
    return out


register("Gather", _gather_infer, lambda xs, a, s: np.take(xs[0], xs[1], axis=0), grad=lambda op, g: [
    apply_op("GatherGrad", [g, op.inputs[1], op.inputs[0]]), None])
register("GatherGrad", lambda s, d, a: (s[2], d[0]), _gather_grad_kernel)


def gather(params: Any, indices: Any, name: str | None = None) -> Any:
    """Rows ``indices`` of ``params`` (an embedding lookup); the gradient is a dense scatter-add."""
    return apply_op("Gather", [as_tensor(params), as_tensor(indices)], name=name)
