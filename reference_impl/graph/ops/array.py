"""Shape manipulation: reshape, transpose, concat and gather (the embedding lookup)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

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


def _reshape_kernel(inputs: list, attrs: dict, state: dict) -> np.ndarray:
    return inputs[0].reshape(attrs["shape"])


def _reshape_grad(op: Any, grad: Any) -> list:
    return [reshape_like(grad, op.inputs[0])]


def _reshape_like_kernel(inputs: list, attrs: dict, state: dict) -> np.ndarray:
    x, like = inputs
    return x.reshape(like.shape)


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


def _transpose_kernel(inputs: list, attrs: dict, state: dict) -> np.ndarray:
    return np.transpose(inputs[0], attrs["perm"])


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


def _concat_kernel(inputs: list, attrs: dict, state: dict) -> np.ndarray:
    return np.concatenate(inputs, axis=attrs["axis"])


def _concat_grad(op: Any, grad: Any) -> list:
    """Input ``i`` gets its own slice of the gradient along the concat axis."""
    return [apply_op("ConcatSlice", [grad, *op.inputs], {"axis": op.attrs["axis"], "index": i})
            for i in range(len(op.inputs))]


def _concat_slice_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return shapes[1 + attrs["index"]], dtypes[0]


def _concat_slice_kernel(inputs: list, attrs: dict, state: dict) -> np.ndarray:
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


def _gather_kernel(inputs: list, attrs: dict, state: dict) -> np.ndarray:
    params, indices = inputs
    return np.take(params, indices, axis=0)


def _gather_grad(op: Any, grad: Any) -> list:
    params, indices = op.inputs
    return [apply_op("GatherGrad", [grad, indices, params]), None]


def _gather_grad_kernel(inputs: list, attrs: dict, state: dict) -> np.ndarray:
    g, idx, params = inputs
    out = np.zeros(params.shape, dtype=g.dtype)
    np.add.at(out, idx, g)  # repeated ids add up: the embedding row was used twice
    return out


register("Gather", infer=_gather_infer, kernel=_gather_kernel, grad=_gather_grad)
register("GatherGrad", infer=like_input(shape_of=2, dtype_of=0), kernel=_gather_grad_kernel)


def gather(params: Any, indices: Any, name: str | None = None) -> Any:
    """Rows ``indices`` of ``params`` (an embedding lookup); the gradient is a dense scatter-add."""
    return apply_op("Gather", [as_tensor(params), as_tensor(indices)], name=name)
