"""Freezing: turn a trained graph into an inference graph whose variables are constants.

A deployed model's weights no longer change, so every ``VariableV2`` read becomes a
``Const`` holding the value the session has *now*. After that, every later pass can treat
the weights as known numbers: constant folding pre-computes anything that depends only
on them (a transposed or scaled weight matrix becomes one packed constant), and the code
generator can put them into the generated program itself.
"""
from __future__ import annotations

from typing import Iterable

from reference_impl.graph import Graph, GraphError, Session, dead_node_removal
from reference_impl.graph.registry import get_op_def
from reference_impl.graph.rewrite import copy_op


def freeze(session: Session, keep: Iterable[str]) -> Graph:
    """A copy of ``session.graph`` pruned to the ops named in ``keep``, variables as constants.

    Raises ``GraphError`` if a kept op needs an assignment (a training step is not an
    inference graph) or a variable the session has not initialised.
    """
    pruned = dead_node_removal(session.graph, keep)
    new, tmap, omap = Graph(), {}, {}
    for op in pruned.operations:
        if get_op_def(op.type).updates_variable:
            raise GraphError(f"cannot freeze: the fetches need {op.type} op {op.name!r}, which changes a "
                             "variable; fetch the inference outputs only")
        if op.type == "VariableV2":
            value = session.run(session.graph.get_operation_by_name(op.name).outputs[0])
            copy_op(new, op, tmap, omap, type="Const", inputs=[], attrs={"value": value})
        else:
            copy_op(new, op, tmap, omap)
    return new
