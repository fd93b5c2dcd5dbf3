"""The distributed session (reference_impl/runtime) on thread ranks: a master and 2-4 workers.

Results are compared bit for bit with the single-process ``Session`` on random DAGs;
caching is checked by counting partitionings; every misuse and failure is a clear error,
and a failed or silent worker ends the step within a bounded time.
"""
from __future__ import annotations

import pickle
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import reference_impl.graph as G
from reference_impl.comm import Communicator, run_threads
from reference_impl.runtime import (MASTER_RANK, ClusterSpec, DistributedSession, Master, SessionError,
                                    StepError, Worker, run_cluster, serve_rank)
from reference_impl.runtime.channel import PEER_TAG
from reference_impl.runtime import messages as m

sys.path.insert(0, str(Path(__file__).parent / "mpi_programs"))
from distributed_dags import check_against_session, random_dag

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("n_workers, n_dags", [(2, 34), (3, 33), (4, 33)])
def test_random_dags_are_bit_identical_to_the_single_process_session(n_workers, n_dags):
    cluster = ClusterSpec.workers(n_workers)

    def client(master):
        rng = np.random.default_rng(100 + n_workers)
        cut = 0
        for _ in range(n_dags):
            dag = random_dag(rng, cluster.devices, n_ops=int(rng.integers(6, 14)))
            check_against_session(lambda g: DistributedSession(master, g), dag)
            cut += sum(p.send_recv_pairs for s in master.sessions.values() for p in s.plans.values())
        return cut

    assert run_cluster(client, cluster, timeout=20) == 0  # closed sessions keep no plans
    # (the pairs themselves are counted in tests/test_graph_partition.py)


class Traffic(Communicator):
    """Wraps a thread rank's communicator and logs every message it sends or receives:
    (direction, this rank, peer, tag, bytes, payload), in one log shared by all ranks."""

    def __init__(self, inner, log, lock):
        self.inner, self.rank, self.size, self.log, self.lock = inner, inner.rank, inner.size, log, lock

    def send(self, buf, dest, tag=0):
        with self.lock:
            self.log.append(("send", self.rank, dest, tag, buf.nbytes, np.array(buf, copy=True)))
        self.inner.send(buf, dest, tag)

    def recv(self, buf, source, tag=0):
        self.inner.recv(buf, source, tag)
        with self.lock:
            self.log.append(("recv", self.rank, source, tag, buf.nbytes, None))

    def barrier(self):
        self.inner.barrier()


def test_cut_edge_tensors_go_worker_to_worker_once_per_step_and_never_through_the_master():
    """Three workers, three cut edges of 400 kB each: per step, each edge's tensor is one
    message from its producer's rank to its consumer's rank on the peer tag, and the master
    (rank 0) sends and receives none of it, only requests and a scalar fetch."""
    n = 50_000
    g = G.Graph()
    with g.as_default():
        with g.device("/job:worker/task:0"):
            a = G.tanh(G.constant(np.linspace(-1.0, 1.0, n)), name="a")
        with g.device("/job:worker/task:1"):
            b = G.square(a, name="b")
        with g.device("/job:worker/task:2"):
            total = G.reduce_sum(G.add(a, b, name="c"), name="total")
    want = float(np.sum(np.tanh(np.linspace(-1.0, 1.0, n)) + np.tanh(np.linspace(-1.0, 1.0, n)) ** 2))
    cluster = ClusterSpec.workers(3)
    log, lock = [], threading.Lock()

    def client(master):
        sess = DistributedSession(master, g)
        steps = []
        for _ in range(3):  # the first step also registers the partitions; the others reuse them
            start = len(log)
            got = sess.run(total)
            with lock:
                steps.append((sess.last_step_id, got, log[start:]))
        sess.close()
        return steps

    steps = run_threads(cluster.size, serve_rank, cluster, client, timeout=10,
                        wrap=lambda c: Traffic(c, log, lock))[MASTER_RANK]
    ranks = {d: cluster.rank_of(d) for d in cluster.devices}
    w0, w1, w2 = (ranks[f"/job:worker/replica:0/task:{k}/device:CPU:0"] for k in range(3))
    tensor_bytes = n * 8
    for step_id, got, traffic in steps:
        np.testing.assert_allclose(got, want, rtol=1e-12)
        # the master's whole share of the step: far less than one cut-edge tensor, none on the peer tags
        master = [t for t in traffic if t[1] == MASTER_RANK]
        assert not [t for t in master if t[3] in (PEER_TAG, PEER_TAG + 1)]
        if step_id > 1:  # (step 1 also carries the partitions' GraphDefs, constant included)
            assert sum(t[4] for t in master) < tensor_bytes / 20
        # every peer-tag message, decoded: which edge of which step went from where to where
        sent = [(src, dst, pickle.loads(payload.tobytes())) for kind, src, dst, tag, _, payload in traffic
                if kind == "send" and tag == PEER_TAG + 1]
        assert sorted((src, dst, msg.key.split(";")[2]) for src, dst, msg in sent) == \
            sorted([(w0, w1, "a:0"), (w0, w2, "a:0"), (w1, w2, "b:0")])
        for src, dst, msg in sent:
            assert isinstance(msg, m.TensorMessage) and msg.step_id == step_id and msg.key.endswith(f";{step_id}")
            assert msg.value.nbytes == tensor_bytes
        payload = [t[4] for t in traffic if t[0] == "send" and t[3] == PEER_TAG + 1]
        assert all(tensor_bytes < p < tensor_bytes + 1024 for p in payload)  # the tensor once, plus a header
        received = sorted((t[2], t[1]) for t in traffic if t[0] == "recv" and t[3] == PEER_TAG + 1)
        assert received == sorted([(w0, w1), (w0, w2), (w1, w2)])  # each taken once, by its consumer


def _counter_graph():
    g = G.Graph()
    with g.as_default():
        with g.device("/job:worker/task:1"):
            count = G.Variable(0.0, name="count")
        x = G.placeholder("float32", [], name="x")
        with g.device("/job:worker/task:0"):
            y = G.square(x, name="y")
        bump = count.assign_add(y)
    return g, count, x, y, bump


def test_a_repeated_step_reuses_its_partitions_and_variables_persist():
    g, count, x, y, bump = _counter_graph()

    def client(master):
        sess = DistributedSession(master, g)
        s = master.sessions[sess.handle]
        sess.run(count.initializer)
        assert s.partition_count == 1
        values = [sess.run(bump, {x: 2.0}) for _ in range(3)]
        ids = [sess.last_step_id]
        assert s.partition_count == 2  # one new signature; the two repeats re-partition nothing
        sess.run(bump, {x: 3.0})  # new values, same signature
        ids.append(sess.last_step_id)
        assert s.partition_count == 2 and ids[1] > ids[0]
        assert sess.run({"c": count, "y": y}, {x: 1.0}) == {"c": 21.0, "y": 1.0}
        assert s.partition_count == 3
        sess.close()
        return values

    assert run_cluster(client, ClusterSpec.workers(2), timeout=10) == [4.0, 8.0, 12.0]


def test_extend_session_sends_new_nodes_and_refuses_a_stale_version():
    g, count, x, y, bump = _counter_graph()

    def client(master):
        sess = DistributedSession(master, g)
        assert sess.version == 0
        with g.as_default(), g.device("/job:worker/task:1"):
            z = G.neg(y, name="z")  # added after the session was created
        assert sess.run(z, {x: 3.0}) == -9.0
        assert sess.version == 1
        with pytest.raises(SessionError, match="version 0 is stale.*at version 1"):
            master.extend_session(m.ExtendSessionRequest(sess.handle, {"node": []}, 0))
        sess.close()

    run_cluster(client, ClusterSpec.workers(2), timeout=10)


def test_misuse_is_a_clear_error():
    g, count, x, y, bump = _counter_graph()
    other = G.Graph()
    with other.as_default():
        stranger = G.constant(1.0, name="stranger")

    def client(master):
        sess = DistributedSession(master, g)
        with pytest.raises(G.GraphError, match="cannot feed y:0: only placeholders can be fed, it is a Square"):
            sess.run(bump, {y: 1.0})
        with pytest.raises(G.GraphError, match="no operation named 'nothing'"):
            sess.run("nothing:0")
        with pytest.raises(G.GraphError, match="cannot fetch stranger:0: it belongs to another graph"):
            sess.run(stranger)
        # the master checks too, for clients that are not this Python front end
        with pytest.raises(G.GraphError, match="cannot feed y:0: only placeholders"):
            master.run_step(m.RunStepRequest(sess.handle, {"y:0": np.float32(1)}, ["y:0"], []))
        with pytest.raises(G.GraphError, match="no operation named 'nothing'"):
            master.run_step(m.RunStepRequest(sess.handle, {}, ["nothing:0"], []))
        with pytest.raises(G.GraphError, match="placeholder 'x' must be fed"):
            sess.run(y)
        with g.as_default(), g.device("/job:worker/task:7"):
            far = G.neg(x, name="far")
        with pytest.raises(G.PlacementError, match="task:7.* is not in the cluster"):
            sess.run(far, {x: 1.0})
        sess.close()
        with pytest.raises(G.GraphError, match=r"DistributedSession \(session-\w+\) is closed"):
            sess.run(y, {x: 1.0})
        with pytest.raises(SessionError, match="is closed"):
            master.run_step(m.RunStepRequest(sess.handle, {"x:0": np.float32(1)}, ["y:0"], []))
        with pytest.raises(SessionError, match="no session with handle 'bogus'"):
            master.run_step(m.RunStepRequest("bogus", {}, [], []))

    run_cluster(client, ClusterSpec.workers(2), timeout=10)


def test_close_session_frees_worker_graphs_and_variables_but_not_a_shared_container():
    g, count, x, y, bump = _counter_graph()
    workers: dict[int, Worker] = {}

    def rank(comm):
        cluster = ClusterSpec.workers(2)
        if comm.rank != MASTER_RANK:
            workers[comm.rank] = Worker(comm, cluster)
            workers[comm.rank].serve()
            return None
        master = Master(comm, cluster)
        try:
            private, shared = DistributedSession(master, g), DistributedSession(master, g, container="shared")
            for sess in (private, shared):
                sess.run(count.initializer)
                sess.run(bump, {x: 2.0})
            held = {r: (len(w.graphs), sorted(w.containers)) for r, w in workers.items()}
            private.close()
            after_private = {r: (len(w.graphs), sorted(w.containers)) for r, w in workers.items()}
            shared.close()
            after_shared = {r: (len(w.graphs), sorted(w.containers)) for r, w in workers.items()}
            return private.handle, held, after_private, after_shared
        finally:
            master.shutdown()

    handle, held, after_private, after_shared = run_threads(3, rank, timeout=10)[0]
    # per session: worker 1 (rank 2, holding count) got the initializer's and the bump's
    # partitions, worker 0 (rank 1, computing y) only the bump's
    assert held == {1: (2, [handle, "shared"]), 2: (4, [handle, "shared"])}
    assert after_private == {1: (1, ["shared"]), 2: (2, ["shared"])}
    assert after_shared == {1: (0, ["shared"]), 2: (0, ["shared"])}


RELEASE = threading.Event()
if "_TestFail" not in G.REGISTRY:
    class WorkerKilled(BaseException):
        """Not an Exception: the worker's loop does not catch it, so its rank dies."""

    def _fail_kernel(xs, attrs, state):
        if attrs["how"] == "raise":
            raise ValueError("injected failure")
        if attrs["how"] == "hang":  # silent until the test releases it (or 10 s pass)
            RELEASE.wait(10)
            return xs[0]
        raise WorkerKilled("worker process killed")

    G.register("_TestFail", infer=G.like_input(), kernel=_fail_kernel)


def _build_failing(how):
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", [2], name="x")
        with g.device("/job:worker/task:0"):
            a = G.exp(x, name="a")
        with g.device("/job:worker/task:1"):
            bad = G.apply_op("_TestFail", [a], {"how": how}, name="bad")
        with g.device("/job:worker/task:0"):
            out = G.add(a, bad, name="out")  # worker 0 waits for worker 1's tensor
    return g, x, a, out


def test_a_worker_that_raises_fails_the_step_naming_the_worker_and_the_op():
    g, x, a, out = _build_failing("raise")

    def client(master):
        sess = DistributedSession(master, g)
        start = time.monotonic()
        with pytest.raises(StepError, match=r"worker /job:worker/replica:0/task:1/device:CPU:0 \(rank 2\) failed: "
                                            r"GraphError: _TestFail op 'bad' failed: injected failure"):
            sess.run(out, {x: [0.0, 1.0]})
        assert time.monotonic() - start < 2  # worker 0 was told to abort, not left to time out
        np.testing.assert_array_equal(sess.run(a, {x: [0.0, 0.0]}), [1.0, 1.0])  # the cluster still works
        sess.close()

    run_cluster(client, ClusterSpec.workers(2), timeout=10)


def test_a_silent_worker_is_reported_within_the_timeout_then_marked_unavailable():
    g, x, a, out = _build_failing("hang")
    RELEASE.clear()
    seen = {}

    def client(master):
        sess = DistributedSession(master, g)
        start = time.monotonic()
        try:
            with pytest.raises(StepError, match=r"worker /job:worker/replica:0/task:1/device:CPU:0 \(rank 2\) "
                                                r"did not answer RunGraph") as failed:
                sess.run(out, {x: [0.0, 1.0]})
            seen["error"] = str(failed.value)
            seen["waited"] = time.monotonic() - start
            start = time.monotonic()
            with pytest.raises(StepError, match="task:1/device:CPU:0 is unavailable"):
                sess.run(out, {x: [0.0, 1.0]})
            seen["second"] = time.monotonic() - start
            sess.close()  # frees what the live worker holds, skips the silent one
        finally:
            RELEASE.set()  # let the silent worker finish, so that the job can end

    # the communicator's timeout (3 s) bounds every wait; run_threads allows the job 1.1 x that
    run_cluster(client, ClusterSpec.workers(2), timeout=3.0)
    assert 2.9 < seen["waited"] < 3.3 and seen["second"] < 0.1
    # worker 0 waited for the silent worker's tensor, and its own error names that peer and the key
    w0, w1 = "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"
    assert f"no tensor arrived within 2.7 s for '{w1};{w0};bad:0;1' from peer {w1} (rank 2)" in seen["error"]


def test_a_worker_that_dies_mid_step_is_an_error_on_the_client_not_a_hang():
    g, x, a, out = _build_failing("die")
    seen = {}

    def client(master):
        start = time.monotonic()
        try:
            DistributedSession(master, g).run(out, {x: [0.0, 1.0]})
        except StepError as e:
            seen["error"], seen["seconds"] = str(e), time.monotonic() - start

    with pytest.raises(BaseException, match="worker process killed"):  # the dead rank's own failure
        run_cluster(client, ClusterSpec.workers(2), timeout=5)
    assert "worker /job:worker/replica:0/task:1/device:CPU:0 (rank 2) did not answer RunGraph" in seen["error"]
    assert "rank 2 failed" in seen["error"] and seen["seconds"] < 2


def _regression_data(rng, n=8):
    X = rng.normal(size=(n, 3))
    return X, X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=n)


def test_in_graph_replication_averages_tower_gradients_on_the_ps():
    """One client graph: w on the ps, a tower per worker on half the batch, mean gradient on ps."""
    rng = np.random.default_rng(0)
    X, Y = _regression_data(rng)
    g = G.Graph()
    with g.as_default():
        with g.device("/job:ps/task:0"):
            w = G.Variable(np.zeros(3), name="w")
        grads, feeds = [], {}
        for k in range(2):
            with g.device(f"/job:worker/task:{k}"):
                xk = G.placeholder("float64", [4, 3], name=f"x{k}")
                yk = G.placeholder("float64", [4], name=f"y{k}")
                err = G.reshape(G.matmul(xk, G.reshape(w, [3, 1])), [4]) - yk
                loss = G.reduce_mean(err * err)
                grads.append(G.gradients([loss], [w])[0])
            feeds[xk], feeds[yk] = X[4 * k: 4 * k + 4], Y[4 * k: 4 * k + 4]
        with g.device("/job:ps/task:0"):
            mean_grad = (grads[0] + grads[1]) * 0.5
        train = w.assign_sub(mean_grad * 0.1)
    cluster = ClusterSpec({"worker": [1, 2], "ps": [3]})

    def steps(sess):
        sess.run(w.initializer)
        return [sess.run([mean_grad, train], feeds) for _ in range(5)]

    def client(master):
        sess = DistributedSession(master, g)
        got = steps(sess)
        plan = next(iter(p for key, p in master.sessions[sess.handle].plans.items() if key[0]))
        sess.close()
        return got, sorted(plan.handles)

    got, devices = run_cluster(client, cluster, timeout=10)
    assert devices == sorted(cluster.devices)  # both towers and the ps took part
    with G.Session(g, optimize=False) as s:
        want = steps(s)
    w_np = np.zeros(3)
    for (grad, new_w), (grad_s, new_w_s) in zip(got, want):
        np.testing.assert_array_equal(grad, grad_s)
        np.testing.assert_array_equal(new_w, new_w_s)
        full = 2 * X.T @ (X @ w_np - Y) / len(Y)  # the full-batch gradient, by hand
        np.testing.assert_allclose(grad, full, rtol=1e-12)
        w_np = w_np - 0.1 * full
        np.testing.assert_allclose(new_w, w_np, rtol=1e-12)


def test_between_graph_replication_shares_variables_on_the_ps():
    """Two clients, each with its own graph and session, train one w held by the ps (async)."""
    rng = np.random.default_rng(1)
    X, Y = _regression_data(rng, n=16)
    cluster = ClusterSpec({"worker": [1, 2], "ps": [3]})
    initialised = threading.Event()

    def replica(master, k, results):
        g = G.Graph()  # each client builds its own graph, naming the shared variables alike
        with g.as_default():
            with g.device("/job:ps/task:0"):
                w = G.Variable(np.zeros(3), name="w")
                step = G.Variable(0.0, name="global_step", dtype="float64")
            with g.device(f"/job:worker/task:{k}"):
                xk, yk = G.constant(X[8 * k: 8 * k + 8]), G.constant(Y[8 * k: 8 * k + 8])
                err = G.reshape(G.matmul(xk, G.reshape(w, [3, 1])), [8]) - yk
                grad = G.gradients([G.reduce_mean(err * err)], [w])[0]
            train = G.group(w.assign_sub(grad * 0.05), step.assign_add(1.0))
        sess = DistributedSession(master, g, container="train")
        if k == 0:  # the chief initialises; the other replica waits for it
            sess.run(G.global_variables_initializer(g))
            initialised.set()
        assert initialised.wait(5)
        for _ in range(20):
            sess.run(train)
        results[k] = sess.run([w, step])
        sess.close()

    def client(master):
        results = {}
        threads = [threading.Thread(target=replica, args=(master, k, results)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        return results

    results = run_cluster(client, cluster, timeout=10)
    w_final = results[0][0] if results[0][1] == 40.0 else results[1][0]
    assert max(results[0][1], results[1][1]) == 40.0  # both replicas' updates reached one variable
    loss = lambda w: np.mean((X @ w - Y) ** 2)  # noqa: E731
    assert loss(w_final) < 0.1 * loss(np.zeros(3))


def test_benchmark_writes_json_and_the_plotter_reads_it(tmp_path):
    """The distributed_session benchmark on a tiny setting: same values checked inside, JSON, plot."""
    import json

    from benchmarks import distributed_session as bench

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "distributed_session.json"
    assert bench.main(["--repeats", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "distributed_session" and "machine" in doc
    assert all(len(doc["step_seconds"][v]) == 2 for v in ("session", "repeated", "first"))
    assert doc["plans_of_repeated_session"] == 2  # initialiser + step, however many steps ran
    assert doc["send_recv_pairs"] > 0
    moved = doc["repeated_step_bytes"]  # cut edges go worker to worker; none passes the master
    assert moved["worker_to_worker_peer_tags"] > 0 and moved["master_peer_tags"] == 0
    assert moved["master_sent"] > 0 and moved["master_received"] > 0
    sys.path.insert(0, str(root / "docs" / "hooks"))
    try:
        import plot_distributed_session
    finally:
        sys.path.pop(0)
    figures, summary = plot_distributed_session.plot(out, doc)
    assert figures["step"].startswith(b"<?xml") and "| Session (one process) |" in summary
    assert f"{moved['worker_to_worker_peer_tags']:,} bytes of cut-edge tensors directly" in summary
