"""The graph IR: ``Graph`` holds ``Operation`` nodes whose outputs are symbolic ``Tensor`` edges.

Names follow TensorFlow 1: an operation has a unique name ("MatMul_1"), a type ("MatMul"),
input tensors, control inputs (ops that must run first, with no data passed) and attributes
(JSON-friendly values such as an axis).  A tensor is named "<op name>:<output index>" and
carries the statically inferred shape (``None`` for a dimension known only at run time) and
dtype.  Nothing here computes a value: ``Session`` (graph mode) or the eager front end does.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator


class GraphError(ValueError):
    """A graph was built or used wrongly (bad shapes or dtypes, unknown names, mixed graphs)."""


Shape = tuple  # a tuple of ints and Nones; ``None`` as a whole means the rank is unknown


class TensorOperators:
    """Python operators (``a + b``, ``a @ b`` …) for graph and eager tensors alike.

    Each goes through the same front-end function a user would call, so it builds a node in
    graph mode and runs the kernel in eager mode.
    """

    def __add__(self, o: Any) -> Any: from . import ops; return ops.add(self, o)
    def __radd__(self, o: Any) -> Any: from . import ops; return ops.add(o, self)
    def __sub__(self, o: Any) -> Any: from . import ops; return ops.sub(self, o)
    def __rsub__(self, o: Any) -> Any: from . import ops; return ops.sub(o, self)
    def __mul__(self, o: Any) -> Any: from . import ops; return ops.mul(self, o)
    def __rmul__(self, o: Any) -> Any: from . import ops; return ops.mul(o, self)
    def __truediv__(self, o: Any) -> Any: from . import ops; return ops.div(self, o)
    def __rtruediv__(self, o: Any) -> Any: from . import ops; return ops.div(o, self)
    def __neg__(self) -> Any: from . import ops; return ops.neg(self)
    def __matmul__(self, o: Any) -> Any: from . import ops; return ops.matmul(self, o)
    def __pow__(self, o: Any) -> Any: from . import ops; return ops.pow(self, o)


class Tensor(TensorOperators):
    """A symbolic value: output ``index`` of ``op``, with inferred ``shape`` and ``dtype``."""

    def __init__(self, op: "Operation", index: int, shape: Shape | None, dtype: str) -> None:
        self.op, self.index, self.shape, self.dtype = op, index, shape, dtype

    @property
    def name(self) -> str:
        return f"{self.op.name}:{self.index}"

    @property
    def graph(self) -> "Graph":
        return self.op.graph

    def __repr__(self) -> str:
        return f"<Tensor {self.name} shape={self.shape} dtype={self.dtype}>"


class Operation:
    """A node: ``type`` names its registered op definition; ``outputs`` are its tensors."""

    def __init__(self, graph: "Graph", type: str, name: str, inputs: list[Tensor],
                 attrs: dict[str, Any], control_inputs: list["Operation"]) -> None:
        self.graph, self.type, self.name = graph, type, name
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.control_inputs = list(control_inputs)
        self.outputs: list[Tensor] = []
        # Where it runs: "" (the placer decides) or a device string such as
        # "/job:worker/task:1" (see ``placement.DeviceSpec``).  ``colocation`` names ops this
        # one must share a device with (TensorFlow's "_class: loc:@name" attribute).
        self.device: str = ""
        self.colocation: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<Operation {self.name} type={self.type}>"


class Graph:
    """An append-only list of operations, in creation order (which is a topological order)."""

    def __init__(self) -> None:
        self.operations: list[Operation] = []
        self._by_name: dict[str, Operation] = {}
        self._name_counts: dict[str, int] = {}
        self.variables: list[Any] = []  # ``Variable`` objects, for global_variables_initializer
        self._device_stack: list[str] = []  # innermost ``device()`` scope last
        self._colocation_stack: list[Operation] = []

    def unique_name(self, base: str) -> str:
        """``base`` if unused, else ``base_1``, ``base_2`` … (TensorFlow's rule)."""
        n = self._name_counts.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        while name in self._by_name:
            n += 1
            name = f"{base}_{n}"
        self._name_counts[base] = n + 1
        return name

    def add_operation(self, type: str, inputs: list[Tensor], attrs: dict[str, Any],
                      outputs: list[tuple[Shape | None, str]], name: str | None = None,
                      control_inputs: list[Operation] | None = None) -> Operation:
        """Append a node; ``outputs`` lists the (shape, dtype) of each output tensor."""
        for t in inputs:
            if t.graph is not self:
                raise GraphError(f"{type}: input {t.name} belongs to another graph")
        for c in control_inputs or []:
            if c.graph is not self:
                raise GraphError(f"{type}: control input {c.name} belongs to another graph")
        if name is None:
            name = self.unique_name(type)
        elif name in self._by_name:
            raise GraphError(f"duplicate operation name {name!r}")
        else:
            self._name_counts.setdefault(name, 1)
        op = Operation(self, type, name, inputs, attrs, control_inputs or [])
        op.outputs = [Tensor(op, i, s, d) for i, (s, d) in enumerate(outputs)]
        if self._colocation_stack:  # colocate_with wins over device scopes, as in TensorFlow
            op.colocation = tuple(dict.fromkeys(c.name for c in self._colocation_stack))
        elif self._device_stack:
            op.device = self._device_stack[-1]
        self.operations.append(op)
        self._by_name[name] = op
        return op

    def get_operation_by_name(self, name: str) -> Operation:
        try:
            return self._by_name[name]
        except KeyError:
            raise GraphError(f"no operation named {name!r} in this graph") from None

    def get_tensor_by_name(self, name: str) -> Tensor:
        """``"op:0"`` → that tensor (a bare op name means output 0)."""
        op_name, _, index = name.partition(":")
        op = self.get_operation_by_name(op_name)
        i = int(index or 0)
        if i >= len(op.outputs):
            raise GraphError(f"operation {op_name!r} has {len(op.outputs)} outputs, no output {i}")
        return op.outputs[i]

    @contextlib.contextmanager
    def as_default(self) -> Iterator["Graph"]:
        """Make this the graph that front-end functions add to, inside the ``with`` block."""
        _stack().append(self)
        try:
            yield self
        finally:
            _stack().pop()

    @contextlib.contextmanager
    def device(self, device: str) -> Iterator[None]:
        """Ops created inside the block ask to run on ``device`` ("" clears the request).

        The string is checked here (``placement.DeviceSpec.parse``), so a typo fails where it
        was written, not later in the placer.
        """
        from .placement import DeviceSpec
        self._device_stack.append(DeviceSpec.parse(device).to_string() if device else "")
        try:
            yield
        finally:
            self._device_stack.pop()

    @contextlib.contextmanager
    def colocate_with(self, op: "Operation | Tensor | Any") -> Iterator[None]:
        """Ops created inside the block must run wherever ``op`` runs (device scopes are ignored)."""
        op = getattr(op, "op", op)
        if not isinstance(op, Operation) or op.graph is not self:
            raise GraphError(f"colocate_with needs an operation of this graph, got {op!r}")
        self._colocation_stack.append(op)
        try:
            yield
        finally:
            self._colocation_stack.pop()

    def __len__(self) -> int:
        return len(self.operations)


_local = threading.local()
_global_default = [Graph()]


def _stack() -> list[Graph]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def get_default_graph() -> Graph:
    """The innermost ``as_default()`` graph of this thread, else the process-wide graph."""
    s = _stack()
    return s[-1] if s else _global_default[0]


def reset_default_graph() -> None:
    """Replace the process-wide default graph with an empty one."""
    _global_default[0] = Graph()
