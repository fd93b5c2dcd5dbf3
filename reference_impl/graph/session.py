"""``Session``: run a static graph.  Each distinct (fetches, feeds) signature is compiled once:

1. prune the graph to what the fetches and targets need (``passes.dead_node_removal``);
2. optimise the pruned copy (CSE, constant folding, dead-node removal).

A run is then flatten → plan → execute → rebuild: the fetches (a nested structure) become
a list of names, the signature's optimised graph is looked up, the one ``executor`` runs it
(the same one the distributed workers run), and the values go back into the structure the
caller passed.  Variable values live in the session, so two sessions on one graph have
separate state, as in TensorFlow.

A session runs on one array namespace, ``device`` (``backend.get_namespace``: "cpu" is
NumPy, the default; "gpu", "torch", "strict"). The kernels are array-API code that follows
its inputs, so placing a graph on a device is only putting its inputs there: the feeds go
through ``xp.asarray``, and each compiled signature holds its constants as ``xp`` arrays,
moved once, as TensorFlow keeps a constant in the memory of the device its op runs on.
Fetched values are arrays of that namespace (``backend.to_numpy`` brings them back).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backend
from .core import Graph, GraphError, Operation, Tensor, get_default_graph
from .executor import execute
from .ops import Variable
from .passes import dead_node_removal, optimize


@dataclass(frozen=True)
class _Plan:
    """A compiled signature: the optimised graph the executor runs, and what each pass did."""

    graph: Graph
    report: list[tuple[str, int, int]]

    @property
    def ops(self) -> list[Operation]:
        return self.graph.operations


class Session:
    """Runs fetches of ``graph`` (the default graph if omitted).

    ``optimize=False`` skips CSE and constant folding (pruning always happens); ``debug=True``
    prints what each pass did when a signature is compiled (also kept in ``last_report``).
    ``device`` names the array namespace the graph runs on (see the module's docstring).
    """

    def __init__(self, graph: Graph | None = None, optimize: bool = True, debug: bool = False,
                 device: str = "cpu") -> None:
        self.graph = graph or get_default_graph()
        self.optimize, self.debug = optimize, debug
        self.device, self.xp = device, backend.get_namespace(device)
        self._state: dict[str, np.ndarray] = {}
        self._plans: dict[tuple, _Plan] = {}
        self._closed = False
        self.last_report: list[tuple[str, int, int]] = []

    # -- lifecycle
    def close(self) -> None:
        """Free the variables' values and compiled plans; later runs are errors."""
        self._state.clear()
        self._plans.clear()
        self._closed = True

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- resolving user arguments
    def _tensor_or_op(self, f: Any) -> Tensor | Operation:
        if isinstance(f, Variable):
            f = f.value()
        if isinstance(f, str):
            return self.graph.get_operation_by_name(f) if ":" not in f else self.graph.get_tensor_by_name(f)
        if isinstance(f, (Tensor, Operation)):
            if f.graph is not self.graph:
                raise GraphError(f"cannot fetch {f.name}: it belongs to another graph than this session's")
            return f
        raise GraphError(f"cannot fetch a {type(f).__name__} ({f!r}): expected a Tensor, Operation, "
                         "Variable or name")

    def _flatten(self, fetches: Any, out: list) -> Any:
        """Collect leaf fetches into ``out``; return a template to rebuild the structure."""
        if isinstance(fetches, (list, tuple)):
            return type(fetches), [self._flatten(f, out) for f in fetches]
        if isinstance(fetches, dict):
            return dict, {k: self._flatten(v, out) for k, v in fetches.items()}
        out.append(self._tensor_or_op(fetches))
        return None, len(out) - 1

    def _rebuild(self, template: Any, values: list) -> Any:
        kind, body = template
        if kind is None:
            return values[body]
        if kind is dict:
            return {k: self._rebuild(v, values) for k, v in body.items()}
        return kind(self._rebuild(v, values) for v in body)

    def _feed(self, feed_dict: dict) -> dict[str, np.ndarray]:
        feeds = {}
        for key, value in (feed_dict or {}).items():
            if isinstance(key, str):
                t = self.graph.get_tensor_by_name(key)
            elif isinstance(key, Tensor):
                if key.graph is not self.graph:
                    raise GraphError(f"cannot feed {key.name}: it belongs to another graph")
                t = key
            else:
                raise GraphError(f"feed_dict keys must be placeholders, got {key!r}")
            if t.op.type != "Placeholder":
                raise GraphError(f"cannot feed {t.name}: only placeholders can be fed, it is a {t.op.type}")
            arr = (np.asarray(value, dtype=t.dtype) if backend.is_numpy(self.xp)
                   else self.xp.asarray(value, dtype=backend.dtype(self.xp, t.dtype)))
            if t.shape is not None and (arr.ndim != len(t.shape) or any(
                    d is not None and d != a for d, a in zip(t.shape, arr.shape))):
                raise GraphError(f"value of shape {tuple(arr.shape)} fed to {t.name}, which has shape {t.shape}")
            feeds[t.op.name] = arr
        return feeds

    # -- running
    def _plan(self, names: tuple[str, ...], feeds: tuple[str, ...]) -> _Plan:
        key = (names, feeds)
        if key not in self._plans:
            passes = None if self.optimize else [("prune", dead_node_removal)]
            graph, report = optimize(self.graph, set(names), passes)
            if self.debug:
                for name, before, after in report:
                    print(f"[Session] {name}: {before} -> {after} ops")
            if not backend.is_numpy(self.xp):
                _place_constants(graph, self.xp)
            self._plans[key] = _Plan(graph, report)
        return self._plans[key]

    def run(self, fetches: Any, feed_dict: dict | None = None) -> Any:
        """Evaluate ``fetches`` (a tensor, op, variable, name, or nested list/tuple/dict of them)."""
        if self._closed:
            raise GraphError("this Session is closed")
        leaves: list = []
        template = self._flatten(fetches, leaves)
        feeds = self._feed(feed_dict or {})
        names = [leaf.name for leaf in leaves]
        plan = self._plan(tuple(sorted({name.partition(":")[0] for name in names})), tuple(sorted(feeds)))
        self.last_report = plan.report
        return self._rebuild(template, execute(plan.graph, feeds, names, self._state))


def _place_constants(graph: Graph, xp: Any) -> None:
    """Hold every ``Const`` of a compiled signature's graph (the session's own copy) as an
    array of ``xp``: the values move to the device once, not at every run."""
    for op in graph.operations:
        if op.type == "Const":
            op.attrs = {**op.attrs, "value": xp.asarray(op.attrs["value"])}
