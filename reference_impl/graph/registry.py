"""The op registry: one ``OpDef`` per op type, holding everything the runtime needs to know.

Adding an op is one ``register`` call, with keyword arguments, naming three functions:

* ``infer(shapes, dtypes, attrs) -> (shape, dtype)``: static shape/dtype inference, run when
  the op is added to a graph (and in eager mode), so mistakes show up at build time;
* ``kernel(inputs, attrs, state) -> array``: computes the output from the input arrays
  (``state`` is the variable store, used only by stateful ops). A built-in kernel asks its
  inputs for their namespace (``xp = backend.namespace_of(...)``) and uses only the array
  API standard, so one kernel runs on NumPy, a GPU, PyTorch tensors or ``array_api_strict``;
  ``array_kernel("add")`` makes the kernel of an op that is one standard function of its
  inputs, and ``numpy_kernel(np.add)`` the kernel of a NumPy-only op (custom ops);
* ``grad(op, grad) -> list``: builds the gradient for each input out of other ops (``None``
  for an input that gets no gradient), the shape of TensorFlow's ``@RegisterGradient``
  functions. ``grad=None`` means "not differentiable": asking for a gradient through such
  an op is an error; ``NO_GRADIENT`` means the op is differentiable but its result is
  constant almost everywhere (comparisons), so inputs get no gradient.

For example, in ``ops/math.py``::

    def _add_grad(op, grad):
        a, b = op.inputs
        return [sum_to(grad, a), sum_to(grad, b)]

    register("Add", infer=_binary_infer, kernel=array_kernel("add"), grad=_add_grad)

Every built-in op is registered in ``graph/ops/``; code elsewhere only applies them.

Three flags say what else the runtime must know: ``stateful`` (placeholders, variables and
their updates, ``NoOp``, ``_Send``/``_Recv``: the passes never fold such an op nor merge it
with a twin), ``reads_state`` (its output *is* the variable store's array, as a variable
read's or an assignment's is: the executor hands out a fetch of it as a copy) and
``updates_variable`` (it writes the variable its first input reads, as ``Assign`` and
``ScatterUpdate`` do: the placer puts it with that variable, and a frozen graph cannot hold it).

Graph construction, the executor, eager mode, the passes and the gradient builder all read
this one table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..backend import namespace_of
from .core import GraphError


def NO_GRADIENT(op: Any, grad: Any) -> list[None]:
    """Gradient function of ops whose output is locally constant: no input gets a gradient."""
    return [None] * len(op.inputs)


@dataclass(frozen=True)
class OpDef:
    type: str
    infer: Callable[[list, list, dict], tuple]
    kernel: Callable[[list, dict, dict], Any]
    grad: Callable[[Any, Any], list] | None = None
    stateful: bool = False  # never folded, merged or removed as a duplicate
    num_outputs: int = 1
    reads_state: bool = False  # the output is the variable store's array: fetches get a copy
    updates_variable: bool = False  # writes the variable of its first input: placed with it


REGISTRY: dict[str, OpDef] = {}


def register(type: str, *, infer: Callable, kernel: Callable, grad: Callable | None = None,
             stateful: bool = False, num_outputs: int = 1, reads_state: bool = False,
             updates_variable: bool = False) -> OpDef:
    """Add op ``type`` to the registry (one call per op; everything but the name by keyword)."""
    if type in REGISTRY:
        raise GraphError(f"op type {type!r} is already registered")
    REGISTRY[type] = OpDef(type, infer, kernel, grad, stateful, num_outputs, reads_state, updates_variable)
    return REGISTRY[type]


def array_kernel(name: str) -> Callable:
    """The kernel of an op that is one array-API function ``name`` of its inputs, looked up
    on the inputs' own namespace: ``xp.add(a, b)`` with ``xp`` NumPy, CuPy, PyTorch ..."""
    def kernel(inputs: list, attrs: dict, state: dict) -> Any:
        return getattr(namespace_of(*inputs), name)(*inputs)
    kernel.__name__ = kernel.__qualname__ = f"array_kernel({name})"
    return kernel


def numpy_kernel(fn: Callable) -> Callable:
    """The kernel of an op that is one NumPy function of its input arrays: ``fn(*inputs)``."""
    def kernel(inputs: list, attrs: dict, state: dict) -> Any:
        return fn(*inputs)
    kernel.__name__ = kernel.__qualname__ = f"numpy_kernel({getattr(fn, '__name__', fn)})"
    return kernel


def like_input(shape_of: int = 0, dtype_of: int = 0) -> Callable:
    """Shape inference of an op whose output has the shape of input ``shape_of`` and the
    dtype of input ``dtype_of`` (a gradient helper such as ``SumToShapeOf``)."""
    def infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
        return shapes[shape_of], dtypes[dtype_of]
    infer.__name__ = infer.__qualname__ = f"like_input(shape_of={shape_of}, dtype_of={dtype_of})"
    return infer


def get_op_def(type: str) -> OpDef:
    try:
        return REGISTRY[type]
    except KeyError:
        raise GraphError(f"unknown op type {type!r}: it is not in the op registry") from None


class ShapeError(GraphError):
    """Raised by an ``infer`` function; the front end adds the op name and the input types."""


def broadcast_shapes(a: tuple | None, b: tuple | None) -> tuple | None:
    """NumPy broadcasting on static shapes, where ``None`` marks an unknown size."""
    if a is None or b is None:
        return None
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == 1:
            out.append(y)
        elif y == 1 or y == x:
            out.append(x)
        elif x is None or y is None:
            out.append(x if y is None else y)
        else:
            raise ShapeError(f"shapes {a} and {b} do not broadcast (dimension {-i}: {x} vs {y})")
    return tuple(reversed(out))
