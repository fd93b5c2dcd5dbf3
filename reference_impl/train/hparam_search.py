"""Hyper-parameter search: grid, random, and successive halving.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

All three call one ``objective(config, budget) -> loss`` (lower is better): ``config`` maps
hyper-parameter names to values, ``budget`` is how much training the trial gets (steps).

* **Grid search** tries every combination of a few values per parameter.  With ``k`` values
  for each of ``d`` parameters it costs ``k^d`` trials yet tries only ``k`` distinct values of
  the one parameter that matters most.
* **Random search** (Bergstra & Bengio, 2012) draws each trial's values independently, so
  ``n`` trials try ``n`` distinct values of *every* parameter: when only a few parameters
  matter, which is the usual case, it covers them far better for the same cost.
* **Successive halving** (Jamieson & Talwalkar, 2016; the inner loop of Hyperband) spends the
  budget unevenly: train ``n`` random configurations briefly, keep the best ``1/eta``, give
  them ``eta`` times the budget, and repeat until one is left.  Bad configurations are
  usually recognisable early, so most of the compute goes to the promising ones.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

Objective = Callable[[dict[str, Any], int], float]


@dataclass(frozen=True)
class LogUniform:
    """Values whose logarithm is uniform on ``[log low, log high]`` (learning rates, decays)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError(f"LogUniform: need 0 < low < high, got {self.low} and {self.high}")

    def sample(self, rng: np.random.Generator) -> float:
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))


@dataclass(frozen=True)
class Uniform:
    """Values uniform on ``[low, high]``."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"Uniform: need low < high, got {self.low} and {self.high}")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))


@dataclass(frozen=True)
class Choice:
    """One of ``options``, each equally likely."""

    options: tuple

    def sample(self, rng: np.random.Generator) -> Any:
        return self.options[int(rng.integers(len(self.options)))]


@dataclass
class Trial:
    """One evaluated configuration: its values, the budget it was trained for, its loss."""

    config: dict[str, Any]
    budget: int
    loss: float


def _evaluate(objective: Objective, config: dict[str, Any], budget: int) -> Trial:
    loss = float(objective(config, budget))
    return Trial(config, budget, loss if math.isfinite(loss) else math.inf)  # a diverged run loses


def best(trials: list[Trial]) -> Trial:
    """The trial with the lowest loss (the first one on ties)."""
    if not trials:
        raise ValueError("best: no trials")
    return min(trials, key=lambda t: t.loss)


def grid_search(grid: dict[str, list[Any]], objective: Objective, budget: int) -> list[Trial]:
    """Every combination of ``grid``'s values, each trained for ``budget``."""
    if not grid or any(len(v) == 0 for v in grid.values()):
        raise ValueError(f"grid_search: every parameter needs at least one value, got {grid}")
    names = list(grid)
    return [_evaluate(objective, dict(zip(names, values)), budget)
            for values in itertools.product(*(grid[n] for n in names))]


def random_search(space: dict[str, Any], objective: Objective, n_trials: int, budget: int,
                  seed: int = 0) -> list[Trial]:
    """``n_trials`` configurations drawn independently from ``space`` (name -> distribution)."""
    if n_trials < 1:
        raise ValueError(f"random_search: n_trials must be >= 1, got {n_trials}")
    rng = np.random.default_rng(seed)
    return [_evaluate(objective, sample(space, rng), budget) for _ in range(n_trials)]


def sample(space: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """One configuration: each distribution sampled, each plain value used as is."""
    return {k: v.sample(rng) if hasattr(v, "sample") else v for k, v in space.items()}


# --8<-- [start:successive_halving]
def successive_halving(space: dict[str, Any], objective: Objective, n_configs: int, min_budget: int,
                       eta: int = 3, seed: int = 0) -> list[Trial]:
    """Successive halving from ``n_configs`` random configurations; returns every trial run.

    Rung ``r`` trains the survivors for ``min_budget * eta**r`` (from scratch: the objective
    has no checkpoint to resume) and keeps the best ``ceil(len / eta)``.  The last trial of
    the list is the winner's run at the largest budget.
    """
    if n_configs < 1 or min_budget < 1 or eta < 2:
        raise ValueError("successive_halving: need n_configs >= 1, min_budget >= 1 and eta >= 2, "
                         f"got {n_configs}, {min_budget}, {eta}")
    rng = np.random.default_rng(seed)
    survivors = [sample(space, rng) for _ in range(n_configs)]
    trials: list[Trial] = []
    budget = min_budget
    while True:
        rung = [_evaluate(objective, c, budget) for c in survivors]
        trials += rung
        if len(rung) == 1:
            return trials
        rung.sort(key=lambda t: t.loss)
        survivors = [t.config for t in rung[:math.ceil(len(rung) / eta)]]
        budget *= eta
# --8<-- [end:successive_halving]


def total_budget(trials: list[Trial]) -> int:
    """The compute spent: the sum of every trial's budget."""
    return sum(t.budget for t in trials)
