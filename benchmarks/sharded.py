"""ZeRO stages 1-3 against plain data parallelism: memory, step time and bytes per rank, measured.

``python -m benchmarks sharded`` writes ``bench-results/sharded.json`` (with
``--publish``, the site's ``docs/assets/bench/sharded.json``; ``--only SECTION`` runs one
section and replaces it in that file) with these sections:

* ``memory``: peak bytes per rank of ``parallel.zero.ZeroTrainer`` on 1, 2, 4 and 8 ranks,
  stages 0 (plain data parallelism), 1, 2 and 3 (with and without prefetch), for the small
  float32 transformer ``MEMORY_CONFIG`` whose model state outweighs its activations.
  *Measured*: one MPI job of 8 processes split into groups of 8, 4, 2 and 1 ranks; each
  process traces itself with ``tracemalloc`` from before its model is built, over its second
  step. *Predicted*: ``zero.zero_memory`` (persistent arrays plus the step's fullest moment).
* ``time``: the median step time of every stage (stage 3 with prefetch on and off) on 2 and
  4 MPI ranks and on 2 and 4 thread ranks, both on shared memory (the ring's messages are
  memory copies) and behind a simulated 10 Gb/s Ethernet link (``comm.simnet``, ``"sleep"``
  timing: a transfer costs wall time but no CPU, as with a network card doing the copy).
  Every configuration of one job is built once and they take turns step by step (interleaved),
  a barrier before each step; a step's time is the slowest rank's. All repeats are kept.
  Each worker runs with one BLAS thread.
* ``precision`` (when ``parallel.low_precision`` and ``parallel.fp8`` are there): the loss
  curves of fp32, bf16, fp16 (dynamic loss scaling) and fp8 training of the same model on the
  same batches, from ``low_precision.train``.
* ``bytes``: bytes one rank sends per step, counted by ``CountingCommunicator`` on 1-4
  thread ranks for every stage, against ``zero.comm_elements`` (``2 Ψ_pad (N-1)/N`` values
  for stages 0-2, ``3 Ψ_pad (N-1)/N`` for stage 3), for the memory and the timing models.

The functions that do the measuring on each rank (``memory_rows``, ``interleaved_step_times``)
are also what ``tests/mpi_programs/zero_train.py`` runs in its ``memory`` and ``time`` modes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from contextlib import ExitStack
from typing import Any, Iterator

from .harness import (add_sections_argument, bench_parser, emit, mpi_job, sectioned_document, sections_to_run,
                      write_json)
from .machine import machine_info

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SECTIONS = ("memory", "time", "bytes", "precision")  # precision: if parallel.low_precision is there
# (stage, prefetch): stage 0 is plain data parallelism; prefetch only changes stage 3
RUNS = ((0, True), (1, True), (2, True), (3, True), (3, False))
MEMORY_RANKS = (8, 4, 2, 1)
MEMORY_BATCH, MEMORY_SEQ = 2, 16  # per rank
TIME_RANKS = (2, 4)
TIME_BATCH, TIME_SEQ = 8, 64  # per rank
SHARED = "shared-memory"
# The simulated links: the lab's 10 Gb/s Ethernet profile, and the same at 1 Gb/s. On one
# host the ring's messages are memory copies by the cores that also compute, so only the
# link's share of a collective (a sleep, no CPU) can be hidden behind computation.
LINKS = ("10GbE", "1GbE")
BYTES_RANKS = (1, 2, 3, 4)


def _configs():
    from reference_impl.parallel import transformer as tf

    memory = tf.GPTConfig(vocab_size=96, block_size=16, n_layer=4, n_head=2, n_embd=62)
    timed = tf.GPTConfig(vocab_size=96, block_size=TIME_SEQ, n_layer=4, n_head=4, n_embd=128)
    return memory, timed


def run_name(stage: int, prefetch: bool) -> str:
    """'DP', 'ZeRO-1', 'ZeRO-2', 'ZeRO-3 prefetch', 'ZeRO-3 no prefetch'."""
    if stage == 0:
        return "DP"
    if stage < 3:
        return f"ZeRO-{stage}"
    return "ZeRO-3 prefetch" if prefetch else "ZeRO-3 no prefetch"


# ----------------------------------------------------------------- memory, on every MPI rank


def memory_rows(world: Any, config: Any = None, batch: int = MEMORY_BATCH, seq: int = MEMORY_SEQ,
                groups: tuple[int, ...] = MEMORY_RANKS, runs: tuple = RUNS) -> Iterator[dict[str, Any]]:
    """This process's peak bytes per (group size, stage, prefetch): yields one row each.

    ``world`` (mpi4py) is split into consecutive groups of ``n`` ranks for each ``n`` in
    ``groups`` (its size must be a multiple of each). Each process traces itself with
    ``tracemalloc`` from before the model is built, warms up with one step and measures the
    peak over the second, so the peak holds every NumPy and Python allocation of the rank.
    """
    import numpy as np

    from reference_impl.comm import MPICommunicator
    from reference_impl.parallel import transformer as tf
    from reference_impl.parallel import zero

    config = config or _configs()[0]
    zero.global_batch(0, 1, seq)  # the corpus is built and cached before anything is traced
    for n in groups:
        sub = world.Split(color=world.rank // n, key=world.rank)
        comm = MPICommunicator(sub)
        for stage, prefetch in runs:
            tracemalloc.start()
            params = tf.init_params(config, dtype=np.float32)
            with zero.ZeroTrainer(comm, config, params, stage=stage, prefetch=prefetch) as t:
                del params  # the trainer keeps what its stage keeps
                t.step(*zero.local_batch(0, batch * n, seq, comm.rank, n))  # warm: lazy imports, masks
                tracemalloc.reset_peak()
                t.step(*zero.local_batch(1, batch * n, seq, comm.rank, n))
                measured = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            predicted = zero.zero_memory(config, batch, seq, stage=stage, ranks=n, prefetch=prefetch)
            yield {"stage": stage, "prefetch": prefetch, "ranks": n, "rank": comm.rank, "world_rank": world.rank,
                   "measured": measured, "predicted": predicted}
            sub.Barrier()
        sub.Free()


def _memory_worker() -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rows = world.gather(list(memory_rows(world)))
    if world.rank == 0:
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})
        for row in (r for per_rank in rows for r in per_rank):
            emit(row)


def summarise_memory(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (stage, prefetch, ranks): every process's measured peak (all 8, in groups of
    ``ranks``, by world rank), the largest, and the prediction."""
    out: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (r["stage"], r["prefetch"], r["ranks"])
        if key not in out:
            p = r["predicted"]
            out[key] = {"run": run_name(r["stage"], r["prefetch"]), "stage": r["stage"], "prefetch": r["prefetch"],
                        "ranks": r["ranks"], "measured_per_process": [], "predicted_peak": p["peak"],
                        "predicted_phase": p["phase"],
                        "predicted": {k: p[k] for k in ("parameters", "gradients", "optimizer_state", "buffer",
                                                         "persistent", "transient", "psi_pad")}}
        out[key]["measured_per_process"].append((r["world_rank"], r["measured"]))
    entries = []
    for key in sorted(out, key=lambda k: (k[0], not k[1], k[2])):
        e = out[key]
        e["measured_per_process"] = [m for _, m in sorted(e["measured_per_process"])]
        e["measured_max"] = max(e["measured_per_process"])
        e["predicted_over_measured"] = e["predicted_peak"] / e["measured_max"]
        entries.append(e)
    return entries


def memory_section(timeout: float) -> dict[str, Any]:
    memory, _ = _configs()
    rows: list[dict[str, Any]] = []
    library = ["unknown"]

    def on_record(record: dict[str, Any]) -> None:
        if "mpi_library" in record:
            library[0] = record["mpi_library"]
        else:
            rows.append(record)

    mpi_job(max(MEMORY_RANKS), ["-m", "benchmarks.sharded", "--worker", "memory"], on_record, timeout,
            env=ONE_THREAD)
    return {"config": memory.__dict__, "batch_per_rank": MEMORY_BATCH, "seq": MEMORY_SEQ, "dtype": "float32",
            "processes": max(MEMORY_RANKS), "mpi_library": library[0], "results": summarise_memory(rows)}


# ----------------------------------------------------------------- step time, on every rank


def link_profile(name: str) -> Any:
    """A ``comm.simnet`` profile by name; ``"1GbE"`` is its 10GbE profile at 1 Gb/s."""
    from reference_impl.comm.simnet import INTERCONNECTS, Interconnect

    if name == "1GbE":
        ten = INTERCONNECTS["10GbE"]
        return Interconnect("1GbE", 1, ten.latency_s, ten.transport)
    return INTERCONNECTS[name]


def interleaved_step_times(comm: Any, config: Any, runs: tuple, nets: dict[str, Any], repeats: int,
                           warmup: int = 2, batch: int = TIME_BATCH,
                           seq: int = TIME_SEQ) -> dict[tuple[str, int, bool], list[float]]:
    """This rank's seconds per step of every (net, stage, prefetch), taken in turn step by step.

    ``nets`` maps a name to ``None`` (``comm`` itself: shared memory) or to a link profile
    (``comm`` behind its own ``SimulatedNetwork(comm, profile, timing="sleep")`` per trainer).
    Every configuration gets its own trainer (float32, the same initial parameters), built
    once; each repeat runs one step of every configuration in turn, each after a barrier on
    ``comm``, so all of them see the same machine state. The first ``warmup`` repeats are dropped.
    """
    import numpy as np

    from reference_impl.comm import SimulatedNetwork
    from reference_impl.parallel import transformer as tf
    from reference_impl.parallel import zero

    keys = [(net, stage, prefetch) for net in nets for stage, prefetch in runs]
    with ExitStack() as stack:
        trainers = {}
        for net, stage, prefetch in keys:
            c = comm if nets[net] is None else SimulatedNetwork(comm, nets[net], timing="sleep")
            trainers[(net, stage, prefetch)] = stack.enter_context(
                zero.ZeroTrainer(c, config, tf.init_params(config, dtype=np.float32), stage=stage, prefetch=prefetch))
        times: dict[tuple[str, int, bool], list[float]] = {k: [] for k in keys}
        for s in range(warmup + repeats):
            for k in keys:
                comm.barrier()
                t = trainers[k]
                t.step(*zero.local_batch(s, batch * comm.size, seq, comm.rank, comm.size))
                if s >= warmup:
                    times[k].append(t.step_seconds[-1])
    return times


def _slowest(per_rank: list[dict]) -> dict:
    """Step by step, the slowest rank's time (a step is done when every rank is)."""
    return {k: [max(ts) for ts in zip(*(r[k] for r in per_rank))] for k in per_rank[0]}


def _threadpool_one() -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def _time_worker(transport: str, ranks: int, repeats: int, warmup: int) -> None:
    """One job: every configuration on ``ranks`` MPI ranks (``transport`` mpi) or thread ranks."""
    _, config = _configs()
    _threadpool_one()
    nets = {SHARED: None, **{name: link_profile(name) for name in LINKS}}
    if transport == "mpi":
        from mpi4py import MPI

        from reference_impl.comm import MPICommunicator

        world = MPI.COMM_WORLD
        mine = interleaved_step_times(MPICommunicator(world), config, RUNS, nets, repeats, warmup)
        gathered = world.gather(mine)
        if world.rank != 0:
            return
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})
    else:
        from reference_impl.comm import run_threads

        gathered = run_threads(ranks, interleaved_step_times, config, RUNS, nets, repeats, warmup, timeout=300)
    for (net, stage, prefetch), ts in _slowest(gathered).items():
        emit({"transport": transport, "ranks": len(gathered), "net": net, "stage": stage, "prefetch": prefetch,
              "run": run_name(stage, prefetch), "median_s": statistics.median(ts), "step_s": ts})


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (transport, ranks, net): each run's median over DP's, and ZeRO-3's prefetch gain."""
    out = []
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault((r["transport"], r["ranks"], r["net"]), {})[r["run"]] = r
    for (transport, ranks, net), by_run in groups.items():
        dp = by_run["DP"]["median_s"]
        on, off = by_run["ZeRO-3 prefetch"]["median_s"], by_run["ZeRO-3 no prefetch"]["median_s"]
        out.append({"transport": transport, "ranks": ranks, "net": net,
                    "relative_to_dp": {name: r["median_s"] / dp for name, r in by_run.items()},
                    "prefetch_speedup": off / on})  # > 1: prefetch is faster
    return out


def time_section(repeats: int, warmup: int, ranks: tuple[int, ...], timeout: float) -> dict[str, Any]:
    from reference_impl.parallel import zero

    _, config = _configs()
    rows: list[dict[str, Any]] = []
    library = ["not used"]

    def on_record(record: dict[str, Any]) -> None:
        if "mpi_library" in record:
            library[0] = record["mpi_library"]
        else:
            rows.append(record)
            if record["stage"] == 3:
                print(f"  time {record['transport']:>7} {record['ranks']} ranks {record['net']:>13} "
                      f"{record['run']:>18}: {1e3 * record['median_s']:.1f} ms", flush=True)

    argv = ["-m", "benchmarks.sharded", "--worker", "time", "--repeats", str(repeats),
            "--warmup", str(warmup)]
    for n in ranks:  # MPI jobs and thread jobs alternate, so a busy spell of the machine hits both
        mpi_job(n, [*argv, "--transport", "mpi"], on_record, timeout, env=ONE_THREAD)
        _thread_job(n, argv, on_record, timeout)
    links = {name: link_profile(name) for name in LINKS}
    predicted = {name: {str(n): {run_name(s, p): zero.comm_elements(config, s, n) * 4 * link.link.beta
                                 for s, p in RUNS} for n in ranks} for name, link in links.items()}
    return {"config": config.__dict__, "batch_per_rank": TIME_BATCH, "seq": TIME_SEQ, "dtype": "float32",
            "repeats": repeats, "warmup": warmup, "blas_threads": 1, "nets": [SHARED, *LINKS],
            "links": {name: {"gbps": link.link_gbps, "latency_s": link.latency_s, "timing": "sleep"}
                      for name, link in links.items()},
            "link_seconds_per_step": predicted,
            "mpi_library": library[0], "results": rows, "ratios": _ratios(rows)}


def _thread_job(ranks: int, argv: list[str], on_record, timeout: float) -> None:
    """Thread ranks in a fresh process, one BLAS thread, like the MPI jobs (same line protocol)."""
    import os
    import subprocess

    run = subprocess.run([sys.executable, *argv, "--transport", "threads", "--ranks", str(ranks)],
                         capture_output=True, text=True, timeout=timeout, env={**os.environ, **ONE_THREAD})
    if run.returncode != 0:
        raise RuntimeError(f"thread-rank timing job failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    for line in run.stdout.splitlines():
        on_record(json.loads(line))


# ----------------------------------------------------------------- bytes


def bytes_section(ranks: tuple[int, ...] = BYTES_RANKS, steps: int = 2) -> dict[str, Any]:
    """Bytes one rank sends per step (``CountingCommunicator``) against ``comm_elements``, exact."""
    import numpy as np

    from reference_impl.comm import CountingCommunicator, run_threads
    from reference_impl.parallel import transformer as tf
    from reference_impl.parallel import zero

    out: dict[str, Any] = {"steps": steps, "itemsize": 4, "models": {}}
    for label, config, batch, seq in (("memory", _configs()[0], MEMORY_BATCH, MEMORY_SEQ),
                                      ("time", _configs()[1], TIME_BATCH, TIME_SEQ)):
        rows = []
        for n in ranks:
            for stage, prefetch in RUNS:
                def body(comm, stage=stage, prefetch=prefetch):
                    with zero.ZeroTrainer(comm, config, tf.init_params(config, dtype=np.float32), stage=stage,
                                          prefetch=prefetch) as t:
                        sent = []
                        for s in range(steps):
                            before = comm.bytes_sent
                            t.step(*zero.local_batch(s, batch * n, seq, comm.rank, n))
                            sent.append(comm.bytes_sent - before)
                        return sent

                per_rank = run_threads(n, body, timeout=120, wrap=CountingCommunicator)
                elements = zero.comm_elements(config, stage, n)
                psi_pad = zero.padded_params(config, n)
                rows.append({"run": run_name(stage, prefetch), "stage": stage, "prefetch": prefetch, "ranks": n,
                             "measured_bytes_per_step": per_rank, "closed_form_bytes": 4 * elements,
                             "closed_form": f"{3 if stage == 3 else 2} * {psi_pad} * ({n}-1)/{n} * 4",
                             "psi": tf.n_params(config), "psi_pad": psi_pad,
                             "exact": all(s == 4 * elements for sent in per_rank for s in sent)})
        out["models"][label] = {"config": config.__dict__, "results": rows}
    return out


# ----------------------------------------------------------------- precision (parallel.low_precision)

PRECISIONS = ("fp32", "bf16", "fp16", "fp8")


def precision_available() -> bool:
    """Whether ``parallel.low_precision`` (bf16/fp16) and ``parallel.fp8`` can give the loss curves."""
    try:
        from reference_impl.parallel import fp8, low_precision
    except ImportError:
        return False
    return callable(getattr(low_precision, "train", None)) and hasattr(fp8, "FP8Context")


def precision_section(steps: int) -> dict[str, Any]:
    """Loss curves of the same model, batches and initialisation in fp32, bf16, fp16 (dynamic loss
    scaling) and fp8 (E4M3/E5M2 with delayed scaling, bf16 elsewhere), by ``low_precision.train``."""
    from reference_impl.parallel import fp8, low_precision

    runs = {}
    for name in PRECISIONS:
        t0 = time.perf_counter()
        if name == "fp8":
            r = low_precision.train("bf16", steps, fp8=fp8.FP8Context())
        else:
            r = low_precision.train(name, steps)
        runs[name] = {"losses": [float(x) for x in r["losses"]], "eval": [[int(s), float(v)] for s, v in r["eval"]],
                      "skipped": list(r["skipped"]), "final_eval": float(r["final_eval"]),
                      "final_train": float(r["final_train"]), "seconds": time.perf_counter() - t0}
        print(f"  precision {name}: final eval loss {r['final_eval']:.4f}", flush=True)
    return {"steps": steps, "source": "reference_impl.parallel.low_precision.train", "runs": runs}


# ----------------------------------------------------------------- the driver


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("sharded", __doc__, mpi=True)
    parser.add_argument("--quick", action="store_true", help="few repeats (a smoke run, not for the site)")
    add_sections_argument(parser, SECTIONS)
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per configuration (default 20; "
                                                                  "5 with --quick)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per job")
    parser.add_argument("--worker", choices=("memory", "time"), help=argparse.SUPPRESS)
    parser.add_argument("--transport", choices=("mpi", "threads"), default="mpi", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if args.worker == "memory":
        _memory_worker()
        return 0
    if args.worker == "time":
        _time_worker(args.transport, args.ranks, repeats, warmup)
        return 0

    run = sections_to_run(parser, args, SECTIONS)
    parts: dict[str, Any] = {}
    library = "not used (thread ranks)"
    t0 = time.perf_counter()
    if "memory" in run:
        print("memory (8 MPI processes) ...", flush=True)
        parts["memory"] = memory_section(args.timeout)
        library = parts["memory"]["mpi_library"]
    if "time" in run:
        print("time ...", flush=True)
        parts["time"] = time_section(repeats, warmup, TIME_RANKS, args.timeout)
        library = parts["time"]["mpi_library"]
    if "bytes" in run:
        print("bytes ...", flush=True)
        parts["bytes"] = bytes_section(BYTES_RANKS[:2] if args.quick else BYTES_RANKS)
    if "precision" in run:
        if precision_available():
            print("precision ...", flush=True)
            parts["precision"] = precision_section(10 if args.quick else 150)
        elif args.only:
            parser.error("--only precision: reference_impl.parallel.low_precision (with train) and fp8 are not there")
    machine = machine_info(mpi_library=library)
    document = sectioned_document(args, "sharded", parts, machine, {"quick": args.quick})
    write_json(args.out, document)
    print(f"wrote {args.out} in {time.perf_counter() - t0:.0f} s")
    report(document)
    return 0


def report(document: dict[str, Any]) -> None:
    for e in document.get("memory", {}).get("results", []):
        print(f"memory {e['run']:>18} N={e['ranks']}: measured {e['measured_max'] / 2**20:.2f} MiB, predicted "
              f"{e['predicted_peak'] / 2**20:.2f} MiB ({e['predicted_over_measured']:.3f})")
    for r in document.get("time", {}).get("ratios", []):
        rel = ", ".join(f"{k} {v:.2f}" for k, v in r["relative_to_dp"].items() if k != "DP")
        print(f"time {r['transport']:>7} N={r['ranks']} {r['net']:>13}: {rel}; prefetch speedup "
              f"{r['prefetch_speedup']:.2f}x")
    for label, m in document.get("bytes", {}).get("models", {}).items():
        bad = [r for r in m["results"] if not r["exact"]]
        print(f"bytes ({label} model): {len(m['results']) - len(bad)}/{len(m['results'])} equal the closed form")


if __name__ == "__main__":
    sys.exit(main())
