"""Run under mpiexec: the pipelined MLP (GPipe and 1F1B) on MPI ranks against the single-process model.

Each rank holds only its stage's layers; rank 0 gathers every stage's gradients and the
last stage's loss, and compares them with ``mlp.loss_and_grads`` on the whole batch.
"""
import sys

import numpy as np
from mpi4py import MPI

from reference_impl.comm import MPICommunicator
from reference_impl.train.mlp import init_mlp, loss_and_grads
from reference_impl.train.pipeline_parallel import bubble_fraction, measured_bubble, pipeline_step

world = MPI.COMM_WORLD
comm = MPICommunicator(world)
p = comm.size
params = init_mlp((12, 20, 20, 20, 20, 20, 20, 6), seed=3, dtype=np.float64)
rng = np.random.default_rng(4)
x, y = rng.standard_normal((24, 12)), rng.integers(0, 6, 24)
loss, grads = loss_and_grads(params, x, y)
checked = 0
for schedule in ("gpipe", "1f1b"):
    for m in (1, 3, 8):
        result = pipeline_step(comm, params, x, y, m, schedule)
        results = world.gather(result)
        if comm.rank == 0:
            mine = [g for r in results for g in r.grads]
            worst = max(float(np.abs(a - b).max()) for a, b in zip(mine, grads))
            if abs(results[-1].loss - loss) > 1e-6 or worst > 1e-6:
                raise AssertionError(f"{schedule} m={m}: loss off by {abs(results[-1].loss - loss)}, grads by {worst}")
            if abs(measured_bubble(results) - bubble_fraction(p, m)) > 1e-12:
                raise AssertionError(f"{schedule} m={m}: bubble {measured_bubble(results)} != {bubble_fraction(p, m)}")
            checked += 1
if comm.rank == 0:
    print(f"OK {checked} pipeline steps on {p} ranks")
sys.stdout.flush()
