"""Every op: its registration (inference, kernel, gradient) and its front-end function.

One section per op family.  A front-end function (``matmul``, ``reduce_sum`` …) calls
``apply_op``, which either adds a node to a graph (graph mode, when an input is a graph
``Tensor`` or no eager context is active) or runs the kernel now (eager mode).  Gradient
functions are written with the same front-end functions, so they build gradient nodes in
graph mode and compute gradient values in eager mode.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import eager as _eager
from .core import Graph, GraphError, Operation, Tensor, get_default_graph
from .registry import NO_GRADIENT, ShapeError, broadcast_shapes, get_op_def, register

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


def _convert(x: Any, like_dtype: str | None, graph: Graph | None) -> Any:
    """A Python number or NumPy array as a constant (graph) or eager tensor."""
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
        return _eager.EagerTensor(arr)
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
    like = next((t.dtype for t in inputs if isinstance(t, (Tensor, _eager.EagerTensor))), None)
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


# ---------------------------------------------------------------- sources: constants, placeholders, variables
def _const_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return tuple(attrs["value"].shape), attrs["value"].dtype.name


register("Const", _const_infer, lambda xs, a, s: a["value"], grad=NO_GRADIENT)


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


def _placeholder_kernel(xs: list, attrs: dict, state: dict) -> Any:
    raise GraphError("a placeholder must be fed a value")


register("Placeholder", lambda s, d, a: (None if a["shape"] is None else tuple(a["shape"]), a["dtype"]),
         _placeholder_kernel, grad=NO_GRADIENT, stateful=True)


def placeholder(dtype: str, shape: Sequence[int | None] | None = None, name: str | None = None) -> Tensor:
    """A graph input that must be given in ``feed_dict`` whenever a run needs it."""
    if _eager.executing_eagerly():
        raise GraphError("placeholder() has no meaning in eager mode: pass values directly")
    g = get_default_graph()
    shp = None if shape is None else [None if d is None else int(d) for d in shape]
    return g.add_operation("Placeholder", [], {"shape": shp, "dtype": np.dtype(dtype).name},
                           [(None if shp is None else tuple(shp), np.dtype(dtype).name)],
                           name=g.unique_name(name or "Placeholder")).outputs[0]


class Uninitialised:
    """What reading a variable gives before its initializer ran (Assign may still consume it)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def error(self) -> GraphError:
        return GraphError(f"variable {self.name!r} is not initialised: "
                          "run its initializer (or global_variables_initializer()) first")


def _variable_kernel(xs: list, attrs: dict, state: dict) -> Any:
    name = attrs["shared_name"]
    return state[name] if name in state else Uninitialised(name)


register("VariableV2", lambda s, d, a: (tuple(a["shape"]), a["dtype"]), _variable_kernel,
         grad=NO_GRADIENT, stateful=True)


def _ref_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    if tuple(shapes[0]) != tuple(shapes[1] or ()) and shapes[1] is not None:
        broadcast_shapes(shapes[0], shapes[1])
        if None not in shapes[1] and tuple(shapes[1]) != tuple(shapes[0]):
            raise ShapeError(f"value shape {shapes[1]} differs from variable shape {shapes[0]}")
    return shapes[0], _same_dtype(dtypes)


def _assign_kernel(xs: list, attrs: dict, state: dict) -> Any:
    state[attrs["shared_name"]] = np.array(xs[1], copy=True)
    return state[attrs["shared_name"]]


def _assign_add_kernel(xs: list, attrs: dict, state: dict) -> Any:
    name = attrs["shared_name"]
    if name not in state:
        raise Uninitialised(name).error()
    state[name] = state[name] + xs[1]
    return state[name]


def _assign_sub_kernel(xs: list, attrs: dict, state: dict) -> Any:
    name = attrs["shared_name"]
    if name not in state:
        raise Uninitialised(name).error()
    state[name] = state[name] - xs[1]
    return state[name]


# A new array per update (not in place): ops that read the old value in the same step keep it.
register("Assign", _ref_infer, _assign_kernel, stateful=True)
register("AssignAdd", _ref_infer, _assign_add_kernel, stateful=True)
register("AssignSub", _ref_infer, _assign_sub_kernel, stateful=True)


class Variable:
    """A graph variable: a ``VariableV2`` node whose value lives in each Session's state.

    ``initial_value`` becomes a constant; ``initializer`` is the Assign op that stores it.
    Use the variable wherever a tensor is expected (``value()`` is its read tensor).
    """

    def __init__(self, initial_value: Any, name: str | None = None, dtype: str | None = None,
                 trainable: bool = True) -> None:
        init = initial_value if isinstance(initial_value, Tensor) else constant(initial_value, dtype=dtype)
        g = init.graph
        if init.shape is None or None in init.shape:
            raise GraphError("Variable: the initial value needs a fully known shape")
        vname = g.unique_name(name or "Variable")
        self._tensor = g.add_operation("VariableV2", [], {"shape": list(init.shape), "dtype": init.dtype,
                                                          "shared_name": vname},
                                       [(tuple(init.shape), init.dtype)], name=vname).outputs[0]
        self.trainable = trainable
        self.initializer = assign(self, init, name=f"{vname}/Assign").op
        g.variables.append(self)

    def value(self) -> Tensor:
        return self._tensor

    op = property(lambda self: self._tensor.op)
    name = property(lambda self: self._tensor.name)
    shape = property(lambda self: self._tensor.shape)
    dtype = property(lambda self: self._tensor.dtype)
    graph = property(lambda self: self._tensor.graph)

    def assign(self, value: Any) -> Tensor:
        return assign(self, value)

    def assign_add(self, delta: Any) -> Tensor:
        return assign_add(self, delta)

    def assign_sub(self, delta: Any) -> Tensor:
        return assign_sub(self, delta)

    def __repr__(self) -> str:
        return f"<Variable {self.name} shape={self.shape} dtype={self.dtype}>"


def as_tensor(x: Any) -> Any:
    """A ``Variable`` as its read tensor; anything else unchanged."""
    return x.value() if isinstance(x, Variable) else x


def _ref(var: Any, opname: str) -> Tensor:
    t = as_tensor(var)
    if not isinstance(t, Tensor) or t.op.type != "VariableV2":
        raise GraphError(f"{opname}: the first argument must be a graph Variable, got {var!r}")
    return t


def assign(ref: Any, value: Any, name: str | None = None) -> Any:
    """Store ``value`` in variable ``ref`` when run; the result is the new value."""
    if isinstance(ref, _eager.Variable):
        return ref.assign(value)
    t = _ref(ref, "assign")
    return apply_op("Assign", [t, as_tensor(value)], {"shared_name": t.op.attrs["shared_name"]}, name=name)


def assign_add(ref: Any, delta: Any, name: str | None = None) -> Any:
    """Add ``delta`` to variable ``ref`` when run; the result is the new value."""
    if isinstance(ref, _eager.Variable):
        return ref.assign_add(delta)
    t = _ref(ref, "assign_add")
    return apply_op("AssignAdd", [t, as_tensor(delta)], {"shared_name": t.op.attrs["shared_name"]}, name=name)


def assign_sub(ref: Any, delta: Any, name: str | None = None) -> Any:
    """Subtract ``delta`` from variable ``ref`` when run (an SGD step); the result is the new value."""
    if isinstance(ref, _eager.Variable):
        return ref.assign_sub(delta)
    t = _ref(ref, "assign_sub")
    return apply_op("AssignSub", [t, as_tensor(delta)], {"shared_name": t.op.attrs["shared_name"]}, name=name)


def global_variables_initializer(graph: Graph | None = None) -> Operation:
    """One op that runs every variable's initializer."""
    g = graph or get_default_graph()
    return group(*[v.initializer for v in g.variables], name="init")


# ---------------------------------------------------------------- control: identity, no_op, group
register("Identity", _unary_infer, lambda xs, a, s: xs[0], grad=lambda op, g: [g])
register("NoOp", lambda s, d, a: (None, None), lambda xs, a, s: None, stateful=True, num_outputs=0)


def identity(x: Any, name: str | None = None) -> Any:
    return apply_op("Identity", [as_tensor(x)], name=name)


def no_op(name: str | None = None) -> Operation:
    """An op that does nothing: useful only for its control inputs."""
    return apply_op("NoOp", [], name=name)


def group(*inputs: Any, name: str | None = None) -> Operation:
    """A NoOp that runs after every op in ``inputs`` (ops, tensors or variables)."""
    ops = [x if isinstance(x, Operation) else as_tensor(x).op for x in inputs]
    graph = ops[0].graph if ops else get_default_graph()
    with graph.as_default():
        return apply_op("NoOp", [], name=name or "group_deps", control_inputs=ops)


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


# ---------------------------------------------------------------- softmax family
def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def _axis_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    if shapes[0] is not None:
        _axes(attrs["axis"], len(shapes[0]))
    return _float_unary_infer(shapes, dtypes, attrs)


register("Softmax", _axis_infer, lambda xs, a, s: _softmax(xs[0], a["axis"]), grad=lambda op, g: [
    op.outputs[0] * (g - reduce_sum(g * op.outputs[0], op.attrs["axis"], keepdims=True))])
register("LogSoftmax", _axis_infer, lambda xs, a, s: _log_softmax(xs[0], a["axis"]), grad=lambda op, g: [
    g - exp(op.outputs[0]) * reduce_sum(g, op.attrs["axis"], keepdims=True)])


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


def _xent_kernel(xs: list, a: dict, s: dict) -> np.ndarray:
    logits, labels = xs
    return -_log_softmax(logits, -1)[np.arange(len(labels)), labels]


def _xent_grad_kernel(xs: list, a: dict, s: dict) -> np.ndarray:
    logits, labels = xs
    p = _softmax(logits, -1)
    p[np.arange(len(labels)), labels] -= 1
    return p


register("SparseSoftmaxCrossEntropyWithLogits", _xent_infer, _xent_kernel, grad=lambda op, g: [
    reshape(g, [-1, 1]) * apply_op("SparseSoftmaxCrossEntropyGrad", op.inputs), None])
register("SparseSoftmaxCrossEntropyGrad", lambda s, d, a: (s[0], d[0]), _xent_grad_kernel)


def sparse_softmax_cross_entropy(labels: Any, logits: Any, name: str | None = None) -> Any:
    """Per-example loss ``-log softmax(logits)[label]`` (TF: ..._with_logits)."""
    return apply_op("SparseSoftmaxCrossEntropyWithLogits", [as_tensor(logits), as_tensor(labels)], name=name)


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
