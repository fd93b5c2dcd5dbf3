"""Consistency rules on real parameter-server ranks (threads, and one mpiexec job).

The SSP bound is checked on what every read actually contained (``staleness_probe_rank``:
each worker's pushes count its steps in a shared vector), not on the servers' own clock;
backup workers must drop exactly the straggler's gradients, and with no backups must be
bit-for-bit the original BSP; ASP must let the fast workers run away from a straggler;
EASGD's centre must follow the elastic rule.
"""
import subprocess
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import run_threads
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.models import ClickLog
from reference_impl.ps import Adagrad, ClusterSpec, Consistency
from reference_impl.ps.training import (
    LocalStore,
    Pace,
    batch_slice,
    model_spec,
    run_ps_rank,
    staleness_probe_rank,
    train_local,
    train_step,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = ClickLog(vocab_size=300).sample(768, seed=5)
STRAGGLER = Pace(step_time=0.01, straggler=0, slowdown=3.0)  # worker 0 (global rank 1) is 3x slower


def probe(rule, steps=12, workers=3, pace=STRAGGLER):
    cluster = ClusterSpec(1, workers)
    return run_threads(cluster.size, staleness_probe_rank, cluster, rule, steps, pace, timeout=20)


@pytest.mark.parametrize("s", [0, 2])
def test_ssp_reads_never_miss_an_update_older_than_the_bound(s):
    ranks = probe(Consistency("ssp", staleness=s))
    server, workers = ranks[0], ranks[1:]
    leads = []
    for w, result in enumerate(workers):
        assert result["steps_done"] == 12
        for clock, count in result["reads"]:
            assert count[w] == clock  # its own pushes were acknowledged, hence applied
            assert count.min() >= clock - s, f"worker {w} at clock {clock} read {count}"
            leads.append(clock - count.min())
    assert max(leads) == s  # the straggler held the fast workers exactly at the bound
    assert all(clock - min(clocks) <= s for _, clock, clocks in server.reads)  # the server's own record


def test_asp_lets_the_fast_workers_run_ahead_of_a_3x_straggler():
    ranks = probe(Consistency("asp"))
    slow_count_seen = [result["reads"][-1][1][0] for result in ranks[2:]]  # at each fast worker's last read
    assert all(r["steps_done"] == 12 for r in ranks[1:])
    assert max(slow_count_seen) <= 9  # the fast workers reached step 11 while the straggler had done ~4
    assert max(clock - count.min() for r in ranks[2:] for clock, count in r["reads"]) > 2


def replay_rounds(spec, ids, labels, rounds, batch, n_workers, used):
    """One process applying, at step k, the summed gradients of the workers in ``rounds[k]``."""
    store = LocalStore(spec)
    for k, workers in enumerate(rounds):
        part = np.concatenate([np.arange(len(ids))[batch_slice(k, batch, len(ids), w, n_workers)] for w in workers])
        train_step(store, ids[part], labels[part], 1.0 / (batch // n_workers * used))
    return store


def test_backup_workers_apply_the_first_n_gradients_and_drop_exactly_the_late_ones():
    ids, labels = DATA
    spec, cluster, steps, batch = model_spec(4), ClusterSpec(1, 4), 8, 128
    probe_ids = np.unique(ids)
    ranks = run_threads(cluster.size, run_ps_rank, cluster, spec, ids, labels, steps, batch, True, "ps",
                        probe_ids, Consistency("backup", backups=1), Pace(0.02, straggler=0, slowdown=5.0),
                        timeout=20)
    server, done = ranks[0], [ranks[w]["steps_done"] for w in cluster.workers]
    assert len(server.rounds) == steps and all(len(used) == 3 for used in server.rounds)
    assert sum(done) == 3 * steps + len(server.dropped)  # every gradient computed was used or dropped
    assert {w for w, _ in server.dropped} == {1} and done[1:] == [steps] * 3  # only the straggler is late
    assert sum(1 in used for used in server.rounds) <= 1  # (once, at most, under a badly loaded machine)
    # The parameters are exactly what applying each step's first three gradients gives.
    replay = replay_rounds(spec, ids, labels, [[w - 1 for w in used] for used in server.rounds], batch, 4, 3)
    np.testing.assert_allclose(ranks[1]["rows"], replay.table("emb").pull(probe_ids), atol=1e-12, rtol=0)
    np.testing.assert_allclose(ranks[1]["w"], replay.dense["w"], atol=1e-12, rtol=0)


def test_backup_with_no_backups_is_exactly_bsp_and_both_equal_one_process():
    ids, labels = DATA
    spec, cluster, steps, batch = model_spec(4, Adagrad(0.2), Adagrad(0.2)), ClusterSpec(2, 3), 6, 96
    probe_ids = np.unique(ids[: steps * batch])
    jitter = Pace(0.002, straggler=1, slowdown=3.0)  # arrival order differs from rank order
    runs = [run_threads(cluster.size, run_ps_rank, cluster, spec, ids, labels, steps, batch, True, "ps", probe_ids,
                        rule, pace, timeout=20)[2]
            for rule, pace in ((None, None), (Consistency("bsp"), jitter), (Consistency("backup", backups=0), jitter))]
    for run in runs[1:]:
        for key in ("w", "b", "rows"):
            np.testing.assert_array_equal(run[key], runs[0][key])
    local = train_local(spec, ids, labels, steps, batch)
    np.testing.assert_allclose(runs[0]["rows"], local.table("emb").pull(probe_ids), atol=1e-6, rtol=0)
    np.testing.assert_allclose(runs[0]["w"], local.dense["w"], atol=1e-6, rtol=0)


def test_easgd_centre_is_the_elastic_mix_of_start_and_local_replica():
    # One worker, one exchange (tau >= steps): centre = (1 - alpha) start + alpha x_T, where
    # x_T is plain local SGD on the worker's batches, computed here in one process.
    ids, labels = DATA
    spec, steps, batch, alpha = model_spec(4), 5, 64, 0.3
    probe_ids = np.unique(ids[: steps * batch])
    got = run_threads(2, run_ps_rank, ClusterSpec(1, 1), spec, ids, labels, steps, batch, True, "ps", probe_ids,
                      Consistency("easgd", tau=steps, alpha=alpha), timeout=20)[1]
    start, x = LocalStore(spec), train_local(spec, ids, labels, steps, batch)
    for name in ("w", "b"):
        np.testing.assert_allclose(got[name], (1 - alpha) * start.dense[name] + alpha * x.dense[name], atol=1e-12)
    mix = (1 - alpha) * start.table("emb").pull(probe_ids) + alpha * x.table("emb").pull(probe_ids)
    np.testing.assert_allclose(got["rows"], mix, atol=1e-12)


def test_easgd_with_no_elastic_force_leaves_the_centre_alone_and_with_it_learns():
    ids, labels = DATA
    spec, cluster, probe_ids = model_spec(4, Adagrad(0.3), Adagrad(0.3)), ClusterSpec(2, 3), np.unique(ids)
    start = LocalStore(spec)

    def loss(r):
        table = dict(zip(probe_ids.tolist(), r["rows"]))
        z = np.array([[table[i] for i in row] for row in ids.tolist()]).sum(1) @ r["w"] + r["b"][0]
        return float(np.mean(np.logaddexp(0, z) - labels * z))

    runs = {alpha: run_threads(cluster.size, run_ps_rank, cluster, spec, ids, labels, 16, 96, True, "ps", probe_ids,
                               Consistency("easgd", tau=2, alpha=alpha), STRAGGLER, timeout=20)[2]
            for alpha in (0.0, 0.25)}
    np.testing.assert_array_equal(runs[0.0]["rows"], start.table("emb").pull(probe_ids))
    np.testing.assert_array_equal(runs[0.0]["w"], start.dense["w"])
    initial = loss({"rows": start.table("emb").pull(probe_ids), "w": start.dense["w"], "b": start.dense["b"]})
    assert loss(runs[0.25]) < initial - 0.02


def test_rules_are_checked():
    with pytest.raises(ValueError, match="unknown rule 'eventual'"):
        Consistency("eventual")
    with pytest.raises(ValueError, match="need staleness >= 0"):
        Consistency("ssp", staleness=-1)
    with pytest.raises(ValueError, match="3 backup workers leave none of the 3 workers"):
        Consistency("backup", backups=3).dropped_per_step(3)


def test_ssp_backup_and_asp_on_mpi_ranks():
    run = subprocess.run(mpiexec_command(4, str(ROOT / "tests" / "mpi_programs" / "ps_consistency.py")),
                         capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK ssp bound, asp lead, backup drops on 4 ranks" in run.stdout, run.stdout + run.stderr


def test_the_cluster_benchmark_measures_every_rule(tmp_path):
    import json

    from benchmarks import ps_cluster

    out = tmp_path / "ps_cluster.json"
    assert ps_cluster.main(["--steps", "10", "--repeats", "1", "--step-time", "0.004", "--every", "0.004",
                            "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {row["rule"]: row for row in data["rows"]}
    assert set(rows) == set(ps_cluster.RULES) and data["reference"]["median_time_to_target"] > 0
    assert data["machine"]["cores"] >= 1 and len(data["reference"]["curve_time"]) > 3
    assert rows["backup b=1"]["dropped"][0] == rows["backup b=1"]["steps_per_worker"][0][0] > 0
    assert all(r["steps_per_worker"][0] == [10] * 4 for label, r in rows.items() if label != "backup b=1")
