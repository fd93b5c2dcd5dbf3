"""Run one partition for one step: the ready-queue executor of ``Session``, plus Send/Recv.

Ops run when every producer has run (pending-input counts, as in ``graph.session``).  Two
op types are special:

* ``_Send`` hands its input to ``deliver(key, recv_device, value)`` (the rendezvous, or the
  worker's route to a peer) and never waits;
* ``_Recv`` ops have no inputs, so they are all ready at once.  The executor first runs every
  other ready op, and only when nothing else can run does it wait, for *whichever* awaited
  ``_Recv`` arrives first (``Rendezvous.recv_any``).  Waiting for one particular ``_Recv``
  could deadlock: the peer may need a ``_Send`` of ours that depends on another ``_Recv``.

``run_partitions`` runs all partitions of a step in threads of this process around one
``Rendezvous``: the in-process version of a distributed step, used by tests and exercise 06.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

import numpy as np

from ..graph import REGISTRY, Graph, GraphError, Uninitialised, control_value, rendezvous_key
from .rendezvous import Rendezvous

Deliver = Callable[[str, str, Any], None]
READS_STATE = ("VariableV2", "Assign", "AssignAdd", "AssignSub")


def execute(graph: Graph, feeds: dict[str, np.ndarray], fetches: list[str], state: dict,
            rendezvous: Rendezvous, step_id: int, deliver: Deliver | None = None) -> dict[str, Any]:
    """Run ``graph`` once; returns the values of the ``fetches`` (tensor names) it holds."""
    deliver = deliver or (lambda key, device, value: rendezvous.send(key, value))
    pending = {op: len({t.op for t in op.inputs} | set(op.control_inputs)) for op in graph.operations}
    consumers: dict[Any, list] = {op: [] for op in graph.operations}
    for op in graph.operations:
        for p in {t.op for t in op.inputs} | set(op.control_inputs):
            consumers[p].append(op)
    values: dict[Any, Any] = {}
    ready = deque(op for op in graph.operations if pending[op] == 0 and op.type != "_Recv")
    waiting = {rendezvous_key(op.attrs["send_device"], op.attrs["recv_device"], op.attrs["tensor_name"],
                              step_id): op for op in graph.operations if op.type == "_Recv"}
    done = 0

    def finish(op: Any) -> None:
        nonlocal done
        done += 1
        for c in consumers[op]:
            pending[c] -= 1
            if pending[c] == 0:
                ready.append(c)

    while ready or waiting:
        if not ready:
            key, value = rendezvous.recv_any(waiting)
            op = waiting.pop(key)
            values[op] = value
            finish(op)
            continue
        op = ready.popleft()
        inputs = [values[t.op] for t in op.inputs]
        if op.type == "Placeholder":
            if op.name not in feeds:
                raise GraphError(f"placeholder {op.name!r} must be fed: the fetches depend on it")
            values[op] = feeds[op.name]
        elif op.type == "_Send":
            key = rendezvous_key(op.attrs["send_device"], op.attrs["recv_device"], op.attrs["tensor_name"],
                                 step_id)
            deliver(key, op.attrs["recv_device"], inputs[0] if inputs else control_value())
        else:
            try:
                out = REGISTRY[op.type].kernel(inputs, op.attrs, state)
            except GraphError:
                raise
            except Exception as e:
                for v in inputs:
                    if isinstance(v, Uninitialised):
                        raise v.error() from None
                raise GraphError(f"{op.type} op {op.name!r} failed: {e}") from e
            values[op] = out if out is None or isinstance(out, (np.ndarray, Uninitialised)) else np.asarray(out)
        finish(op)
    if done != len(graph.operations):
        raise GraphError("the partition has a cycle; it cannot be executed")
    result = {}
    for name in fetches:
        op = graph.get_tensor_by_name(name).op if ":" in name else graph.get_operation_by_name(name)
        v = values.get(op) if ":" in name else None
        if isinstance(v, Uninitialised):
            raise v.error()
        result[name] = v.copy() if op.type in READS_STATE and v is not None else v
    return result


def _holder(parts: dict[str, Graph], name: str) -> str:
    op_name = name.partition(":")[0]
    for device, g in parts.items():
        if op_name in g._by_name:
            return device
    raise GraphError(f"no partition holds {name!r}")


def run_partitions(parts: dict[str, Graph], feeds: dict[str, np.ndarray], fetches: list[str],
                   states: dict[str, dict] | None = None, step_id: int = 0,
                   timeout: float = 30.0) -> dict[str, Any]:
    """Run every partition in its own thread around one rendezvous; the fetched values by name.

    ``feeds`` maps fed op names to values; ``states`` gives each device its variable store.
    The first error of any partition is raised (the others are aborted, never left waiting).
    """
    states = states if states is not None else {}
    rendezvous = Rendezvous(timeout)
    by_device: dict[str, list[str]] = {d: [] for d in parts}
    for name in fetches:
        by_device[_holder(parts, name)].append(name)
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def body(device: str) -> None:
        g = parts[device]
        mine = {k: v for k, v in feeds.items() if k in g._by_name}
        try:
            results.update(execute(g, mine, by_device[device], states.setdefault(device, {}),
                                   rendezvous, step_id))
        except BaseException as e:  # noqa: BLE001 - the step fails as a whole
            errors.append(e)
            rendezvous.abort(f"partition {device} failed: {e}")

    threads = [threading.Thread(target=body, args=(d,), daemon=True) for d in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"run_partitions: a partition still runs after {timeout + 5:g} s")
    return results
