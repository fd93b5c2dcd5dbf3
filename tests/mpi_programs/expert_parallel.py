"""Run under mpiexec: expert parallelism on MPI processes, one per rank (E = 8, k = 2).

``expert_parallel.py`` (no argument): every rank builds the same float64 parameters and tokens
(uneven token counts per rank, one rank may have none), runs its share of the layer over a
counted ``MPICommunicator``, and compares its outputs, input gradients, the summed router
gradient and its experts' gradients with the single-process ``moe_forward``/``moe_backward``
routed with one group per rank, and the bytes it sent with ``expert_parallel.comm_bytes``.
Rank 0 prints ``EP ranks=N maxdiff=D dropped=K bytes_fwd=[...] bytes_bwd=[...] ok``.

``expert_parallel.py die``: the last rank routes its tokens and ends its process (``os._exit``)
before the dispatch; every other rank must fail with a ``CommError`` within about the
communicator's timeout (``LAB_COMM_TIMEOUT``). Each survivor prints
``SURVIVOR rank=R seconds=S error=... END``. Launch with ``mpiexec -disable-auto-cleanup`` so that
MPICH lets the survivors report; they leave with ``os._exit`` (``MPI_Finalize`` would wait for
the dead rank).
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from reference_impl.comm import CommError, CountingCommunicator, MPICommunicator
from reference_impl.parallel import expert_parallel as xp
from reference_impl.parallel import moe

DEAD_EXIT_CODE = 3
world = MPI.COMM_WORLD
comm = CountingCommunicator(MPICommunicator(world))
p, rank = comm.size, comm.rank

cfg = moe.MoEConfig(n_embd=8, n_experts=8, top_k=2, capacity_factor=1.0, aux_loss_coeff=0.1, z_loss_coeff=1e-3)
params = moe.init_params(cfg, seed=5, std=0.3, router_std=1.0)
rng = np.random.default_rng(17)
sizes = [int(n) for n in rng.integers(0, 24, size=p)]
sizes[0] = max(sizes[0], 5)
x = rng.standard_normal((sum(sizes), cfg.n_embd))
dy = rng.standard_normal((sum(sizes), cfg.n_embd))
starts = np.concatenate([[0], np.cumsum(sizes)])
mine = slice(starts[rank], starts[rank + 1])
layer = xp.ExpertParallelMoE(comm, xp.shard_experts(params, rank, p), cfg)

if sys.argv[1:] == ["die"]:
    if rank == p - 1:
        moe.route(params["wg"], x[mine], cfg)  # routed, then gone before the dispatch
        os._exit(DEAD_EXIT_CODE)
    start = time.monotonic()
    try:
        layer.forward(x[mine])
    except CommError as e:
        report = f"SURVIVOR rank={rank} seconds={time.monotonic() - start:.3f} error={e} END\n"
    else:
        report = f"SURVIVOR rank={rank} finished a step without the dead rank END\n"
    os.write(1, report.encode())  # one write: the survivors' reports do not interleave
    os._exit(0)

y_ref, cache = moe.moe_forward(params, x, cfg, sizes)
dx_ref, grads_ref = moe.moe_backward(params, dy, cache, cfg)
expected = xp.comm_bytes(cache.routing.stats.processed, cfg.n_embd, 8)

start = comm.bytes_sent
y = layer.forward(x[mine])
fwd = comm.bytes_sent - start
dx, grads = layer.backward(dy[mine])
bwd = comm.bytes_sent - start - fwd
full = xp.unshard_experts(world.allgather(grads))
diff = max([float(np.abs(y - y_ref[mine]).max(initial=0)), float(np.abs(dx - dx_ref[mine]).max(initial=0))]
           + [float(np.abs(full[k] - grads_ref[k]).max()) for k in grads_ref])
if diff > 1e-6 or fwd != expected["forward"][rank] or bwd != expected["backward"][rank]:
    raise AssertionError(f"rank {rank}: differs by {diff}, or sent {fwd}/{bwd} bytes, not "
                         f"{expected['forward'][rank]}/{expected['backward'][rank]}")
diffs, sent = world.gather(diff), world.gather((fwd, bwd))
if rank == 0:
    print(f"EP ranks={p} sizes={sizes} maxdiff={max(diffs):.3g} dropped={cache.routing.stats.dropped} "
          f"bytes_fwd={[s[0] for s in sent]} bytes_bwd={[s[1] for s in sent]} ok", flush=True)
