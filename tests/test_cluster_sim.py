"""The cluster simulator against timelines worked out by hand and the cost model's closed forms."""
from __future__ import annotations

import pytest

from reference_impl.comm.bucketing import plan_buckets
from reference_impl.comm.cluster_sim import Layer, gain_vs_ratio, scaling, simulate_step
from reference_impl.comm.cost_model import LinkParams, allreduce_time

pytestmark = pytest.mark.timeout(60)
LINK = LinkParams(alpha=1e-3, beta=1e-6)  # 1 ms per message, 1 MB/s: round numbers


def test_one_layer_cannot_overlap():
    layers = [Layer(0.010, 0.020, (1000,))]
    comm = allreduce_time("ring", 1000, 4, LINK)  # 6 ms latency + 1.5 ms bytes
    for overlap in (True, False):
        s = simulate_step(layers, 4, LINK, bucket_bytes=0, overlap=overlap, update_s=0.001)
        assert s.step_s == pytest.approx(0.030 + comm + 0.001)
        assert s.comm_s == pytest.approx(comm) and s.buckets == [(1000, 0.030, 0.030, 0.030 + comm)]


def test_three_layers_timeline_by_hand():
    """Backward of layer 2 ends at 3 ms, layer 1 at 5, layer 0 at 7; each bucket's allreduce takes 4 ms."""
    link = LinkParams(alpha=1e-3, beta=0.0)  # 2 ranks: 2 messages = 2 ms per allreduce
    layers = [Layer(0.001, 0.002, (10,)), Layer(0.0, 0.002, (10,)), Layer(0.0, 0.002, (10,))]
    ov = simulate_step(layers, 2, link, bucket_bytes=0, overlap=True)
    # ready at 3, 5, 7 ms; the link is busy 3-5, 5-7, 7-9.
    assert [t for b in ov.buckets for t in b[1:]] == pytest.approx(
        [0.003, 0.003, 0.005, 0.005, 0.005, 0.007, 0.007, 0.007, 0.009])
    assert ov.step_s == pytest.approx(0.009)
    end = simulate_step(layers, 2, link, bucket_bytes=0, overlap=False)
    assert [t for b in end.buckets for t in b[2:]] == pytest.approx([0.007, 0.009, 0.009, 0.011, 0.011, 0.013])
    assert end.step_s == pytest.approx(0.013) and end.comm_s == pytest.approx(0.006)
    # A slower link queues the buckets: each waits for the one before.
    slow = simulate_step(layers, 2, LinkParams(alpha=2e-3, beta=0.0), bucket_bytes=0, overlap=True)
    assert [s for _, _, s, _ in slow.buckets] == pytest.approx([0.003, 0.007, 0.011])
    assert slow.step_s == pytest.approx(0.015)


def test_buckets_are_the_trainers_buckets():
    layers = [Layer(0.0, 0.001, (400, 16)), Layer(0.0, 0.001, (800, 16)), Layer(0.0, 0.001, (200, 8))]
    s = simulate_step(layers, 2, LINK, bucket_bytes=500)
    sizes = [200, 8, 800, 16, 400, 16]  # production order: last layer first
    assert [b[0] for b in s.buckets] == [sum(sizes[p] for p in b) for b in plan_buckets(sizes, 500)]


def test_one_worker_never_communicates_and_overlap_never_loses():
    layers = [Layer(0.001 * i, 0.002 * i, (4096 * i, 64)) for i in range(1, 9)]
    alone = simulate_step(layers, 1, LINK, bucket_bytes=10000)
    assert alone.comm_s == 0 and alone.step_s == pytest.approx(alone.compute_s)
    for p in (2, 3, 8, 64, 1024):
        for cap in (0, 10000, 10**9):
            ov = simulate_step(layers, p, LINK, cap, overlap=True)
            end = simulate_step(layers, p, LINK, cap, overlap=False)
            assert end.step_s == pytest.approx(ov.compute_s + ov.comm_s)
            assert max(ov.compute_s, ov.forward_s + ov.comm_s) <= ov.step_s + 1e-12
            assert ov.step_s <= end.step_s + 1e-12


def test_scaling_efficiency_and_gain_peak_near_one_to_one():
    layers = [Layer(0.0005, 0.001, (250_000, 1000)) for _ in range(40)]  # 40 MB of gradients
    link = LinkParams.from_bandwidth(5e-6, 12.5e9)
    rows = scaling(layers, link, [1, 2, 16, 1024], bucket_bytes=1 << 20)
    assert rows[0]["efficiency_overlap"] == 1.0 and rows[0]["gain"] == 1.0
    assert all(r["efficiency_overlap"] >= r["efficiency_end"] for r in rows)
    assert rows[-1]["efficiency_end"] < rows[1]["efficiency_end"]  # more workers, more latency
    factors = [0.5 * 1.1**k for k in range(60)]
    curve = gain_vs_ratio(layers, 8, link, 1 << 20, factors)
    best = max(curve, key=lambda r: r["gain"])
    assert 0.7 < best["backward_ratio"] < 1.4, best  # the peak sits where backward ~ communication
    # F = B / 2 bounds the gain by (F + 2B) / (F + B) = 5/3; the last bucket's tail takes some.
    assert 1.4 < best["gain"] < 5 / 3
    assert curve[0]["gain"] < best["gain"] - 0.3 and curve[-1]["gain"] < best["gain"] - 0.25
    # Without a forward pass the bound is 2: step = C + M against max(C, M) plus the time
    # before the first bucket fills (5 of 40 layers), so about 2 / (1 + 1/8) = 1.78 at C = M.
    no_fwd = [Layer(0.0, 0.0015, (250_000, 1000)) for _ in range(40)]
    best = max(gain_vs_ratio(no_fwd, 8, link, 1 << 20, factors), key=lambda r: r["gain"])
    assert 1.7 < best["gain"] <= 2.0 and 0.8 < best["ratio"] < 1.25


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="at least one layer"):
        simulate_step([], 2, LINK, 0)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        simulate_step([Layer(0, 0, (1,))], 0, LINK, 0)
    with pytest.raises(ValueError, match="layer 0 has a negative compute time"):
        simulate_step([Layer(-1, 0, (1,))], 2, LINK, 0)
    with pytest.raises(ValueError, match="no cost model for allreduce algorithm 'magic'"):
        simulate_step([Layer(0, 0, (1,))], 2, LINK, 0, algorithm="magic")


def test_a_measured_profile_is_replayed_exactly_by_the_simulator():
    """The benchmark's bridge from trainer traces to simulator input (benchmarks/overlap.py)."""
    from benchmarks.overlap import beta_for_ratio, profile_from_traces, simulator_layers
    from reference_impl.comm import run_threads
    from reference_impl.train.data_parallel import train

    traces = run_threads(2, lambda c: train(c, widths=(16, 64, 64, 4), steps=4, global_batch=32, mode="end",
                                              bucket_bytes=8000), timeout=30)[0].traces
    profile = profile_from_traces(traces)
    assert profile["bucket_bytes"] == [b.nbytes for b in traces[0].buckets] and len(profile["bucket_bytes"]) > 1
    layers = simulator_layers(profile)
    sim = simulate_step(layers, 2, LINK, bucket_bytes=0, overlap=False, update_s=profile["update_s"])
    assert [b[0] for b in sim.buckets] == profile["bucket_bytes"]
    ready, t = [], profile["forward_s"]
    for segment in profile["segments_s"]:
        t += segment
        ready.append(t)
    assert [b[1] for b in sim.buckets] == pytest.approx(ready)
    assert sim.backward_s == pytest.approx(sum(profile["segments_s"]) + profile["tail_s"])
    for ratio in (0.5, 1.0, 3.0):
        link = LinkParams(1e-6, beta_for_ratio(profile, 2, 1e-6, ratio))
        assert simulate_step(layers, 2, link, 0).comm_s == pytest.approx(ratio * sim.backward_s)
    with pytest.raises(ValueError, match="latency alone"):
        beta_for_ratio(profile, 2, 1.0, 0.5)
