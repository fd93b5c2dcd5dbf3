"""Model-parallel communication, measured: our all-to-all against the MPI library's.

``python -m benchmarks model_parallel`` writes ``bench-results/model_parallel.json`` (with
``--publish``, the site's ``docs/assets/bench/model_parallel.json``; ``--only SECTION`` runs
one section and replaces it in that file). Sections:

* ``alltoall``: expert parallelism sends every token to the rank holding its expert and
  back, one ``MPI_Alltoall`` (``MPI_Alltoallv`` when the experts get uneven loads) each way.
  Per rank count (2 and 4 processes) one ``mpiexec`` job times our ``comm.alltoall``
  (``pairwise`` and ``bruck``) and the library's ``MPI_Alltoall`` (``mpi``, its default
  choice of algorithm) interleaved repeat by repeat (``harness.time_interleaved``), from 8 B
  to 64 MiB of send buffer per rank, then our ``alltoallv`` against ``MPI_Alltoallv`` with
  uneven blocks at a few sizes. Further jobs force MPICH's own algorithms with
  ``MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM`` (``pairwise``, ``brucks``, ``scattered``; with
  ``MPIR_CVAR_DEVICE_COLLECTIVES=none``, as benchmarks/collectives.py does) and time ours
  beside each, so ours also meets the library running the *same* algorithm. MPICH's default
  selection (maint/tuning/coll/mpir/generic.json in MPICH's source; fewer than 8 ranks) is
  ``scattered`` up to 32 KiB per block and ``pairwise`` above it, with the exclusive-or
  pairing our ``pairwise`` also uses on a power-of-two rank count.
* ``routing``: what the router of a mixture-of-experts layer does while it trains, with and
  without Switch's load-balancing loss. ``moe.routing_sweep`` trains a tiny MoE character
  model (8 experts, 256 tokens a step, Adam) once per top-k (1, 2), auxiliary coefficient
  (0 and Switch's 0.01), capacity factor (0.5, 1, 1.25, 2) and seed, and this section keeps,
  per run, the busiest expert's load over the mean, the fraction of assignments dropped and
  the loss, averaged over every ``ROUTING_EVERY`` steps, and per setting their mean over the
  seeds at the start and the end of training (``summary``). No timing: the numbers are
  routing decisions, so the machine matters only through floating-point rounding.
* ``activations``: what tensor and sequence parallelism keep and send, for one transformer layer
  (``tensor_parallel_model.ParallelTransformerLayer``; width 64, 4 heads, 4 sequences of 64
  tokens, float32) on t = 1, 2 and 4 ranks, under tensor parallelism (``TP``), with sequence
  parallelism as Megatron-LM runs it (``TP+SP``: each linear's input kept as the rank's tokens
  and all-gathered again in backward) and with the gathered inputs kept (``TP+SP keep``).
  *Memory*: one MPI job of 4 processes split into groups of 4, 2 and 1; each traces itself with
  ``tracemalloc`` while a fresh layer runs forward, and what it still holds afterwards, less the
  output, is what the layer keeps for backward; beside it the arrays' own ``nbytes``, the closed
  form ``sequence_parallel.activation_bytes`` and the paper's formula (Korthikanti et al. 2022,
  ``paper_activation_bytes``), each also as a fraction of one rank's. *Bytes*: every byte each
  rank sends forward and backward, counted by ``CountingCommunicator`` on thread ranks, against
  ``tensor_parallel_model.layer_comm_bytes``. *Time*: the median of a layer's forward and backward
  on 2 MPI processes, the three modes interleaved repeat by repeat, for this layer and a wider
  one (width 256, 8 heads, 256 tokens), one BLAS thread per process.
* ``layouts`` (``model_parallel_layouts.py`` measures it): one float32 GPT (3.2 M parameters),
  one global batch, trained in each layout on 4 MPI processes (DP, ZeRO-3, TP4, TP4+SP, PP4 with
  GPipe, DP2xTP2, TP2xPP2) and on 2 (DP, ZeRO-3, TP2, TP2+SP, PP2): median step time, interleaved
  step by step, and each rank's ``tracemalloc`` peak, beside the closed forms (model state; the
  whole peak of ``zero.zero_memory`` for DP and ZeRO-3); every layout's losses must equal DP's.
  Then one mixture-of-experts layer (8 experts of the GPT's MLP shape, k = 1 and 2): experts
  spread over the ranks (EP, all-to-all) against all of them replicated (gradients allreduced).
* ``predicted``: ``planner.predict_step`` for each measured layout on "this machine" (one
  rank's measured FLOP/s, the α-β-γ of ``comm.calibrate``), predicted over measured step time,
  and whether the planner orders the layouts as measured. Needs ``layouts`` (run in the same
  command, or already in the output file).

Every implementation is checked before it is timed, and again after: each block is random
bytes from its own seed (sender, receiver), so a rank knows what it must receive without
asking anyone; MPI's output is checked against that first, then ours against MPI's. The
element type is ``uint8``: all-to-all only moves bytes, and one byte per element lets 8 B
be split over 4 ranks. Every call writes into a receive buffer allocated once (``out=``,
as MPI's ``recvbuf``), so neither side pays the page faults of a fresh 64 MiB array.

Bandwidths follow nccl-tests (doc/PERFORMANCE.md; src/alltoall.cu, ``AlltoAllGetBw``):
``algbw = S / t`` with ``S`` a rank's whole send buffer, and ``busbw = algbw * (n - 1) / n``,
the share of the buffer that leaves the rank, so busbw is the per-rank link speed the
exchange achieved. For ``alltoallv`` the same formula is applied to the rank's actual total.

The machine load (``os.getloadavg()``) before and after every job is stored with it: on a
shared machine it says how far to trust a curve.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

from .harness import (add_sections_argument, bench_parser, emit, mpi_job, repeats_for, sectioned_document,
                      sections_to_run, sizes, time_interleaved, write_json)
from . import model_parallel_layouts as layouts_mod
from .machine import machine_info

SECTIONS = ("alltoall", "routing", "activations", "layouts", "predicted")
MIN_BYTES, MAX_BYTES = 8, 64 << 20
V_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)  # alltoallv: nominal send bytes per rank
RANKS = (2, 4)
OURS = ("pairwise", "bruck")
MPICH_FORCED = ("pairwise", "brucks", "scattered")  # the jobs run by default
# Every value MPICH 5.0 accepts (``mpivars`` lists them; pairwise_sendrecv_replace is for MPI_IN_PLACE)
MPICH_ALGORITHMS = ("brucks", "k_brucks", "nb", "pairwise", "pairwise_sendrecv_replace", "scattered")
FORCE_VARIABLE = "MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM"
SAME_ALGORITHM = {"mpi:pairwise": "pairwise", "mpi:brucks": "bruck"}  # MPICH's name -> ours
LARGE = 1 << 20  # the target: ours >= the library's busbw from here up
SEED = 2024
BUSBW_SOURCE = ("nccl-tests src/alltoall.cu AlltoAllGetBw: algBw = count*nranks*typesize/sec, "
                "busBw = algBw*(nranks-1)/nranks (doc/PERFORMANCE.md: AlltoAll factor (n-1)/n)")


def alltoall_bandwidths(n_bytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an all-to-all of ``n_bytes`` send buffer per rank, as nccl-tests."""
    algbw = n_bytes / seconds / 1e9
    return algbw, algbw * (ranks - 1) / ranks


def repeats(n_bytes: int, scale: float) -> int:
    """The harness's repeat count for this size, scaled (fewer when ranks outnumber cores), at least 3."""
    return max(3, round(repeats_for(n_bytes) * scale))


# ----------------------------------------------------------------- data every rank can recompute


def block(src: int, dst: int, n: int) -> Any:
    """The ``n`` random bytes rank ``src`` sends rank ``dst`` (its own seed: anyone can make it)."""
    import numpy as np

    return np.frombuffer(np.random.default_rng([SEED, src, dst, n]).bytes(n), dtype=np.uint8)


def check_same(what: str, got: Any, expected: Any, rank: int, n_bytes: int) -> None:
    """Raise ``AssertionError`` naming the rank, size and first wrong block if ``got`` differs."""
    import numpy as np

    if got.shape == expected.shape and np.array_equal(got, expected):
        return
    detail = f"shape {got.shape} instead of {expected.shape}"
    if got.shape == expected.shape and got.ndim == 1:
        detail = f"first wrong byte at index {int(np.flatnonzero(got != expected)[0])}"
    elif got.shape == expected.shape:
        rows = np.flatnonzero((got.reshape(got.shape[0], -1) != expected.reshape(got.shape[0], -1)).any(axis=1))
        detail = f"block(s) {rows.tolist()[:8]} wrong"
    raise AssertionError(f"rank {rank}: {what} gave a wrong result at {n_bytes} B per rank: {detail}")


# ----------------------------------------------------------------- on every rank


def _alltoall_rows(world: Any, comm: Any, n_bytes: int, scale: float, warmup: int) -> list[dict[str, Any]]:
    """Time ours and ``MPI_Alltoall`` at one size; verified before and after; rank 0's rows."""
    import numpy as np

    from reference_impl.comm.alltoall import alltoall

    n, r = comm.size, comm.rank
    m = n_bytes // n
    x = np.empty((n, m), dtype=np.uint8)
    expected = np.empty_like(x)
    for j in range(n):
        x[j] = block(r, j, m)
        expected[j] = block(j, r, m)
    outs = {name: np.empty_like(x) for name in (*OURS, "mpi")}
    impls: dict[str, Callable[[], Any]] = {
        name: (lambda name=name: alltoall(comm, x, algorithm=name, out=outs[name])) for name in OURS
    }
    impls["mpi"] = lambda: world.Alltoall(x, outs["mpi"])
    for name in ("mpi", *OURS):  # MPI first: the library against the seeds, then ours against it
        outs[name][...] = ~expected  # every byte wrong until written
        impls[name]()
        check_same(name, outs[name], expected, r, n_bytes)
        if name != "mpi":
            check_same(f"{name} (against MPI_Alltoall)", outs[name], outs["mpi"], r, n_bytes)
        for _ in range(warmup - 1):
            impls[name]()
    reps = repeats(n_bytes, scale)
    medians = time_interleaved(world, impls, reps)
    for name in impls:
        check_same(f"{name} (after timing)", outs[name], expected, r, n_bytes)
    rows = []
    for name, t in medians.items():
        algbw, busbw = alltoall_bandwidths(n_bytes, t, n)
        rows.append({"op": "alltoall", "ranks": n, "bytes": n_bytes, "impl": name, "time_s": t,
                     "algbw_GBps": algbw, "busbw_GBps": busbw, "repeats": reps, "verified": True})
    return rows


def v_counts(n_bytes: int, p: int) -> list[list[int]]:
    """``counts[src][dst]`` for alltoallv: shares 1 : 2 : ... : p of ``n_bytes``, rotated by rank,
    so every block has another size and every rank sends (and receives) the same total."""
    base = max(1, n_bytes // (p * (p + 1) // 2))
    return [[base * (1 + (src + dst) % p) for dst in range(p)] for src in range(p)]


def _alltoallv_rows(world: Any, comm: Any, n_bytes: int, scale: float, warmup: int) -> list[dict[str, Any]]:
    """Our ``alltoallv`` against ``MPI_Alltoallv`` with uneven blocks at one size; rank 0's rows.

    ``pairwise`` and ``mpi`` know the receive counts (ours through ``out=``); the ``+counts``
    pair learns them first (ours: a pairwise all-to-all of the counts; MPI: ``MPI_Alltoall``)
    and allocates the receive buffer, as an MoE dispatch that has just routed its tokens must.
    """
    import numpy as np
    from mpi4py import MPI

    from reference_impl.comm.alltoall import alltoallv

    n, r = comm.size, comm.rank
    counts = v_counts(n_bytes, n)
    sc = np.array(counts[r], dtype=np.int64)
    rc = np.array([counts[i][r] for i in range(n)], dtype=np.int64)
    sd = np.concatenate([[0], np.cumsum(sc)[:-1]])
    rd = np.concatenate([[0], np.cumsum(rc)[:-1]])
    send = np.concatenate([block(r, j, int(sc[j])) for j in range(n)])
    expected = np.concatenate([block(i, r, int(rc[i])) for i in range(n)])
    blocks = [send[sd[j]:sd[j] + sc[j]] for j in range(n)]  # views: contiguous, nothing copied
    recv = {name: np.empty_like(expected) for name in ("pairwise", "mpi")}
    views = [recv["pairwise"][rd[i]:rd[i] + rc[i]] for i in range(n)]
    got: dict[str, Any] = {}

    def ours_counts() -> None:
        got["pairwise+counts"] = alltoallv(comm, blocks)

    def mpi_counts() -> None:
        theirs = np.empty_like(sc)
        world.Alltoall(sc, theirs)
        displ = np.concatenate([[0], np.cumsum(theirs)[:-1]])
        buf = np.empty(int(theirs.sum()), dtype=np.uint8)
        world.Alltoallv([send, (sc, sd), MPI.BYTE], [buf, (theirs, displ), MPI.BYTE])
        got["mpi+counts"] = buf

    impls: dict[str, Callable[[], Any]] = {
        "pairwise": lambda: alltoallv(comm, blocks, out=views),
        "mpi": lambda: world.Alltoallv([send, (sc, sd), MPI.BYTE], [recv["mpi"], (rc, rd), MPI.BYTE]),
        "pairwise+counts": ours_counts,
        "mpi+counts": mpi_counts,
    }

    def result(name: str) -> Any:
        if name in recv:
            return recv[name]
        value = got[name]
        return np.concatenate(value) if isinstance(value, list) else value

    for name in ("mpi", "mpi+counts", "pairwise", "pairwise+counts"):
        if name in recv:
            recv[name][...] = ~expected
        impls[name]()
        check_same(f"alltoallv {name}", result(name), expected, r, n_bytes)
        if not name.startswith("mpi"):
            check_same(f"alltoallv {name} (against MPI_Alltoallv)", result(name), recv["mpi"], r, n_bytes)
        for _ in range(warmup - 1):
            impls[name]()
    total = int(sc.sum())
    reps = repeats(total, scale)
    medians = time_interleaved(world, impls, reps)
    for name in impls:
        check_same(f"alltoallv {name} (after timing)", result(name), expected, r, n_bytes)
    rows = []
    for name, t in medians.items():
        algbw, busbw = alltoall_bandwidths(total, t, n)
        rows.append({"op": "alltoallv", "ranks": n, "bytes": total, "nominal_bytes": n_bytes, "impl": name,
                     "time_s": t, "algbw_GBps": algbw, "busbw_GBps": busbw, "repeats": reps,
                     "counts": counts, "verified": True})
    return rows


def run_rank(byte_sizes: list[int], v_sizes: list[int], scale: float, warmup: int) -> None:
    """One job's worker: every size of the all-to-all, then of the alltoallv; rank 0 prints JSON lines."""
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator

    world = MPI.COMM_WORLD
    comm = MPICommunicator(world)
    if comm.rank == 0:
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})
    for n_bytes in byte_sizes:
        rows = _alltoall_rows(world, comm, n_bytes, scale, warmup)
        if comm.rank == 0:
            for row in rows:
                emit(row)
    for n_bytes in v_sizes:
        rows = _alltoallv_rows(world, comm, n_bytes, scale, warmup)
        if comm.rank == 0:
            for row in rows:
                emit(row)


# ----------------------------------------------------------------- the driver


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per job, rank count, op and size: best of ours over the library, as busbw ratios (> 1: ours is faster).

    In the main job ``ours_over_mpi`` is against the library's default choice; in a forced
    job against that MPICH algorithm. ``pairwise_over_mpi`` sets our pairwise against it, and
    ``same_algorithm_over_mpi`` (forced pairwise and brucks jobs) our implementation of the
    same algorithm.
    """
    groups: dict[tuple, dict[str, dict[str, Any]]] = {}
    for row in results:
        groups.setdefault((row["job"], row["ranks"], row["op"], row["bytes"]), {})[row["impl"]] = row
    out = []
    for (job, ranks, op, n_bytes), by_impl in sorted(groups.items(), key=lambda kv: (kv[0][0] != "main", kv[0][1:])):
        mpi_name = "mpi" if job == "main" else f"mpi:{job.split(':', 1)[1]}"
        if mpi_name not in by_impl:
            continue
        mine = {k: v for k, v in by_impl.items() if not k.startswith("mpi")}
        if op == "alltoallv":
            mine = {k: v for k, v in mine.items() if "+counts" not in k}
        best = max(mine, key=lambda k: mine[k]["busbw_GBps"])
        mpi_bw = by_impl[mpi_name]["busbw_GBps"]
        row = {"job": job, "ranks": ranks, "op": op, "bytes": n_bytes, "against": mpi_name, "best_ours": best,
               "ours_over_mpi": mine[best]["busbw_GBps"] / mpi_bw,
               "pairwise_over_mpi": mine["pairwise"]["busbw_GBps"] / mpi_bw}
        same = SAME_ALGORITHM.get(mpi_name)
        if same in mine:  # ours against MPICH running the same algorithm, timed in turn in one job
            row["same_algorithm"] = same
            row["same_algorithm_over_mpi"] = mine[same]["busbw_GBps"] / mpi_bw
        if op == "alltoallv" and "pairwise+counts" in by_impl and "mpi+counts" in by_impl:
            row["with_counts_over_mpi"] = by_impl["pairwise+counts"]["busbw_GBps"] / by_impl["mpi+counts"]["busbw_GBps"]
        out.append(row)
    return out


def alltoall_section(rank_counts: list[int], byte_sizes: list[int], v_sizes: list[int], forced: tuple[str, ...],
                     repeat_scale: float, warmup: int, timeout: float) -> dict[str, Any]:
    """Run the jobs (per rank count: the main one, then one per forced MPICH algorithm)."""
    results: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    library = ["unknown"]
    cores = os.cpu_count() or 1
    for ranks in rank_counts:
        scale = repeat_scale * (0.5 if ranks > cores else 1.0)
        mine = [b for b in byte_sizes if b % ranks == 0]
        for algorithm in (None, *forced):
            job = "main" if algorithm is None else f"forced:{algorithm}"
            env = {} if algorithm is None else {FORCE_VARIABLE: algorithm, "MPIR_CVAR_DEVICE_COLLECTIVES": "none"}

            def on_record(record: dict[str, Any], job: str = job, algorithm: str | None = algorithm) -> None:
                if "mpi_library" in record:
                    library[0] = record["mpi_library"]
                    return
                if algorithm is not None and record["impl"] == "mpi":
                    record["impl"] = f"mpi:{algorithm}"
                record["job"] = job
                results.append(record)

            argv = ["-m", "benchmarks.model_parallel", "--worker", "--sizes", ",".join(map(str, mine)),
                    "--v-sizes", ",".join(map(str, v_sizes if algorithm is None else [])),
                    "--scale", repr(scale), "--warmup", str(warmup)]
            load_before, t0 = os.getloadavg(), time.perf_counter()
            mpi_job(ranks, argv, on_record, timeout, env=env)
            jobs.append({"ranks": ranks, "job": job, "env": env, "repeat_scale": scale,
                         "oversubscribed": ranks > cores, "seconds": time.perf_counter() - t0,
                         "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg())})
            print(f"  {ranks} ranks, {job}: {jobs[-1]['seconds']:.0f} s, load {load_before[0]:.2f} -> "
                  f"{jobs[-1]['loadavg_after'][0]:.2f}", flush=True)
    return {"dtype": "uint8", "bytes": "a rank's whole send buffer (nccl-tests' size)",
            "busbw": "algbw * (n - 1) / n", "busbw_source": BUSBW_SOURCE,
            "forced_algorithm_variable": FORCE_VARIABLE, "mpi_library": library[0],
            "jobs": jobs, "results": results, "ratios": ratios(results)}


# ----------------------------------------------------------------- routing: load and drops while training

ROUTING_CAPACITY = (0.5, 1.0, 1.25, 2.0)
ROUTING_AUX = (0.0, 1e-2)  # off, and Switch Transformer's alpha
ROUTING_TOP_K = (1, 2)
ROUTING_STEPS, ROUTING_SEEDS, ROUTING_EVERY = 500, 3, 10
ROUTING_CURVES = ("max_load", "dropped", "loss")


def routing_section(steps: int = ROUTING_STEPS, seeds: int = ROUTING_SEEDS,
                    every: int = ROUTING_EVERY) -> dict[str, Any]:
    """``moe.routing_sweep`` per top-k and seed: curves per run, and per setting the mean over seeds."""
    import numpy as np

    from reference_impl.parallel import moe

    runs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for k in ROUTING_TOP_K:
        for seed in range(seeds):
            for row in moe.routing_sweep(ROUTING_CAPACITY, ROUTING_AUX, top_k=k, steps=steps, seed=seed):
                n = len(row["max_load"]) // every * every  # whole windows of ``every`` steps
                curves = {key: np.asarray(row[key][:n]).reshape(-1, every).mean(axis=1).tolist()
                          for key in ROUTING_CURVES}
                runs.append({**{key: v for key, v in row.items() if key not in ROUTING_CURVES}, "seed": seed,
                             "step": list(range(every, n + 1, every)), **curves})
        print(f"  routing, top-{k}: {len(runs)} runs, {time.perf_counter() - t0:.0f} s", flush=True)
    summary = []
    for k in ROUTING_TOP_K:
        for alpha in ROUTING_AUX:
            for cf in ROUTING_CAPACITY:
                same = [r for r in runs if (r["top_k"], r["aux_loss_coeff"], r["capacity_factor"]) == (k, alpha, cf)]
                entry: dict[str, Any] = {"top_k": k, "aux_loss_coeff": alpha, "capacity_factor": cf, "seeds": len(same)}
                for key in ("max_load_first", "max_load_last", "dropped_first", "dropped_last", "loss_first",
                            "loss_last"):
                    values = [r[key] for r in same]
                    entry[key] = statistics.fmean(values)
                    entry[f"{key}_range"] = [min(values), max(values)]
                summary.append(entry)
    first = runs[0]
    return {"model": ("next-character model: h = emb[c] + moe(emb[c]), logits h @ out.T, cross-entropy plus the "
                      "auxiliary loss, Adam; one routing group of all the step's tokens"),
            "n_experts": first["n_experts"], "tokens": first["tokens"], "steps": steps, "every": every,
            "seeds": seeds, "capacity_factors": list(ROUTING_CAPACITY), "aux_loss_coeffs": list(ROUTING_AUX),
            "top_k": list(ROUTING_TOP_K), "tail": "first and last 50 steps (moe.routing_sweep's tail)",
            "max_load": "busiest expert's assignments over the mean, before capacity (1 = balanced)",
            "dropped": "fraction of the T k assignments over capacity",
            "seconds": time.perf_counter() - t0, "runs": runs, "summary": summary}


# ----------------------------------------------------------------- activations: tensor and sequence parallelism

# One transformer layer (``tensor_parallel_model.ParallelTransformerLayer``) in three modes:
# (name, sequence_parallel, keep_gathered_inputs). "TP+SP" is Megatron-LM's default, which keeps
# only the rank's tokens of each linear's input and all-gathers them again in backward.
ACT_MODES = (("TP", False, False), ("TP+SP", True, False), ("TP+SP keep", True, True))
ACT_RANKS = (4, 2, 1)  # tensor-parallel sizes; the memory job's processes are split into groups of each
ACT_BATCH, ACT_SEQ = 4, 64
ACT_WIDE_SEQ = 256  # the second, wider layer timed (width 256, 8 heads)
ACT_TIME_RANKS, ACT_REPEATS, ACT_WARMUP = 2, 20, 3
ACT_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def act_config(wide: bool = False) -> Any:
    """The layer measured: width 64, 4 heads (``wide``: width 256, 8 heads, for the timing only)."""
    from reference_impl.parallel import transformer as tf

    if wide:
        return tf.GPTConfig(vocab_size=96, block_size=ACT_WIDE_SEQ, n_layer=1, n_head=8, n_embd=256)
    return tf.GPTConfig(vocab_size=96, block_size=ACT_SEQ, n_layer=1, n_head=4, n_embd=64)


def _act_setup(comm: Any, config: Any, seq: int) -> tuple[dict, Any]:
    """This rank's shards of the layer and the layer's full float32 input ``(ACT_BATCH, seq, C)``."""
    import numpy as np

    import reference_impl.parallel.tensor_parallel_model as tpm
    from reference_impl.parallel import transformer as tf

    shards = tpm.shard_model(tf.init_params(config, dtype=np.float32), config, comm.rank, comm.size)
    x = np.random.default_rng(SEED).standard_normal((ACT_BATCH, seq, config.n_embd)).astype(np.float32)
    return shards, x


def _act_layer(comm: Any, shards: dict, config: Any, sp: bool, keep: bool, x_full: Any) -> tuple[Any, Any]:
    """A fresh layer for one mode, and its input on this rank (its tokens with sequence parallelism)."""
    import reference_impl.parallel.sequence_parallel as sqp
    import reference_impl.parallel.tensor_parallel_model as tpm

    layer = tpm.ParallelTransformerLayer(comm, shards, 0, config, sequence_parallel=sp, keep_gathered_inputs=keep)
    return layer, (sqp.split_sequence(comm, x_full) if sp else x_full)


def activation_rows(world: Any) -> list[dict[str, Any]]:
    """This process's bytes kept for backward by one layer, one row per (tensor-parallel size t, mode).

    ``world`` (mpi4py) is split into consecutive groups of ``t`` ranks for each ``t`` of
    ``ACT_RANKS`` that divides its size. Each mode runs forward and backward once untraced (lazy
    imports, the cached causal mask); then a fresh layer's forward runs under ``tracemalloc``:
    what it allocated and still holds when forward returns, less its output, is what it keeps
    for backward (``measured``). ``counted`` sums the ``nbytes`` of the arrays in its caches.
    """
    import tracemalloc

    from reference_impl.comm import MPICommunicator

    config, rows = act_config(), []
    for t in (t for t in ACT_RANKS if world.size % t == 0):
        sub = world.Split(color=world.rank // t, key=world.rank)
        comm = MPICommunicator(sub)
        shards, x_full = _act_setup(comm, config, ACT_SEQ)
        for mode, sp, keep in ACT_MODES:
            warm, x = _act_layer(comm, shards, config, sp, keep, x_full)
            warm.backward(warm.forward(x))
            layer, x = _act_layer(comm, shards, config, sp, keep, x_full)
            sub.Barrier()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            out = layer.forward(x)
            measured = tracemalloc.get_traced_memory()[0] - before - out.nbytes
            tracemalloc.stop()
            rows.append({"mode": mode, "ranks": t, "rank": comm.rank, "world_rank": world.rank,
                         "measured": measured, "counted": layer.cached_bytes()})
            layer.backward(out)
        sub.Free()
    return rows


def activation_times(world: Any, wide: bool, repeats: int, warmup: int) -> dict[str, float]:
    """Median seconds of one layer's forward + backward per mode on ``world``, interleaved repeat by repeat."""
    from reference_impl.comm import MPICommunicator

    config = act_config(wide)
    comm = MPICommunicator(world)
    shards, x_full = _act_setup(comm, config, ACT_WIDE_SEQ if wide else ACT_SEQ)

    def step(sp: bool, keep: bool) -> Callable[[], None]:
        def run() -> None:
            layer, x = _act_layer(comm, shards, config, sp, keep, x_full)
            layer.backward(layer.forward(x))
        return run

    impls = {mode: step(sp, keep) for mode, sp, keep in ACT_MODES}
    time_interleaved(world, impls, warmup)
    return time_interleaved(world, impls, repeats)


def _activations_worker(part: str, repeats: int, warmup: int) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if part == "memory":
        rows = world.gather(activation_rows(world))
        if world.rank == 0:
            emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})
            for row in (r for per_rank in rows for r in per_rank):
                emit(row)
    else:
        for wide in (False, True):
            medians = activation_times(world, wide, repeats, warmup)
            if world.rank == 0:
                emit({"wide": wide, "median_s": medians})


def activation_bytes_sent(ranks: tuple[int, ...] = ACT_RANKS) -> list[dict[str, Any]]:
    """Bytes each rank sends in one layer's forward and backward, counted by ``CountingCommunicator``
    on thread ranks, against ``tensor_parallel_model.layer_comm_bytes``."""
    import reference_impl.parallel.tensor_parallel_model as tpm
    from reference_impl.comm import CountingCommunicator, run_threads

    config, rows = act_config(), []
    for t in sorted(ranks):
        for mode, sp, keep in ACT_MODES:
            def body(comm: Any, sp: bool = sp, keep: bool = keep) -> dict[str, int]:
                shards, x_full = _act_setup(comm, config, ACT_SEQ)
                layer, x = _act_layer(comm, shards, config, sp, keep, x_full)
                start = comm.bytes_sent
                out = layer.forward(x)
                forward = comm.bytes_sent - start
                layer.backward(out)
                return {"forward": forward, "backward": comm.bytes_sent - start - forward}

            sent = run_threads(t, body, timeout=120, wrap=CountingCommunicator)
            closed = tpm.layer_comm_bytes(ACT_BATCH, ACT_SEQ, config.n_embd, t, 4, sp, keep)
            rows.append({"mode": mode, "ranks": t, "measured": sent, "closed_form": closed,
                         "exact": all(s["forward"] == closed["forward"] and s["backward"] == closed["backward"]
                                      for s in sent)})
    return rows


def summarise_activations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (mode, t): every process's measured and counted bytes (by world rank), the
    largest, ``sequence_parallel.activation_bytes`` (the closed form) and the paper's formula for the
    same shape (``paper_activation_bytes``; none for "TP+SP keep", which the paper does not have),
    each also as a fraction of what one rank keeps."""
    import reference_impl.parallel.sequence_parallel as sqp

    config = act_config()
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        grouped.setdefault((r["mode"], r["ranks"]), []).append(r)
    order = [m for m, _, _ in ACT_MODES]
    entries = []
    for (mode, t), same in sorted(grouped.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        sp, keep = next((s, k) for m, s, k in ACT_MODES if m == mode)
        same.sort(key=lambda r: r["world_rank"])
        closed = sqp.activation_bytes(config, ACT_BATCH, ACT_SEQ, t, sp, 4, keep)
        paper = None if keep else sqp.paper_activation_bytes(ACT_SEQ, ACT_BATCH, config.n_embd, config.n_head, t, sp)
        measured = max(r["measured"] for r in same)
        entries.append({"mode": mode, "ranks": t, "measured_per_process": [r["measured"] for r in same],
                        "counted_per_process": [r["counted"] for r in same], "measured_max": measured,
                        "counted_max": max(r["counted"] for r in same), "closed_form": closed,
                        "measured_over_closed_form": measured / closed["total"], "paper_bytes": paper})
    for e in entries:
        one = next(x for x in entries if x["mode"] == e["mode"] and x["ranks"] == 1)
        e["fraction_of_one_rank"] = e["measured_max"] / one["measured_max"]
        e["closed_form_fraction_of_one_rank"] = e["closed_form"]["total"] / one["closed_form"]["total"]
        e["paper_fraction_of_one_rank"] = (None if e["paper_bytes"] is None
                                           else e["paper_bytes"] / one["paper_bytes"])
    return entries


def activations_section(timeout: float, repeats: int = ACT_REPEATS, warmup: int = ACT_WARMUP,
                        processes: int = max(ACT_RANKS), time_ranks: int = ACT_TIME_RANKS) -> dict[str, Any]:
    """Memory (one MPI job of ``processes`` ranks), bytes (thread ranks) and time (``time_ranks`` processes)."""
    rows: list[dict[str, Any]] = []
    library = ["unknown"]

    def on_record(record: dict[str, Any]) -> None:
        if "mpi_library" in record:
            library[0] = record["mpi_library"]
        else:
            rows.append(record)

    worker = ["-m", "benchmarks.model_parallel", "--activations-worker"]
    mpi_job(processes, worker + ["memory"], on_record, timeout, env=ACT_ENV)
    timed: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    mpi_job(time_ranks, worker + ["time", "--activations-repeats", str(repeats), "--activations-warmup",
                                  str(warmup)], timed.append, timeout, env=ACT_ENV)
    times = []
    for record in timed:
        config = act_config(record["wide"])
        m = record["median_s"]
        times.append({"config": config.__dict__, "batch": ACT_BATCH, "seq": ACT_WIDE_SEQ if record["wide"] else ACT_SEQ,
                      "median_s": m, "relative_to_tp": {k: v / m["TP"] for k, v in m.items()}})
    config = act_config()
    return {"config": config.__dict__, "batch": ACT_BATCH, "seq": ACT_SEQ, "dtype": "float32", "itemsize": 4,
            "modes": {m: {"sequence_parallel": s, "keep_gathered_inputs": k} for m, s, k in ACT_MODES},
            "processes": processes, "mpi_library": library[0],
            "measured": "tracemalloc: bytes a fresh layer's forward allocated and still holds, less its output",
            "closed_form": "reference_impl.parallel.sequence_parallel.activation_bytes",
            "paper": "Korthikanti et al. 2022: s b h (10 + 24/t + 5 a s/(h t)) bytes (TP), s b h (34/t + 5 a s/(h t)) "
                     "(TP+SP); fp16 values and 1-byte dropout masks",
            "memory": summarise_activations(rows),
            "bytes": activation_bytes_sent(tuple(t for t in ACT_RANKS if t <= processes)),
            "time": {"ranks": time_ranks, "transport": "mpi", "repeats": repeats, "warmup": warmup,
                     "oversubscribed": time_ranks > (os.cpu_count() or 1), "loadavg_before": list(load_before),
                     "loadavg_after": list(os.getloadavg()), "results": times}}


def _int_list(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("model_parallel", __doc__, mpi=True)
    add_sections_argument(parser, SECTIONS)
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)), help="comma-separated rank counts (default 2,4)")
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES, help="smallest send buffer per rank (default 8)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest send buffer per rank (default 64 MiB)")
    parser.add_argument("--v-sizes", default=",".join(map(str, V_SIZES)),
                        help="alltoallv send bytes per rank, comma-separated (default 4 KiB, 64 KiB, 1 MiB, 16 MiB)")
    parser.add_argument("--forced", default=",".join(MPICH_FORCED),
                        help=f"MPICH algorithms to force, one job each, with {FORCE_VARIABLE} (comma-separated; "
                             f"empty for none; default {','.join(MPICH_FORCED)})")
    parser.add_argument("--repeat-scale", type=float, default=1.0,
                        help="times the harness's repeats per size (halved again when ranks outnumber cores)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per implementation and size (the first is checked)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per mpiexec job")
    parser.add_argument("--layouts-repeats", type=int, default=layouts_mod.REPEATS,
                        help=f"timed steps per layout in the layouts section (default {layouts_mod.REPEATS})")
    parser.add_argument("--layouts-ranks", default=",".join(map(str, layouts_mod.RANKS)),
                        help="rank counts of the layouts section, comma-separated, from 4 and 2 (default 4,2)")
    parser.add_argument("--layouts-workload", choices=tuple(layouts_mod.WORKLOADS), default="default",
                        help="the GPT and batch of the layouts section ('tiny': a quick check, as the tests run it)")
    parser.add_argument("--routing-steps", type=int, default=ROUTING_STEPS,
                        help=f"training steps per routing run (default {ROUTING_STEPS})")
    parser.add_argument("--routing-seeds", type=int, default=ROUTING_SEEDS,
                        help=f"seeds per routing setting (default {ROUTING_SEEDS})")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--activations-repeats", type=int, default=ACT_REPEATS,
                        help=f"timed forward + backward passes per mode in the activations section (default {ACT_REPEATS})")
    parser.add_argument("--activations-warmup", type=int, default=ACT_WARMUP, help=argparse.SUPPRESS)
    parser.add_argument("--activations-worker", choices=("memory", "time"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup < 1:
        parser.error(f"--warmup must be at least 1 (the checked call), got {args.warmup}")

    if args.activations_worker:
        _activations_worker(args.activations_worker, args.activations_repeats, args.activations_warmup)
        return 0
    if args.worker:
        run_rank(_int_list(args.sizes), _int_list(args.v_sizes), args.scale, args.warmup)
        return 0

    forced = tuple(a for a in args.forced.split(",") if a)
    unknown = [a for a in forced if a not in MPICH_ALGORITHMS]
    if unknown:
        parser.error(f"--forced {args.forced}: unknown MPICH algorithm(s) {unknown}; expected some of {MPICH_ALGORITHMS}")
    run = sections_to_run(parser, args, SECTIONS)
    if "routing" in run and (args.routing_steps < ROUTING_EVERY or args.routing_seeds < 1):
        parser.error(f"--routing-steps must be >= {ROUTING_EVERY} and --routing-seeds >= 1, got "
                     f"{args.routing_steps} and {args.routing_seeds}")
    if "layouts" in run:
        bad = [r for r in _int_list(args.layouts_ranks) if r not in layouts_mod.GPT_LAYOUTS]
        if bad or not _int_list(args.layouts_ranks) or args.layouts_repeats < 1:
            parser.error(f"--layouts-ranks {args.layouts_ranks!r} must name some of {sorted(layouts_mod.GPT_LAYOUTS)} "
                         f"(not {bad}) and --layouts-repeats must be >= 1, got {args.layouts_repeats}")
    byte_sizes = sizes(args.min_bytes, args.max_bytes)
    if not byte_sizes:
        parser.error(f"no sizes from --min-bytes {args.min_bytes} to --max-bytes {args.max_bytes}")
    rank_counts = _int_list(args.ranks)
    parts: dict[str, Any] = {}
    t0 = time.perf_counter()
    library = "unknown"
    if "alltoall" in run:
        print("alltoall ...", flush=True)
        parts["alltoall"] = alltoall_section(rank_counts, byte_sizes, _int_list(args.v_sizes),
                                             forced, args.repeat_scale,
                                             args.warmup, args.timeout)
        library = parts["alltoall"]["mpi_library"]
    if "routing" in run:
        print("routing ...", flush=True)
        parts["routing"] = routing_section(args.routing_steps, args.routing_seeds)
    if "activations" in run:
        print("activations ...", flush=True)
        parts["activations"] = activations_section(args.timeout, args.activations_repeats, args.activations_warmup)
        library = parts["activations"]["mpi_library"]
    if "layouts" in run:
        print("layouts ...", flush=True)
        parts["layouts"] = layouts_mod.layouts_section(tuple(_int_list(args.layouts_ranks)),
                                                       repeats=args.layouts_repeats, timeout=args.timeout,
                                                       workload=args.layouts_workload)
        library = parts["layouts"]["mpi_library"]
    if "predicted" in run:
        print("predicted ...", flush=True)
        measured = parts.get("layouts") or (json.loads(args.out.read_text(encoding="utf-8")).get("layouts")
                                            if args.out.exists() else None)
        if not measured:
            parser.error(f"the predicted section needs the layouts section: run it too, or have it in {args.out}")
        parts["predicted"] = layouts_mod.predicted_section(measured, timeout=args.timeout)
        library = parts["predicted"]["mpi_library"]
    machine = machine_info(mpi_library=library, loadavg=list(os.getloadavg()))
    settings = {"ranks": rank_counts, "min_bytes": args.min_bytes, "max_bytes": args.max_bytes,
                "repeat_scale": args.repeat_scale, "warmup": args.warmup, "forced": args.forced}
    document = sectioned_document(args, "model_parallel", parts, machine, settings)
    write_json(args.out, document)
    print(f"wrote {args.out} in {time.perf_counter() - t0:.0f} s")
    report(document)
    return 0


def report(document: dict[str, Any]) -> None:
    """The ratio table on stdout: per rank count and size >= 1 MiB, ours over the library."""
    section = document.get("alltoall")
    if not section:
        return
    table: dict[tuple[int, str, int], dict[str, float]] = {}
    for r in section["ratios"]:
        table.setdefault((r["ranks"], r["op"], r["bytes"]), {})[r["against"]] = r["ours_over_mpi"]
    against = sorted({a for v in table.values() for a in v}, key=lambda a: (a != "mpi", a))
    print("busbw ratio, best of ours / library (> 1: ours faster)")
    print(f"{'ranks':>5} {'op':>9} {'bytes':>10} " + " ".join(f"{a:>15}" for a in against))
    for (ranks, op, n_bytes), row in sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        if n_bytes >= LARGE or op == "alltoallv":
            print(f"{ranks:>5} {op:>9} {n_bytes:>10} " + " ".join(
                f"{row[a]:>15.2f}" if a in row else f"{'':>15}" for a in against))
    for ranks in sorted({r["ranks"] for r in section["ratios"]}):
        large = [r["ours_over_mpi"] for r in section["ratios"]
                 if r["ranks"] == ranks and r["job"] == "main" and r["op"] == "alltoall" and r["bytes"] >= LARGE]
        if large:
            print(f"{ranks} ranks, alltoall >= 1 MiB against the library's default: median "
                  f"{statistics.median(large):.2f}, min {min(large):.2f}")


if __name__ == "__main__":
    sys.exit(main())
