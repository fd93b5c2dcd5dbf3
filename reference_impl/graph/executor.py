"""The executor: run each op of a graph once, as soon as everything it waits for has run.

There is one executor, as TensorFlow's ``common_runtime`` executor serves both its local
``DirectSession`` and the workers of a cluster: ``Session.run`` calls ``execute`` on the
pruned, optimised graph of a signature, and a worker of the distributed runtime calls it
on its partition for one step, with ``send``/``recv`` connected to the step's rendezvous
(``reference_impl.runtime.executor.connect``).

* Each op waits for its distinct producers (data and control inputs): ``pending`` counts
  them, and the ops that wait for nothing seed a ready queue.  An op taken from the queue
  runs its kernel (a placeholder takes its fed value); each of its consumers then waits
  for one op fewer, and joins the queue at zero.  An input's value is freed once its last
  consumer has run (less peak memory), unless it is fetched.
* ``_Send`` hands its input to ``send(op, value)`` and never waits.  ``_Recv`` ops have no
  inputs, so all of them are ready at once: the executor first runs every other ready op,
  and only when nothing else can run does it wait, for *whichever* awaited ``_Recv``
  arrives first (``recv(ops) -> (op, value)``).  Waiting for one particular ``_Recv``
  could deadlock: the peer may need a ``_Send`` of ours that depends on another ``_Recv``.
  Without ``send``/``recv`` (the local ``Session``) they are ordinary ops, whose kernel
  says that they need a partition executor.
* A fetch of an op whose output is the variable store's own array (``OpDef.reads_state``:
  a variable read, an assignment) returns a copy, so the caller cannot change the store.

What each op waits for and who waits for it (the ``Schedule``) is worked out once per graph.
"""
from __future__ import annotations

import weakref
from collections import deque
from typing import Any, Callable

import numpy as np

from ..backend import namespace_of
from .core import Graph, GraphError, Operation
from .ops import Uninitialised
from .partition import control_value
from .registry import get_op_def

Send = Callable[[Operation, Any], None]  # (the _Send op, the value it sends)
Recv = Callable[[list[Operation]], tuple[Operation, Any]]  # awaited _Recv ops -> (the one that arrived, value)


class Schedule:
    """Per op of ``graph``: how many producers it waits for, its consumers, its kernel, and
    its data edges out (when that many consumers have run, its value can be freed)."""

    def __init__(self, graph: Graph) -> None:
        self.ops = list(graph.operations)
        self.pending: dict[Operation, int] = {}
        self.consumers: dict[Operation, list[Operation]] = {op: [] for op in self.ops}
        self.uses: dict[Operation, int] = {op: 0 for op in self.ops}
        for op in self.ops:
            producers = {t.op for t in op.inputs} | set(op.control_inputs)
            self.pending[op] = len(producers)
            for p in producers:
                self.consumers[p].append(op)
            for t in op.inputs:
                self.uses[t.op] += 1
        self.kernels = {op: get_op_def(op.type).kernel for op in self.ops}


_SCHEDULES: weakref.WeakKeyDictionary[Graph, Schedule] = weakref.WeakKeyDictionary()


def schedule(graph: Graph) -> Schedule:
    """``graph``'s schedule, built on its first run (a graph only grows: a new op means a new one)."""
    s = _SCHEDULES.get(graph)
    if s is None or len(s.ops) != len(graph.operations):
        s = _SCHEDULES[graph] = Schedule(graph)
    return s


def execute(graph: Graph, feeds: dict[str, np.ndarray], fetches: list[str], state: dict,
            send: Send | None = None, recv: Recv | None = None) -> list[Any]:
    """Run ``graph`` once; the value of each of ``fetches`` (tensor names; ``None`` for an op name).

    ``feeds`` maps placeholder op names to values; ``state`` is the variable store the
    stateful kernels read and write.
    """
    plan = schedule(graph)
    pending, uses = dict(plan.pending), dict(plan.uses)
    fetched = {graph.get_operation_by_name(name.partition(":")[0]) for name in fetches}
    values: dict[Operation, Any] = {}
    waiting = [op for op in plan.ops if op.type == "_Recv"] if recv is not None else []
    ready = deque(op for op in plan.ops if pending[op] == 0 and op not in waiting)
    done = 0
    while ready or waiting:
        if ready:
            op = ready.popleft()
            inputs = [values[t.op] for t in op.inputs]
            if op.type == "Placeholder":
                if op.name not in feeds:
                    raise GraphError(f"placeholder {op.name!r} must be fed: the fetches depend on it")
                values[op] = feeds[op.name]
            elif op.type == "_Send" and send is not None:
                send(op, inputs[0] if inputs else control_value())
            else:
                try:
                    out = plan.kernels[op](inputs, op.attrs, state)
                except GraphError:
                    raise
                except Exception as e:
                    for v in inputs:
                        if isinstance(v, Uninitialised):
                            raise v.error() from None
                    raise GraphError(f"{op.type} op {op.name!r} failed: {e}") from e
                values[op] = out if out is None or isinstance(out, (np.ndarray, Uninitialised)) else _array(out)
            for t in op.inputs:  # free each input after its last consumer
                uses[t.op] -= 1
                if uses[t.op] == 0 and t.op not in fetched:
                    del values[t.op]
        else:  # nothing else can run: wait for whichever awaited value comes first
            op, values[op] = recv(waiting)
            waiting.remove(op)
        done += 1
        for c in plan.consumers[op]:
            pending[c] -= 1
            if pending[c] == 0:
                ready.append(c)
    if done != len(plan.ops):
        raise GraphError("the graph has a cycle; it cannot be executed")
    results = []
    for name in fetches:
        if ":" not in name:
            results.append(None)
            continue
        op = graph.get_tensor_by_name(name).op
        v = values[op]
        if isinstance(v, Uninitialised):
            raise v.error()
        results.append(_copy(v) if get_op_def(op.type).reads_state and v is not None else v)
    return results


def _array(out: Any) -> Any:
    """A kernel's result as an array: an array of any namespace as it is (a device's kernels
    return the device's arrays), a NumPy scalar or Python number as a 0-d NumPy array."""
    if isinstance(out, np.generic) or not hasattr(out, "shape"):
        return np.asarray(out)
    return out


def _copy(v: Any) -> Any:
    """A copy of array ``v`` (a fetched variable must not change when the variable does)."""
    return v.copy() if isinstance(v, np.ndarray) else namespace_of(v).asarray(v, copy=True)
