"""Run under mpiexec -n 4 (or torchrun --nproc-per-node 4): 2 parameter servers + 2 workers train the embedding model.

For each server-side optimiser and both placements of the dense variables (on the
servers, or replicated and all-reduced among the workers), BSP training on the two
workers must end where one process training on the global batch ends (checked on each
worker against its own single-process run). Rank 2 prints one OK line.
"""
import numpy as np

from reference_impl.comm.engines import world_communicator
from reference_impl.models import ClickLog
from reference_impl.ps import FTRL, SGD, Adagrad, Adam, ClusterSpec
from reference_impl.ps.training import model_spec, run_ps_rank, train_local

comm = world_communicator(timeout=30)
cluster = ClusterSpec(2, 2)
ids, labels = ClickLog(vocab_size=300).sample(512, seed=11)
steps, batch = 4, 64
probe = np.unique(ids[: steps * batch])
checked = 0
for optimizer in (SGD(0.3), Adagrad(0.2), Adam(0.05), FTRL(0.3, 1.0, 0.01, 0.01)):
    for dense in ("ps", "allreduce"):
        spec = model_spec(4, optimizer, optimizer)
        result = run_ps_rank(comm, cluster, spec, ids, labels, steps, batch, True, dense, probe)
        if comm.rank in cluster.workers:
            local = train_local(model_spec(4, optimizer, optimizer), ids, labels, steps, batch)
            for name, got, want in (("rows", result["rows"], local.table("emb").pull(probe)),
                                    ("w", result["w"], local.dense["w"]), ("b", result["b"], local.dense["b"])):
                err = float(np.max(np.abs(got - want)))
                if err > 1e-6:
                    raise AssertionError(f"rank {comm.rank}: {type(optimizer).__name__}/{dense}: "
                                         f"{name} differs from one process by {err}")
                checked += 1
        else:
            assert len(result.tables[0]) > 0, f"server rank {comm.rank} holds no rows"
        comm.barrier()
if comm.rank == 2:
    print(f"OK {checked} comparisons on {comm.size} ranks", flush=True)
