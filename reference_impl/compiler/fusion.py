"""Elementwise fusion: a chain (or tree) of elementwise ops becomes one ``FusedElementwise`` op.

Unfused, ``relu(x @ w + b) * s`` writes the sum to memory, reads it back for the relu, writes
again, reads again for the product: every elementwise op is a full pass over memory. Fused,
one loop computes all of them per element while the value is in a register. The graph
records the fused op's little program in its ``program`` attribute: a list of steps
``[op type, [argument, ...]]``, where an argument is ``["in", i]`` (input ``i`` of the fused op)
or ``["step", j]`` (the result of an earlier step); the last step is the output.

An op is absorbed into its consumer when it is elementwise, has exactly one consumer, that
consumer is elementwise too, and it is not fetched (not in ``keep``) and has no control
edges. Adding the fused op to the runtime is one ``register`` call; its interpreter kernel
runs each step with the registered kernel of the op it replaced, so it cannot disagree.
The code generators instead emit one loop (C) or one expression block (NumPy) from
``ELEMENTWISE``.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from reference_impl.graph import REGISTRY, Graph, Operation, Tensor, register
from reference_impl.graph.registry import broadcast_shapes
from reference_impl.graph.rewrite import consumers, copy_op

#: elementwise op type -> (NumPy expression, C expression for float); {0}, {1} are the operands.
ELEMENTWISE: dict[str, tuple[str, str]] = {
    "Add": ("{0} + {1}", "{0} + {1}"),
    "Sub": ("{0} - {1}", "{0} - {1}"),
    "Mul": ("{0} * {1}", "{0} * {1}"),
    "RealDiv": ("{0} / {1}", "{0} / {1}"),
    "Maximum": ("np.maximum({0}, {1})", "fmaxf({0}, {1})"),
    "Pow": ("np.power({0}, {1})", "powf({0}, {1})"),
    "Neg": ("-{0}", "-{0}"),
    "Exp": ("np.exp({0})", "expf({0})"),
    "Log": ("np.log({0})", "logf({0})"),
    "Tanh": ("np.tanh({0})", "tanhf({0})"),
    "Sigmoid": ("0.5 * (np.tanh(0.5 * {0}) + 1)", "0.5f * (tanhf(0.5f * {0}) + 1.0f)"),
    "Relu": ("np.maximum({0}, 0)", "({0} > 0.0f ? {0} : 0.0f)"),
    "Square": ("{0} * {0}", "{0} * {0}"),
    "Sqrt": ("np.sqrt({0})", "sqrtf({0})"),
}


def last_reads(program: list) -> list[list[int]]:
    """For each step, the earlier steps whose results it is the last to read (the output, the
    last step, is read by nobody inside the program and never appears)."""
    last: dict[int, int] = {}
    for s, (_type, args) in enumerate(program):
        for kind, i in args:
            if kind == "step":
                last[i] = s
    dead: list[list[int]] = [[] for _ in program]
    for i, s in last.items():
        dead[s].append(i)
    return dead


def _run_program(xs: list, attrs: dict, state: dict) -> Any:
    """Run the steps in order with their ops' registered kernels, dropping each step's result
    once its last reader has run (``frees``, worked out when the op was made; the interpreter
    does the same for whole ops): on a large batch, keeping them all would hold one array per
    step where the unfused graph holds two."""
    program = attrs["program"]
    results: list = [None] * len(program)
    for s, ((type, args), dead) in enumerate(zip(program, attrs["frees"])):
        results[s] = REGISTRY[type].kernel([xs[i] if kind == "in" else results[i] for kind, i in args], {}, {})
        for i in dead:
            results[i] = None
    return results[-1]


def _infer_program(shapes: list, dtypes: list, attrs: dict) -> tuple:
    out_shapes: list = []
    for _type, args in attrs["program"]:
        s = [shapes[i] if kind == "in" else out_shapes[i] for kind, i in args]
        out_shapes.append(s[0] if len(s) == 1 else broadcast_shapes(s[0], s[1]))
    return out_shapes[-1], dtypes[0]


register("FusedElementwise", infer=_infer_program, kernel=_run_program)


def _fusible(op: Operation) -> bool:
    return op.type in ELEMENTWISE and not op.control_inputs and len(op.outputs) == 1


def elementwise_fusion(graph: Graph, keep: Iterable[str] = ()) -> Graph:
    """A copy in which every group of two or more fusible elementwise ops is one fused op."""
    keep = set(keep)
    users = consumers(graph)
    waited_on = {c for op in graph.operations for c in op.control_inputs}  # must stay a node
    absorbed = {op for op in graph.operations
                if _fusible(op) and op.name not in keep and op not in waited_on and len(users[op.outputs[0]]) == 1
                and _fusible(users[op.outputs[0]][0])}
    new, tmap, omap = Graph(), {}, {}
    for op in graph.operations:
        if op in absorbed:
            continue  # emitted as a step of the fused op that consumes it
        if not _fusible(op) or not any(t.op in absorbed for t in op.inputs):
            copy_op(new, op, tmap, omap)
            continue
        program: list = []
        inputs: list[Tensor] = []

        def emit(o: Operation) -> list:
            args = []
            for t in o.inputs:
                if t.op in absorbed:
                    args.append(["step", emit(t.op)[1]])
                else:
                    if tmap[t] not in inputs:
                        inputs.append(tmap[t])
                    args.append(["in", inputs.index(tmap[t])])
            program.append([o.type, args])
            return ["step", len(program) - 1]

        emit(op)
        copy_op(new, op, tmap, omap, type="FusedElementwise", inputs=inputs, attrs={"program": program, "frees": last_reads(program)})
    return new
