"""Pruning and partitioning: from one graph to one subgraph per device, joined by Send/Recv.

``prune(graph, fetches, targets, feeds)`` keeps what a step needs: walking backwards from
the fetched tensors and the target ops along data and control edges, stopping at fed ops
(a fed value replaces whatever computed it).  Everything else is never placed, shipped to a
worker or run.

``partition(placed_graph)`` cuts a graph whose ops all carry a device (``placement.place``)
into one graph per device.  Every edge that crosses devices becomes a pair of ops:

* a ``_Send`` on the producer's device, reading the tensor, and
* a ``_Recv`` on the consumer's device, producing it,

exactly one pair per distinct (source tensor, destination device): two consumers of ``x:0``
on ``worker:1`` share one ``_Recv``, so the tensor crosses the network once.  A control
edge across devices (``b`` must run after ``a``) becomes a pair too: the ``_Send`` runs
after ``a`` and sends a dummy scalar, and ``b`` gets a control input on the ``_Recv``.

The pair meets in a rendezvous under the key ``"{send_device};{recv_device};{edge};{step_id}"``
(``rendezvous_key``), the shape of TensorFlow's key; the step id keeps two steps apart.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from .core import Graph, GraphError, Operation, Tensor
from .placement import DeviceSpec
from .rewrite import copy_op

CONTROL_DTYPE = "float32"  # the dummy value a control Send carries


def rendezvous_key(send_device: str, recv_device: str, edge: str, step_id: int) -> str:
    """The name under which one step's value of one cut edge is exchanged."""
    return f"{send_device};{recv_device};{edge};{step_id}"


def prune(graph: Graph, fetches: Iterable[str], targets: Iterable[str] = (),
          feeds: Iterable[str] = ()) -> Graph:
    """A copy of ``graph`` with only the ops the fetched tensors and target ops need.

    ``fetches`` are tensor names ("op:0") or op names, ``targets`` op names, ``feeds`` the
    names of fed ops (their inputs are not followed: the fed value is used instead).
    """
    fed = {f.partition(":")[0] for f in feeds}
    needed: set[Operation] = set()
    stack = [graph.get_operation_by_name(n.partition(":")[0]) for n in (*fetches, *targets)]
    while stack:
        op = stack.pop()
        if op in needed:
            continue
        needed.add(op)
        if op.name not in fed:
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    new, tmap, omap = Graph(), {}, {}
    for op in graph.operations:
        if op in needed:
            if op.name in fed:
                copy_op(new, op, tmap, omap, inputs=[])
                new.operations[-1].control_inputs = []
            else:
                copy_op(new, op, tmap, omap)
    return new


def _label(device: str) -> str:
    spec = DeviceSpec.parse(device)
    return f"{spec.job}{spec.task}"


# --8<-- [start:partition]
def partition(graph: Graph) -> dict[str, Graph]:
    """One graph per device of the placed ``graph``, with ``_Send``/``_Recv`` on every cut edge."""
    parts: dict[str, Graph] = {}
    new_op: dict[Operation, Operation] = {}
    recvs: dict[tuple[str, str], Operation] = {}  # (edge, destination device) → its _Recv

    def part(device: str) -> Graph:
        return parts.setdefault(device, Graph())

    def cross(edge: str, src: Operation, dst_device: str, tensor: Tensor | None) -> Operation:
        """The _Recv on ``dst_device`` for ``edge``, adding the pair the first time it is asked."""
        key = (edge, dst_device)
        if key not in recvs:
            src_device, local = src.device, new_op[src]
            tag = edge.replace(":", "_").lstrip("^")
            attrs = {"tensor_name": edge, "send_device": src_device, "recv_device": dst_device}
            sender = part(src_device)
            if tensor is None:
                send = sender.add_operation("_Send", [], dict(attrs), [], control_inputs=[local],
                                            name=f"_send_{tag}_ctrl_to_{_label(dst_device)}")
                shape, dtype = [], CONTROL_DTYPE
            else:
                send = sender.add_operation("_Send", [local.outputs[tensor.index]], dict(attrs), [],
                                            name=f"_send_{tag}_to_{_label(dst_device)}")
                shape = None if tensor.shape is None else list(tensor.shape)
                dtype = tensor.dtype
            send.device = src_device
            recv = part(dst_device).add_operation(
                "_Recv", [], {**attrs, "shape": shape, "dtype": dtype},
                [(None if shape is None else tuple(shape), dtype)],
                name=f"_recv_{tag}{'_ctrl' if tensor is None else ''}_from_{_label(src_device)}")
            recv.device = dst_device
            recvs[key] = recv
        return recvs[key]

    for op in graph.operations:
        if not op.device:
            raise GraphError(f"partition: op {op.name!r} has no device; run placement.place first")
        inputs, controls = [], []
        for t in op.inputs:
            if t.op.device == op.device:
                inputs.append(new_op[t.op].outputs[t.index])
            else:
                inputs.append(cross(t.name, t.op, op.device, t).outputs[0])
        for c in op.control_inputs:
            controls.append(new_op[c] if c.device == op.device else cross(f"^{c.name}", c, op.device, None))
        n = part(op.device).add_operation(op.type, inputs, op.attrs,
                                          [(t.shape, t.dtype) for t in op.outputs], name=op.name,
                                          control_inputs=controls)
        n.device, n.colocation = op.device, op.colocation
        new_op[op] = n
    return parts
# --8<-- [end:partition]


def control_value() -> np.ndarray:
    """What a control ``_Send`` sends: a float32 zero nobody reads."""
    return np.zeros((), dtype=CONTROL_DTYPE)


def count_send_recv(parts: dict[str, Graph]) -> tuple[int, int]:
    """(number of ``_Send`` ops, number of ``_Recv`` ops) over all partitions."""
    ops = [op for g in parts.values() for op in g.operations]
    return sum(op.type == "_Send" for op in ops), sum(op.type == "_Recv" for op in ops)
