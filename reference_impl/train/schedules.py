"""Learning-rate schedules, and the linear scaling rule for large global batches.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

A schedule maps the number of steps already taken, ``step`` (0 for the first update), to a
learning rate.  Each one is a small object with a NumPy ``__call__`` (vectorised, used by
tests and plots) and a JSON ``config()``; the graph op ``LearningRate`` holds that config as
an attribute (``reference_impl/graph/ops/training.py``) and evaluates the same formula when
a Session runs it, so there is one implementation per formula and a GraphDef with a
schedule still serialises.

Large-batch training (Goyal et al., 2017, "Accurate, Large Minibatch SGD"): multiplying the
global batch by ``k`` cuts the number of steps per epoch by ``k``; to cover the same distance
per epoch, multiply the learning rate by ``k`` too (``linear_scaling_rule``).  The scaled rate
is too large for the first steps, when the weights are random and gradients change fast, so
it is reached by a linear warm-up over the first few epochs (``LinearWarmup``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def check_learning_rate(value: float, where: str = "learning_rate") -> float:
    """``value`` as a float, or a ValueError naming it if it is NaN, infinite or negative."""
    try:
        lr = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a number, got {value!r}") from None
    if not math.isfinite(lr):
        raise ValueError(f"{where} must be finite, got {lr}")
    if lr < 0:
        raise ValueError(f"{where} must be >= 0, got {lr}")
    return lr


class Schedule:
    """Base class: ``schedule(step)`` is the learning rate for update number ``step`` (from 0)."""

    kind = ""

    def __call__(self, step: Any) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must define __call__(step)")

    def config(self) -> dict[str, Any]:
        """The schedule as JSON-friendly data (``from_config`` rebuilds it)."""
        return {"kind": self.kind, **{k: v.config() if isinstance(v, Schedule) else v
                                      for k, v in vars(self).items()}}


class Constant(Schedule):
    kind = "constant"

    def __init__(self, learning_rate: float) -> None:
        self.learning_rate = check_learning_rate(learning_rate, "Constant: learning_rate")

    def __call__(self, step: Any) -> np.ndarray:
        return np.full(np.shape(step), self.learning_rate)


class StepDecay(Schedule):
    """Multiply by ``decay_rate`` every ``decay_steps`` steps: ``lr * rate ** floor(step / steps)``."""

    kind = "step"

    def __init__(self, learning_rate: float, decay_rate: float, decay_steps: int) -> None:
        self.learning_rate = check_learning_rate(learning_rate, "StepDecay: learning_rate")
        self.decay_rate = check_learning_rate(decay_rate, "StepDecay: decay_rate")
        if int(decay_steps) < 1:
            raise ValueError(f"StepDecay: decay_steps must be >= 1, got {decay_steps}")
        self.decay_steps = int(decay_steps)

    def __call__(self, step: Any) -> np.ndarray:
        return self.learning_rate * self.decay_rate ** np.floor(np.asarray(step, dtype=np.float64) / self.decay_steps)


class ExponentialDecay(Schedule):
    """Smooth decay: ``lr * rate ** (step / decay_steps)``."""

    kind = "exponential"

    def __init__(self, learning_rate: float, decay_rate: float, decay_steps: int) -> None:
        self.learning_rate = check_learning_rate(learning_rate, "ExponentialDecay: learning_rate")
        self.decay_rate = check_learning_rate(decay_rate, "ExponentialDecay: decay_rate")
        if int(decay_steps) < 1:
            raise ValueError(f"ExponentialDecay: decay_steps must be >= 1, got {decay_steps}")
        self.decay_steps = int(decay_steps)

    def __call__(self, step: Any) -> np.ndarray:
        return self.learning_rate * self.decay_rate ** (np.asarray(step, dtype=np.float64) / self.decay_steps)


class CosineDecay(Schedule):
    """Half a cosine from ``lr`` down to ``alpha * lr`` over ``decay_steps``, then flat."""

    kind = "cosine"

    def __init__(self, learning_rate: float, decay_steps: int, alpha: float = 0.0) -> None:
        self.learning_rate = check_learning_rate(learning_rate, "CosineDecay: learning_rate")
        if int(decay_steps) < 1:
            raise ValueError(f"CosineDecay: decay_steps must be >= 1, got {decay_steps}")
        if not 0 <= alpha <= 1:
            raise ValueError(f"CosineDecay: alpha must be in [0, 1], got {alpha}")
        self.decay_steps, self.alpha = int(decay_steps), float(alpha)

    def __call__(self, step: Any) -> np.ndarray:
        progress = np.minimum(np.asarray(step, dtype=np.float64), self.decay_steps) / self.decay_steps
        cosine = 0.5 * (1 + np.cos(np.pi * progress))
        return self.learning_rate * ((1 - self.alpha) * cosine + self.alpha)


# --8<-- [start:warmup]
class LinearWarmup(Schedule):
    """Ramp linearly up to ``after`` over ``warmup_steps``: ``after(step) * (step + 1) / warmup_steps``.

    The first update uses ``1 / warmup_steps`` of the target rate; from step ``warmup_steps``
    on, ``after`` applies unchanged.
    """

    kind = "warmup"

    def __init__(self, after: Schedule | float, warmup_steps: int) -> None:
        self.after = after if isinstance(after, Schedule) else Constant(after)
        if int(warmup_steps) < 1:
            raise ValueError(f"LinearWarmup: warmup_steps must be >= 1, got {warmup_steps}")
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step: Any) -> np.ndarray:
        step = np.asarray(step, dtype=np.float64)
        return self.after(step) * np.minimum(1.0, (step + 1) / self.warmup_steps)
# --8<-- [end:warmup]


SCHEDULES = {cls.kind: cls for cls in (Constant, StepDecay, ExponentialDecay, CosineDecay, LinearWarmup)}


def from_config(config: dict[str, Any]) -> Schedule:
    """Rebuild a schedule from ``Schedule.config()``."""
    config = dict(config)
    kind = config.pop("kind", None)
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule kind {kind!r}; known: {', '.join(SCHEDULES)}")
    if kind == "warmup":
        config["after"] = from_config(config["after"])
    return SCHEDULES[kind](**config)


# --8<-- [start:linear_scaling]
def linear_scaling_rule(base_learning_rate: float, base_batch_size: int, global_batch_size: int) -> float:
    """The learning rate for ``global_batch_size``, given one tuned at ``base_batch_size``.

    ``base_lr * global / base``: with ``k`` times the batch, one step averages ``k`` times as
    many gradients, so it can take a ``k`` times longer step to keep the progress per epoch.
    """
    base = check_learning_rate(base_learning_rate, "linear_scaling_rule: base_learning_rate")
    if int(base_batch_size) < 1 or int(global_batch_size) < 1:
        raise ValueError("linear_scaling_rule: batch sizes must be >= 1, got "
                         f"base {base_batch_size} and global {global_batch_size}")
    return base * int(global_batch_size) / int(base_batch_size)
# --8<-- [end:linear_scaling]
