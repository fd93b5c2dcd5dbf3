"""Parameter servers on thread ranks: server-side optimisers against their closed forms,
BSP on m workers equal to one process on the global batch, async semantics, and failures
that end the job with an error naming the rank."""
import math
import time

import numpy as np
import pytest

from reference_impl.comm import CommError, run_threads
from reference_impl.models import ClickLog
from reference_impl.ps import (FTRL, SGD, Adagrad, Adam, ClusterSpec, ParameterServer, PSClient,
                               PSError, SparseTable)
from reference_impl.ps.cluster import DATA_TAG, PUSH_SPARSE, REPLY_TAG, REQUEST_TAG
from reference_impl.ps.training import model_spec, run_ps_rank, train_local

# ---------------------------------------------------------------- closed forms, one float at a time


def sgd_closed(w, g, s, t, lr=0.2):
    return w - lr * g


def adagrad_closed(w, g, s, t, lr=0.2, a0=0.1):
    s.setdefault("acc", a0)
    s["acc"] += g * g
    return w - lr * g / math.sqrt(s["acc"])


def adam_closed(w, g, s, t, lr=0.05, b1=0.9, b2=0.999, eps=1e-8):
    s["m"] = b1 * s.get("m", 0.0) + (1 - b1) * g
    s["v"] = b2 * s.get("v", 0.0) + (1 - b2) * g * g
    return w - lr * (s["m"] / (1 - b1**t)) / (math.sqrt(s["v"] / (1 - b2**t)) + eps)


def ftrl_closed(w, g, s, t, alpha=0.3, beta=1.0, l1=0.05, l2=0.01):
    n = s.get("n", 0.0)
    sigma = (math.sqrt(n + g * g) - math.sqrt(n)) / alpha
    s["z"] = s.get("z", 0.0) + g - sigma * w
    s["n"] = n + g * g
    z = s["z"]
    if abs(z) <= l1:
        return 0.0
    return -(z - math.copysign(l1, z)) / ((beta + math.sqrt(s["n"])) / alpha + l2)


CASES = [(SGD(0.2), sgd_closed), (Adagrad(0.2, 0.1), adagrad_closed), (Adam(0.05), adam_closed),
         (FTRL(0.3, 1.0, 0.05, 0.01), ftrl_closed)]


@pytest.mark.parametrize("optimizer, closed", CASES, ids=["sgd", "adagrad", "adam", "ftrl"])
def test_sparse_rows_follow_the_closed_form_with_per_row_state(rng, optimizer, closed):
    """Rows are pushed in different steps, so Adam's per-row step count matters (lazy Adam)."""
    dim = 3
    table = SparseTable(dim, optimizer, init_scale=0.5, seed=1)
    ids = np.arange(6)
    expect = {int(i): list(row) for i, row in zip(ids, table.pull(ids))}
    state = {(i, j): {} for i in range(6) for j in range(dim)}
    steps = {i: 0 for i in range(6)}
    for _ in range(5):
        chosen = np.sort(rng.choice(6, 3, replace=False))
        grads = rng.standard_normal((3, dim))
        table.push(chosen, grads)
        for i, g in zip(chosen.tolist(), grads):
            steps[i] += 1
            for j in range(dim):
                expect[i][j] = closed(expect[i][j], float(g[j]), state[(i, j)], steps[i])
    got = table.pull(ids)
    np.testing.assert_allclose(got, [expect[i] for i in range(6)], rtol=1e-10, atol=1e-12)


def test_ftrl_l1_gives_exact_zeros():
    table = SparseTable(4, FTRL(alpha=0.1, l1=1.0), init_scale=0.0)
    table.pull([1])
    table.push([1], np.full((1, 4), 0.3))  # |z| = 0.3 <= l1: the weight is exactly zero
    assert np.all(table.pull([1]) == 0.0)


# ---------------------------------------------------------------- BSP equals one process

DATA = ClickLog(vocab_size=400).sample(1024, seed=3)


@pytest.mark.parametrize("optimizer", [c[0] for c in CASES], ids=["sgd", "adagrad", "adam", "ftrl"])
@pytest.mark.parametrize("servers, workers, dense", [(2, 2, "ps"), (3, 2, "allreduce"), (1, 4, "ps")])
def test_bsp_on_m_workers_equals_one_process_on_the_global_batch(optimizer, servers, workers, dense):
    ids, labels = DATA
    steps, batch = 5, 64
    local = train_local(model_spec(4, optimizer, optimizer), ids, labels, steps, batch)
    probe = np.unique(ids[: steps * batch])
    results = run_threads(servers + workers, run_ps_rank, ClusterSpec(servers, workers),
                          model_spec(4, optimizer, optimizer), ids, labels, steps, batch, True,
                          dense, probe, timeout=20)
    expect_rows = local.table("emb").pull(probe)
    for r in range(servers, servers + workers):
        np.testing.assert_allclose(results[r]["rows"], expect_rows, atol=1e-6, rtol=0)
        np.testing.assert_allclose(results[r]["w"], local.dense["w"], atol=1e-6, rtol=0)
        np.testing.assert_allclose(results[r]["b"], local.dense["b"], atol=1e-6, rtol=0)
    stored = sum(len(results[s].tables[0]) for s in range(servers))
    assert stored == len(probe)  # each row lives on exactly one server


def test_async_servers_apply_every_push_and_sync_ones_once_per_round():
    ids, labels = DATA
    spec = ClusterSpec(2, 3)
    for sync, updates in ((True, 4), (False, 12)):
        res = run_threads(5, run_ps_rank, spec, model_spec(2), ids, labels, 4, 96, sync, "ps", timeout=20)
        assert [s.dense_steps for s in res[:2]] == [[updates, updates]] * 2


def test_loss_falls_with_parameter_servers():
    ids, labels = DATA
    spec = model_spec(4, Adagrad(0.3), Adagrad(0.3))
    before = train_local(spec, ids, labels, 0, 128)
    res = run_threads(4, run_ps_rank, ClusterSpec(2, 2), spec, ids, labels, 24, 128, False, "ps",
                      np.unique(ids), timeout=20)

    def loss(w, b, rows):
        table = dict(zip(np.unique(ids).tolist(), rows))
        emb = np.array([[table[i] for i in row] for row in ids.tolist()])
        z = emb.sum(1) @ w + b[0]
        return float(np.mean(np.logaddexp(0, z) - labels * z))

    start = loss(before.dense["w"], before.dense["b"], before.table("emb").pull(np.unique(ids)))
    assert loss(res[2]["w"], res[2]["b"], res[2]["rows"]) < start - 0.03


# ---------------------------------------------------------------- bad input and failures


def _bad_pushes(comm, cluster, spec):
    if comm.rank in cluster.servers:
        return ParameterServer(comm, cluster, spec, sync=False).serve()
    client = PSClient(comm, cluster, spec)
    table = client.table("emb")
    table.pull(np.array([1, 2, 3]))
    messages = []
    for ids, grads in (([1, 12345], np.ones((2, 4))), ([1, 2], np.full((2, 4), np.nan))):
        with pytest.raises(PSError) as info:
            table.push(np.array(ids), grads)
        messages.append(str(info.value))
    with pytest.raises(PSError) as info:
        client.push_dense("w", np.array([0.0, np.inf, 0, 0]))
    messages.append(str(info.value))
    # A client that skips its own checks: a raw request for an id no one pulled.
    from reference_impl.ps.hashing import shard_of
    server = int(shard_of([12345], 2)[0])
    comm.send(np.array([PUSH_SPARSE, 0, 1, 0], dtype=np.int64), server, REQUEST_TAG)
    comm.send(np.array([12345], dtype=np.int64), server, DATA_TAG)
    comm.send(np.ones((1, 4)), server, DATA_TAG)
    code = np.empty(1, dtype=np.int64)
    comm.recv(code, server, REPLY_TAG)
    messages.append(int(code[0]))
    rows = table.pull(np.array([1, 2, 3]))
    client.stop()
    return messages, rows


def test_bad_pushes_are_refused_without_corrupting_any_server():
    cluster, spec = ClusterSpec(2, 1), model_spec(4)
    messages, rows = run_threads(3, _bad_pushes, cluster, spec, timeout=10)[2]
    assert "rank 2: push to table 'emb' names 1 id(s) this worker did not pull" in messages[0]
    assert "did not pull since its last push: id 12345; nothing was sent" in messages[0]
    assert "must have been pulled first in the same step" in messages[0]  # says what to do
    assert "NaN or inf" in messages[1] and "push_dense('w') has NaN or inf" in messages[2]
    assert messages[3] == 1  # the server's own check: UNKNOWN_IDS
    np.testing.assert_array_equal(rows, SparseTable(4, seed=0).pull([1, 2, 3]))
    with pytest.raises(KeyError, match="unknown sparse table 'nope'"):
        spec.sparse_index("nope")


def _server_dies(comm, cluster, spec):
    if comm.rank == 0:
        return "server 0 exits without serving"
    if comm.rank in cluster.servers:
        return None
    start = time.monotonic()
    try:
        PSClient(comm, cluster, spec).pull_dense("w")
    except CommError as exc:
        return str(exc), time.monotonic() - start
    return "no error", 0.0


def test_a_dead_server_gives_workers_an_error_naming_it_in_bounded_time():
    message, waited = run_threads(3, _server_dies, ClusterSpec(2, 1), model_spec(2), timeout=1.0)[2]
    assert "rank 2: no message from rank 0" in message
    assert waited < 3.0


def _mismatched(comm, cluster, spec):
    if comm.rank in cluster.servers:
        return ParameterServer(comm, cluster, spec, sync=True).serve()
    client = PSClient(comm, cluster, spec)
    client.pull_dense("w" if comm.rank == 1 else "b")


def test_a_synchronous_round_with_different_requests_fails_naming_the_ranks():
    with pytest.raises(RuntimeError, match=r"server rank 0: synchronous round.*rank 1: pull_dense\(0\), "
                                           r"rank 2: pull_dense\(1\)"):
        run_threads(3, _mismatched, ClusterSpec(1, 2), model_spec(2), timeout=5)


def test_roles_and_sizes_are_checked():
    with pytest.raises(ValueError, match="at least one server"):
        ClusterSpec(0, 2)

    def body(comm):
        with pytest.raises(ValueError, match="2 servers \\+ 2 workers = 4 ranks, but the job has 2"):
            PSClient(comm, ClusterSpec(2, 2), model_spec(2))
        if comm.rank == 0:
            with pytest.raises(ValueError, match="rank 0 is a server"):
                PSClient(comm, ClusterSpec(1, 1), model_spec(2))
        else:
            with pytest.raises(ValueError, match="rank 1 is a worker"):
                ParameterServer(comm, ClusterSpec(1, 1), model_spec(2))
        return "ok"

    assert run_threads(2, body, timeout=5) == ["ok", "ok"]
