"""Graph optimisation passes, each a function ``Graph -> Graph`` that leaves its input alone.

* ``dead_node_removal`` (pruning, DCE): keep only the ops the ``keep`` ops need, following
  data and control edges backwards (``partition.prune``, which a distributed step runs too).
  ``Session`` runs it first, which is why an unfed placeholder that no fetch needs is harmless.
* ``common_subexpression_elimination``: two ops of the same type, attributes and inputs
  compute the same value, so the later one is dropped and its users read the earlier one.
  (Not the same thing as pruning: CSE removes *duplicates* of needed work, pruning removes
  work nobody needs.)
* ``constant_folding``: an op whose inputs are all constants is run once, now, and replaced
  by a ``Const`` holding its result.

Each builds a new graph with ``rewrite.copy_op``.  Stateful ops (placeholders, variables,
assignments, NoOps) are never merged or folded, and an op whose name is in ``keep`` is never
dropped or renamed, so fetches stay valid.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from .core import Graph, Operation
from .partition import prune
from .registry import get_op_def
from .rewrite import copy_op


# --8<-- [start:passes]
def dead_node_removal(graph: Graph, keep: Iterable[str]) -> Graph:
    """A copy holding only the ops named in ``keep`` and everything they depend on.

    This is ``partition.prune`` with nothing fed (the walk backwards from the kept ops along
    data and control edges), under the signature every pass has.
    """
    return prune(graph, keep)


def _freeze(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.name, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


def common_subexpression_elimination(graph: Graph, keep: Iterable[str] = ()) -> Graph:
    """A copy in which each distinct (type, attrs, inputs, control inputs) is computed once."""
    keep = set(keep)
    new, tmap, omap = Graph(), {}, {}
    seen: dict[Any, Operation] = {}
    for op in graph.operations:
        key = (op.type, op.device, _freeze(op.attrs), tuple(id(tmap[t]) for t in op.inputs),
               tuple(sorted(id(omap[c]) for c in op.control_inputs)))
        first = seen.get(key)
        if first is not None and op.name not in keep and not get_op_def(op.type).stateful:
            omap[op] = first
            for a, b in zip(op.outputs, first.outputs):
                tmap[a] = b
            continue
        n = copy_op(new, op, tmap, omap)
        if not get_op_def(op.type).stateful:
            seen.setdefault(key, n)
    return new


def constant_folding(graph: Graph, keep: Iterable[str] = ()) -> Graph:
    """A copy in which every stateless op with only constant inputs is replaced by a Const.

    The replaced op keeps its name; constants it no longer needs stay until dead-node removal.
    """
    new, tmap, omap = Graph(), {}, {}
    for op in graph.operations:
        opdef = get_op_def(op.type)
        new_inputs = [tmap[t] for t in op.inputs]
        if (op.inputs and not opdef.stateful and opdef.num_outputs == 1 and not op.control_inputs
                and all(t.op.type == "Const" for t in new_inputs)):
            value = np.asarray(opdef.kernel([t.op.attrs["value"] for t in new_inputs], op.attrs, {}),
                               dtype=op.outputs[0].dtype)
            copy_op(new, op, tmap, omap, attrs={"value": value}, type="Const", inputs=[])
        else:
            copy_op(new, op, tmap, omap)
    return new
# --8<-- [end:passes]


PassFn = Callable[[Graph, Iterable[str]], Graph]
DEFAULT_PASSES: list[tuple[str, PassFn]] = [
    ("prune", dead_node_removal),
    ("common_subexpression_elimination", common_subexpression_elimination),
    ("constant_folding", constant_folding),
    ("dead_node_removal", dead_node_removal),
]


def optimize(graph: Graph, keep: Iterable[str],
             passes: list[tuple[str, PassFn]] | None = None) -> tuple[Graph, list[tuple[str, int, int]]]:
    """Run ``passes`` in order; returns the result and (pass, ops before, ops after) per pass."""
    keep = list(keep)
    report = []
    for name, fn in DEFAULT_PASSES if passes is None else passes:
        before = len(graph)
        graph = fn(graph, keep)
        report.append((name, before, len(graph)))
    return graph, report
