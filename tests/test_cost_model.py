"""Closed forms of the α–β–γ model, checked against hand-derived values and each other."""
import pytest

from reference_impl.comm.cost_model import LinkParams, allreduce_time, best_allreduce

C = LinkParams(alpha=5e-6, beta=1 / 12.5e9, gamma=1 / 50e9)


def test_ring_matches_the_derivation_on_the_concept_page():
    n, p = 100e6, 8
    expected = 2 * 7 * 5e-6 + 2 * 7 / 8 * n / 12.5e9 + 7 / 8 * n / 50e9
    assert allreduce_time("ring", n, p, C) == pytest.approx(expected)


def test_one_rank_costs_nothing():
    for algorithm in ("ring", "recursive_doubling", "rabenseifner", "tree"):
        assert allreduce_time(algorithm, 1e6, 1, C) == 0.0


def test_non_power_of_two_pays_the_fold():
    n = 1e6
    fold = 2 * (C.alpha + n * C.beta) + n * C.gamma
    assert allreduce_time("recursive_doubling", n, 6, C) == pytest.approx(
        allreduce_time("recursive_doubling", n, 4, C) + fold
    )
    assert allreduce_time("rabenseifner", n, 5, C) == pytest.approx(allreduce_time("rabenseifner", n, 4, C) + fold)


def test_small_messages_favour_few_steps_large_ones_few_bytes():
    assert best_allreduce(8, 64, C) == "recursive_doubling"
    assert best_allreduce(256e6, 64, C) in ("ring", "rabenseifner")
    # Rabenseifner moves the ring's bytes in 2 log2(p) instead of 2(p-1) steps.
    assert allreduce_time("rabenseifner", 256e6, 64, C) < allreduce_time("ring", 256e6, 64, C)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="no cost model for allreduce algorithm 'star'"):
        allreduce_time("star", 1, 2, C)
    with pytest.raises(ValueError, match="p >= 1"):
        allreduce_time("ring", 1, 0, C)
