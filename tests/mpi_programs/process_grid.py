"""Run under mpiexec -n 4: Communicator.split against MPI's own Comm.Split, and the process grid.

1. ``split``: for several (color, key) patterns, both ``MPICommunicator.split`` (MPI's
   ``Comm.Split``) and the generic ``split_communicator`` (tags folded with a context id, on
   MPICommunicator's send/recv) give the same members, in the same order, as mpi4py's
   ``COMM_WORLD.Split`` called directly (``Group.Translate_ranks`` to world ranks).
   Prints ``SPLIT patterns=N ok``.
2. Collectives on both kinds of sub-communicator (allreduce, reduce_scatter, allgather,
   alltoall, broadcast) equal NumPy on the members' inputs. Prints ``COLLECTIVES ok``.
3. Messages of different communicators never mix: on a 2x2 grid, every rank runs four
   allreduces *at once*, one thread each, on its row, its column, a second split of its row
   (the same members: only the context id differs) and the world; all four equal NumPy.
   Then, on one thread, a message on the world and one on a generic sub-communicator with
   the same members, peer and tag, received in the opposite order, each land in their own
   receive. Prints ``ISOLATION ok``.
4. ``ProcessGrid`` on 4 processes (dp=2 tp=2, tp=2 pp=2, dp=4 ep=2, dp=1 tp=4): every group's
   members, gathered over the group itself, equal the Megatron layout ``grid.groups``.
   Prints ``GRID layouts=N ok``.
"""
import threading

import numpy as np
from mpi4py import MPI

from reference_impl.comm import MPICommunicator, allgather, allreduce, alltoall, broadcast, reduce_scatter
from reference_impl.comm.communicator import SplitCommunicator, split_communicator
from reference_impl.parallel.process_grid import ProcessGrid

world = MPI.COMM_WORLD
comm = MPICommunicator(world)
n, r = comm.size, comm.rank
assert n == 4, "run with mpiexec -n 4"


def members(sub) -> list[int]:
    """World ranks of ``sub``'s members in its rank order, gathered over ``sub`` itself."""
    return [int(v) for v in allgather(sub, np.array([r], dtype=np.int64))]


def mpi_members(color, key) -> list[int] | None:
    child = world.Split(MPI.UNDEFINED if color is None else color, key)
    if child == MPI.COMM_NULL:
        return None
    out = list(child.Get_group().Translate_ranks(list(range(child.Get_size())), world.Get_group()))
    child.Free()
    return out


# ------------------------------------------------------------------ 1. split == MPI's Split
PATTERNS = [  # (color, key) on rank r
    lambda r: (0, 0), lambda r: (r % 2, 0), lambda r: (r // 2, -r), lambda r: (r % 2, (3 * r) % 4),
    lambda r: (None if r == 2 else 1, 0), lambda r: (r, 0), lambda r: (7 * (r % 2), 5 - 2 * (r // 2)),
]
for pattern in PATTERNS:
    color, key = pattern(r)
    expected = mpi_members(color, key)
    for kind, sub in (("MPI", comm.split(color, key)), ("generic", split_communicator(comm, color, key))):
        got = None if sub is None else members(sub)
        if got != expected:
            raise AssertionError(f"rank {r}: {kind} split({color}, {key}) gave {got}, MPI's Split {expected}")
        if sub is not None and kind == "MPI" and not isinstance(sub, MPICommunicator):
            raise AssertionError(f"rank {r}: MPICommunicator.split returned {type(sub).__name__}")
        if sub is not None and kind == "generic" and not isinstance(sub, SplitCommunicator):
            raise AssertionError(f"rank {r}: split_communicator returned {type(sub).__name__}")
world.Barrier()
if r == 0:
    print(f"SPLIT patterns={len(PATTERNS)} ok", flush=True)

# ------------------------------------------------------------------ 2. collectives on sub-communicators
rng = np.random.default_rng(5)
data = rng.standard_normal((n, 12))  # every rank knows every rank's input
for kind, sub in (("MPI", comm.split(r % 2, -r)), ("generic", split_communicator(comm, r % 2, -r))):
    group = members(sub)
    mine = data[r]
    checks = {
        "allreduce": (allreduce(sub, mine), data[group].sum(axis=0)),
        "reduce_scatter": (reduce_scatter(sub, mine), np.array_split(data[group].sum(axis=0), sub.size)[sub.rank]),
        "allgather": (allgather(sub, mine), data[group].reshape(-1)),
        "alltoall": (alltoall(sub, mine.reshape(sub.size, -1)),  # block i of the result came from member i
                     np.stack([data[g].reshape(sub.size, -1)[sub.rank] for g in group])),
        "broadcast": (broadcast(sub, mine.copy(), root=1), data[group[1]]),
    }
    for name, (got, want) in checks.items():
        if got.shape != want.shape or np.abs(got - want).max() > 1e-12:
            raise AssertionError(f"rank {r}: {name} on the {kind} sub-communicator {group} differs from NumPy")
world.Barrier()
if r == 0:
    print("COLLECTIVES ok", flush=True)

# ------------------------------------------------------------------ 3. isolation
for make in (lambda c, k: comm.split(c, k), lambda c, k: split_communicator(comm, c, k)):
    row, col, row2 = make(r // 2, r), make(r % 2, r), make(r // 2, r)
    comms = {"row": row, "column": col, "row again": row2, "world": comm}
    rank_inputs = {name: [np.random.default_rng([k, i]).standard_normal(50_000) + 100 * i for k in range(n)]
                   for i, name in enumerate(comms)}
    results, errors = {}, []

    def run(name):
        try:
            results[name] = allreduce(comms[name], rank_inputs[name][r])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(name,)) for name in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for name, sub in comms.items():
        want = sum(rank_inputs[name][g] for g in members(sub))
        if np.abs(results[name] - want).max() > 1e-9:
            raise AssertionError(f"rank {r}: concurrent allreduce on the {name} communicator mixed messages")
# same peer, same tag, two communicators, received in the opposite order
sub = split_communicator(comm, 0, 0)
peer = (r + 1) % n
comm.send(np.full(3, 1.0), peer, tag=0)
sub.send(np.full(3, 2.0), peer, tag=0)
on_sub, on_world = np.empty(3), np.empty(3)
sub.recv(on_sub, (r - 1) % n, tag=0)
comm.recv(on_world, (r - 1) % n, tag=0)
if not (on_sub == 2.0).all() or not (on_world == 1.0).all():
    raise AssertionError(f"rank {r}: a message crossed from one communicator to the other")
sub.send(np.full(3, 3.0), peer, tag=4)
got = np.empty(3)
if sub.recv_any(got, tag=4) != (r - 1) % n or not (got == 3.0).all():
    raise AssertionError(f"rank {r}: recv_any on the sub-communicator got the wrong message")
world.Barrier()
if r == 0:
    print("ISOLATION ok", flush=True)

# ------------------------------------------------------------------ 4. the grid
LAYOUTS = [dict(dp=2, tp=2), dict(tp=2, pp=2, dp=1), dict(dp=4, ep=2), dict(dp=1, tp=4)]
for layout in LAYOUTS:
    grid = ProcessGrid(comm, **layout)
    for kind in ("tp", "dp", "pp", "ep", "expert_dp", "embedding"):
        sub = getattr(grid, f"{kind}_group")
        want = [g for g in grid.layout.groups(kind) if r in g]
        got = None if sub is None else members(sub)
        if (got is None and want) or (got is not None and [got] != want):
            raise AssertionError(f"rank {r}, grid {layout}: {kind} group {got}, Megatron's layout {want}")
    c = grid.coords
    if (grid.tp_group.rank, grid.dp_group.rank, grid.pp_group.rank, grid.ep_group.rank) != (c.tp, c.dp, c.pp, c.ep):
        raise AssertionError(f"rank {r}, grid {layout}: group ranks disagree with coordinates {c}")
world.Barrier()
if r == 0:
    print(f"GRID layouts={len(LAYOUTS)} ok", flush=True)
