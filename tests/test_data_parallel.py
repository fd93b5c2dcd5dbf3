"""Data-parallel training: the manual backward, bucketing, the three modes, overlap, determinism.

Independent references: finite differences for the gradients, NumPy's mean of per-shard
gradients (and MPI's own Allreduce, in tests/mpi_programs/dp_train.py) for the averaged
gradient, single-process large-batch SGD for the whole training run.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import CommError, run_threads
from reference_impl.comm.bucketing import plan_buckets
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.train.data import batch_indices, shard, synthetic_classification
from reference_impl.train.data_parallel import DataParallelTrainer, train
from reference_impl.train.determinism import (
    arrival_order_sum, max_abs_diff, params_digest, stale_sgd, sum_in_order,
)
from reference_impl.train.mlp import backward, backward_order, forward, cross_entropy, init_mlp, loss_and_grads

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)
MODES = ("overlap", "end", "per_tensor")


# --------------------------------------------------------------------------- the model


def test_gradients_match_finite_differences(rng):
    params = init_mlp((5, 7, 6, 3), seed=3, dtype=np.float64)
    for p in params[1::2]:
        p[...] = rng.standard_normal(p.shape) * 0.1  # non-zero biases exercise the ReLU masks
    x = rng.standard_normal((8, 5))
    y = rng.integers(0, 3, size=8)
    _, grads = loss_and_grads(params, x, y)
    eps = 1e-6
    for i, p in enumerate(params):
        for flat_i in rng.choice(p.size, size=min(p.size, 6), replace=False):
            where = np.unravel_index(flat_i, p.shape)
            old = p[where]
            p[where] = old + eps
            up = loss_and_grads(params, x, y)[0]
            p[where] = old - eps
            down = loss_and_grads(params, x, y)[0]
            p[where] = old
            numeric = (up - down) / (2 * eps)
            assert grads[i][where] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (i, where)


def test_backward_yields_last_layer_first_and_lazily():
    params = init_mlp((4, 8, 8, 3), seed=0)
    x = np.ones((2, 4), np.float32)
    logits, acts = forward(params, x)
    _, dlogits = cross_entropy(logits, np.array([0, 2]))
    gen = backward(params, acts, dlogits)
    first_index, _ = next(gen)
    # A generator: the first gradient is handed out before the rest of backward has run.
    assert first_index == 4 and gen.gi_frame is not None
    order = [first_index] + [i for i, _ in gen]
    assert order == backward_order(len(params)) == [4, 5, 2, 3, 0, 1]


def test_bad_model_input_is_named():
    with pytest.raises(ValueError, match="at least two positive layer widths"):
        init_mlp((4,))
    with pytest.raises(ValueError, match="layer 0 expects 4 inputs, got 5"):
        forward(init_mlp((4, 2)), np.ones((1, 5), np.float32))
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        shard(np.ones((10, 2)), np.ones(10), 0, 3)


# --------------------------------------------------------------------------- buckets


def test_plan_buckets_examples():
    assert plan_buckets([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    assert plan_buckets([4, 4, 4, 4, 4], 8) == [[0, 1], [2, 3], [4]]
    assert plan_buckets([100, 4, 4, 100], 8) == [[0], [1, 2], [3]]
    assert plan_buckets([4, 100, 4], 8) == [[0, 1], [2]]  # a big tensor closes the open bucket
    assert plan_buckets([4, 4, 4], 0) == [[0], [1], [2]]
    assert plan_buckets([4, 4, 4], 10**9) == [[0, 1, 2]]
    assert plan_buckets([], 8) == []
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="bucket_bytes must be an integer >= 0"):
            plan_buckets([4], bad)


def test_plan_buckets_properties(rng):
    for _ in range(200):
        sizes = [int(s) for s in rng.integers(0, 5000, size=int(rng.integers(0, 30)))]
        cap = int(rng.integers(0, 20000))
        plan = plan_buckets(sizes, cap)
        assert [p for b in plan for p in b] == list(range(len(sizes)))  # in order, each once
        for k, bucket in enumerate(plan):
            total = sum(sizes[p] for p in bucket)
            assert bucket
            if k < len(plan) - 1:
                assert total >= cap  # closed because it was full...
            assert total - sizes[bucket[-1]] < cap or len(bucket) == 1  # ...and not before


# --------------------------------------------------------------------------- the trainer


def _shards(widths, n, batch_per_rank, seed=0):
    x, y = synthetic_classification(256, widths[0], widths[-1], seed=seed)
    idx = batch_indices(256, batch_per_rank * n, 0, seed=seed)
    return [shard(x[idx], y[idx], r, n) for r in range(n)], (x[idx], y[idx])


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("mode", MODES)
def test_averaged_gradient_is_the_mean_of_the_shards_gradients(n, mode):
    widths = (6, 16, 16, 4)
    params = init_mlp(widths, seed=1)
    shards, _ = _shards(widths, n, 5)
    local = [loss_and_grads(params, *s)[1] for s in shards]
    expected = [np.mean(np.stack([g[i] for g in local]), axis=0) for i in range(len(params))]

    def step(comm):
        with DataParallelTrainer(comm, [p.copy() for p in params], mode=mode, bucket_bytes=300) as t:
            t.step(*shards[comm.rank])
            return [g.copy() for g in t.averaged_grads()], t.params

    for grads, new_params in run_threads(n, step, timeout=20):
        for i, (g, e) in enumerate(zip(grads, expected)):
            if n == 2:  # (a + b) / 2 is the same float in any order
                assert np.array_equal(g, e), (mode, i)
            else:
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
        for p0, p1, g in zip(params, new_params, grads):
            assert np.array_equal(p1, p0 - np.float32(0.1) * g)


def test_modes_give_identical_training_on_two_ranks_and_agree_to_rounding_beyond():
    for n, batch in ((2, 32), (3, 48)):
        final = {m: run_threads(n, lambda c, m=m: train(c, steps=15, global_batch=batch, mode=m,
                                                          bucket_bytes=3000), timeout=30)
                 for m in MODES}
        for m in MODES:
            assert len({params_digest(r.params) for r in final[m]}) == 1  # replicas agree
            diff = max_abs_diff(final[m][0].params, final["overlap"][0].params)
            assert diff == 0.0 if n == 2 else diff < 1e-5, (n, m, diff)
    # On 3 ranks the per-tensor layout puts elements in other ring chunks than the buckets do.
    assert max_abs_diff(final["per_tensor"][0].params, final["end"][0].params) > 0


def test_data_parallel_equals_large_batch_sgd_on_one_process():
    steps, global_batch = 10, 48
    single = stale_sgd(steps=steps, batch=global_batch, staleness=0)[-1]
    for n in (1, 2, 4):
        result = run_threads(n, lambda c: train(c, steps=steps, global_batch=global_batch, bucket_bytes=5000),
                             timeout=30)[0]
        diff = max_abs_diff(result.params, single)
        assert diff == 0.0 if n == 1 else diff < 1e-5, (n, diff)
        assert result.losses[-1] < 0.5 * result.losses[0]


def test_training_is_bit_for_bit_reproducible_and_rank_count_changes_the_bits():
    def digest(n, mode="overlap"):
        results = run_threads(n, lambda c: train(c, steps=15, global_batch=48, mode=mode, bucket_bytes=4000),
                              timeout=30)
        return params_digest(results[0].params), results[0].params

    first, p3 = digest(3)
    assert digest(3)[0] == first
    _, p4 = digest(4)
    assert 0 < max_abs_diff(p3, p4) < 1e-4


def test_communication_starts_before_backward_ends_only_in_overlap_mode():
    widths = (64, 512, 512, 512, 10)
    runs = {m: run_threads(2, lambda c, m=m: train(c, widths=widths, steps=8, global_batch=256, mode=m,
                                                     bucket_bytes=16384), timeout=60)
            for m in MODES}
    for r in runs["overlap"]:
        # Whether the communication thread is scheduled before backward ends depends on the
        # machine's load (2 cores, a suite running beside it): ask for one early step in eight.
        # The other modes are never early, whatever the load (below).
        early = sum(t.comm_started_before_backward_end for t in r.traces)
        assert early >= 1, [(t.buckets[0].start - t.backward_end) for t in r.traces]
        for t in r.traces:
            assert t.start < t.forward_end <= t.buckets[0].ready < t.backward_end <= t.comm_end <= t.end
            starts = [b.start for b in t.buckets]
            assert starts == sorted(starts) and all(b.ready <= b.start < b.end for b in t.buckets)
    for r in runs["end"] + runs["per_tensor"]:
        assert all(b.start >= t.backward_end for t in r.traces for b in t.buckets)


def test_trainer_rejects_bad_configuration():
    def make(comm, **kw):
        return DataParallelTrainer(comm, init_mlp((3, 2)), **kw)

    with pytest.raises(ValueError, match="unknown mode 'async'"):
        run_threads(1, lambda c: make(c, mode="async"))
    with pytest.raises(ValueError, match="bucket_bytes must be an integer"):
        run_threads(1, lambda c: make(c, bucket_bytes=-5))
    mixed = init_mlp((3, 2)) + init_mlp((2, 2), dtype=np.float64)
    with pytest.raises(TypeError, match="share one floating dtype"):
        run_threads(1, lambda c: DataParallelTrainer(c, mixed))


def test_mismatched_buckets_fail_fast_with_a_clear_error():
    """Ranks that disagree on the bucket layout must raise, not hang."""
    def body(comm):
        x, y = synthetic_classification(8, 3, 2)
        with DataParallelTrainer(comm, init_mlp((3, 8, 2)), bucket_bytes=64 if comm.rank else 0,
                                 timeout=5) as t:
            t.step(x[:4], y[:4])

    with pytest.raises(CommError, match="rank [01]"):
        run_threads(2, body, timeout=10)


# --------------------------------------------------------------------------- MPI


def test_data_parallel_on_mpi_ranks_is_reproducible_across_runs():
    cmd = mpiexec_command(2, str(ROOT / "tests" / "mpi_programs" / "dp_train.py"))
    runs = [subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT) for _ in range(2)]
    digests = []
    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
        lines = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
        digests.append(lines["DIGEST"])
        thread_level, _, early, _, late = lines["thread_level"].split()
        assert int(thread_level) >= 2  # MPI_THREAD_SERIALIZED or better
        assert int(early.split("/")[0]) >= 9 and late == "12/12", run.stdout
    assert digests[0] == digests[1]


# --------------------------------------------------------------------------- non-determinism


def test_sum_order_changes_float_results():
    a = [np.float32([1e8]), np.float32([1.0]), np.float32([-1e8])]
    assert sum_in_order(a, [0, 2, 1])[0] == 1.0
    assert sum_in_order(a, [0, 1, 2])[0] == 0.0  # 1e8 + 1 rounds back to 1e8
    with pytest.raises(ValueError, match="permutation"):
        sum_in_order(a, [0, 0, 1])


def test_arrival_order_sum_is_the_sum_in_the_order_threads_finished():
    arrays = [np.random.default_rng(i).standard_normal(500).astype(np.float32) * 10.0**i for i in range(6)]
    results = set()
    for seed in range(6):
        total, order = arrival_order_sum(arrays, jitter_s=2e-3, seed=seed)
        assert sorted(order) == list(range(6))
        assert np.array_equal(total, sum_in_order(arrays, order))
        results.add(total.tobytes())
    assert len(results) > 1  # different timings, different bits


def test_stale_gradients_change_the_trajectory():
    sync = stale_sgd(steps=8, staleness=0)
    again = stale_sgd(steps=8, staleness=0)
    stale = stale_sgd(steps=8, staleness=2)
    assert all(max_abs_diff(a, b) == 0.0 for a, b in zip(sync, again))
    assert max_abs_diff(sync[1], stale[1]) == 0.0  # step 0 uses the initial weights either way
    assert max_abs_diff(sync[2], stale[2]) > 0
    assert max_abs_diff(sync[8], stale[8]) > 1e-2
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        stale_sgd(staleness=-1)
