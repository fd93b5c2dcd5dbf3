"""Sources and state: placeholders, variables and their updates, and the control ops
(identity, no_op, group).

A ``Variable`` is a ``VariableV2`` node whose value lives outside the graph, in the state of
whoever runs it (a ``Session``, or a worker's container in the distributed runtime); its
updates (``Assign``, ``AssignAdd``, ``AssignSub``) are colocated with it.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...backend import namespace_of
from .. import eager as _eager
from ..core import Graph, GraphError, Operation, Tensor, get_default_graph
from ..registry import NO_GRADIENT, ShapeError, broadcast_shapes, register
from .dispatch import _same_dtype, _unary_infer, apply_op, constant


# ---------------------------------------------------------------- placeholders, variables
def _placeholder_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    raise GraphError("a placeholder must be fed a value")


def _declared_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    """Shape and dtype as declared in the op's attributes (``shape`` may be None: unknown)."""
    return (None if attrs["shape"] is None else tuple(attrs["shape"])), attrs["dtype"]


register("Placeholder", infer=_declared_infer, kernel=_placeholder_kernel, grad=NO_GRADIENT, stateful=True)


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


def _variable_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    name = attrs["shared_name"]
    return state[name] if name in state else Uninitialised(name)


register("VariableV2", infer=_declared_infer, kernel=_variable_kernel, grad=NO_GRADIENT, stateful=True,
         reads_state=True)


def _ref_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    if tuple(shapes[0]) != tuple(shapes[1] or ()) and shapes[1] is not None:
        broadcast_shapes(shapes[0], shapes[1])
        if None not in shapes[1] and tuple(shapes[1]) != tuple(shapes[0]):
            raise ShapeError(f"value shape {shapes[1]} differs from variable shape {shapes[0]}")
    return shapes[0], _same_dtype(dtypes)


def _assign_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    value = inputs[1]
    state[attrs["shared_name"]] = namespace_of(value).asarray(value, copy=True)
    return state[attrs["shared_name"]]


def _assign_add_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    name = attrs["shared_name"]
    if name not in state:
        raise Uninitialised(name).error()
    state[name] = state[name] + inputs[1]
    return state[name]


def _assign_sub_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    name = attrs["shared_name"]
    if name not in state:
        raise Uninitialised(name).error()
    state[name] = state[name] - inputs[1]
    return state[name]


# A new array per update (not in place): ops that read the old value in the same step keep it.
register("Assign", infer=_ref_infer, kernel=_assign_kernel, stateful=True, reads_state=True, updates_variable=True)
register("AssignAdd", infer=_ref_infer, kernel=_assign_add_kernel, stateful=True, reads_state=True,
         updates_variable=True)
register("AssignSub", infer=_ref_infer, kernel=_assign_sub_kernel, stateful=True, reads_state=True,
         updates_variable=True)


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


def _update(method: str, op_type: str, ref: Any, value: Any, name: str | None) -> Any:
    """The op ``op_type`` writing ``value`` into variable ``ref``, placed with the variable (an
    update runs where its variable lives); in eager mode, the variable's own ``method``."""
    if isinstance(ref, _eager.Variable):
        return getattr(ref, method)(value)
    t = _ref(ref, method)
    with t.graph.colocate_with(t.op):
        return apply_op(op_type, [t, as_tensor(value)], {"shared_name": t.op.attrs["shared_name"]}, name=name)


def assign(ref: Any, value: Any, name: str | None = None) -> Any:
    """Store ``value`` in variable ``ref`` when run; the result is the new value."""
    return _update("assign", "Assign", ref, value, name)


def assign_add(ref: Any, delta: Any, name: str | None = None) -> Any:
    """Add ``delta`` to variable ``ref`` when run; the result is the new value."""
    return _update("assign_add", "AssignAdd", ref, delta, name)


def assign_sub(ref: Any, delta: Any, name: str | None = None) -> Any:
    """Subtract ``delta`` from variable ``ref`` when run (an SGD step); the result is the new value."""
    return _update("assign_sub", "AssignSub", ref, delta, name)


def global_variables_initializer(graph: Graph | None = None) -> Operation:
    """One op that runs every variable's initializer."""
    g = graph or get_default_graph()
    return group(*[v.initializer for v in g.variables], name="init")


# ---------------------------------------------------------------- control: identity, no_op, group
def _identity_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    return inputs[0]


def _identity_grad(op: Any, grad: Any) -> list:
    return [grad]


def _no_output_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return None, None


def _no_op_kernel(inputs: list, attrs: dict, state: dict) -> None:
    return None


register("Identity", infer=_unary_infer, kernel=_identity_kernel, grad=_identity_grad)
register("NoOp", infer=_no_output_infer, kernel=_no_op_kernel, stateful=True, num_outputs=0)


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


# ---------------------------------------------------------------- _Send and _Recv
def _executor_only(inputs: list, attrs: dict, state: dict) -> None:
    raise GraphError("_Send/_Recv are run by a partition executor (reference_impl.runtime.executor), "
                     "which connects them to a rendezvous")


# Partitioning (graph/partition.py) puts a _Send/_Recv pair on every edge it cuts; the executor
# runs them against a rendezvous, so their kernels only say so if anything else tries.
register("_Send", infer=_no_output_infer, kernel=_executor_only, stateful=True, num_outputs=0)
register("_Recv", infer=_declared_infer, kernel=_executor_only, stateful=True)

