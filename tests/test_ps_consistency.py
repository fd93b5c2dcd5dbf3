"""Consistency models: the SSP bound holds at every read (simulated and with real threads),
backup workers drop exactly the latecomers, and the models agree where they must."""
import threading
import time

import numpy as np
import pytest

from reference_impl.models import ClickLog
from reference_impl.models.hashed_logreg import HashedLogReg
from reference_impl.ps.consistency import simulate
from reference_impl.ps.ssp_clock import SSPClock


def small_problem(seed=0):
    return HashedLogReg(n_buckets=256, n_train=2048, n_test=512, batch=32, seed=seed,
                        log=ClickLog(vocab_size=100))


@pytest.mark.parametrize("staleness", [0, 1, 4])
def test_ssp_never_lets_a_worker_read_more_than_s_clocks_ahead(staleness):
    run = simulate("ssp", small_problem(), n_workers=4, horizon=40, staleness=staleness, slowdown=3.0)
    lags = [clock - slowest for _, clock, slowest in run.reads]
    assert max(lags) == staleness  # the bound holds, and with a 3x straggler it is reached
    assert min(lags) >= 0


def test_asp_lets_the_fast_workers_run_away_from_a_straggler():
    run = simulate("asp", small_problem(), n_workers=4, horizon=40, slowdown=3.0)
    assert max(clock - slowest for _, clock, slowest in run.reads) > 16
    assert max(run.staleness) >= 3 and all(s >= 0 for s in run.staleness)


def test_ssp_clock_blocks_real_threads_within_the_bound():
    staleness, steps = 2, 12
    clock = SSPClock(3, staleness)
    seen = []
    lock = threading.Lock()

    def worker(i):
        for _ in range(steps):
            slowest = clock.wait_to_read(i, timeout=10)
            with lock:
                seen.append((clock.clocks[i], slowest))
            time.sleep(0.004 if i == 0 else 0.0)  # worker 0 is the straggler
            clock.tick(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert clock.clocks == [steps] * 3
    assert all(mine - slowest <= staleness for mine, slowest in seen)
    assert max(mine - slowest for mine, slowest in seen) == staleness  # the fast ones did wait


def test_ssp_clock_times_out_naming_the_worker_it_waits_for():
    clock = SSPClock(3, 1)
    clock.tick(0), clock.tick(0), clock.tick(2), clock.tick(2)
    with pytest.raises(TimeoutError, match="worker 0 at clock 2 waited 0.05 s for worker 1 \\(clock 0\\)"):
        clock.wait_to_read(0, timeout=0.05)
    with pytest.raises(ValueError, match="staleness"):
        SSPClock(2, -1)


def test_backup_workers_use_the_first_n_and_drop_the_straggler():
    run = simulate("backup", small_problem(), n_workers=3, backups=1, horizon=30, straggler=0, slowdown=3.0)
    assert run.used and all(len(u) == 3 and 0 not in u for u in run.used)
    assert run.dropped == len(run.used)


def test_with_one_worker_bsp_asp_and_ssp_are_the_same_training():
    runs = [simulate(m, small_problem(), n_workers=1, horizon=20, straggler=None, staleness=0)
            for m in ("bsp", "asp", "ssp")]
    k = min(len(r.losses) for r in runs)
    assert k > 15
    for r in runs[1:]:
        np.testing.assert_allclose(r.losses[:k], runs[0].losses[:k], rtol=0, atol=1e-12)
        np.testing.assert_allclose(r.times[:k], runs[0].times[:k], rtol=0, atol=1e-12)
    assert set(runs[1].staleness) == {0}


def test_easgd_centre_moves_only_through_the_elastic_force():
    frozen = simulate("easgd", small_problem(), n_workers=2, horizon=20, alpha=0.0)
    assert len(set(frozen.losses)) == 1
    moving = simulate("easgd", small_problem(), n_workers=2, horizon=20, alpha=0.3)
    assert moving.losses[-1] < moving.losses[0] - 0.01


def test_unknown_model_is_named():
    with pytest.raises(ValueError, match="unknown consistency model 'bogus'"):
        simulate("bogus", small_problem())


def test_bsp_with_a_3x_straggler_reaches_the_same_loss_in_about_3x_the_time():
    # Every BSP round waits for the slowest worker, so a persistent 3x straggler stretches
    # each round 3x but leaves the arithmetic (and the loss after k rounds) alone: the same
    # target is reached, ~3x later. (The committed benchmark once set a target that BSP with
    # a straggler could not reach within its horizon; this pins what the figure must show.)
    free = simulate("bsp", small_problem(), n_workers=4, horizon=60, straggler=None, seed=1)
    slow = simulate("bsp", small_problem(), n_workers=4, horizon=180, straggler=0, slowdown=3.0, seed=1)
    k = min(len(slow.losses), len(free.losses))
    assert k > 50
    np.testing.assert_allclose(slow.losses[:k], free.losses[:k], rtol=0, atol=1e-12)
    target = free.mean_loss(10, 20)
    t_free, t_slow = free.time_to(target), slow.time_to(target)
    assert t_free < 20 and t_slow < 180
    assert 2.6 < t_slow / t_free < 3.2


@pytest.mark.parametrize("model", ["bsp", "asp", "ssp", "backup", "easgd"])
def test_every_model_reaches_a_reachable_target_despite_a_straggler(model):
    free = simulate("bsp", small_problem(), n_workers=4, horizon=60, straggler=None, seed=2)
    target = free.mean_loss(6, 12)
    run = simulate(model, small_problem(), n_workers=4, horizon=240, straggler=0, slowdown=3.0, seed=2)
    assert run.time_to(target) < 240, f"{model} never reached {target:.4f}; best {min(run.losses):.4f}"


def test_easgd_exchange_follows_the_published_elastic_update():
    # One worker, tau = 1: per step x <- x - lr g(x), then d = alpha (x - c); x <- x - d; c <- c + d
    # (Zhang, Choromanska and LeCun 2015, asynchronous EASGD). Replay it by hand with the same
    # gradient stream and compare the centre's loss after every exchange.
    lr, alpha = 0.5, 0.3
    run = simulate("easgd", small_problem(), n_workers=1, horizon=10, straggler=None, lr=lr, alpha=alpha, tau=1)
    replay = small_problem()
    x, c = replay.init(), replay.init()
    losses = [replay.test_loss(c)]
    assert len(run.losses) > 8
    for _ in range(len(run.losses) - 1):
        x = x - lr * replay.grad(x)
        d = alpha * (x - c)
        x, c = x - d, c + d
        losses.append(replay.test_loss(c))
    np.testing.assert_allclose(run.losses, losses, rtol=0, atol=1e-12)


def test_the_ps_room_does_not_import_the_models_room():
    """Rooms depend one way: models (Wide & Deep, the click log) build on ps, never the reverse."""
    import subprocess
    import sys

    code = ("import sys, reference_impl.ps, reference_impl.ps.consistency, reference_impl.ps.training; "
            "print(sorted(m for m in sys.modules if m.startswith('reference_impl.models')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
