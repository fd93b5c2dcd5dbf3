"""Mixture of experts (reference_impl/parallel/moe.py) and expert parallelism (expert_parallel.py).

* the layer's output is a token-by-token dense computation (NumPy GELU, each token through
  its own top-k experts, gates renormalised for k > 1), zero for fully dropped tokens;
* capacity, kept assignments and drop counts equal a direct count written as loops (GShard's
  position order: first choices, then second choices; Megatron's "probs": largest gates);
* the load-balancing loss and the z-loss equal a NumPy computation of Switch's / ST-MoE's
  formulas, group by group;
* every gradient (router, experts, input), auxiliary losses included, equals central finite
  differences with the routing held fixed (top-k and capacity are piecewise constant);
* expert parallelism on 1, 2, 4 thread ranks (E = 4, 8; k = 1, 2; uneven tokens per rank, a
  rank with none) equals the single-process layer routed with one group per rank: outputs,
  input gradients, router and expert gradients to 1e-6 (float64), each rank's bytes equal
  ``comm_bytes``' closed form; a router that sends nothing to one rank's experts (empty
  alltoallv blocks, idle experts) works too;
* the same under ``mpiexec -n 2`` and ``-n 4`` (tests/mpi_programs/expert_parallel.py);
* a rank that fails before the dispatch ends the step: on thread ranks the others get a
  CommError naming it at once, a rank that silently stops makes its peer give up after the
  communicator's timeout naming it; on MPI a process that exits makes every survivor fail
  within about ``LAB_COMM_TIMEOUT``;
* E not divisible by the ranks, bad top_k / drop policy / groups are refused with clear errors;
* ``routing_sweep`` records what capacity allows (no drops when capacity >= tokens, at least
  1 - E cap / T dropped when it is below) and repeats itself for a seed.
"""
import math
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import reference_impl.parallel.expert_parallel as xp
import reference_impl.parallel.moe as moe
from reference_impl.comm import CommError, CountingCommunicator, run_threads
from reference_impl.comm.mpi import mpiexec_command

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "mpi_programs" / "expert_parallel.py"
pytestmark = pytest.mark.timeout(120)
C = 6


def setup(k=1, E=4, cf=1.0, policy="position", z=0.0, T=12, seed=1):
    cfg = moe.MoEConfig(n_embd=C, n_experts=E, top_k=k, capacity_factor=cf, drop_policy=policy,
                        aux_loss_coeff=0.1, z_loss_coeff=z)
    params = moe.init_params(cfg, seed=seed, std=0.3, router_std=1.0)
    rng = np.random.default_rng(seed + 100)
    return cfg, params, rng.standard_normal((T, C)), rng.standard_normal((T, C))


def gelu_tanh(h):
    return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))


def direct_keep(experts, gates, cap, E, policy):
    """Kept assignments of one group, by loops: GShard order, or each expert's largest gates."""
    T, k = experts.shape
    kept = np.zeros((T, k), dtype=bool)
    if cap is None:
        return ~kept
    if policy == "position":
        load = [0] * E
        for j in range(k):
            for t in range(T):
                e = experts[t, j]
                if load[e] < cap:
                    kept[t, j], load[e] = True, load[e] + 1
    else:
        for e in range(E):
            mine = [(-gates[t, j], t, j) for t in range(T) for j in range(k) if experts[t, j] == e]
            for _, t, j in sorted(mine)[:cap]:
                kept[t, j] = True
    return kept


CASES = [(1, "position", 1.0, 0.0), (2, "position", 1.0, 1e-2), (2, "probs", 0.75, 1e-2), (3, "position", None, 0.0)]


@pytest.mark.parametrize("k,policy,cf,z", CASES)
def test_output_capacity_and_drops_match_a_direct_count(k, policy, cf, z):
    cfg, params, x, _ = setup(k, cf=cf, policy=policy, z=z)
    groups = [5, 7]
    y, cache = moe.moe_forward(params, x, cfg, groups)
    r = cache.routing
    logits = x @ params["wg"].T
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    top = np.argsort(-p, axis=1)[:, :k]
    assert np.array_equal(r.experts, top)
    s = np.take_along_axis(p, top, axis=1)
    gates = s if k == 1 else s / s.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(r.gates, gates, rtol=1e-12)
    kept, start, caps = [], 0, []
    for n in groups:
        cap = None if cf is None else math.ceil(n * k / 4 * cf)
        caps.append(cap)
        kept.append(direct_keep(top[start:start + n], gates[start:start + n], cap, 4, policy))
        start += n
    kept = np.concatenate(kept)
    assert np.array_equal(r.kept, kept)
    stats = r.stats
    assert stats.capacity == tuple(caps)
    assert stats.dropped == int((~kept).sum())
    assert stats.dropped_tokens == int((~kept.any(axis=1)).sum())
    for g, (a, b) in enumerate([(0, 5), (5, 12)]):
        assert np.array_equal(stats.routed[g], np.bincount(top[a:b].ravel(), minlength=4))
        assert np.array_equal(stats.processed[g], np.bincount(top[a:b][kept[a:b]], minlength=4))
    if cf is not None:
        assert stats.dropped > 0  # the case exercises dropping
    # a token at a time, through its own experts
    dense = np.zeros_like(x)
    for t in range(len(x)):
        for j in range(k):
            if kept[t, j]:
                e = top[t, j]
                h = x[t] @ params["c_fc.weight"][e].T + params["c_fc.bias"][e]
                dense[t] += gates[t, j] * (gelu_tanh(h) @ params["c_proj.weight"][e].T + params["c_proj.bias"][e])
    np.testing.assert_allclose(y, dense, rtol=1e-10, atol=1e-12)
    assert np.all(y[~kept.any(axis=1)] == 0.0)  # fully dropped: only the residual carries them


def test_aux_and_z_loss_match_numpy():
    for k in (1, 2):
        cfg, params, x, _ = setup(k, z=1e-2, T=20)
        groups = [8, 12]
        r = moe.route(params["wg"], x, cfg, groups)
        logits = x @ params["wg"].T
        want_aux, want_z = [], []
        for a, b in [(0, 8), (8, 20)]:
            lg = logits[a:b]
            p = np.exp(lg) / np.exp(lg).sum(axis=1, keepdims=True)
            top = np.argsort(-p, axis=1)[:, :k]
            f = np.array([(top == i).sum() for i in range(4)]) / ((b - a) * k)
            want_aux.append(0.1 * 4 * np.sum(f * p.mean(axis=0)))
            want_z.append(1e-2 * np.mean(np.log(np.exp(lg).sum(axis=1)) ** 2))
        np.testing.assert_allclose(r.aux_losses, want_aux, rtol=1e-12)
        np.testing.assert_allclose(r.z_losses, want_z, rtol=1e-12)
        assert r.aux_loss == pytest.approx(np.mean(want_aux), rel=1e-12)
    # equal probabilities: f and P uniform in the sum, so L_aux = alpha whatever f is
    cfg, params, x, _ = setup(1)
    assert moe.route(np.zeros_like(params["wg"]), x, cfg).aux_loss == pytest.approx(0.1, rel=1e-12)


@pytest.mark.parametrize("k,policy,cf,z", CASES)
def test_gradients_match_finite_differences(k, policy, cf, z):
    cfg, params, x, dy = setup(k, cf=cf, policy=policy, z=z)
    groups = [5, 7]
    y, cache = moe.moe_forward(params, x, cfg, groups)
    dx, grads = moe.moe_backward(params, dy, cache, cfg)
    fixed = cache.routing

    def loss(p, xx):
        yy, c = moe.moe_forward(p, xx, cfg, groups, fixed=fixed)
        return float((yy * dy).sum()) + c.routing.aux_loss + c.routing.z_loss

    rng, eps, worst = np.random.default_rng(3), 1e-6, 0.0
    for name in params:
        for _ in range(8):
            idx = tuple(int(rng.integers(0, s)) for s in params[name].shape)
            q = {n: v.copy() for n, v in params.items()}
            q[name][idx] += eps
            up = loss(q, x)
            q[name][idx] -= 2 * eps
            worst = max(worst, abs((up - loss(q, x)) / (2 * eps) - grads[name][idx]))
    for _ in range(12):
        idx = tuple(int(rng.integers(0, s)) for s in x.shape)
        xx = x.copy()
        xx[idx] += eps
        up = loss(params, xx)
        xx[idx] -= 2 * eps
        worst = max(worst, abs((up - loss(params, xx)) / (2 * eps) - dx[idx]))
    assert worst < 1e-7
    assert np.abs(grads["wg"]).max() > 1e-3  # the router learns (k = 1: through the Switch gate)


def run_parallel(ranks, cfg, params, x, dy, sizes):
    starts = np.concatenate([[0], np.cumsum(sizes)])

    def body(comm):
        r = comm.rank
        layer = xp.ExpertParallelMoE(comm, xp.shard_experts(params, r, comm.size), cfg)
        mine = slice(starts[r], starts[r + 1])
        b0 = comm.bytes_sent
        y = layer.forward(x[mine])
        b1 = comm.bytes_sent
        dx, grads = layer.backward(dy[mine])
        return y, dx, grads, layer.stats, layer.aux_loss, layer.z_loss, (b1 - b0, comm.bytes_sent - b1)

    return run_threads(ranks, body, timeout=30, wrap=CountingCommunicator)


@pytest.mark.parametrize("ranks,E,k", [(1, 4, 1), (2, 4, 2), (2, 8, 1), (4, 4, 1), (4, 8, 2)])
def test_expert_parallel_equals_single_process(ranks, E, k):
    cfg = moe.MoEConfig(n_embd=C, n_experts=E, top_k=k, capacity_factor=1.0, aux_loss_coeff=0.1, z_loss_coeff=1e-3)
    params = moe.init_params(cfg, seed=ranks + E + k, std=0.3, router_std=1.0)
    sizes = [9, 4, 0, 13][:ranks] if ranks == 4 else [11, 6][:ranks]
    rng = np.random.default_rng(E * k)
    x, dy = rng.standard_normal((sum(sizes), C)), rng.standard_normal((sum(sizes), C))
    y_ref, cache = moe.moe_forward(params, x, cfg, sizes)
    dx_ref, g_ref = moe.moe_backward(params, dy, cache, cfg)
    results = run_parallel(ranks, cfg, params, x, dy, sizes)
    assert np.abs(np.concatenate([r[0] for r in results]) - y_ref).max() < 1e-6
    assert np.abs(np.concatenate([r[1] for r in results]) - dx_ref).max() < 1e-6
    for r in results:  # the router gradient is summed over the ranks: the same everywhere
        assert np.abs(r[2]["wg"] - g_ref["wg"]).max() < 1e-6
    full = xp.unshard_experts([r[2] for r in results])
    assert max(float(np.abs(full[n] - g_ref[n]).max()) for n in g_ref) < 1e-6
    ref = cache.routing
    for rank, r in enumerate(results):  # each rank routed exactly its group of the reference
        assert np.array_equal(r[3].processed[0], ref.stats.processed[rank])
    assert np.mean([r[4] for r in results]) == pytest.approx(ref.aux_loss, rel=1e-12)
    assert np.mean([r[5] for r in results]) == pytest.approx(ref.z_loss, rel=1e-12)
    assert ref.stats.dropped > 0
    expected = xp.comm_bytes(ref.stats.processed, C, 8)
    assert [r[6] for r in results] == list(zip(expected["forward"], expected["backward"]))


def test_empty_blocks_when_no_token_goes_to_one_ranks_experts():
    """A constant feature and a very negative router weight on it: rank 1's experts are never chosen."""
    cfg = moe.MoEConfig(n_embd=C, n_experts=8, top_k=2, capacity_factor=None, aux_loss_coeff=0.1)
    params = moe.init_params(cfg, seed=4, std=0.3, router_std=1.0)
    params["wg"][2:4, 0] = -50.0
    rng = np.random.default_rng(9)
    x, dy = rng.standard_normal((24, C)), rng.standard_normal((24, C))
    x[:, 0] = 1.0
    sizes = [10, 0, 6, 8]
    y_ref, cache = moe.moe_forward(params, x, cfg, sizes)
    dx_ref, g_ref = moe.moe_backward(params, dy, cache, cfg)
    processed = cache.routing.stats.processed
    assert processed[:, 2:4].sum() == 0 and processed[1].sum() == 0  # rank 1 neither sends nor receives
    results = run_parallel(4, cfg, params, x, dy, sizes)
    assert np.abs(np.concatenate([r[0] for r in results]) - y_ref).max() < 1e-6
    assert np.abs(np.concatenate([r[1] for r in results]) - dx_ref).max() < 1e-6
    full = xp.unshard_experts([r[2] for r in results])
    assert max(float(np.abs(full[n] - g_ref[n]).max()) for n in g_ref) < 1e-6
    assert np.all(full["c_fc.weight"][2:4] == 0.0)  # idle experts: zero gradient
    expected = xp.comm_bytes(processed, C, 8)
    assert [r[6] for r in results] == list(zip(expected["forward"], expected["backward"]))
    # rank 1 moves only the counts forward and its share of the router allreduce backward
    assert results[1][6] == (8 * 3 * 2, 2 * 3 * 8 * C * 8 // 4)


def test_a_rank_that_fails_before_the_dispatch_ends_the_step_naming_it():
    cfg, params, x, _ = setup(2, E=8, T=16)
    seen = {}

    def body(comm):
        layer = xp.ExpertParallelMoE(comm, xp.shard_experts(params, comm.rank, comm.size), cfg)
        mine = x[4 * comm.rank:4 * comm.rank + 4]
        if comm.rank == 1:
            moe.route(params["wg"], mine, cfg)
            raise RuntimeError("expert rank 1 crashed before the dispatch")
        try:
            layer.forward(mine)
        except CommError as e:
            seen[comm.rank] = str(e)
            raise

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="expert rank 1 crashed"):
        run_threads(4, body, timeout=20)
    assert time.monotonic() - start < 5  # woken at once, not after the 20 s timeout
    assert sorted(seen) == [0, 2, 3]
    assert all("because rank 1 failed" in m for m in seen.values()), seen


def test_a_rank_that_silently_stops_makes_its_peer_give_up_within_the_timeout():
    cfg, params, x, _ = setup(1, E=4, T=8)

    def body(comm):
        if comm.rank == 1:
            return None  # gone: never joins the all-to-all
        layer = xp.ExpertParallelMoE(comm, xp.shard_experts(params, 0, 2), cfg)
        return layer.forward(x[:4])

    start = time.monotonic()
    with pytest.raises(CommError, match=r"no message from rank 1 .* after 1 s"):
        run_threads(2, body, timeout=1.0)
    assert 0.9 < time.monotonic() - start < 4


def test_experts_not_divisible_by_ranks_are_refused():
    cfg, params, _, _ = setup(1, E=6)
    with pytest.raises(ValueError, match=r"6 experts cannot be split evenly over 4 ranks"):
        xp.shard_experts(params, 0, 4)
    with pytest.raises(ValueError, match=r"6 experts cannot be split evenly over 4 ranks"):
        run_threads(4, lambda comm: xp.ExpertParallelMoE(comm, params, cfg), timeout=5)
    with pytest.raises(ValueError, match=r"expected E/ep = 6/2 = 3"):
        run_threads(2, lambda comm: xp.ExpertParallelMoE(comm, params, cfg), timeout=5)


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError, match="top_k=5 must be between 1 and n_experts=4"):
        moe.MoEConfig(n_embd=4, n_experts=4, top_k=5)
    with pytest.raises(ValueError, match="drop_policy 'random'"):
        moe.MoEConfig(n_embd=4, n_experts=4, drop_policy="random")
    with pytest.raises(ValueError, match="capacity_factor must be positive"):
        moe.MoEConfig(n_embd=4, n_experts=4, capacity_factor=0.0)
    cfg, params, x, _ = setup(1)
    with pytest.raises(ValueError, match=r"group_sizes \[5, 5\] must be >= 0 and add up to the 12 tokens"):
        moe.moe_forward(params, x, cfg, [5, 5])
    with pytest.raises(ValueError, match=r"x must be \(tokens, n_embd=6\)"):
        moe.moe_forward(params, x[:, :4], cfg)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("ranks", [2, 4])
def test_mpi_expert_parallel_equals_single_process(ranks):
    run = subprocess.run(mpiexec_command(ranks, str(PROGRAM)), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    m = re.search(r"EP ranks=(\d+) sizes=\[[\d, ]*\] maxdiff=(\S+) dropped=(\d+) .* ok", run.stdout)
    assert m, run.stdout + run.stderr
    assert int(m.group(1)) == ranks and float(m.group(2)) < 1e-6 and int(m.group(3)) > 0


@pytest.mark.timeout(60)
def test_mpi_rank_that_exits_fails_every_survivor_within_the_timeout():
    command = mpiexec_command(4, str(PROGRAM), "die")
    command.insert(1, "-disable-auto-cleanup")  # MPICH would otherwise kill the survivors at once
    run = subprocess.run(command, capture_output=True, text=True, timeout=45, cwd=ROOT,
                         env={**os.environ, "LAB_COMM_TIMEOUT": "2"})
    out = run.stdout + run.stderr
    assert run.returncode == 3, out  # the dead rank's exit code
    survivors = re.findall(r"SURVIVOR rank=(\d) seconds=(\S+) error=(.*?) END", run.stdout, re.S)
    assert sorted(int(r) for r, _, _ in survivors) == [0, 1, 2], out
    for _, seconds, error in survivors:
        assert 1.9 < float(seconds) < 4.5, out  # the communicator's timeout bounds the wait
        assert "still waiting for a message from rank" in error, out
    # a survivor waits for the dead rank, or for a survivor stuck on it: at least one names it
    assert any("from rank 3 " in error for _, _, error in survivors), out


def test_routing_sweep_records_what_capacity_allows():
    kw = dict(capacity_factors=(0.5, 8.0), aux_coeffs=(0.0, 1e-2), n_experts=8, steps=12, tokens=64, tail=4)
    rows = moe.routing_sweep(**kw)
    runs = [(r["aux_loss_coeff"], r["capacity_factor"]) for r in rows]
    assert runs == [(0.0, 0.5), (0.0, 8.0), (1e-2, 0.5), (1e-2, 8.0)]
    for r in rows:
        assert len(r["dropped"]) == len(r["max_load"]) == len(r["loss"]) == 12
        assert all(1.0 <= load <= 8.0 for load in r["max_load"])
        if r["capacity_factor"] == 8.0:  # capacity = 64 tokens: nothing can be dropped
            assert r["dropped"] == [0.0] * 12
        else:  # capacity 4 x 8 experts = 32 of 64 assignments at most
            assert min(r["dropped"]) >= 0.5
        assert r["loss_last"] < r["loss_first"]
    again = moe.routing_sweep(**kw)
    assert [r["dropped"] for r in again] == [r["dropped"] for r in rows]
