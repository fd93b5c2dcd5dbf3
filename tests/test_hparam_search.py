"""Hyper-parameter search: what each method evaluates, at which budgets, and what it returns."""
import math

import numpy as np
import pytest

from reference_impl.train import graph_mlp as gm
from reference_impl.train import hparam_search as hs
from reference_impl.train import optimizers as opt
from reference_impl.train.data import synthetic_classification

pytestmark = pytest.mark.timeout(60)


def bowl(config, budget):
    """Loss depends on log10(lr) only (minimum at lr = 1e-2); ``noise`` is an irrelevant knob."""
    return (math.log10(config["lr"]) + 2) ** 2


def test_grid_tries_every_combination():
    trials = hs.grid_search({"lr": [1e-3, 1e-2, 1e-1], "noise": [0, 1]}, bowl, budget=5)
    assert [(t.config["lr"], t.config["noise"]) for t in trials] == [
        (1e-3, 0), (1e-3, 1), (1e-2, 0), (1e-2, 1), (1e-1, 0), (1e-1, 1)]
    assert all(t.budget == 5 for t in trials)
    assert hs.best(trials).config["lr"] == 1e-2 and hs.best(trials).loss == 0


def test_random_search_draws_from_the_distributions_reproducibly():
    space = {"lr": hs.LogUniform(1e-4, 1.0), "noise": hs.Uniform(0, 1), "act": hs.Choice(("relu", "tanh")),
             "width": 32}
    a = hs.random_search(space, lambda c, b: bowl(c, b), n_trials=400, budget=1, seed=3)
    b = hs.random_search(space, lambda c, b: bowl(c, b), n_trials=400, budget=1, seed=3)
    assert [t.config for t in a] == [t.config for t in b]
    logs = np.log10([t.config["lr"] for t in a])
    assert logs.min() >= -4 and logs.max() <= 0
    assert abs(np.mean(logs) + 2) < 0.2  # uniform in the exponent: mean -2
    assert {t.config["act"] for t in a} == {"relu", "tanh"} and {t.config["width"] for t in a} == {32}
    assert len({t.config["lr"] for t in a}) == 400  # every trial tries a new learning rate


def test_successive_halving_rungs_and_budgets():
    seen = []

    def objective(config, budget):
        seen.append(budget)
        return bowl(config, budget)

    trials = hs.successive_halving({"lr": hs.LogUniform(1e-4, 1.0), "noise": 0}, objective,
                                   n_configs=27, min_budget=2, eta=3, seed=0)
    assert seen == [2] * 27 + [6] * 9 + [18] * 3 + [54]
    assert hs.total_budget(trials) == 2 * 27 + 6 * 9 + 18 * 3 + 54
    first_rung = trials[:27]
    assert trials[-1].config == hs.best(first_rung).config  # a deterministic objective keeps its best


def test_successive_halving_beats_random_search_at_equal_budget_when_short_runs_are_informative():
    """Loss = the true quality plus noise that shrinks with the budget (noisy short runs)."""
    def noisy(config, budget, _rng=np.random.default_rng(0)):
        return bowl(config, budget) + _rng.standard_normal() / math.sqrt(budget)

    space = {"lr": hs.LogUniform(1e-4, 1.0), "noise": 0}
    sh_wins = 0
    for seed in range(10):
        sh = hs.successive_halving(space, noisy, n_configs=27, min_budget=1, eta=3, seed=seed)
        rs = hs.random_search(space, noisy, n_trials=hs.total_budget(sh) // 27, budget=27, seed=seed)
        assert hs.total_budget(rs) <= hs.total_budget(sh)
        sh_true = bowl(sh[-1].config, 0)
        rs_true = bowl(hs.best(rs).config, 0)
        sh_wins += sh_true <= rs_true
    assert sh_wins >= 6


def test_diverged_trial_loses_and_bad_arguments_are_named():
    trials = hs.grid_search({"lr": [0.1, 10.0]}, lambda c, b: float("nan") if c["lr"] > 1 else 1.0, 1)
    assert trials[1].loss == math.inf and hs.best(trials).config["lr"] == 0.1
    with pytest.raises(ValueError, match="LogUniform: need 0 < low < high"):
        hs.LogUniform(0.0, 1.0)
    with pytest.raises(ValueError, match="at least one value"):
        hs.grid_search({"lr": []}, bowl, 1)
    with pytest.raises(ValueError, match="eta >= 2"):
        hs.successive_halving({}, bowl, 9, 1, eta=1)


def test_search_on_the_real_task_finds_a_working_learning_rate():
    data = synthetic_classification(1024, 4, 6, seed=1)

    def objective(config, budget):
        model = gm.build_classifier((4, 32, 6), seed=0)
        result = gm.train_classifier(model, gm.train_with(opt.Momentum(config["lr"], 0.9)), data, budget, 64)
        return result["final_loss"]

    trials = hs.grid_search({"lr": [1e-5, 1e-1]}, objective, budget=40)
    assert trials[1].loss < trials[0].loss - 0.3  # 1e-5 barely moves in 40 steps
