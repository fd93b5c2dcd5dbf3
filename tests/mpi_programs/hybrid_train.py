"""Run under mpiexec -n 4: hybrid training on a 2x2 grid of processes equals single-rank training.

For each layout (DP x TP = 2 x 2; TP x PP = 2 x 2 with 2 micro-batches; the same with sequence
parallelism), every process trains the float64 GPT for 3 Adam steps with
``hybrid.train`` over a counted ``MPICommunicator`` (the grid's groups are real MPI
communicators from ``Comm.Split``); rank 0 gathers every rank's shards, rebuilds the model
(``hybrid.full_params``) and compares it and the losses with ``zero.reference_train``; every
rank compares the bytes it sent on each group with ``hybrid.step_comm_bytes`` (without
sequence parallelism). Rank 0 prints per layout
``HYBRID dp=D tp=T pp=P m=M sp=S maxdiff=X lossdiff=Y bytes=ok step_s=... peak_MiB=...``.
"""
import numpy as np
from mpi4py import MPI

from reference_impl.comm import CountingCommunicator, MPICommunicator
from reference_impl.parallel import hybrid, zero
from reference_impl.parallel import transformer as tf
from reference_impl.parallel.process_grid import GridLayout

CFG = tf.GPTConfig(vocab_size=96, block_size=8, n_layer=2, n_head=4, n_embd=16)
STEPS, BATCH, SEQ = 3, 8, 8
LAYOUTS = [dict(dp=2, tp=2, pp=1, microbatches=1), dict(dp=1, tp=2, pp=2, microbatches=2),
           dict(dp=1, tp=2, pp=2, microbatches=2, sequence_parallel=True)]

world = MPI.COMM_WORLD
comm = CountingCommunicator(MPICommunicator(world))


def reference_losses():
    params = tf.init_params(CFG, dtype=np.float64)
    opt, out = hybrid.Adam(1e-3), []
    for s in range(STEPS):
        loss, grads = tf.loss_and_grads(params, *zero.global_batch(s, BATCH, SEQ), CFG)
        opt.step(params, grads)
        out.append(loss)
    return out


reference = zero.reference_train(CFG, STEPS, BATCH, SEQ) if world.rank == 0 else None
losses_ref = reference_losses()
for layout in LAYOUTS:
    run = hybrid.train(comm, CFG, steps=STEPS, batch=BATCH, seq=SEQ, measure_memory=True, **layout)
    grid = GridLayout(dp=layout["dp"], tp=layout["tp"], pp=layout["pp"])
    if not layout.get("sequence_parallel"):
        want = {k: STEPS * v for k, v in hybrid.step_comm_bytes(CFG, grid, run.coords, BATCH, SEQ,
                                                               layout["microbatches"]).items()}
        got = {k: run.bytes_sent.get(k, 0) for k in want}
        if got != want:
            raise AssertionError(f"rank {world.rank}, {layout}: sent {got} bytes per group, closed form {want}")
    lossdiff = max(abs(a - b) for a, b in zip(run.losses, losses_ref))
    if lossdiff > 1e-9:
        raise AssertionError(f"rank {world.rank}, {layout}: losses {run.losses} differ from {losses_ref}")
    shards = world.gather(run.shards)
    times, peaks = world.gather(float(np.median(run.step_seconds))), world.gather(run.peak_bytes)
    if world.rank == 0:
        full = hybrid.full_params(shards, grid, CFG)
        diff = max(float(np.abs(full[k] - reference[k]).max()) for k in reference)
        if diff > 1e-6:
            raise AssertionError(f"{layout}: parameters differ from single-rank training by {diff}")
        print(f"HYBRID dp={grid.dp} tp={grid.tp} pp={grid.pp} m={layout['microbatches']} "
              f"sp={int(bool(layout.get('sequence_parallel')))} maxdiff={diff:.3g} lossdiff={lossdiff:.3g} bytes=ok "
              f"step_s={max(times):.4f} peak_MiB={max(peaks) / 2**20:.2f}", flush=True)
