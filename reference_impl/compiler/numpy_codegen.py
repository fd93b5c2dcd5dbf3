"""NumPy target: a frozen, optimised graph as one straight-line Python function.

NumPy-only: the compiler's targets are NumPy source and C compiled for host memory.

No interpreter runs at call time: no ready queue, no per-op dictionary lookups, no
dispatch through the registry; each op is one line of NumPy. The constants (weights) are
globals of the generated module, named after their op, so the source stays short enough to
print. An op with no NumPy template calls its registered kernel (the documented fallback:
every registered op works on this target, and ``source`` shows where a kernel is called).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from reference_impl.graph import REGISTRY, Graph

from .fusion import ELEMENTWISE


def generate_numpy(graph: Graph, feeds: list[str], fetches: list[str]) -> tuple[str, dict[str, Any]]:
    """(source of ``def run(<feeds>)``, the globals it needs); it returns a tuple of the fetches.

    ``feeds`` are placeholder op names (the arguments, in order); ``fetches`` tensor names.
    """
    names: dict[Any, str] = {}  # tensor -> Python variable name
    namespace: dict[str, Any] = {"np": np}
    args = [f"x{i}" for i in range(len(feeds))]
    body: list[str] = []
    for k, op in enumerate(graph.operations):
        if not op.outputs:
            continue
        out = f"t{k}"
        ins = [names[t] for t in op.inputs]
        comment = f"  # {op.name} ({op.type})"
        if op.type == "Placeholder":
            if op.name not in feeds:
                raise ValueError(f"placeholder {op.name!r} is needed by the fetches but is not among the feeds")
            names[op.outputs[0]] = args[feeds.index(op.name)]
            continue
        if op.type == "Const":
            namespace[f"c{k}"] = op.attrs["value"]
            names[op.outputs[0]] = f"c{k}"
            continue
        if op.type == "Identity":
            names[op.outputs[0]] = ins[0]
            continue
        if op.type in ELEMENTWISE:
            body.append(f"{out} = {ELEMENTWISE[op.type][0].format(*ins)}{comment}")
        elif op.type == "FusedElementwise":
            steps: list[str] = []
            for j, (type, sargs) in enumerate(op.attrs["program"]):
                vals = [ins[i] if kind == "in" else steps[i] for kind, i in sargs]
                steps.append(f"{out}_{j}")
                body.append(f"{out}_{j} = {ELEMENTWISE[type][0].format(*vals)}"
                            f"{comment if j == len(op.attrs['program']) - 1 else ''}")
            body.append(f"{out} = {steps[-1]}")
        elif op.type == "MatMul":
            body.append(f"{out} = {ins[0]} @ {ins[1]}{comment}")
        else:  # fallback: the op's registered kernel
            namespace[f"kernel_{op.type}"] = REGISTRY[op.type].kernel
            namespace[f"attrs{k}"] = op.attrs
            body.append(f"{out} = kernel_{op.type}([{', '.join(ins)}], attrs{k}, {{}}){comment}")
        names[op.outputs[0]] = out
    results = ", ".join(f"np.asarray({names[graph.get_tensor_by_name(f)]}, "
                        f"dtype={graph.get_tensor_by_name(f).dtype!r})" for f in fetches)
    lines = [f"def run({', '.join(args)}):"] + [f"    {line}" for line in body] + [f"    return ({results},)"]
    return "\n".join(lines) + "\n", namespace
