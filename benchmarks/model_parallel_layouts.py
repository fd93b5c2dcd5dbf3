"""One GPT, many layouts, measured; and what the layout planner predicts for each.

The ``layouts`` and ``predicted`` sections of ``python -m benchmarks model_parallel`` (this
module does the measuring; ``model_parallel.py`` calls ``layouts_section`` and
``predicted_section`` and writes the file).

**layouts.** The same float32 GPT (``Workload``: 4 blocks of width 256, 4 heads, 3.2 M
parameters, a step of about 0.25 s on one core), the same global batch (16 sequences of 64
tokens), the same Adam and the same batches, trained on one ``mpiexec`` job of 4 processes (one process per rank,
so a process's ``tracemalloc`` peak is one rank's memory) in each of these layouts:

* ``DP``: plain data parallelism, ``zero.ZeroTrainer`` stage 0 (one ring allreduce of the
  gradients per layer unit);
* ``ZeRO-3``: ``ZeroTrainer`` stage 3 without prefetch (FSDP's FULL_SHARD: each layer's
  parameters all-gathered before its forward and its backward, its gradients reduce-scattered);
* ``TP4``, ``TP4+SP``: Megatron-LM tensor parallelism over the 4 ranks, without and with
  sequence parallelism (``hybrid.HybridTrainer`` with ``tp=4``);
* ``PP4``: four pipeline stages, one block each (the embedding on the first, the tied output
  layer and the loss on the last), GPipe over 4 micro-batches;
* ``DP2xTP2`` and ``TP2xPP2``: two-dimensional grids (``process_grid.ProcessGrid``, Megatron's
  rank order: TP fastest).

and on a second job of 2 processes (where each has a core of its own on a 2-core machine)
``DP``, ``ZeRO-3``, ``TP2``, ``TP2+SP`` and ``PP2``. Every trainer of a job is built first;
then each timed repeat steps every layout once, in turn, a barrier before each step, and a
step's time is its slowest rank's: load that comes and goes hits all layouts alike. After
``WARMUP`` untimed steps the median of ``REPEATS`` is kept, and all repeats are stored.

*Baseline.* Each job also times ``1 rank``: rank 0 trains the whole model on the whole batch
alone (forward and backward, then Adam, timed apart) while the other ranks sleep in a barrier,
so it has a core of its own; its step is the speed-up's denominator and its forward-backward
rate is what the ``predicted`` section gives the planner.

*Correctness guard.* The same model on the same data must give the same loss in every layout
(each is an exact re-arrangement of one-rank training; ``tests/test_hybrid.py`` and
``tests/test_parallel_zero.py`` prove it in float64): every layout's loss at every step is compared
with the one-process baseline's, and the job fails if one differs by more than ``LOSS_RTOL``
(float32 rounding).

*Memory.* Then each layout is built again inside ``tracemalloc`` (from before its parameters
exist), steps once, and the peak of its second step is its rank's footprint: every NumPy
array and Python object, not MPI's own buffers. Stored per rank (pipeline stages differ),
with the closed forms the code has: ``model_state_bytes``, 16 bytes (parameter, gradient,
Adam's two moments) per parameter the rank holds, for every layout; and for ``DP`` and
``ZeRO-3`` the whole-step peak of ``zero.zero_memory``.

**A mixture-of-experts layer** (not the GPT: the lab has no MoE GPT). One MoE layer with
``MOE_EXPERTS`` experts of the GPT's MLP shape (``C -> 4C -> C``), top-k routing (k = 1,
Switch; k = 2, GShard) with capacity factor ``MOE_CAPACITY``, 1024 tokens per rank
(the same on every rank and for both layouts), trained on a regression loss (the mean squared
error of ``x + MoE(x)`` against a fixed target) with Adam, the load-balancing loss off (its
gradient needs no communication). Two layouts on the same ranks:

* ``EP``: ``expert_parallel.ExpertParallelMoE``, the experts spread over the ranks (E/ep
  each), tokens moved by all-to-all, two each way (dispatch and combine, forward and
  backward), the router's gradient allreduced;
* ``replicated``: every rank holds all ``E`` experts (``moe.moe_forward``/``moe_backward`` on
  its own tokens: the same routing, capacity per rank, as EP's), no all-to-all, all the
  gradients allreduced (one coalesced ring allreduce, Megatron's DDP bucket).

Both compute the same function and the same update, which the job checks (their losses at
every step and their expert parameters after training). Step time and peak memory as above.

*Oversubscription.* The machine the site's numbers come from may have fewer cores than 4:
then 4 processes share them, a step costs about ``ranks / cores`` times its compute, and the
waits inside collectives depend on the scheduler. The JSON says so per job
(``oversubscribed``), and stores the load average before and after each job.

**predicted.** ``planner.predict_step`` for each measured GPT layout on "this machine"
(``planner.local_cluster``): the compute rate of the job's ``1 rank`` baseline (forward and
backward of the whole batch, ``transformer.step_flops`` over its median time, measured between
the layouts' steps, so under the same background load; ``planner.measure_flops_per_second``
in the calibration job is stored beside it) and the link's α, β, γ fitted by
``comm.calibrate.calibrate`` between two ranks (one job of 2 processes). Each row
stores predicted over measured; the target is within ``TARGET`` (25 %), as the cluster
simulator. Twice: as the planner is (each rank has a whole core), and with each rank's rate
scaled by ``cores / ranks`` when ranks outnumber cores (``predicted_shared_s``). And whether
the planner orders the layouts as the measurements do: Kendall's tau and the pairs it swaps,
and, since layouts whose predictions differ by a percent are a tie the measurement's noise
decides, the same for the pairs it tells apart by more than ``DECISIVE`` (5 %).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass
from typing import Any, Callable

from .harness import emit, mpi_job

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Workload:
    """What every layout trains: the GPT's shape, the global batch (``batch`` sequences of ``seq``
    tokens), the pipelined layouts' GPipe micro-batches, and the MoE layer's tokens per rank."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    vocab_size: int = 96
    batch: int = 16
    seq: int = 64
    microbatches: int = 4
    moe_tokens: int = 1024

    def config(self) -> Any:
        from reference_impl.parallel import transformer as tf

        return tf.GPTConfig(vocab_size=self.vocab_size, block_size=self.seq, n_layer=self.n_layer,
                            n_head=self.n_head, n_embd=self.n_embd)


# the site's numbers (a step of about 0.25 s on one core), and a tiny one for the tests
WORKLOADS = {"default": Workload(), "tiny": Workload(n_embd=32, batch=8, seq=16, microbatches=2, moe_tokens=64)}
M = None  # in a layout below: the workload's micro-batches
ONE_RANK = "1 rank"  # the baseline in every job: one process, the whole model and batch
WARMUP, REPEATS = 1, 5
LOSS_RTOL = 1e-4  # float32: the layouts add the same numbers in different orders
SEED = 0
# name -> (kind, dp, tp, pp, zero stage, micro-batches, sequence parallel)
GPT_LAYOUTS: dict[int, tuple[tuple[str, str, int, int, int, int, int | None, bool], ...]] = {
    4: (("DP", "zero", 4, 1, 1, 0, 1, False), ("ZeRO-3", "zero", 4, 1, 1, 3, 1, False),
        ("TP4", "hybrid", 1, 4, 1, 0, 1, False), ("TP4+SP", "hybrid", 1, 4, 1, 0, 1, True),
        ("PP4", "hybrid", 1, 1, 4, 0, M, False), ("DP2xTP2", "hybrid", 2, 2, 1, 0, 1, False),
        ("TP2xPP2", "hybrid", 1, 2, 2, 0, M, False)),
    2: (("DP", "zero", 2, 1, 1, 0, 1, False), ("ZeRO-3", "zero", 2, 1, 1, 3, 1, False),
        ("TP2", "hybrid", 1, 2, 1, 0, 1, False), ("TP2+SP", "hybrid", 1, 2, 1, 0, 1, True),
        ("PP2", "hybrid", 1, 1, 2, 0, M, False)),
}
RANKS = (4, 2)
MOE_EXPERTS, MOE_TOP_K, MOE_CAPACITY = 8, (1, 2), 1.25
TARGET = 0.25  # predicted within 25 % of measured
DECISIVE = 0.05  # two layouts whose predictions differ by less are a tie for the planner


def resolve(spec: tuple, w: Workload) -> tuple:
    """A layout with its micro-batch count filled in from the workload."""
    name, kind, dp, tp, pp, stage, m, sp = spec
    return name, kind, dp, tp, pp, stage, w.microbatches if m is None else m, sp


def layout_fields(spec: tuple) -> dict[str, Any]:
    name, kind, dp, tp, pp, stage, m, sp = spec
    return {"layout": name, "trainer": kind, "dp": dp, "tp": tp, "pp": pp, "zero": stage, "microbatches": m,
            "sequence_parallel": sp}


def slowest(per_rank: list[list[float]]) -> list[float]:
    """Per repeat, the slowest rank's time (a step is done when its last rank is)."""
    return [max(ts) for ts in zip(*per_rank)]


def check_losses(losses: dict[str, list[float]], reference: str, rtol: float = LOSS_RTOL) -> float:
    """The largest relative difference of any layout's loss from ``reference``'s, step by step;
    ``AssertionError`` naming the layout and step when it exceeds ``rtol``."""
    ref = losses[reference]
    worst = 0.0
    for name, values in losses.items():
        if len(values) != len(ref):
            raise AssertionError(f"layout {name}: {len(values)} losses, {reference} has {len(ref)}")
        for step, (a, b) in enumerate(zip(values, ref)):
            diff = abs(a - b) / abs(b)
            if diff > rtol:
                raise AssertionError(f"layout {name}: loss {a!r} at step {step} differs from {reference}'s {b!r} "
                                     f"by {diff:.2e} (relative), more than {rtol:g}: not the same training")
            worst = max(worst, diff)
    return worst


def kendall(order_a: list[str], order_b: list[str]) -> tuple[float, list[list[str]]]:
    """Kendall's tau between two orderings of the same names, and the pairs they order differently."""
    if sorted(order_a) != sorted(order_b):
        raise ValueError(f"kendall: the orderings hold different names: {order_a} and {order_b}")
    pos_b = {name: i for i, name in enumerate(order_b)}
    swapped, pairs = [], 0
    for i, a in enumerate(order_a):
        for b in order_a[i + 1:]:
            pairs += 1
            if pos_b[a] > pos_b[b]:
                swapped.append([a, b])
    return (1.0 - 2.0 * len(swapped) / pairs if pairs else 1.0), swapped


# ----------------------------------------------------------------- on every rank: the GPT layouts


class _GPTRun:
    """One layout's trainer on this rank, stepping through the global batches 0, 1, 2, ..."""

    def __init__(self, comm: Any, spec: tuple, w: Workload) -> None:
        import numpy as np

        from reference_impl.parallel import hybrid, zero
        from reference_impl.parallel import transformer as tf
        from reference_impl.parallel.process_grid import ProcessGrid

        name, kind, dp, tp, pp, stage, m, sp = spec
        self.name, self.kind, self.comm, self.s = name, kind, comm, 0
        config = w.config()
        params = tf.init_params(config, seed=SEED, dtype=np.float32)
        if kind == "zero":
            self.trainer = zero.ZeroTrainer(comm, config, params, stage=stage, prefetch=False)
            self.batch = lambda s: zero.local_batch(s, w.batch, w.seq, comm.rank, comm.size, SEED)
            self.held = sum(u.shard if stage == 3 else u.padded for u in self.trainer.units.values())
        else:
            grid = ProcessGrid(comm, dp=dp, tp=tp, pp=pp)
            self.trainer = hybrid.HybridTrainer(grid, config, params, microbatches=m, sequence_parallel=sp)
            self.batch = lambda s: zero.local_batch(s, w.batch, w.seq, grid.coords.dp, dp, SEED)
            self.held = sum(int(v.size) for v in self.trainer.shards.values())
        del params

    def step(self) -> float:
        """One training step; the global batch's mean loss (ZeRO's rank-local loss is averaged later)."""
        loss = self.trainer.step(*self.batch(self.s))
        self.s += 1
        return float(loss)

    def close(self) -> None:
        if self.kind == "zero":
            self.trainer.close()


class _OneRank:
    """The baseline: rank 0 trains the whole model on the whole global batch alone (forward and
    backward, then Adam, timed apart) while the other ranks sleep in a barrier, so it has a core
    to itself even when ranks outnumber cores; it is also the single-process reference loss."""

    name = ONE_RANK

    def __init__(self, world: Any, w: Workload) -> None:
        import numpy as np

        from reference_impl.parallel import transformer as tf
        from reference_impl.parallel.adam import Adam

        self.world, self.w, self.s = world, w, 0
        self.fwd_bwd: list[float] = []
        self.whole: list[float] = []
        self.held = 0
        if world.rank == 0:
            self.config = w.config()
            self.params = tf.init_params(self.config, seed=SEED, dtype=np.float32)
            self.opt = Adam()
            self.opt.init_state(self.params)
            self.held = sum(int(v.size) for v in self.params.values())

    def step(self) -> float:
        from reference_impl.parallel import transformer as tf
        from reference_impl.parallel import zero

        loss = float("nan")
        if self.world.rank == 0:
            tokens, targets = zero.global_batch(self.s, self.w.batch, self.w.seq, SEED)
            t0 = time.perf_counter()
            loss, grads = tf.loss_and_grads(self.params, tokens, targets, self.config)
            t1 = time.perf_counter()
            self.opt.step(self.params, grads)
            self.fwd_bwd.append(t1 - t0)
            self.whole.append(time.perf_counter() - t0)
        self.s += 1
        sleepy_barrier(self.world)
        return float(loss)

    def close(self) -> None:
        pass


def sleepy_barrier(world: Any, pause: float = 1e-3) -> None:
    """An MPI barrier whose waiters sleep between polls (MPICH's blocking one spins on the core)."""
    request = world.Ibarrier()
    while not request.Test():
        time.sleep(pause)


def interleaved(comm: Any, steps: dict[str, Callable[[], float]], total: int) -> tuple[dict, dict]:
    """``total`` rounds; each steps every layout once, in turn, after a barrier. This rank's
    (seconds, losses) per layout."""
    times: dict[str, list[float]] = {n: [] for n in steps}
    losses: dict[str, list[float]] = {n: [] for n in steps}
    for _ in range(total):
        for name, fn in steps.items():
            comm.barrier()  # the communicator's: it yields the core while it waits
            t0 = time.perf_counter()
            losses[name].append(fn())
            times[name].append(time.perf_counter() - t0)
    return times, losses


def traced_peak(build: Callable[[], Any], step: Callable[[Any], Any], close: Callable[[Any], None]) -> int:
    """This process's ``tracemalloc`` peak over the second step of a trainer built while tracing."""
    gc.collect()
    tracemalloc.start()
    try:
        obj = build()
        step(obj)  # warm: lazy imports, first-touch caches
        tracemalloc.reset_peak()
        step(obj)
        peak = tracemalloc.get_traced_memory()[1]
        close(obj)
    finally:
        tracemalloc.stop()
    return peak


def gpt_rows(world: Any, comm: Any, w: Workload, warmup: int, repeats: int) -> list[dict[str, Any]]:
    """Every GPT layout of this rank count, timed interleaved, then traced one by one; rank 0's rows."""
    from reference_impl.parallel import transformer as tf
    from reference_impl.parallel import zero

    config = w.config()
    specs = [resolve(spec, w) for spec in GPT_LAYOUTS[comm.size]]
    zero.global_batch(0, 1, w.seq)  # the corpus is built and cached before anything is timed or traced
    one = _OneRank(world, w)
    runs = [one] + [_GPTRun(comm, spec, w) for spec in specs]
    times, losses = interleaved(comm, {r.name: r.step for r in runs}, warmup + repeats)
    held = {r.name: r.held for r in runs}
    for r in runs:
        r.close()
    del runs
    builders = {ONE_RANK: lambda: _OneRank(world, w)}
    builders.update({spec[0]: (lambda spec=spec: _GPTRun(comm, spec, w)) for spec in specs})
    peaks = {}
    for name, build in builders.items():
        peaks[name] = traced_peak(build, lambda run: run.step(), lambda run: run.close())
        comm.barrier()
    everyone = world.gather((times, losses, peaks, held))
    if comm.rank:
        return []
    fwd_bwd, whole = one.fwd_bwd[warmup:], one.whole[warmup:]
    rows = [{"kind": "gpt", "ranks": 1, "job_ranks": comm.size, "layout": ONE_RANK, "trainer": "one process",
             "dp": 1, "tp": 1, "pp": 1, "zero": 0, "microbatches": 1, "sequence_parallel": False,
             "step_s": statistics.median(whole), "step_times": whole, "warmup_times": one.whole[:warmup],
             "forward_backward_s": statistics.median(fwd_bwd), "forward_backward_times": fwd_bwd,
             "flops_per_step": tf.step_flops(config, w.batch, w.seq)["total"],
             "peak_bytes_per_rank": [everyone[0][2][ONE_RANK]], "model_state_bytes_per_rank": [16 * one.held],
             "held_parameters_per_rank": [one.held], "losses": losses[ONE_RANK]}]
    rows[0]["flops_per_s"] = rows[0]["flops_per_step"] / rows[0]["forward_backward_s"]
    rows[0]["peak_bytes"], rows[0]["model_state_bytes"] = rows[0]["peak_bytes_per_rank"][0], 16 * one.held
    global_losses = {ONE_RANK: losses[ONE_RANK]}
    for spec in specs:
        name, kind = spec[0], spec[1]
        per_rank_losses = [e[1][name] for e in everyone]
        # ZeRO's step returns its own rows' mean; the ranks' rows are equal in number, so the
        # global batch's mean is the mean over ranks. The hybrid trainer's is already global.
        global_losses[name] = ([statistics.fmean(v) for v in zip(*per_rank_losses)] if kind == "zero"
                               else per_rank_losses[0])
        all_times = slowest([e[0][name] for e in everyone])
        timed = all_times[warmup:]
        row = {"kind": "gpt", "ranks": comm.size, "job_ranks": comm.size, **layout_fields(spec),
               "step_s": statistics.median(timed),
               "step_times": timed, "warmup_times": all_times[:warmup],
               "peak_bytes_per_rank": [e[2][name] for e in everyone],
               "model_state_bytes_per_rank": [16 * e[3][name] for e in everyone],
               "held_parameters_per_rank": [e[3][name] for e in everyone], "losses": global_losses[name]}
        row["peak_bytes"] = max(row["peak_bytes_per_rank"])
        row["model_state_bytes"] = max(row["model_state_bytes_per_rank"])
        if kind == "zero":
            z = zero.zero_memory(config, w.batch // comm.size, w.seq, stage=spec[5], ranks=comm.size, prefetch=False,
                                 itemsize=4)
            row["predicted_peak_bytes"] = z["peak"]
            row["predicted_phase"] = z["phase"]
        rows.append(row)
    worst = check_losses(global_losses, ONE_RANK)
    for row in rows:
        row["loss_check"] = {"against": ONE_RANK, "max_rel_diff": worst, "rtol": LOSS_RTOL}
    emit({"n_params": tf.n_params(config)})
    return rows


# ----------------------------------------------------------------- on every rank: the MoE layer


class _MoERun:
    """One MoE layer on this rank, ``ep`` (experts spread, all-to-all) or ``replicated`` (all experts)."""

    def __init__(self, comm: Any, w: Workload, k: int, how: str) -> None:
        import numpy as np

        from reference_impl.parallel import expert_parallel, moe
        from reference_impl.parallel.adam import Adam

        self.comm, self.how = comm, how
        C, T = w.n_embd, w.moe_tokens
        self.cfg = moe.MoEConfig(n_embd=C, n_experts=MOE_EXPERTS, top_k=k, capacity_factor=MOE_CAPACITY,
                                 aux_loss_coeff=0.0)
        full = moe.init_params(self.cfg, seed=SEED, dtype=np.float32)
        rng = np.random.default_rng([SEED, comm.rank])
        self.x = rng.standard_normal((T, C)).astype(np.float32)
        self.target = rng.standard_normal((T, C)).astype(np.float32)
        self.scale = np.float32(1.0 / (T * comm.size * C))  # the mean over every rank's tokens
        if how == "ep":
            self.params = expert_parallel.shard_experts(full, comm.rank, comm.size)
            self.layer = expert_parallel.ExpertParallelMoE(comm, self.params, self.cfg)
        else:
            self.params = {n: v.copy() for n, v in full.items()}
        del full
        self.held = sum(int(v.size) for v in self.params.values())
        self.opt = Adam()
        self.opt.init_state(self.params)

    def step(self) -> float:
        import numpy as np

        from reference_impl.comm import allreduce
        from reference_impl.parallel import moe

        if self.how == "ep":
            y = self.layer.forward(self.x)
        else:
            y, cache = moe.moe_forward(self.params, self.x, self.cfg)
        r = self.x + y - self.target
        loss = 0.5 * float(np.dot(r.ravel(), r.ravel())) * float(self.scale)
        dy = r * self.scale
        if self.how == "ep":
            _, grads = self.layer.backward(dy)
        else:
            _, grads = moe.moe_backward(self.params, dy, cache, self.cfg)
            names = sorted(grads)  # every gradient summed over the ranks: one coalesced ring allreduce
            flat = allreduce(self.comm, np.concatenate([grads[n].reshape(-1) for n in names]), algorithm="ring")
            offset = 0
            for n in names:
                grads[n] = flat[offset:offset + grads[n].size].reshape(grads[n].shape)
                offset += grads[n].size
        self.opt.step(self.params, grads)
        return float(allreduce(self.comm, np.array([loss]))[0])

    def experts(self) -> dict[str, Any]:
        """This rank's experts (EP: its own; replicated: the same slice of all of them) and the router."""
        E_local = MOE_EXPERTS // self.comm.size
        lo = 0 if self.how == "ep" else self.comm.rank * E_local
        return {n: (v if n == "wg" else v[lo:lo + E_local]) for n, v in self.params.items()}


def moe_rows(world: Any, comm: Any, w: Workload, warmup: int, repeats: int) -> list[dict[str, Any]]:
    """EP against replicated experts, per top-k, timed interleaved and traced; rank 0's rows."""
    import numpy as np

    out = []
    for k in MOE_TOP_K:
        runs = {how: _MoERun(comm, w, k, how) for how in ("ep", "replicated")}
        times, losses = interleaved(comm, {how: r.step for how, r in runs.items()}, warmup + repeats)
        mine, theirs = runs["ep"].experts(), runs["replicated"].experts()
        param_diff = max(float(np.abs(mine[n] - theirs[n]).max()) for n in mine)
        held = {how: r.held for how, r in runs.items()}
        dropped = runs["ep"].layer.stats.dropped_fraction
        del runs
        peaks = {how: traced_peak(lambda how=how: _MoERun(comm, w, k, how), lambda run: run.step(), lambda run: None)
                 for how in ("ep", "replicated")}
        everyone = world.gather((times, peaks, held, param_diff, dropped))
        if comm.rank:
            continue
        worst = check_losses(losses, "replicated")  # every rank has the allreduced loss
        diff = max(e[3] for e in everyone)
        if diff > 1e-4:
            raise AssertionError(f"MoE k={k}: after {warmup + repeats} steps the expert-parallel experts differ from "
                                 f"the replicated ones by {diff:.2e}: not the same training")
        for how in ("ep", "replicated"):
            all_times = slowest([e[0][how] for e in everyone])
            timed = all_times[warmup:]
            name = f"EP{comm.size}" if how == "ep" else f"replicated x{comm.size}"
            row = {"kind": "moe_layer", "ranks": comm.size, "layout": f"{name} k={k}", "moe": how, "top_k": k,
                   "step_s": statistics.median(timed), "step_times": timed, "warmup_times": all_times[:warmup],
                   "peak_bytes_per_rank": [e[1][how] for e in everyone],
                   "model_state_bytes_per_rank": [16 * e[2][how] for e in everyone],
                   "held_parameters_per_rank": [e[2][how] for e in everyone], "losses": losses[how],
                   "loss_check": {"against": "replicated", "max_rel_diff": worst, "rtol": LOSS_RTOL,
                                  "max_expert_param_diff": diff},
                   "dropped_fraction_last_step_per_rank": [e[4] for e in everyone]}
            row["peak_bytes"] = max(row["peak_bytes_per_rank"])
            row["model_state_bytes"] = max(row["model_state_bytes_per_rank"])
            out.append(row)
    return out


def run_layouts_rank(w: Workload, warmup: int, repeats: int, moe: bool) -> None:
    """The ``layouts`` job's worker: GPT layouts, then the MoE layer; rank 0 prints JSON lines."""
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator

    world = MPI.COMM_WORLD
    comm = MPICommunicator(world)
    if comm.size not in GPT_LAYOUTS:
        raise SystemExit(f"layouts: no layouts for {comm.size} ranks (have {sorted(GPT_LAYOUTS)})")
    if comm.rank == 0:
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})
    for row in gpt_rows(world, comm, w, warmup, repeats):
        emit(row)
    if moe:
        for row in moe_rows(world, comm, w, warmup, repeats):
            emit(row)


def run_calibrate_rank(w: Workload, flops_repeats: int) -> None:
    """The ``predicted`` job's worker (2 ranks): α-β-γ between the ranks, then rank 0's one-rank FLOP/s."""
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator
    from reference_impl.comm.calibrate import calibrate
    from reference_impl.parallel import planner

    comm = MPICommunicator(MPI.COMM_WORLD)
    link = calibrate(comm)
    if comm.rank == 0:
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})
        flops = planner.measure_flops_per_second(w.config(), w.batch, w.seq, repeats=flops_repeats)
        emit({"one_rank": one_rank_times(w, flops_repeats)})
        emit({"link": {"alpha": link.alpha, "beta": link.beta, "gamma": link.gamma,
                       "r_squared": link.fit.r_squared if link.fit is not None else None},
              "flops_per_s": flops, "flops_repeats": flops_repeats})
    comm.barrier()  # the communicator's: rank 1 sleeps while rank 0 measures


def one_rank_times(w: Workload, repeats: int) -> dict[str, Any]:
    """What the planner's rate leaves out, on one process: the whole step with Adam beside forward and
    backward alone (median seconds, global batch), and the forward-backward rate at a rank's share of
    the batch (smaller matrices run at another rate)."""
    import numpy as np

    from reference_impl.parallel import planner, zero
    from reference_impl.parallel import transformer as tf
    from reference_impl.parallel.adam import Adam

    config = w.config()
    params = tf.init_params(config, seed=SEED, dtype=np.float32)
    opt = Adam()
    tokens, targets = zero.global_batch(0, w.batch, w.seq, SEED)
    fwd_bwd, adam = [], []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        _, grads = tf.loss_and_grads(params, tokens, targets, config)
        t1 = time.perf_counter()
        opt.step(params, grads)
        t2 = time.perf_counter()
        if i:  # the first is a warm-up
            fwd_bwd.append(t1 - t0)
            adam.append(t2 - t1)
    rates = {str(b): planner.measure_flops_per_second(config, b, w.seq, repeats=repeats)
             for b in (w.batch // 2, w.batch // 4)}
    return {"forward_backward_s": statistics.median(fwd_bwd), "adam_s": statistics.median(adam),
            "flops_per_s_at_batch": rates}


# ----------------------------------------------------------------- the driver side


def _job(ranks: int, argv: list[str], timeout: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    records: list[dict[str, Any]] = []
    cores = os.cpu_count() or 1
    load_before, t0 = os.getloadavg(), time.perf_counter()
    mpi_job(ranks, ["-m", "benchmarks.model_parallel_layouts", *argv], records.append, timeout, env=ONE_THREAD)
    job = {"ranks": ranks, "cores": cores, "oversubscribed": ranks > cores, "seconds": time.perf_counter() - t0,
           "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()), "env": ONE_THREAD}
    return records, job


def layouts_section(rank_counts: tuple[int, ...] = RANKS, warmup: int = WARMUP, repeats: int = REPEATS,
                    moe: bool = True, timeout: float = 1800.0, workload: str = "default") -> dict[str, Any]:
    """One ``mpiexec`` job per rank count; the rows of every layout, and the jobs' machine state."""
    w = WORKLOADS[workload]
    unknown = [r for r in rank_counts if r not in GPT_LAYOUTS]
    if unknown or not rank_counts:
        raise ValueError(f"layouts: no layouts for rank counts {unknown or list(rank_counts)}; "
                         f"the section has them for {sorted(GPT_LAYOUTS)}")
    results, jobs, library, n_params = [], [], "unknown", None
    for ranks in rank_counts:
        argv = ["--worker", "layouts", "--workload", workload, "--warmup", str(warmup), "--repeats", str(repeats)]
        argv += [] if moe else ["--no-moe"]
        records, job = _job(ranks, argv, timeout)
        for rec in records:
            if "mpi_library" in rec:
                library = rec["mpi_library"]
            elif "n_params" in rec:
                n_params = rec["n_params"]
            else:
                results.append(rec)
        jobs.append(job)
        print(f"  layouts, {ranks} ranks: {job['seconds']:.0f} s, load {job['loadavg_before'][0]:.2f} -> "
              f"{job['loadavg_after'][0]:.2f}" + (" (oversubscribed)" if job["oversubscribed"] else ""), flush=True)
    cores = os.cpu_count() or 1
    caveat = (f"{max(rank_counts)} processes on {cores} cores: oversubscribed, each rank gets about "
              f"{cores / max(rank_counts):.2g} of a core, so step times include waiting for the CPU, not only "
              f"computing and communicating" if max(rank_counts) > cores else "every rank has a core of its own")
    C = w.n_embd
    return {"workload": workload, "model": {**asdict(w), "n_params": n_params, "dtype": "float32",
                                            "optimizer": "Adam"},
            "batch": w.batch, "seq": w.seq, "microbatches": w.microbatches, "warmup": warmup, "repeats": repeats,
            "moe_layer": {"n_experts": MOE_EXPERTS, "top_k": list(MOE_TOP_K), "tokens_per_rank": w.moe_tokens,
                          "capacity_factor": MOE_CAPACITY, "expert_shape": f"{C} -> {4 * C} -> {C}",
                          "aux_loss_coeff": 0.0,
                          "loss": "mean squared error of x + MoE(x) against a fixed random target",
                          "note": "one MoE layer, not the GPT"} if moe else None,
            "step_time": "median over the timed repeats of the slowest rank's step (barrier before each step)",
            "peak": "tracemalloc peak of the rank's process over its second step, traced from before its model "
                    "was built (NumPy arrays and Python objects; not MPI's own buffers)",
            "model_state": "16 bytes (float32 parameter, gradient, Adam m and v) per parameter the rank holds",
            "mpi_library": library, "cores": cores, "caveat": caveat, "jobs": jobs, "results": results}


def _planner_layout(row: dict[str, Any], batch: int) -> Any:
    from reference_impl.parallel import planner

    micro = batch // (row["dp"] * row["microbatches"])
    return planner.Layout(tp=row["tp"], pp=row["pp"], dp=row["dp"], zero=row["zero"], micro_batch=micro,
                          sequence_parallel=row["sequence_parallel"])


def predicted_section(layouts: dict[str, Any], flops_repeats: int = 5, timeout: float = 600.0) -> dict[str, Any]:
    """The planner's step time and memory for every measured GPT layout, against the measurement."""
    from reference_impl.comm.cost_model import LinkParams
    from reference_impl.parallel import planner

    workload = layouts.get("workload", "default")
    w = WORKLOADS[workload]
    if (w.batch, w.seq) != (layouts.get("batch"), layouts.get("seq")):
        raise ValueError(f"predicted: the layouts section measured batch {layouts.get('batch')} x "
                         f"{layouts.get('seq')}, but its workload {workload!r} is now {w.batch} x {w.seq}: "
                         "measure the layouts again")
    records, job = _job(2, ["--worker", "calibrate", "--workload", workload, "--flops-repeats", str(flops_repeats)],
                        timeout)
    measured = next(r for r in records if "link" in r)
    one_rank = next((r["one_rank"] for r in records if "one_rank" in r), None)
    library = next((r["mpi_library"] for r in records if "mpi_library" in r), "unknown")
    link = LinkParams(measured["link"]["alpha"], measured["link"]["beta"], measured["link"]["gamma"])
    # the compute rate of each job: its one-rank baseline, timed between the layouts' steps
    rates = {r["job_ranks"]: r["flops_per_s"] for r in layouts["results"] if r["layout"] == ONE_RANK}
    cores = os.cpu_count() or 1
    model = planner.Model.from_config(w.config(), w.seq, precision="fp32")
    rows = []
    for m in (r for r in layouts["results"] if r["kind"] == "gpt" and r["layout"] != ONE_RANK):
        ranks = m["ranks"]
        if ranks not in rates:
            raise ValueError(f"predicted: the {ranks}-rank job of the layouts section has no {ONE_RANK!r} row")
        flops = rates[ranks]
        share = min(1.0, cores / ranks)
        layout = _planner_layout(m, w.batch)
        est = planner.predict_step(layout, model, planner.local_cluster(flops, link, ranks), w.batch)
        shared = planner.predict_step(layout, model, planner.local_cluster(flops * share, link, ranks), w.batch)
        if est.kind not in (None, "memory"):
            raise AssertionError(f"planner refuses measured layout {m['layout']} on {ranks} ranks: {est.reason}")
        row = {"ranks": ranks, "layout": m["layout"], "planner_layout": est.layout.label(), "flops_per_s": flops,
               "measured_s": m["step_s"], "predicted_s": est.step_s, "ratio": est.step_s / m["step_s"],
               "core_share": share, "predicted_shared_s": shared.step_s,
               "ratio_shared": shared.step_s / m["step_s"], "time_parts": est.time,
               "measured_peak_bytes": m["peak_bytes"], "predicted_memory_bytes": est.memory["total"],
               "memory_parts": est.memory, "memory_ratio": est.memory["total"] / m["peak_bytes"]}
        row["within_target"] = abs(row["ratio"] - 1) <= TARGET
        row["within_target_shared"] = abs(row["ratio_shared"] - 1) <= TARGET
        rows.append(row)
    ranking = []
    for ranks in sorted({r["ranks"] for r in rows}):
        mine = [r for r in rows if r["ranks"] == ranks]
        by_measured = [r["layout"] for r in sorted(mine, key=lambda r: r["measured_s"])]
        entry = {"ranks": ranks, "measured_order": by_measured}
        for key, suffix in (("predicted_s", ""), ("predicted_shared_s", "_shared")):
            order = [r["layout"] for r in sorted(mine, key=lambda r: r[key])]
            tau, swapped = kendall(by_measured, order)
            entry[f"predicted_order{suffix}"], entry[f"kendall_tau{suffix}"] = order, tau
            entry[f"swapped{suffix}"], entry[f"same_order{suffix}"] = swapped, order == by_measured
        entry["same_fastest"] = entry["predicted_order"][0] == by_measured[0]
        # pairs the planner tells apart (predicted times more than DECISIVE apart): does the measurement agree?
        pairs = [(a, b) for i, a in enumerate(mine) for b in mine[i + 1:]
                 if abs(a["predicted_s"] / b["predicted_s"] - 1) > DECISIVE]
        agree = [(a, b) for a, b in pairs
                 if (a["predicted_s"] < b["predicted_s"]) == (a["measured_s"] < b["measured_s"])]
        entry["decisive_margin"], entry["decisive_pairs"], entry["decisive_agree"] = DECISIVE, len(pairs), len(agree)
        entry["decisive_disagree"] = [[a["layout"], b["layout"]] for a, b in pairs if (a, b) not in agree]
        ranking.append(entry)
    return {"cluster": "planner.local_cluster: one node, every group on the calibrated link, efficiency 1",
            "flops_per_s": rates,
            "flops_measure": (f"per job: its '{ONE_RANK}' row, one process's forward and backward of the same model "
                              f"on the whole global batch ({w.batch} x {w.seq}), transformer.step_flops over the "
                              f"median time, timed between the layouts' steps while the other ranks sleep"),
            "flops_per_s_separate": measured["flops_per_s"],
            "flops_separate_measure": (f"planner.measure_flops_per_second in the calibration job, median of "
                                       f"{flops_repeats} (another moment: for comparison)"),
            "one_rank": one_rank, "link": measured["link"],
            "link_measure": "comm.calibrate.calibrate: ping-pong between 2 ranks, 8 B to 16 MiB, and a += b for gamma",
            "model": "planner.Model.from_config(the GPT, seq, precision='fp32')", "global_batch": w.batch,
            "cores": cores, "target": TARGET, "mpi_library": library, "job": job, "rows": rows, "ranking": ranking,
            "within_target": sum(r["within_target"] for r in rows),
            "within_target_shared": sum(r["within_target_shared"] for r in rows), "layouts": len(rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="worker of python -m benchmarks model_parallel's layouts and "
                                                 "predicted sections (run under mpiexec)")
    parser.add_argument("--worker", choices=("layouts", "calibrate"), required=True,
                        help="what this rank process measures (started by benchmarks.model_parallel)")
    parser.add_argument("--workload", choices=tuple(WORKLOADS), default="default", help="the model and batch to measure")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps before the timed ones")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed steps per layout")
    parser.add_argument("--no-moe", action="store_true", help="leave out the mixture-of-experts layouts")
    parser.add_argument("--flops-repeats", type=int, default=5, help="timed matmuls for the FLOP-rate calibration")
    args = parser.parse_args(argv)
    if args.worker == "layouts":
        run_layouts_rank(WORKLOADS[args.workload], args.warmup, args.repeats, not args.no_moe)
    else:
        run_calibrate_rank(WORKLOADS[args.workload], args.flops_repeats)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
