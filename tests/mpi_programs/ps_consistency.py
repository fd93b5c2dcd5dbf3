"""Run under mpiexec -n 4 (or torchrun --nproc-per-node 4): one server and three workers, worker 0 (rank 1) 3x slower.

SSP(s=1): every read at clock c contains every worker's first c - 1 steps, and the bound
is reached. ASP: the fast workers finish while the straggler is far behind. Backup
workers (b = 1, straggler 5x slower): every step uses two gradients, only the straggler's
are dropped, and the server's values are what applying each step's two gives. Rank 0 (the server) prints one OK line.
"""
import numpy as np

from reference_impl.comm.engines import gather_objects, world_communicator
from reference_impl.models import ClickLog
from reference_impl.ps import ClusterSpec, Consistency
from reference_impl.ps.training import (
    LocalStore,
    Pace,
    batch_slice,
    model_spec,
    run_ps_rank,
    staleness_probe_rank,
    train_step,
)

comm = world_communicator(timeout=20)
cluster = ClusterSpec(1, 3)
pace = Pace(step_time=0.01, straggler=0, slowdown=3.0)
me = comm.rank - 1


def gather(value):
    """The workers' results on the server (a pickled gather is fine for a test); then a
    barrier, so that no rank starts the next job while the server still serves this one."""
    values = gather_objects(comm, value, root=0)
    comm.barrier()
    return values


ssp = staleness_probe_rank(comm, cluster, Consistency("ssp", staleness=1), 10, pace)
if comm.rank:
    for clock, count in ssp["reads"]:
        assert count[me] == clock and count.min() >= clock - 1, (comm.rank, clock, count)
leads = gather(None if comm.rank == 0 else max(c - count.min() for c, count in ssp["reads"]))
asp = staleness_probe_rank(comm, cluster, Consistency("asp"), 10, pace)
behind = gather(None if comm.rank == 0 else asp["reads"][-1][0] - asp["reads"][-1][1][0])
ids, labels = ClickLog(vocab_size=300).sample(384, seed=5)
spec, steps, batch = model_spec(4), 6, 96
backup = run_ps_rank(comm, cluster, spec, ids, labels, steps, batch, True, "ps", None,
                     Consistency("backup", backups=1), Pace(0.02, straggler=0, slowdown=5.0))
done = gather(None if comm.rank == 0 else backup["steps_done"])
if comm.rank == 0:
    assert max(leads[1:]) == 1, leads
    assert min(behind[2:]) >= 3, behind  # fast workers at clock 9 had seen <= 6 straggler steps
    assert len(backup.rounds) == steps and all(len(used) == 2 for used in backup.rounds), backup.rounds
    assert sum(done[1:]) == 2 * steps + len(backup.dropped), (done, backup.dropped)
    assert {w for w, _ in backup.dropped} == {1} and done[2:] == [steps] * 2, (backup.dropped, done)
    # The one server holds the whole model: it must be what the first two gradients of each step give.
    replay = LocalStore(spec)
    for k, used in enumerate(backup.rounds):
        part = np.concatenate([np.arange(len(ids))[batch_slice(k, batch, len(ids), w - 1, 3)] for w in used])
        train_step(replay, ids[part], labels[part], 1.0 / (batch // 3 * 2))
    every = np.unique(ids)
    np.testing.assert_allclose(backup.tables[0].pull(every), replay.table("emb").pull(every), atol=1e-12)
    np.testing.assert_allclose(backup.dense[0], replay.dense["w"], atol=1e-12)
    print("OK ssp bound, asp lead, backup drops on 4 ranks", flush=True)
