"""Benchmark: our ring allreduce against the MPI library's own ``Allreduce``, same run.

``python -m benchmarks allreduce`` launches ``mpiexec`` once per rank count. In
each job every message size is timed for both implementations, interleaved repeat by
repeat so both see the same machine state: a barrier, then the call; a repeat's time is
the slowest rank's; the reported time is the median over repeats after warm-up calls.

Four implementations: ``ring`` (ours, writing into a buffer the caller reuses, as MPI's
``Allreduce`` does), ``ring_alloc`` (ours, allocating a new output array every call: the
cost of fresh memory made visible), ``library`` (``allreduce(..., algorithm="library")``:
the whole call handed to ``MPI_Allreduce``, through the lab's checks) and ``mpi`` (the
library's own, called directly).

The ``torch`` section runs the same sweep as a ``torchrun`` job over ``TorchCommunicator``
(gloo): ``ring`` and ``library`` against ``torch.distributed.all_reduce`` called directly
(``torch``; it reduces in place, so the call copies the input into the output first, as the
library path does). Its results go under the document's ``torch`` key.

Bandwidths follow nccl-tests' definitions (their PERFORMANCE.md):

* algbw = size / time: what the caller sees;
* busbw = algbw * 2 (n - 1) / n: the rate each link must run at for a ring allreduce,
  which makes figures comparable across rank counts and with the hardware's peak.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from .harness import (
    add_sections_argument, bandwidths, bench_parser, emit, mpi_job, repeats_for, sectioned_document, sections_to_run,
    sizes, time_interleaved, time_interleaved_torch, warm_up_and_check, write_json,
)
from .machine import machine_info

MIN_BYTES, MAX_BYTES = 8, 64 << 20
ITEM_BYTES = 4  # float32
SECTIONS = ("mpi", "torch")
MPI_IMPLS = ("ring", "ring_alloc", "library", "mpi")
TORCH_IMPLS = ("ring", "library", "torch")


# ----------------------------------------------------------------- inside the MPI job


def run_rank(byte_sizes: list[int], warmup: int) -> None:
    """Time both implementations for every size; rank 0 prints one JSON line per result."""
    import numpy as np
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator, allreduce

    world = MPI.COMM_WORLD
    comm = MPICommunicator(world)
    n, rank = comm.size, comm.rank
    if rank == 0:
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})

    for n_bytes in byte_sizes:
        count = n_bytes // ITEM_BYTES
        x = np.full(count, rank + 1, dtype=np.float32)
        out = np.empty_like(x)
        impls = {
            "ring": lambda: allreduce(comm, x, out=out),  # the caller's buffer, like MPI's recvbuf
            "ring_alloc": lambda: allreduce(comm, x),  # a new output array every call
            "library": lambda: allreduce(comm, x, algorithm="library", out=out),
            "mpi": lambda: world.Allreduce(x, out, op=MPI.SUM),
        }
        expected = n * (n + 1) / 2
        for name, fn in impls.items():  # warm-up, and check every implementation is right
            for _ in range(warmup):
                result = fn()
            result = out if result is None else result
            if count and not np.all(result == expected):
                raise AssertionError(f"rank {rank}: {name} gave a wrong allreduce at {n_bytes} bytes")
        medians = time_interleaved(world, impls, repeats_for(n_bytes))
        if rank == 0:
            for name, t in medians.items():
                algbw, busbw = bandwidths(n_bytes, t, n)
                emit({
                    "ranks": n, "bytes": n_bytes, "impl": name, "time_s": t,
                    "algbw_GBps": algbw, "busbw_GBps": busbw, "repeats": repeats_for(n_bytes),
                })


def run_torch_rank(byte_sizes: list[int], warmup: int, impl_names: tuple[str, ...] = TORCH_IMPLS) -> None:
    """Inside a ``torchrun`` job: time ``impl_names`` (ours on ``TorchCommunicator``, ``library``,
    and ``torch``: ``torch.distributed.all_reduce`` called directly) for every size; rank 0 prints JSON lines."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from reference_impl.comm import allreduce
    from reference_impl.comm.engines import world_communicator

    comm = world_communicator("torch")
    n, rank = comm.size, comm.rank
    if rank == 0:
        emit({"torch_library": f"torch {torch.__version__}, backend {comm.backend}"})
    for n_bytes in byte_sizes:
        count = n_bytes // ITEM_BYTES
        x = np.full(count, rank + 1, dtype=np.float32)
        out = np.empty_like(x)
        x_t, out_t = torch.from_numpy(x), torch.from_numpy(out)

        def direct() -> None:
            out_t.copy_(x_t)  # all_reduce works in place: keep x, as every other implementation does
            dist.all_reduce(out_t, group=comm.group)

        impls = {name: direct if name == "torch" else
                 (lambda name=name: allreduce(comm, x, algorithm=name, out=out))
                 for name in impl_names}
        warm_up_and_check(impls, out, warmup, n * (n + 1) / 2, f"rank {rank}, {n_bytes} bytes")
        medians = time_interleaved_torch(comm.group, impls, repeats_for(n_bytes))
        if rank == 0:
            for name, t in medians.items():
                algbw, busbw = bandwidths(n_bytes, t, n)
                emit({"ranks": n, "bytes": n_bytes, "impl": name, "time_s": t,
                      "algbw_GBps": algbw, "busbw_GBps": busbw, "repeats": repeats_for(n_bytes)})


def torch_job(ranks: int, module: str, argv: list[str], on_record: Any, timeout: float) -> None:
    """Run ``python -m MODULE ARGV`` under ``torchrun`` on ``ranks`` processes (``mpi_job``'s streaming and watchdog)."""
    from reference_impl.comm.torch_dist import torchrun_command

    mpi_job(ranks, ["-m", module, *argv], on_record, timeout, command=torchrun_command)


def library_overhead(results: list[dict], direct: str) -> dict[int, dict[str, float]]:
    """Per rank count: time of ``library`` / time of ``direct`` (the library called directly),
    the median over all sizes and over sizes >= 1 MiB."""
    by_key = {(r["ranks"], r["bytes"], r["impl"]): r["time_s"] for r in results}
    out: dict[int, dict[str, float]] = {}
    for ranks in sorted({r["ranks"] for r in results}):
        ratios = {b: t / by_key[(ranks, b, direct)] for (n, b, impl), t in by_key.items()
                  if n == ranks and impl == "library" and (ranks, b, direct) in by_key}
        if ratios:
            large = [v for b, v in ratios.items() if b >= 1 << 20]
            out[ranks] = {"all_sizes": statistics.median(ratios.values()),
                          "sizes_from_1MiB": statistics.median(large) if large else float("nan")}
    return out


# ----------------------------------------------------------------- the driver


def _launch(ranks: int, byte_sizes: list[int], warmup: int, timeout: float, progress: Any,
            engine: str = "mpi") -> tuple[list[dict], str]:
    """Run one ``mpiexec`` (or ``torchrun``) job and collect rank 0's results as they arrive."""
    results: list[dict] = []
    meta: dict[str, str] = {"library": "unknown"}

    def on_record(record: dict) -> None:
        if "mpi_library" in record or "torch_library" in record:
            meta["library"] = record.get("mpi_library") or record["torch_library"]
        else:
            results.append(record)
            progress.update(1)

    argv = ["--worker", "--engine", engine, "--sizes", ",".join(map(str, byte_sizes)), "--warmup", str(warmup)]
    if engine == "torch":
        torch_job(ranks, "benchmarks.allreduce", argv, on_record, timeout)
    else:
        mpi_job(ranks, ["-m", "benchmarks.allreduce", *argv], on_record, timeout)
    return results, meta["library"]


def summarise(results: list[dict], min_bytes: int = 1 << 20, impl_name: str = "ring",
              direct: str = "mpi") -> dict[int, float]:
    """Median over sizes >= ``min_bytes`` of ``impl_name`` busbw / ``direct`` busbw (the library's own), per rank count."""
    by_key = {(r["ranks"], r["bytes"], r["impl"]): r["busbw_GBps"] for r in results}
    ratios: dict[int, list[float]] = {}
    for (ranks, n_bytes, impl), busbw in by_key.items():
        if impl == impl_name and n_bytes >= min_bytes and (ranks, n_bytes, direct) in by_key:
            ratios.setdefault(ranks, []).append(busbw / by_key[(ranks, n_bytes, direct)])
    return {ranks: statistics.median(v) for ranks, v in sorted(ratios.items())}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("allreduce", __doc__, mpi=True)
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    parser.add_argument("--torch-ranks", default=None,
                        help="comma-separated process counts of the torch section's torchrun jobs (default: --ranks)")
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES, help="smallest message, in bytes (sizes double from here)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest message, in bytes")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before each timed size")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mpiexec or torchrun job")
    add_sections_argument(parser, SECTIONS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=SECTIONS, default="mpi", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        (run_torch_rank if args.engine == "torch" else run_rank)([int(s) for s in args.sizes.split(",")], args.warmup)
        return 0

    from tqdm import tqdm

    rank_counts = [int(r) for r in args.ranks.split(",")]
    torch_counts = [int(r) for r in (args.torch_ranks or args.ranks).split(",")]
    byte_sizes = sizes(args.min_bytes, args.max_bytes)
    if not byte_sizes or args.min_bytes < ITEM_BYTES or any(b % ITEM_BYTES for b in byte_sizes):
        parser.error(f"sizes must be multiples of {ITEM_BYTES} bytes (float32), from --min-bytes to --max-bytes")
    run = sections_to_run(parser, args, SECTIONS)
    results: list[dict] = []
    torch_results: list[dict] = []
    library, torch_library = "unknown", "unknown"
    points = len(byte_sizes) * (len(rank_counts) * len(MPI_IMPLS) * ("mpi" in run)
                                + len(torch_counts) * len(TORCH_IMPLS) * ("torch" in run))
    with tqdm(total=points, desc="allreduce", unit="point") as progress:
        for ranks in sorted(set(rank_counts) | set(torch_counts)):
            progress.set_postfix(ranks=ranks)
            if "mpi" in run and ranks in rank_counts:
                part, library = _launch(ranks, byte_sizes, args.warmup, args.timeout, progress)
                results.extend(part)
            if "torch" in run and ranks in torch_counts:
                part, torch_library = _launch(ranks, byte_sizes, args.warmup, args.timeout, progress, "torch")
                torch_results.extend(part)

    parts: dict[str, Any] = {}
    if "mpi" in run:
        parts.update(dtype="float32", results=results)
    if "torch" in run:
        parts["torch"] = {"library": torch_library, "machine": machine_info(torch_library=torch_library),
                          "results": torch_results}
    machine = machine_info(mpi_library=library) if "mpi" in run else machine_info(torch_library=torch_library)
    document = sectioned_document(args, "allreduce", parts, machine, {})
    if not args.only:
        document.pop("settings")
    write_json(args.out, document)

    print(f"wrote {args.out}")
    for engine, rows, direct in (("MPI", results, "mpi"), ("torch.distributed", torch_results, "torch")):
        for ranks, ratio in library_overhead(rows, direct).items():
            print(f"{engine}, {ranks} ranks: time of algorithm='library' / the library called directly, median "
                  f"over all sizes = {ratio['all_sizes']:.3f}, over sizes >= 1 MiB = {ratio['sizes_from_1MiB']:.3f}")
    for ranks, ratio in summarise(torch_results, direct="torch").items():
        print(f"torch.distributed, {ranks} ranks, sizes >= 1 MiB: median busbw ratio ring / all_reduce = {ratio:.2f}")
    if "mpi" not in run:
        return 0
    print(f"{'ranks':>5}  {'bytes':>10}  busbw GB/s: {'ring':>7} {'ring_alloc':>10} {'MPI':>7}  ring/MPI")
    by_key = {(r["ranks"], r["bytes"], r["impl"]): r["busbw_GBps"] for r in results}
    for ranks in rank_counts:
        for n_bytes in byte_sizes:
            ring, fresh, mpi = (by_key[(ranks, n_bytes, i)] for i in ("ring", "ring_alloc", "mpi"))
            print(f"{ranks:>5}  {n_bytes:>10}  {'':>11} {ring:7.3f} {fresh:10.3f} {mpi:7.3f}  {ring / mpi:8.2f}")
    fresh = summarise(results, impl_name="ring_alloc")
    for ranks, ratio in summarise(results).items():
        print(f"{ranks} ranks, sizes >= 1 MiB: median busbw ratio ring / MPI = {ratio:.2f} "
              f"(ring_alloc / MPI = {fresh[ranks]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
