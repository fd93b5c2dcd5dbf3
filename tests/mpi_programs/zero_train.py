"""Run under mpiexec: ZeRO stages 0-3 on MPI processes, one process per rank.

Usage: zero_train.py MODE, MODE one of

* ``equivalence``: every stage (stage 3 with prefetch on and off) trains the tiny float64 GPT
  for 50 Adam steps on the world's ranks, each on its rows of the global batch; every rank
  compares the gathered parameters with single-process Adam on the whole batch, and checks
  that the bytes its ``CountingCommunicator`` sent in one step equal ``zero.comm_elements``.
  Rank 0 prints ``EQUIV stage=S prefetch=P ranks=N maxdiff=D bytes=B expected=E`` lines.
* ``memory``: on 8 processes, the world is split into groups of 8, 4, 2 and 1 ranks; in each,
  every stage trains a float32 model whose state outweighs its activations, and each process
  measures its own peak with ``tracemalloc`` over its second step (everything the process
  allocated since before the model was built is traced, so the peak is the rank's whole
  footprint: persistent arrays, activations, temporaries, gathered layers, messages).
  Prints ``MEM stage=S prefetch=P ranks=N rank=R measured=M predicted=X phase=...``.
* ``time`` (under mpiexec) or ``time-threads N`` (plain ``python``, N thread ranks): median
  step time (slowest rank) of stage 3 with prefetch off and on, twice each, float32, one
  BLAS thread per rank, on the plain communicator and behind a simulated 1 Gb/s link.
  Prints ``TIME`` lines.
"""
import sys
import time
import tracemalloc

import numpy as np
from mpi4py import MPI

from reference_impl.comm import CountingCommunicator, MPICommunicator
from reference_impl.parallel import transformer as tf
from reference_impl.parallel import zero

TINY = tf.GPTConfig(vocab_size=96, block_size=9, n_layer=2, n_head=2, n_embd=10)  # units of 1050, 1330, 20
STATE_HEAVY = tf.GPTConfig(vocab_size=96, block_size=16, n_layer=4, n_head=2, n_embd=62)
TIMED = tf.GPTConfig(vocab_size=96, block_size=32, n_layer=4, n_head=4, n_embd=128)
RUNS = [(s, True) for s in range(4)] + [(3, False)]

world = MPI.COMM_WORLD
mode = sys.argv[1]

if mode == "equivalence":
    comm = MPICommunicator(world)
    n, batch, seq, steps = comm.size, 8, 9, 50
    reference = zero.reference_train(TINY, steps, batch, seq)
    for stage, prefetch in RUNS:
        counting = CountingCommunicator(comm)
        with zero.ZeroTrainer(counting, TINY, tf.init_params(TINY, dtype=np.float64), stage=stage,
                              prefetch=prefetch) as t:
            sent = []
            for s in range(steps):
                before = counting.bytes_sent
                t.step(*zero.local_batch(s, batch, seq, comm.rank, n))
                sent.append(counting.bytes_sent - before)
            params = t.full_params()
        diff = max(float(np.abs(params[k] - reference[k]).max()) for k in reference)
        expected = 8 * zero.comm_elements(TINY, stage, n)
        if diff > 1e-6 or set(sent) != {expected}:
            raise AssertionError(f"rank {comm.rank}: stage {stage} prefetch {prefetch}: differs from single-process "
                                 f"Adam by {diff}, or sent {sorted(set(sent))} bytes per step, not {expected}")
        diffs = world.gather(diff)
        if comm.rank == 0:
            print(f"EQUIV stage={stage} prefetch={prefetch} ranks={n} maxdiff={max(diffs):.3g} "
                  f"bytes={sent[0]} expected={expected}", flush=True)

elif mode == "memory":
    batch, seq = 2, 16
    zero.global_batch(0, 1, seq)  # the corpus is built and cached before anything is traced
    for n in (8, 4, 2, 1):
        sub = world.Split(color=world.rank // n, key=world.rank)
        comm = MPICommunicator(sub)
        for stage, prefetch in RUNS:
            tracemalloc.start()
            params = tf.init_params(STATE_HEAVY, dtype=np.float32)
            with zero.ZeroTrainer(comm, STATE_HEAVY, params, stage=stage, prefetch=prefetch) as t:
                del params  # the trainer keeps what its stage keeps
                t.step(*zero.local_batch(0, batch * n, seq, comm.rank, n))  # warm: lazy imports, masks
                tracemalloc.reset_peak()
                t.step(*zero.local_batch(1, batch * n, seq, comm.rank, n))
                measured = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            predicted = zero.zero_memory(STATE_HEAVY, batch, seq, stage=stage, ranks=n, prefetch=prefetch)
            print(f"MEM stage={stage} prefetch={prefetch} ranks={n} rank={comm.rank} measured={measured} "
                  f"predicted={predicted['peak']} phase={predicted['phase']!r}", flush=True)
            sub.Barrier()
        sub.Free()

elif mode in ("time", "time-threads"):
    # Prefetch overlaps a collective with computation only if the collective leaves the CPU
    # free: on one host, the ring's messages are memory copies by the same cores. So each
    # run is timed twice: on the plain communicator, and behind a simulated 1 Gb/s link
    # (SimulatedNetwork, timing="sleep": a transfer costs wall time, no CPU, as with a NIC).
    from threadpoolctl import threadpool_limits

    from reference_impl.comm import SimulatedNetwork, run_threads
    from reference_impl.comm.cost_model import LinkParams

    threadpool_limits(limits=1, user_api="blas")
    link = LinkParams(alpha=50e-6, beta=8e-9, gamma=0.1e-9)  # 1 Gb/s, 50 us

    def median_step(comm, net, prefetch, steps=12, batch=2, seq=32):
        c = SimulatedNetwork(comm, link, timing="sleep") if net == "1Gb/s-sim" else comm
        with zero.ZeroTrainer(c, TIMED, tf.init_params(TIMED, dtype=np.float32), stage=3, prefetch=prefetch) as t:
            for s in range(steps):
                t.step(*zero.local_batch(s, batch * comm.size, seq, comm.rank, comm.size))
            return float(np.median(t.step_seconds[2:]))

    for net in ("shared-memory", "1Gb/s-sim"):
        for prefetch in (False, True, False, True):
            if mode == "time":
                n = world.size
                slowest = world.reduce(median_step(MPICommunicator(world), net, prefetch), op=MPI.MAX)
            else:
                n = int(sys.argv[2])
                slowest = max(run_threads(n, median_step, net, prefetch, timeout=120))
            if world.rank == 0:
                print(f"TIME {'mpi' if mode == 'time' else 'threads'} net={net} stage=3 prefetch={prefetch} ranks={n} "
                      f"median_step_ms={1e3 * slowest:.1f}", flush=True)
else:
    raise SystemExit(f"unknown mode {mode!r}")
sys.stdout.flush()
