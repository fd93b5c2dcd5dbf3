"""Pipeline parallelism: schedules, the bubble, equality with the single-rank model, memory, and MPI ranks."""
import subprocess
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import run_threads
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.train.mlp import init_mlp, loss_and_grads
from reference_impl.train.pipeline_parallel import (bubble_fraction, data_parallel_memory, gpipe_schedule, measured_bubble,
                                           median_cost_bubble, one_f_one_b_schedule, pipeline_step, simulate,
                                           split_layers)

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent
PQ = [(1, 1), (1, 4), (2, 1), (2, 3), (3, 4), (4, 2), (4, 8), (5, 7), (8, 3)]


@pytest.mark.parametrize("p,m", PQ)
@pytest.mark.parametrize("make", [gpipe_schedule, one_f_one_b_schedule])
def test_every_stage_runs_each_forward_and_backward_once_forward_first(make, p, m):
    schedule = make(p, m)
    assert len(schedule) == p
    for s, ops in enumerate(schedule):
        assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(m))
        in_flight = peak = 0
        for kind, _ in ops:
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == (m if make is gpipe_schedule else min(p - s, m))


def test_one_f_one_b_order_for_four_stages():
    s = one_f_one_b_schedule(4, 6)
    assert s[0][:5] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0)]
    assert s[3][:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    assert s[1][-4:] == [("F", 5), ("B", 3), ("B", 4), ("B", 5)]


@pytest.mark.parametrize("p,m", PQ)
@pytest.mark.parametrize("tf,tb", [(1.0, 2.0), (1.0, 1.0), (0.3, 0.7)])
def test_simulated_bubble_and_makespan_match_the_formula(p, m, tf, tb):
    for make in (gpipe_schedule, one_f_one_b_schedule):
        result = simulate(make(p, m), tf, tb)
        assert result["makespan"] == pytest.approx((m + p - 1) * (tf + tb))
        assert result["bubble"] == pytest.approx(bubble_fraction(p, m))
    assert bubble_fraction(p, m) == pytest.approx((p - 1) / (m + p - 1))


def test_slowest_stage_sets_the_pace():
    # Stage 1 twice as slow: its m forwards and backwards are the critical path.
    result = simulate(gpipe_schedule(3, 8), [1, 2, 1], [2, 4, 2])
    assert result["makespan"] == pytest.approx(8 * 6 + 2 * 3)
    assert result["bubble"] > bubble_fraction(3, 8)


def test_a_schedule_that_deadlocks_is_reported():
    bad = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("F", 0), ("B", 0), ("B", 1)]]
    with pytest.raises(ValueError, match="schedule deadlocks"):
        simulate(bad)
    with pytest.raises(ValueError, match="runs B0 before F0"):
        simulate([[("B", 0), ("F", 0)]])
    with pytest.raises(ValueError, match="need p >= 1 stages and m >= 1"):
        gpipe_schedule(0, 3)


def test_split_layers():
    assert split_layers(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    with pytest.raises(ValueError, match="cannot split 3 layers over 4 stages"):
        split_layers(3, 4)


WIDTHS = (12, 24, 24, 24, 24, 24, 24, 24, 6)  # 8 layers


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 6])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelined_gradients_equal_the_single_rank_model(p, m, schedule):
    params = init_mlp(WIDTHS, seed=p + m, dtype=np.float64)
    rng = np.random.default_rng(m)
    x, y = rng.standard_normal((18, WIDTHS[0])), rng.integers(0, WIDTHS[-1], 18)
    loss, grads = loss_and_grads(params, x, y)
    results = run_threads(p, lambda c: pipeline_step(c, params, x, y, m, schedule), timeout=30)
    assert [r.layers for r in results] == split_layers(8, p)
    assert results[-1].loss == pytest.approx(loss, abs=1e-6) and all(r.loss is None for r in results[:-1])
    mine = [g for r in results for g in r.grads]
    assert len(mine) == len(grads)
    for a, b in zip(mine, grads):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    # Executed with unit op costs, the measured bubble is the formula's exactly.
    assert measured_bubble(results) == pytest.approx(bubble_fraction(p, m), abs=1e-12)
    assert [r.peak_stashed for r in results] == [m if schedule == "gpipe" else min(p - s, m) for s in range(p)]


def test_measured_op_costs_give_a_bubble_at_least_the_formulas():
    params = init_mlp((64,) * 9, seed=0)
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    y = np.zeros(64, np.int64)
    results = run_threads(4, lambda c: pipeline_step(c, params, x, y, 8, "1f1b", op_cost="measured"), timeout=30)
    assert all(r.busy > 0 for r in results)
    # Equal stages give the formula; real stages differ a little, which can only add idle time.
    assert median_cost_bubble(results, "1f1b") >= bubble_fraction(4, 8) - 1e-9
    assert 0 < measured_bubble(results) < 1


def test_memory_per_rank_pipeline_versus_data_parallel():
    params = init_mlp((32,) * 9, seed=0, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((64, 32))
    y = np.zeros(64, np.int64)
    p, m = 4, 8
    gp = run_threads(p, lambda c: pipeline_step(c, params, x, y, m, "gpipe"), timeout=30)
    fb = run_threads(p, lambda c: pipeline_step(c, params, x, y, m, "1f1b"), timeout=30)
    total = sum(q.nbytes for q in params)
    assert sum(r.param_bytes for r in gp) == total and max(r.param_bytes for r in gp) == total // p
    # Each stage keeps its 2 layer inputs per stashed micro-batch of 8 rows (x 32 float64).
    per_micro = 2 * 8 * 32 * 8
    assert [r.peak_stash_bytes for r in gp] == [m * per_micro] * p
    assert [r.peak_stash_bytes for r in fb] == [(p - s) * per_micro for s in range(p)]
    dp = data_parallel_memory(params, x[: 64 // p])
    assert dp["param_bytes"] == total and dp["activation_bytes"] == 8 * 16 * 32 * 8


def test_bad_input_is_named():
    params = init_mlp((4, 4, 4), seed=0)
    x, y = np.zeros((10, 4), np.float32), np.zeros(10, np.int64)
    with pytest.raises(ValueError, match="batch of 10 does not split into 3 equal micro-batches"):
        run_threads(2, lambda c: pipeline_step(c, params, x, y, 3), timeout=10)
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zigzag'"):
        run_threads(1, lambda c: pipeline_step(c, params, x, y, 2, "zigzag"), timeout=10)
    with pytest.raises(ValueError, match="cannot split 2 layers over 3 stages"):
        run_threads(3, lambda c: pipeline_step(c, params, x, y, 2), timeout=10)


@pytest.mark.parametrize("n_ranks", [3])
def test_pipeline_on_mpi_ranks_equals_the_single_process_model(n_ranks):
    run = subprocess.run(mpiexec_command(n_ranks, str(ROOT / "tests" / "mpi_programs" / "pipeline_vs_single.py")),
                         capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"OK 6 pipeline steps on {n_ranks} ranks" in run.stdout
