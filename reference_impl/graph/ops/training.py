"""Ops that training code builds: sparse (row-wise) updates, a run-time choice, and the
learning rate of a schedule.

``train/optimizers.py`` applies a gradient that arrives as ``IndexedSlices`` (the rows an
embedding lookup used) with the first three ops: ``unique_rows`` and ``sum_rows`` turn the
batch's ids into one summed gradient row per distinct id, and ``scatter_update`` writes the
updated rows back into the variable, leaving every other row (and its optimiser slots) alone.
``select_if`` lets dynamic loss scaling turn a step into a no-op at run time, and
``learning_rate`` evaluates a ``train.schedules`` schedule at the current step inside the
graph, from the schedule's JSON config (so a GraphDef holding it still serialises).

The kernels are array-API code; the row operations are ``array.segment_sum`` and
``array.scatter_rows``.
"""
from __future__ import annotations

from typing import Any

from ... import backend
from ...backend import namespace_of
from ..core import GraphError
from ..registry import ShapeError, register
from .array import scatter_rows, segment_sum
from .dispatch import INTS, apply_op
from .state import as_tensor


# ---------------------------------------------------------------- sparse updates
def _unique_rows_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    if dtypes[0] not in INTS:
        raise ShapeError(f"indices must be integers, got {dtypes[0]}")
    return (None,), dtypes[0]


def _unique_rows_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    xp = namespace_of(inputs[0])
    return xp.sort(xp.unique_values(xp.reshape(inputs[0], (-1,))))


def _sum_rows_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    values = shapes[0]
    return (None if values is None else (None,) + tuple(values[1:])), dtypes[0]


def _sum_rows_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    values, indices = inputs
    return segment_sum(values, indices)[1]  # repeated ids add up


def _scatter_update_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    return shapes[0], dtypes[0]


def _scatter_update_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    _, rows, values = inputs
    name = attrs["shared_name"]
    if name not in state:
        raise GraphError(f"variable {name!r} is not initialised: run its initializer first")
    state[name] = scatter_rows(state[name], rows, values)  # a new array, as Assign makes: earlier
    return state[name]                                     # reads keep the old value


# [indices] -> the distinct indices, sorted
register("UniqueRows", infer=_unique_rows_infer, kernel=_unique_rows_kernel)
# [values (n, ...), indices (n,)] -> one summed row per distinct index, in UniqueRows' order
register("SumRows", infer=_sum_rows_infer, kernel=_sum_rows_kernel)
# [variable, rows, values] -> the variable with those rows replaced (stored in the session)
register("ScatterUpdate", infer=_scatter_update_infer, kernel=_scatter_update_kernel, stateful=True,
         updates_variable=True)


def unique_rows(indices: Any) -> Any:
    """The distinct values of ``indices``, sorted."""
    return apply_op("UniqueRows", [as_tensor(indices)])


def sum_rows(values: Any, indices: Any) -> Any:
    """Rows of ``values`` summed per distinct index, in the order of ``unique_rows(indices)``."""
    return apply_op("SumRows", [as_tensor(values), as_tensor(indices)])


def scatter_update(variable: Any, rows: Any, values: Any) -> Any:
    """Replace rows ``rows`` of graph variable ``variable`` by ``values`` when run; placed with
    the variable, as every update is (the write must happen where the table lives)."""
    ref = as_tensor(variable)
    with ref.graph.colocate_with(ref.op):
        return apply_op("ScatterUpdate", [ref, as_tensor(rows), as_tensor(values)],
                        {"shared_name": ref.op.attrs["shared_name"]})


# ---------------------------------------------------------------- a choice made at run time
def _select_if_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    if dtypes[0] != "bool" or shapes[0] not in ((), None):
        raise ShapeError(f"the condition must be a boolean scalar, got {shapes[0]} {dtypes[0]}")
    if dtypes[1] != dtypes[2]:
        raise ShapeError(f"both branches need one dtype, got {dtypes[1]} and {dtypes[2]}")
    return shapes[1], dtypes[1]


def _select_if_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    condition, x, y = inputs
    return x if bool(condition) else y


# [condition (bool scalar), x, y] -> x if condition else y (a whole-tensor choice, made at run time)
register("SelectIf", infer=_select_if_infer, kernel=_select_if_kernel)


def select_if(condition: Any, x: Any, y: Any) -> Any:
    """``x`` if the boolean scalar ``condition`` holds when run, else ``y``."""
    return apply_op("SelectIf", [as_tensor(condition), as_tensor(x), as_tensor(y)])


# ---------------------------------------------------------------- the learning rate of a schedule
def _learning_rate_infer(shapes: list, dtypes: list, attrs: dict) -> tuple:
    if shapes[0] not in ((), None):
        raise ShapeError(f"the step must be a scalar, got shape {shapes[0]}")
    return (), attrs["dtype"]


def _learning_rate_kernel(inputs: list, attrs: dict, state: dict) -> Any:
    # The formulas live once, in train/schedules.py (NumPy, also used by tests and plots);
    # imported here, at run time, because the training package builds on this one.
    from ...train.schedules import check_learning_rate, from_config

    step = inputs[0]
    lr = float(from_config(attrs["schedule"])(step))
    check_learning_rate(lr, f"the learning rate at step {float(step):g}")
    xp = namespace_of(step)
    return xp.asarray(lr, dtype=backend.dtype(xp, attrs["dtype"]))


# [the number of steps taken (a scalar)]; attrs: {"schedule": Schedule.config(), "dtype": name}
register("LearningRate", infer=_learning_rate_infer, kernel=_learning_rate_kernel)


def learning_rate(schedule_config: dict, steps_done: Any, dtype: str) -> Any:
    """The learning rate of the schedule ``schedule_config`` after ``steps_done`` updates."""
    return apply_op("LearningRate", [as_tensor(steps_done)], {"schedule": schedule_config, "dtype": dtype})
