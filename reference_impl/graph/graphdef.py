"""GraphDef: a graph as a language-neutral document (JSON), and back.

The document lists nodes in topological order; each node has ``name``, ``op`` (its type in
the registry), ``input`` (tensor names "op:0", and "^op" for a control input, as in
TensorFlow's GraphDef) and ``attr``, plus ``device`` and ``colocate_with`` when set.
Array-valued attributes (a constant's value) are written as
``{"tensor": {"dtype", "shape", "values"}}`` so nothing is lost: float values round-trip
exactly through JSON because Python writes the shortest repr that reads back to the same
double.  Any program in any language that can read JSON can rebuild and run the graph; loading
a document checks every reference and rejects cycles.
"""
from __future__ import annotations

import heapq
import json
from typing import Any

import numpy as np

from .core import Graph, GraphError
from .registry import get_op_def

VERSION = 1


def _attr_to_json(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return {"tensor": {"dtype": v.dtype.name, "shape": list(v.shape), "values": v.ravel().tolist()}}
    return v


def _attr_from_json(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"tensor"}:
        t = v["tensor"]
        return np.array(t["values"], dtype=t["dtype"]).reshape(t["shape"])
    return v


def as_graph_def(graph: Graph) -> dict[str, Any]:
    """The graph as a plain dict (JSON-ready)."""
    nodes = []
    for op in graph.operations:
        node = {
            "name": op.name,
            "op": op.type,
            "input": [t.name for t in op.inputs] + [f"^{c.name}" for c in op.control_inputs],
            "attr": {k: _attr_to_json(v) for k, v in op.attrs.items()},
        }
        if op.device:
            node["device"] = op.device
        if op.colocation:
            node["colocate_with"] = list(op.colocation)
        nodes.append(node)
    return {"version": VERSION, "node": nodes}


def to_json(graph: Graph) -> str:
    return json.dumps(as_graph_def(graph), indent=1)


def _topological(nodes: list[dict]) -> list[dict]:
    """Order nodes so inputs come first (Kahn's algorithm); a cycle is an error naming its nodes."""
    by_name: dict[str, dict] = {}
    for n in nodes:
        if not isinstance(n, dict) or "name" not in n or "op" not in n:
            raise GraphError(f"GraphDef node {n!r} needs at least 'name' and 'op'")
        if n["name"] in by_name:
            raise GraphError(f"GraphDef has two nodes named {n['name']!r}")
        by_name[n["name"]] = n
    deps = {}
    for n in nodes:
        srcs = set()
        for ref in n.get("input", []):
            src = ref[1:] if ref.startswith("^") else ref.partition(":")[0]
            if src not in by_name:
                raise GraphError(f"GraphDef node {n['name']!r} has input {ref!r}, but there is no node {src!r}")
            srcs.add(src)
        deps[n["name"]] = srcs
    users: dict[str, list[str]] = {k: [] for k in by_name}
    for k, srcs in deps.items():
        for s in srcs:
            users[s].append(k)
    pending = {k: len(v) for k, v in deps.items()}
    index = {n["name"]: i for i, n in enumerate(nodes)}
    ready = [(index[k], k) for k, c in pending.items() if c == 0]
    heapq.heapify(ready)  # among ready nodes, the earliest in the document first: keeps its order
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(by_name[k])
        for u in users[k]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, (index[u], u))
    if len(order) != len(nodes):
        stuck = sorted(k for k, c in pending.items() if c > 0)
        raise GraphError(f"GraphDef has a cycle: these nodes wait on each other: {', '.join(stuck)}")
    return order


def import_graph_def(graph_def: dict[str, Any] | str) -> Graph:
    """Build a new ``Graph`` from a GraphDef dict or JSON text (nodes in any order)."""
    gd = json.loads(graph_def) if isinstance(graph_def, str) else graph_def
    if not isinstance(gd, dict) or not isinstance(gd.get("node"), list):
        raise GraphError("a GraphDef is an object with a 'node' list")
    if gd.get("version", VERSION) != VERSION:
        raise GraphError(f"GraphDef version {gd.get('version')} is not supported (expected {VERSION})")
    g = Graph()
    from .ops import _infer
    for n in _topological(gd["node"]):
        opdef = get_op_def(n["op"])
        attrs = {k: _attr_from_json(v) for k, v in n.get("attr", {}).items()}
        refs = n.get("input", [])
        inputs = [g.get_tensor_by_name(r) for r in refs if not r.startswith("^")]
        controls = [g.get_operation_by_name(r[1:]) for r in refs if r.startswith("^")]
        try:
            outputs = [] if opdef.num_outputs == 0 else [_infer(n["op"], n["name"], inputs, attrs)]
        except KeyError as e:
            raise GraphError(f"GraphDef node {n['name']!r} ({n['op']}) lacks attribute {e}") from None
        if n["op"] in ("VariableV2",):
            attrs.setdefault("shared_name", n["name"])
        op = g.add_operation(n["op"], inputs, attrs, outputs, name=n["name"], control_inputs=controls)
        op.device, op.colocation = n.get("device", ""), tuple(n.get("colocate_with", ()))
    return g


def from_json(text: str) -> Graph:
    return import_graph_def(text)
