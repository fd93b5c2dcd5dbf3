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
  step time (slowest rank) of stage 3 with prefetch off and on, interleaved step by step,
  float32, one BLAS thread per rank, on the plain communicator and behind a simulated 1 Gb/s
  link. Prints ``TIME`` lines.

The ``memory`` and ``time`` measurements are ``benchmarks.sharded``'s functions
(``python -m benchmarks sharded`` runs them for the site's figures).
"""
import sys

import numpy as np
from mpi4py import MPI

from benchmarks import sharded
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

elif mode == "memory":  # the benchmark's measurement (benchmarks/sharded.py), printed per rank
    for row in sharded.memory_rows(world, STATE_HEAVY, batch=2, seq=16, groups=(8, 4, 2, 1), runs=tuple(RUNS)):
        print(f"MEM stage={row['stage']} prefetch={row['prefetch']} ranks={row['ranks']} rank={row['rank']} "
              f"measured={row['measured']} predicted={row['predicted']['peak']} "
              f"phase={row['predicted']['phase']!r}", flush=True)

elif mode in ("time", "time-threads"):
    # Prefetch overlaps a collective with computation only if the collective leaves the CPU
    # free: on one host, the ring's messages are memory copies by the same cores. So each
    # run is timed twice: on the plain communicator, and behind a simulated 1 Gb/s link
    # (SimulatedNetwork, timing="sleep": a transfer costs wall time, no CPU, as with a NIC).
    # The configurations take turns step by step (sharded.interleaved_step_times).
    from threadpoolctl import threadpool_limits

    from reference_impl.comm import run_threads
    from reference_impl.comm.cost_model import LinkParams

    threadpool_limits(limits=1, user_api="blas")
    nets = {"shared-memory": None, "1Gb/s-sim": LinkParams(alpha=50e-6, beta=8e-9, gamma=0.1e-9)}  # 1 Gb/s, 50 us
    args = (TIMED, ((3, False), (3, True)), nets, 10, 2, 2, 32)  # repeats, warm-up steps, batch per rank, seq
    if mode == "time":
        n = world.size
        per_rank = world.gather(sharded.interleaved_step_times(MPICommunicator(world), *args))
    else:
        n = int(sys.argv[2])
        per_rank = run_threads(n, sharded.interleaved_step_times, *args, timeout=120)
    if world.rank == 0:
        for (net, stage, prefetch), seconds in per_rank[0].items():
            slowest = [max(ts) for ts in zip(*(r[(net, stage, prefetch)] for r in per_rank))]
            print(f"TIME {'mpi' if mode == 'time' else 'threads'} net={net} stage={stage} prefetch={prefetch} "
                  f"ranks={n} median_step_ms={1e3 * float(np.median(slowest)):.1f}", flush=True)
else:
    raise SystemExit(f"unknown mode {mode!r}")
sys.stdout.flush()
