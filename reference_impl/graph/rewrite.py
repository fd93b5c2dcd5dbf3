"""The one helper every graph rewrite shares: copy an op into a new graph, remapping its inputs.

A pass (dead-node removal, CSE, constant folding, the compiler's simplification and
fusion, freezing), pruning and placement all build a *new* graph and leave their input
alone.  Each walks the old graph in order (a topological order) and, per op, either copies
it (``copy_op``), replaces it with something else, or forwards its outputs to an existing
tensor (``tmap[old] = new``) so that later ops read the replacement instead.
"""
from __future__ import annotations

from typing import Any

from .core import Graph, Operation, Tensor


def copy_op(new: Graph, op: Operation, tmap: dict[Tensor, Tensor], omap: dict[Operation, Operation], *,
            type: str | None = None, inputs: list[Tensor] | None = None,
            attrs: dict[str, Any] | None = None) -> Operation:
    """Add ``op`` (or a variant of it with another type/inputs/attrs) to ``new``, under its name.

    Its inputs are read through ``tmap`` (old tensor → new tensor) and its control inputs
    through ``omap`` (old op → new op; one not copied is dropped); its device and colocation
    come along.  The copy is recorded in both maps.
    """
    n = new.add_operation(type or op.type, [tmap[t] for t in op.inputs] if inputs is None else inputs,
                          op.attrs if attrs is None else attrs,
                          [(t.shape, t.dtype) for t in op.outputs], name=op.name,
                          control_inputs=[omap[c] for c in op.control_inputs if c in omap])
    n.device, n.colocation = op.device, op.colocation
    omap[op] = n
    for a, b in zip(op.outputs, n.outputs):
        tmap[a] = b
    return n


def consumers(graph: Graph) -> dict[Tensor, list[Operation]]:
    """For each tensor, the ops that read it (one entry per data edge)."""
    out: dict[Tensor, list[Operation]] = {t: [] for op in graph.operations for t in op.outputs}
    for op in graph.operations:
        for t in op.inputs:
            out[t].append(op)
    return out
