"""Communicator.split (MPI_Comm_split) and the process grid (reference_impl/parallel/process_grid.py).

* split on 1..8 thread ranks, for several (color, key) patterns, gives the groups and the rank
  order MPI's rules give (members of a color sorted by (key, parent rank); color None -> None),
  computed here independently from the patterns; a split of a split and a split of a
  CountingCommunicator / SimulatedNetwork too;
* allreduce, reduce_scatter, allgather, alltoall and broadcast on the sub-communicators equal
  NumPy on the members' inputs;
* messages never mix: four allreduces run at once (a thread each per rank) on the row, the
  column, a second split of the row (same members, only the context differs) and the world of a
  2x2 grid, each equal to NumPy; a world message and a sub-communicator message to the same peer
  with the same tag, received in the opposite order, land in their own receives; recv_any on a
  sub-communicator takes neither the world's nor another group's message. A broken context id
  (all contexts 0) makes this test fail (checked by monkeypatching it);
* a CountingCommunicator's child counts its own traffic and adds it to the parent's: one ring
  allreduce of N float64 on a group of g sends 2 (g-1)/g N 8 bytes, seen in both;
* under mpiexec -n 4 (tests/mpi_programs/process_grid.py): the same groups and order as MPI's own
  Comm.Split, for MPICommunicator.split and the generic split on MPI; collectives; concurrent
  isolation; the grid's groups;
* ProcessGrid: its groups are Megatron-LM's (the examples in megatron/core/parallel_state.py's
  docstrings: 16 GPUs with tp=2, pp=4; the [tp, dp, pp] = [2, 3, 4] dp groups), TP groups stay
  inside an 8-GPU node, coordinates satisfy rank = tp + TP dp + TP DP pp, and on thread ranks every
  group communicator holds exactly the members of its group, in order; bad grids name both numbers.
"""
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import (CommError, CountingCommunicator, allgather, allreduce, alltoall, broadcast,
                                 reduce_scatter, run_threads)
from reference_impl.comm import communicator as communicator_module
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.comm.simnet import SimulatedNetwork
from reference_impl.parallel import process_grid as pg

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "mpi_programs" / "process_grid.py"
pytestmark = pytest.mark.timeout(120)

PATTERNS = {  # (color, key) of rank r out of n
    "one group": lambda r, n: (0, None),
    "even/odd": lambda r, n: (r % 2, None),
    "halves, reversed": lambda r, n: (r // max(1, n // 2), -r),
    "key ties broken by rank": lambda r, n: (r % 3, r % 2),
    "some undefined": lambda r, n: (None if r % 3 == 1 else 5, (7 * r) % 5),
    "singletons": lambda r, n: (r, 0),
}


def mpi_rule(n, pattern):
    """MPI_Comm_split's result for every rank, computed from the patterns alone: members in order, or None."""
    calls = [pattern(r, n) for r in range(n)]
    out = []
    for color, _ in calls:
        if color is None:
            out.append(None)
            continue
        same = [(0 if k is None else k, q) for q, (c, k) in enumerate(calls) if c == color]
        out.append([q for _, q in sorted(same)])
    return out


def members(sub, world_rank):
    return [int(v) for v in allgather(sub, np.array([world_rank], dtype=np.int64))]


@pytest.mark.parametrize("n", range(1, 9))
def test_split_follows_mpi_rules_on_threads(n):
    def body(comm):
        out = {}
        for name, pattern in PATTERNS.items():
            sub = comm.split(*pattern(comm.rank, n))
            out[name] = None if sub is None else (members(sub, comm.rank), sub.rank, sub.size)
        return out

    results = run_threads(n, body, timeout=60)
    for name, pattern in PATTERNS.items():
        for r, want in enumerate(mpi_rule(n, pattern)):
            got = results[r][name]
            if want is None:
                assert got is None, (name, r)
            else:
                assert got == (want, want.index(r), len(want)), (name, r)


def test_split_of_a_split_and_of_wrappers():
    def body(comm):
        half = comm.split(comm.rank // 4, key=-comm.rank)  # [3,2,1,0] and [7,6,5,4]
        quarter = half.split(half.rank // 2)  # pairs of the half, in the half's order
        return members(half, comm.rank), members(quarter, comm.rank)

    results = run_threads(8, body)
    assert results[0] == ([3, 2, 1, 0], [1, 0])
    assert results[5] == ([7, 6, 5, 4], [5, 4]) and results[6] == ([7, 6, 5, 4], [7, 6])
    for wrap in (CountingCommunicator, lambda c: SimulatedNetwork(c, "IB-NDR")):
        got = run_threads(4, lambda comm: members(comm.split(comm.rank % 2), comm.rank), wrap=wrap)
        assert got == [[0, 2], [1, 3], [0, 2], [1, 3]]


def test_bad_split_arguments():
    with pytest.raises(ValueError, match="color must be a non-negative int or None"):
        run_threads(2, lambda comm: comm.split(-1))
    with pytest.raises(ValueError, match="key must be an int or None"):
        run_threads(2, lambda comm: comm.split(0, key="first"))
    with pytest.raises(ValueError, match="tag 1024 is outside 0..1023"):
        run_threads(2, lambda comm: comm.split(0).send(np.zeros(1), 0, tag=1024))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_collectives_on_sub_communicators_equal_numpy(n):
    data = np.random.default_rng(n).standard_normal((n, 24))

    def body(comm):
        sub = comm.split(comm.rank % 2, key=-comm.rank)
        group = members(sub, comm.rank)
        mine, p = data[comm.rank], sub.size
        checks = {
            "allreduce": (allreduce(sub, mine), data[group].sum(axis=0)),
            "reduce_scatter": (reduce_scatter(sub, mine), np.array_split(data[group].sum(axis=0), p)[sub.rank]),
            "allgather": (allgather(sub, mine), data[group].reshape(-1)),
            "alltoall": (alltoall(sub, mine.reshape(p, -1)),
                         np.stack([data[g].reshape(p, -1)[sub.rank] for g in group])),
            "broadcast": (broadcast(sub, mine.copy(), root=p - 1), data[group[-1]]),
        }
        return {k: float(np.abs(got - want).max()) if got.shape == want.shape else np.inf
                for k, (got, want) in checks.items()}

    for r, diffs in enumerate(run_threads(n, body)):
        assert max(diffs.values()) < 1e-12, (r, diffs)


def isolation_body(comm):
    """Four allreduces at once on the row, column, row again and world of a 2x2 grid; then ordered sends."""
    n, r = comm.size, comm.rank
    comms = {"row": comm.split(r // 2, r), "column": comm.split(r % 2, r), "row again": comm.split(r // 2, r),
             "world": comm}
    inputs = {name: [np.random.default_rng([k, i]).standard_normal(20_000) + 100 * i for k in range(n)]
              for i, name in enumerate(comms)}
    results, errors = {}, []

    def run(name):
        try:
            results[name] = allreduce(comms[name], inputs[name][r])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(name,)) for name in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    diffs = {name: float(np.abs(results[name] - sum(inputs[name][g] for g in members(sub, r))).max())
             for name, sub in comms.items()}
    # world and a sub-communicator with the same members: same peer, same tag, opposite order
    everyone = comm.split(0)
    peer, left = (r + 1) % n, (r - 1) % n
    comm.send(np.full(3, 1.0), peer, tag=0)
    everyone.send(np.full(3, 2.0), peer, tag=0)
    on_sub, on_world = np.empty(3), np.empty(3)
    everyone.recv(on_sub, left, tag=0)
    comm.recv(on_world, left, tag=0)
    # recv_any: the world's message and the row's are sent first, the one for `everyone` last
    comm.send(np.full(2, -1.0), peer, tag=4)
    comms["row"].send(np.full(2, -2.0), (comms["row"].rank + 1) % 2, tag=4)
    everyone.send(np.full(2, 3.0), peer, tag=4)
    got = np.empty(2)
    source = everyone.recv_any(got, tag=4)
    comm.recv(np.empty(2), left, tag=4)
    comms["row"].recv(np.empty(2), (comms["row"].rank + 1) % 2, tag=4)
    return diffs, on_sub.tolist(), on_world.tolist(), source, got.tolist()


def check_isolation(results):
    for r, (diffs, on_sub, on_world, source, got) in enumerate(results):
        assert max(diffs.values()) < 1e-9, (r, diffs)
        assert on_sub == [2.0] * 3 and on_world == [1.0] * 3, r
        assert source == (r - 1) % 4 and got == [3.0, 3.0], r


def test_messages_of_different_communicators_never_mix():
    check_isolation(run_threads(4, isolation_body, timeout=60))


def test_the_isolation_test_fails_without_context_ids(monkeypatch):
    """The same test with every context id forced to 0 (tags not folded): messages mix."""
    monkeypatch.setattr(communicator_module.SplitCommunicator, "_wire", lambda self, tag: tag)
    with pytest.raises((CommError, AssertionError)):  # a message in the wrong receive, or one that does not fit
        check_isolation(run_threads(4, isolation_body, timeout=5))


@pytest.mark.parametrize("g", [2, 3, 4])
def test_counting_child_counts_and_adds_to_parent(g):
    N = 600

    def body(comm):
        group = comm.split(comm.rank // g)
        before = comm.bytes_sent
        allreduce(group, np.ones(N))
        return comm.bytes_sent - before, group.bytes_sent, type(group).__name__

    for parent, child, kind in run_threads(2 * g, body, wrap=CountingCommunicator):
        assert kind == "CountingCommunicator"
        assert parent == child == 2 * (g - 1) * (N // g) * 8  # ring allreduce: 2 (g-1)/g N values


def test_split_under_mpiexec_matches_mpi_split():
    run = subprocess.run(mpiexec_command(4, str(PROGRAM)), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    for line in ("SPLIT patterns=7 ok", "COLLECTIVES ok", "ISOLATION ok", "GRID layouts=4 ok"):
        assert line in run.stdout, run.stdout + run.stderr


# ------------------------------------------------------------------ the grid
def test_groups_are_megatrons():
    """The examples of megatron/core/parallel_state.py (initialize_model_parallel, generate_masked_...)."""
    axes = [("tp", 2), ("dp", 2), ("pp", 4)]  # 16 GPUs, tensor_model_parallel_size=2, pipeline=4
    assert pg.orthogonal_groups(axes, "dp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert pg.orthogonal_groups(axes, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert pg.orthogonal_groups(axes, "pp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    dp = pg.orthogonal_groups([("tp", 2), ("dp", 3), ("pp", 4)], "dp")
    assert dp[0] == [0, 2, 4] and dp[1] == [1, 3, 5] and dp[7] == [19, 21, 23]


@pytest.mark.parametrize("tp,dp,pp,ep", [(2, 2, 4, 1), (8, 4, 2, 2), (4, 8, 1, 4), (1, 6, 2, 3)])
def test_layout_on_paper(tp, dp, pp, ep):
    layout = pg.GridLayout(dp=dp, tp=tp, pp=pp, ep=ep)
    n = layout.size
    same_axis = {"tp": {"tp"}, "pp": {"pp"}, "dp": {"dp", "ep", "expert_dp"}, "ep": {"ep", "dp"},
                 "expert_dp": {"expert_dp", "dp"}}  # coordinates that vary inside a group of each kind
    for kind in ("tp", "dp", "pp", "ep", "expert_dp"):
        groups = layout.groups(kind)
        assert sorted(r for g in groups for r in g) == list(range(n)), kind  # a partition of the world
        for g in groups:
            coords = [layout.coords_of(r) for r in g]
            assert [getattr(c, kind) for c in coords] == list(range(len(g))), (kind, g)  # listed by coordinate
            for field in {"tp", "dp", "pp", "ep", "expert_dp"} - same_axis[kind]:
                assert len({getattr(c, field) for c in coords}) == 1, (kind, field, g)  # the others agree
    for r in range(n):
        c = layout.coords_of(r)
        assert r == c.tp + tp * c.dp + tp * dp * c.pp == layout.rank_of(tp=c.tp, dp=c.dp, pp=c.pp)
        assert c.dp == c.ep + ep * c.expert_dp
    assert all(len({r // 8 for r in g}) == 1 for g in layout.groups("tp"))  # TP inside an 8-GPU node
    assert layout.groups("embedding") == [[g[0], g[-1]] if pp > 1 else [g[0]] for g in layout.groups("pp")]


@pytest.mark.parametrize("layout", [dict(dp=2, tp=2), dict(tp=2, pp=2, dp=1), dict(dp=4, ep=2), dict(dp=1, tp=4),
                                    dict(dp=2, tp=2, pp=2, ep=2), dict(dp=1), dict(dp=3, tp=2), dict(dp=1, pp=3)])
def test_grid_communicators_hold_their_groups(layout):
    n = pg.GridLayout(**layout).size

    def body(comm):
        grid = pg.ProcessGrid(comm, **layout)
        out = {}
        for kind in pg.GROUP_KINDS:
            sub = getattr(grid, f"{kind}_group")
            out[kind] = None if sub is None else (members(sub, comm.rank), sub.rank)
        return grid.coords, out

    paper = pg.GridLayout(**layout)
    for r, (coords, out) in enumerate(run_threads(n, body, timeout=60)):
        assert coords == paper.coords_of(r)
        for kind, got in out.items():
            want = [g for g in paper.groups(kind) if r in g]
            if not want:
                assert kind == "embedding" and got is None, (kind, r)  # a middle pipeline stage
                continue
            assert got == (want[0], want[0].index(r)), (kind, r)
            if kind != "embedding":
                assert got[1] == getattr(coords, kind), (kind, r)


def test_bad_grids_name_the_numbers():
    with pytest.raises(ValueError, match=r"dp x tp x pp = 2 x 2 x 2 = 8 ranks, but the communicator has 4"):
        run_threads(4, lambda comm: pg.ProcessGrid(comm, dp=2, tp=2, pp=2))
    with pytest.raises(ValueError, match=r"ep=3 must divide dp=4"):
        run_threads(4, lambda comm: pg.ProcessGrid(comm, dp=4, ep=3))
    with pytest.raises(ValueError, match=r"tp must be a positive int, got 0"):
        run_threads(1, lambda comm: pg.ProcessGrid(comm, dp=1, tp=0))
