"""Devices, placement, pruning and partitioning (reference_impl/graph/placement.py, partition.py).

Checked against independent computations: the Send/Recv count against a count of distinct
(tensor, destination device) pairs over the placed graph's edges, and the partitions' values,
run in threads around a rendezvous, against the single-process ``Session`` bit for bit.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import reference_impl.graph as G
from reference_impl.runtime import Rendezvous, RendezvousError, RendezvousTimeout, run_partitions

sys.path.insert(0, str(Path(__file__).parent / "mpi_programs"))
from distributed_dags import random_dag

pytestmark = pytest.mark.timeout(60)

PS, W0, W1 = "/job:ps/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:0/device:CPU:0", \
    "/job:worker/replica:0/task:1/device:CPU:0"


def test_device_strings_parse_to_their_full_form():
    assert G.DeviceSpec.parse("/job:worker/task:1") == G.DeviceSpec("worker", 1)
    assert G.canonical("/job:ps/task:0") == PS
    assert G.canonical("/job:worker/replica:0/task:1/device:cpu:0") == W1
    assert G.DeviceSpec.parse(W1).short == "worker:1"


@pytest.mark.parametrize("text, complaint", [
    ("job:worker/task:1", "must start with '/'"),
    ("/job:worker/tsk:1", "cannot read 'tsk:1'"),
    ("/task:1", "needs a job name"),
    ("/job:worker/task:one", "task must be a number"),
    ("/job:worker/task:1/device:GPU:0", "one device per task"),
    ("/job:worker/task:1/task:2", "names task twice"),
])
def test_a_malformed_device_string_is_a_clear_error(text, complaint):
    with pytest.raises(G.PlacementError, match=complaint):
        G.DeviceSpec.parse(text)
    with pytest.raises(G.PlacementError, match=complaint):
        with G.Graph().device(text):
            pass


def _example():
    """v on ps; y = x * v and z = y + x on worker 1; w = exp(y) + z and v += w on worker 0."""
    g = G.Graph()
    with g.as_default():
        with g.device("/job:ps/task:0"):
            v = G.Variable([1.0, 2.0], name="v")
        x = G.placeholder("float32", [2], name="x")
        with g.device("/job:worker/task:1"):
            y = G.mul(x, v, name="y")
            z = G.add(y, x, name="z")
        with g.device("/job:worker/task:0"):
            w = G.add(G.exp(y, name="e"), z, name="w")
            update = v.assign_add(w)
    return g, v, x, y, z, w, update


def test_device_scopes_nest_and_an_empty_string_clears_them():
    g = G.Graph()
    with g.as_default(), g.device("/job:worker/task:1"):
        a = G.constant(1.0)
        with g.device("/job:ps/task:0"):
            b = G.constant(2.0)
        with g.device(""):
            c = G.constant(3.0)
    assert (a.op.device, b.op.device, c.op.device) == (W1, PS, "")


def test_placer_colocates_updates_with_their_variable_and_follows_inputs():
    g, v, x, y, z, w, update = _example()
    assert update.op.device == "" and update.op.colocation == ("v",)  # asked for nothing itself
    placed = G.place(g)
    dev = {op.name: op.device for op in placed.operations}
    assert dev["v"] == dev["v/Assign"] == dev["AssignAdd"] == PS  # colocated with v, not worker 0
    assert dev["x"] == W0  # a source op with no request: the default device
    assert dev["y"] == dev["z"] == W1 and dev["e"] == dev["w"] == W0


def test_a_sparse_row_update_is_placed_with_its_variable():
    """ScatterUpdate (a sparse optimiser's row write) is registered as updating its first input's
    variable, so the placer puts it where the table lives, as it does Assign."""
    from reference_impl.train.optimizers import GradientDescent

    g = G.Graph()
    with g.as_default():
        with g.device("/job:ps/task:0"):
            table = G.Variable(np.ones((5, 2), np.float32), name="table")
        with g.device("/job:worker/task:1"):
            ids = G.placeholder("int64", [None], name="ids")
            loss = G.reduce_sum(G.gather(table, ids))
            GradientDescent(0.1).minimize(loss)
    updates = [op for op in g.operations if op.type == "ScatterUpdate"]
    assert updates, "the sparse path should write rows with ScatterUpdate"
    placed = {op.name: op.device for op in G.place(g).operations}
    assert {placed[op.name] for op in updates} == {PS}
    assert G.REGISTRY["ScatterUpdate"].updates_variable and G.REGISTRY["Assign"].updates_variable


def test_unplaced_ops_follow_their_first_input_else_the_default():
    g = G.Graph()
    with g.as_default():
        with g.device("/job:ps/task:0"):
            a = G.constant(1.0, name="a")
        G.neg(a, name="b")
        G.constant(2.0, name="c")
    dev = {op.name: op.device for op in G.place(g, "/job:worker/task:1").operations}
    assert dev == {"a": PS, "b": PS, "c": W1}


def test_colocate_with_ignores_device_scopes_and_conflicts_name_both_ops():
    g = G.Graph()
    with g.as_default():
        with g.device("/job:ps/task:0"):
            a = G.constant(1.0, name="a")
        with g.device("/job:worker/task:1"), g.colocate_with(a):
            b = G.neg(a, name="b")
    assert G.place(g).get_operation_by_name("b").device == PS
    b.op.device = W1  # a hand-made request that contradicts the colocation
    with pytest.raises(G.PlacementError, match=r"cannot colocate 'a' .*ps.* with 'b' .*worker"):
        G.place(g)
    b.op.device, b.op.colocation = "", ("nowhere",)
    with pytest.raises(G.PlacementError, match="'b' must be colocated with 'nowhere'"):
        G.place(g)
    b.op.device, b.op.colocation = "/job:worker/tsk:1", ()  # as a hand-written GraphDef could say
    with pytest.raises(G.PlacementError, match="op 'b': device string '/job:worker/tsk:1': cannot read 'tsk:1'"):
        G.place(g)


def test_graphdef_keeps_devices_and_colocation():
    g = _example()[0]
    back = G.from_json(G.to_json(g))
    assert [(o.name, o.device, o.colocation) for o in back.operations] == \
        [(o.name, o.device, o.colocation) for o in g.operations]


def test_prune_keeps_what_fetches_and_targets_need_and_stops_at_feeds():
    g, v, x, y, z, w, update = _example()
    assert sorted(o.name for o in G.prune(g, ["z:0"]).operations) == ["v", "x", "y", "z"]
    assert sorted(o.name for o in G.prune(g, [], ["v/Assign"]).operations) == ["Const", "v", "v/Assign"]
    with g.as_default():
        with g.device(""):
            p = G.placeholder("float32", [2], name="p")
        q = G.no_op(name="q")
    p.op.control_inputs.append(q)  # a fed op's own dependencies are not needed
    assert sorted(o.name for o in G.prune(g, ["p:0"], feeds=["p"]).operations) == ["p"]
    assert sorted(o.name for o in G.prune(g, ["p:0"]).operations) == ["p", "q"]


def test_partition_of_the_example_graph():
    g, v, x, y, z, w, update = _example()
    parts = G.partition(G.place(G.prune(g, [update.name, w.name])))
    names = {d: [o.name for o in p.operations] for d, p in parts.items()}
    assert names == {
        PS: ["v", "_send_v_0_to_worker1", "_recv_w_0_from_worker0", "AssignAdd"],
        W0: ["x", "_send_x_0_to_worker1", "_recv_y_0_from_worker1", "e", "_recv_z_0_from_worker1", "w",
             "_send_w_0_to_ps0"],
        W1: ["_recv_x_0_from_worker0", "_recv_v_0_from_ps0", "y", "z", "_send_y_0_to_worker0",
             "_send_z_0_to_worker0"],
    }
    # x:0 feeds both y and z on worker 1: one pair, and both read the same _Recv
    recv_x = parts[W1].get_operation_by_name("_recv_x_0_from_worker0")
    assert parts[W1].get_operation_by_name("y").inputs[0].op is recv_x
    assert parts[W1].get_operation_by_name("z").inputs[1].op is recv_x
    assert G.count_send_recv(parts) == (5, 5)
    assert recv_x.attrs["tensor_name"] == "x:0" and recv_x.attrs["send_device"] == W0
    assert G.rendezvous_key(W0, W1, "x:0", 7) == f"{W0};{W1};x:0;7"


def test_a_control_edge_across_devices_becomes_a_control_pair():
    g = G.Graph()
    with g.as_default():
        with g.device("/job:worker/task:0"):
            a = G.constant(1.0, name="a")
        with g.device("/job:worker/task:1"):
            done = G.group(a, name="done")
    parts = G.partition(G.place(g))
    send = parts[W0].get_operation_by_name("_send_a_ctrl_to_worker1")
    recv = parts[W1].get_operation_by_name("_recv_a_ctrl_from_worker0")
    assert send.inputs == [] and [c.name for c in send.control_inputs] == ["a"]
    assert send.attrs["tensor_name"] == "^a"
    assert parts[W1].get_operation_by_name("done").control_inputs == [recv]
    assert done.name == "done"


def _expected_pairs(placed: G.Graph) -> int:
    """Distinct (tensor or ^op, destination device) over edges whose ends differ in device."""
    pairs = set()
    for op in placed.operations:
        pairs |= {(t.name, op.device) for t in op.inputs if t.op.device != op.device}
        pairs |= {("^" + c.name, op.device) for c in op.control_inputs if c.device != op.device}
    return len(pairs)


def test_random_dags_partitions_match_the_session_bit_for_bit():
    rng = np.random.default_rng(3)
    devices = ["/job:worker/task:0", "/job:worker/task:1", "/job:worker/task:2", "/job:ps/task:0"]
    total_pairs = 0
    for _ in range(30):
        dag = random_dag(rng, devices[: rng.integers(2, 5)], n_ops=int(rng.integers(5, 15)))
        fetch = [t.name for t in dag.fetches]
        target = [op.name for op in dag.targets] + [dag.init.name]
        placed = G.place(G.prune(dag.graph, fetch, target))
        parts = G.partition(placed)
        sends, recvs = G.count_send_recv(parts)
        assert sends == recvs == _expected_pairs(placed)
        total_pairs += sends
        assert sorted(o.name for p in parts.values() for o in p.operations if not o.type.startswith("_")) == \
            sorted(o.name for o in placed.operations)
        for device, p in parts.items():
            assert all(o.device == device for o in p.operations)
        with G.Session(dag.graph, optimize=False) as s:
            s.run(dag.init)
            want = s.run(dag.fetches, dag.feeds)
        states: dict = {}
        feeds = {t.op.name: v for t, v in dag.feeds.items()}
        run_partitions(G.partition(G.place(G.prune(dag.graph, [], [dag.init.name]))), {}, [], states)
        got = run_partitions(parts, feeds, fetch, states, step_id=1)
        for t, value in zip(fetch, want):
            np.testing.assert_array_equal(got[t], value, strict=True)
    assert total_pairs > 30  # the random devices really cut edges


def test_rendezvous_send_never_blocks_and_recv_times_out_naming_the_key():
    r = Rendezvous(timeout=0.2)
    r.send("a;b;x:0;1", np.ones(2))
    np.testing.assert_array_equal(r.recv("a;b;x:0;1"), np.ones(2))
    start = time.monotonic()
    with pytest.raises(RendezvousTimeout, match=r"'a;b;y:0;1'.*within 0.2 s"):
        r.recv("a;b;y:0;1")
    assert time.monotonic() - start < 1.0
    r.send("k", 1)
    with pytest.raises(RendezvousError, match="sent twice"):
        r.send("k", 2)


def test_rendezvous_recv_waits_for_a_later_send_and_abort_wakes_it():
    r = Rendezvous(timeout=5)
    threading.Timer(0.05, r.send, args=("k", 42)).start()
    assert r.recv_any(["j", "k"]) == ("k", 42)
    threading.Timer(0.05, r.abort, args=("worker 1 failed",)).start()
    with pytest.raises(RendezvousError, match="aborted.*worker 1 failed"):
        r.recv("never")


def test_the_committed_partition_pictures_are_what_the_code_draws(tmp_path):
    """docs/assets/diagrams/partition-{before,after}.svg come from docs/generators/graph_pictures.py;
    regenerate them with ``python docs/generators/graph_pictures.py`` after changing either."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "generators"))
    from graph_pictures import write_pictures

    committed = Path(__file__).resolve().parent.parent / "docs" / "assets" / "diagrams"
    for fresh in write_pictures(tmp_path):
        assert fresh.read_text() == (committed / fresh.name).read_text(), \
            f"{fresh.name} is out of date: run python docs/generators/graph_pictures.py"
    after = (committed / "partition-after.svg").read_text()
    assert after.count(">_Send</text>") == after.count(">_Recv</text>") == 5  # w to each worker, loss0, loss1, ^total
    assert "unused" not in after  # pruned
