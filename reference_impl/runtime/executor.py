"""Connect the executor's ``_Send``/``_Recv`` to a step's rendezvous, and run a step's
partitions in this process.

NumPy-only: messages carry NumPy buffers between ranks (the graph executor is portable).

The executor is the graph runtime's own (``reference_impl.graph.executor``: the single
process ``Session`` runs it too).  What a distributed step adds is where a cut edge's
value goes: ``connect(rendezvous, step_id)`` gives the ``send``/``recv`` pair through which
a partition's ``_Send`` leaves its value under the edge's rendezvous key
(``"{send_device};{recv_device};{edge};{step_id}"``) and its ``_Recv`` waits for whichever
of its keys arrives first (``Rendezvous.recv_any``).  A worker passes its own ``deliver``,
which sends a value for another task straight to that task.

``run_partitions`` runs all partitions of a step in threads of this process around one
``Rendezvous``: the in-process version of a distributed step, used by tests and exercise 06.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from ..graph import Graph, GraphError, Operation, execute, rendezvous_key
from ..graph.executor import Recv, Send
from .rendezvous import Rendezvous

Deliver = Callable[[str, str, Any], None]  # (rendezvous key, receiving device, value)


def connect(rendezvous: Rendezvous, step_id: int, deliver: Deliver | None = None) -> tuple[Send, Recv]:
    """The executor's ``send`` and ``recv`` for step ``step_id``: through ``rendezvous``, or,
    for sends, through ``deliver(key, recv_device, value)``."""
    def key(op: Operation) -> str:
        return rendezvous_key(op.attrs["send_device"], op.attrs["recv_device"], op.attrs["tensor_name"], step_id)

    def send(op: Operation, value: Any) -> None:
        if deliver is None:
            rendezvous.send(key(op), value)
        else:
            deliver(key(op), op.attrs["recv_device"], value)

    def recv(ops: list[Operation]) -> tuple[Operation, Any]:
        by_key = {key(op): op for op in ops}
        arrived, value = rendezvous.recv_any(by_key)
        return by_key[arrived], value

    return send, recv


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
            values = execute(g, mine, by_device[device], states.setdefault(device, {}),
                             *connect(rendezvous, step_id))
            results.update(zip(by_device[device], values))
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
