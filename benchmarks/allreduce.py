"""Benchmark: our ring allreduce against the MPI library's own ``Allreduce``, same run.

``python -m benchmarks allreduce`` launches ``mpiexec`` once per rank count. In
each job every message size is timed for both implementations, interleaved repeat by
repeat so both see the same machine state: a barrier, then the call; a repeat's time is
the slowest rank's; the reported time is the median over repeats after warm-up calls.

Three implementations: ``ring`` (ours, writing into a buffer the caller reuses, as MPI's
``Allreduce`` does), ``ring_alloc`` (ours, allocating a new output array every call: the
cost of fresh memory made visible) and ``mpi`` (the library's own).

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

from .harness import bandwidths, bench_parser, emit, mpi_job, repeats_for, sizes, time_interleaved, write_json
from .machine import machine_info

MIN_BYTES, MAX_BYTES = 8, 64 << 20
ITEM_BYTES = 4  # float32


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


# ----------------------------------------------------------------- the driver


def _launch(ranks: int, byte_sizes: list[int], warmup: int, timeout: float, progress: Any) -> tuple[list[dict], str]:
    """Run one ``mpiexec`` job and collect rank 0's results as they arrive."""
    results: list[dict] = []
    meta: dict[str, str] = {"mpi_library": "unknown"}

    def on_record(record: dict) -> None:
        if "mpi_library" in record:
            meta.update(record)
        else:
            results.append(record)
            progress.update(1)

    argv = ["-m", "benchmarks.allreduce", "--worker",
            "--sizes", ",".join(map(str, byte_sizes)), "--warmup", str(warmup)]
    mpi_job(ranks, argv, on_record, timeout)
    return results, meta["mpi_library"]


def summarise(results: list[dict], min_bytes: int = 1 << 20, impl_name: str = "ring") -> dict[int, float]:
    """Median over sizes >= ``min_bytes`` of ``impl_name`` busbw / MPI busbw, per rank count."""
    by_key = {(r["ranks"], r["bytes"], r["impl"]): r["busbw_GBps"] for r in results}
    ratios: dict[int, list[float]] = {}
    for (ranks, n_bytes, impl), busbw in by_key.items():
        if impl == impl_name and n_bytes >= min_bytes and (ranks, n_bytes, "mpi") in by_key:
            ratios.setdefault(ranks, []).append(busbw / by_key[(ranks, n_bytes, "mpi")])
    return {ranks: statistics.median(v) for ranks, v in sorted(ratios.items())}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("allreduce", __doc__, mpi=True)
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES, help="smallest message, in bytes (sizes double from here)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest message, in bytes")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before each timed size")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mpiexec job")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        run_rank([int(s) for s in args.sizes.split(",")], args.warmup)
        return 0

    from tqdm import tqdm

    rank_counts = [int(r) for r in args.ranks.split(",")]
    byte_sizes = sizes(args.min_bytes, args.max_bytes)
    if not byte_sizes or args.min_bytes < ITEM_BYTES or any(b % ITEM_BYTES for b in byte_sizes):
        parser.error(f"sizes must be multiples of {ITEM_BYTES} bytes (float32), from --min-bytes to --max-bytes")
    results: list[dict] = []
    library = "unknown"
    with tqdm(total=len(rank_counts) * len(byte_sizes) * 3, desc="allreduce", unit="point") as progress:
        for ranks in rank_counts:
            progress.set_postfix(ranks=ranks)
            part, library = _launch(ranks, byte_sizes, args.warmup, args.timeout, progress)
            results.extend(part)

    document = {
        "benchmark": "allreduce",
        "dtype": "float32",
        "machine": machine_info(mpi_library=library),
        "results": results,
    }
    write_json(args.out, document)

    print(f"wrote {args.out}")
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
