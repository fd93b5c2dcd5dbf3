"""Devices and the placer: decide, for every op of a graph, which device runs it.

A device string names a task of a cluster and a device on it, as in TensorFlow:
``/job:worker/replica:0/task:1/device:CPU:0``.  Users may write part of it
(``/job:ps/task:0``); ``DeviceSpec.parse`` checks the string and fills in the rest, so a
typo fails where it was written.  This runtime gives every task one device, ``CPU:0``.

``place(graph, default_device)`` returns a copy of ``graph`` in which every op has a full
device string, following three rules in this order:

1. **Colocation.** Ops that must share a device form a group: an op and the ops it names
   in ``colocation`` (``with graph.colocate_with(v)``), and a variable with every
   op that updates it (Assign, AssignAdd, AssignSub, ScatterUpdate: the ops registered with
   ``updates_variable``), since the update must run where the value lives.
   If two members of a group asked for different devices the constraint cannot be met, and
   ``PlacementError`` names both ops and both devices.
2. **An explicit request** (``with graph.device(...)``) places the op, and its whole group.
3. **Otherwise follow the data**: an op goes where its first placed input is (the cheapest
   choice: that input needs no transfer), and a source op with no inputs goes to
   ``default_device``.

TensorFlow's placer follows the same rules (plus device types and soft placement); a
cost-based placer would instead estimate op costs and transfer sizes and search.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .core import Graph, GraphError, Operation
from .registry import get_op_def
from .rewrite import copy_op

_PART = re.compile(r"^(job|replica|task|device):(.+)$")


class PlacementError(GraphError):
    """A device string is malformed, or a colocation constraint cannot be satisfied."""


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed device string: ``job``, ``replica``, ``task`` and ``device`` (type:index)."""

    job: str
    task: int
    replica: int = 0
    device: str = "CPU:0"

    @staticmethod
    def parse(text: str) -> "DeviceSpec":
        """``"/job:worker/task:1"`` → ``DeviceSpec("worker", 1)``; a clear error on anything else."""
        if not isinstance(text, str) or not text.startswith("/"):
            raise PlacementError(f"device string {text!r} must start with '/', "
                                 "e.g. '/job:worker/task:1'")
        fields: dict[str, str] = {}
        for part in text[1:].split("/"):
            m = _PART.match(part)
            if m is None:
                raise PlacementError(f"device string {text!r}: cannot read {part!r} "
                                     "(expected job:NAME, replica:N, task:N or device:CPU:N)")
            key, value = m.groups()
            if key in fields:
                raise PlacementError(f"device string {text!r} names {key} twice")
            fields[key] = value
        if "job" not in fields or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", fields["job"]):
            raise PlacementError(f"device string {text!r} needs a job name, e.g. '/job:worker/task:0'")
        for key in ("replica", "task"):
            if not fields.get(key, "0").isdigit():
                raise PlacementError(f"device string {text!r}: {key} must be a number, got {fields[key]!r}")
        device = fields.get("device", "CPU:0").upper()
        if device != "CPU:0":
            raise PlacementError(f"device string {text!r}: this runtime has one device per task, "
                                 f"'device:CPU:0', not 'device:{fields['device']}'")
        return DeviceSpec(fields["job"], int(fields.get("task", 0)), int(fields.get("replica", 0)))

    def to_string(self) -> str:
        return f"/job:{self.job}/replica:{self.replica}/task:{self.task}/device:{self.device}"

    @property
    def short(self) -> str:
        """``worker:1``: the label used in op names and pictures."""
        return f"{self.job}:{self.task}"


def canonical(device: str) -> str:
    """The full form of a device string (``/job:ps/task:0`` → ``/job:ps/replica:0/task:0/device:CPU:0``)."""
    return DeviceSpec.parse(device).to_string()


def colocation_groups(graph: Graph) -> dict[Operation, Operation]:
    """Each op → the representative op of its colocation group (union-find over the rules)."""
    parent: dict[Operation, Operation] = {op: op for op in graph.operations}

    def find(op: Operation) -> Operation:
        while parent[op] is not op:
            parent[op] = parent[parent[op]]
            op = parent[op]
        return op

    def union(a: Operation, b: Operation) -> None:
        ra, rb = find(a), find(b)
        if ra is not rb:
            parent[rb] = ra

    for op in graph.operations:
        for name in op.colocation:
            try:
                other = graph.get_operation_by_name(name)
            except GraphError:
                raise PlacementError(f"op {op.name!r} must be colocated with {name!r}, "
                                     "which is not in the graph") from None
            union(other, op)
        if get_op_def(op.type).updates_variable and op.inputs and op.inputs[0].op.type == "VariableV2":
            union(op.inputs[0].op, op)
    return {op: find(op) for op in graph.operations}


def place(graph: Graph, default_device: str = "/job:worker/task:0") -> Graph:
    """A copy of ``graph`` with a full device string on every op (rules in the module docstring)."""
    default_device = canonical(default_device)
    group = colocation_groups(graph)
    chosen: dict[Operation, tuple[str, Operation]] = {}  # group representative → (device, asked by)
    for op in graph.operations:
        if not op.device:
            continue
        try:
            device = canonical(op.device)
        except PlacementError as e:
            raise PlacementError(f"op {op.name!r}: {e}") from None
        rep = group[op]
        if rep in chosen and chosen[rep][0] != device:
            other = chosen[rep][1]
            raise PlacementError(
                f"cannot colocate {other.name!r} (asks for {chosen[rep][0]}) with {op.name!r} "
                f"(asks for {device}): they must share a device")
        chosen.setdefault(rep, (device, op))
    new, tmap, omap = Graph(), {}, {}
    for op in graph.operations:  # creation order is topological: inputs are placed first
        rep = group[op]
        if rep not in chosen:
            inputs = [omap[t.op].device for t in op.inputs]
            chosen[rep] = (inputs[0] if inputs else default_device, op)
        n = copy_op(new, op, tmap, omap)
        n.device = chosen[rep][0]
    return new
