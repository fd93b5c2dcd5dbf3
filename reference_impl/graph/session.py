"""``Session``: run a static graph.  Each distinct (fetches, feeds) signature is compiled once:

1. prune the graph to what the fetches and targets need (``passes.dead_node_removal``);
2. optimise the pruned copy (CSE, constant folding, dead-node removal);
3. build the executor plan: for each op, how many distinct producer ops it waits for
   (``pending``) and which ops wait on it.

A run then seeds a ready queue with the ops that wait on nothing, runs ops as they become
ready (each finished op decrements its consumers' pending counts), and returns the fetched
values in the structure the caller passed.  Variable values live in the session, so two
sessions on one graph have separate state, as in TensorFlow.
"""
from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from .core import Graph, GraphError, Operation, Tensor, get_default_graph
from .ops import Uninitialised, Variable
from .passes import dead_node_removal, optimize
from .registry import get_op_def


class _Plan:
    """A compiled signature: the optimised graph, and per op its producers and consumers."""

    def __init__(self, graph: Graph, report: list) -> None:
        self.graph, self.report = graph, report
        self.ops = graph.operations
        self.pending: dict[Operation, int] = {}
        self.consumers: dict[Operation, list[Operation]] = {op: [] for op in self.ops}
        for op in self.ops:
            producers = {t.op for t in op.inputs} | set(op.control_inputs)
            self.pending[op] = len(producers)
            for p in producers:
                self.consumers[p].append(op)
        self.kernels = {op: get_op_def(op.type).kernel for op in self.ops}
        # data edges out of each op: when that many consumers have run, its value can be freed
        self.uses: dict[Operation, int] = {op: 0 for op in self.ops}
        for op in self.ops:
            for t in op.inputs:
                self.uses[t.op] += 1


class Session:
    """Runs fetches of ``graph`` (the default graph if omitted).

    ``optimize=False`` skips CSE and constant folding (pruning always happens); ``debug=True``
    prints what each pass did when a signature is compiled (also kept in ``last_report``).
    """

    def __init__(self, graph: Graph | None = None, optimize: bool = True, debug: bool = False) -> None:
        self.graph = graph or get_default_graph()
        self.optimize, self.debug = optimize, debug
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
            arr = np.asarray(value, dtype=t.dtype)
            if t.shape is not None and (arr.ndim != len(t.shape) or any(
                    d is not None and d != a for d, a in zip(t.shape, arr.shape))):
                raise GraphError(f"value of shape {arr.shape} fed to {t.name}, which has shape {t.shape}")
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
            self._plans[key] = _Plan(graph, report)
        return self._plans[key]

    def run(self, fetches: Any, feed_dict: dict | None = None) -> Any:
        """Evaluate ``fetches`` (a tensor, op, variable, name, or nested list/tuple/dict of them)."""
        if self._closed:
            raise GraphError("this Session is closed")
        leaves: list = []
        template = self._flatten(fetches, leaves)
        feeds = self._feed(feed_dict or {})
        plan = self._plan(tuple(sorted({x.name.partition(":")[0] for x in leaves})), tuple(sorted(feeds)))
        self.last_report = plan.report
        values: dict[Operation, Any] = {}
        pending, uses = dict(plan.pending), dict(plan.uses)
        fetched = {plan.graph.get_operation_by_name(leaf.op.name if isinstance(leaf, Tensor) else leaf.name)
                   for leaf in leaves}
        ready = deque(op for op in plan.ops if pending[op] == 0)
        done = 0
        while ready:
            op = ready.popleft()
            if op.type == "Placeholder":
                if op.name not in feeds:
                    raise GraphError(f"placeholder {op.name!r} must be fed: the fetches depend on it")
                values[op] = feeds[op.name]
            else:
                try:
                    out = plan.kernels[op]([values[t.op] for t in op.inputs], op.attrs, self._state)
                except GraphError:
                    raise
                except Exception as e:
                    for t in op.inputs:
                        if isinstance(values[t.op], Uninitialised):
                            raise values[t.op].error() from None
                    raise GraphError(f"{op.type} op {op.name!r} failed: {e}") from e
                values[op] = out if out is None or isinstance(out, (np.ndarray, Uninitialised)) else np.asarray(out)
                for t in op.inputs:  # free each input after its last consumer (less peak memory)
                    uses[t.op] -= 1
                    if uses[t.op] == 0 and t.op not in fetched:
                        del values[t.op]
            done += 1
            for c in plan.consumers[op]:
                pending[c] -= 1
                if pending[c] == 0:
                    ready.append(c)
        if done != len(plan.ops):
            raise GraphError("the graph has a cycle; it cannot be executed")
        results = []
        for leaf in leaves:
            if isinstance(leaf, Operation):
                results.append(None)
            else:
                v = values[plan.graph.get_operation_by_name(leaf.op.name)]
                if isinstance(v, Uninitialised):
                    raise v.error()
                results.append(v.copy() if leaf.op.type in ("VariableV2", "Assign", "AssignAdd", "AssignSub") else v)
        return self._rebuild(template, results)
