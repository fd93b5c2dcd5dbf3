"""Benchmark: our ring allreduce against the MPI library's own ``Allreduce``, same run.

``python -m reference_impl.bench allreduce`` launches ``mpiexec`` once per rank count. In
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
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .machine import machine_info

DEFAULT_OUT = Path("docs/assets/bench/allreduce.json")
MIN_BYTES, MAX_BYTES = 8, 64 << 20
ITEM_BYTES = 4  # float32


def sizes(min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES) -> list[int]:
    """Powers of two from ``min_bytes`` to ``max_bytes`` inclusive."""
    out, b = [], min_bytes
    while b <= max_bytes:
        out.append(b)
        b *= 2
    return out


def repeats_for(n_bytes: int) -> int:
    """More repeats for small messages, whose times are short and noisy."""
    if n_bytes <= 64 << 10:
        return 40
    if n_bytes <= 4 << 20:
        return 15
    return 7


def bandwidths(n_bytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second), as nccl-tests defines them."""
    algbw = n_bytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


# ----------------------------------------------------------------- inside the MPI job


def run_rank(byte_sizes: list[int], warmup: int) -> None:
    """Time both implementations for every size; rank 0 prints one JSON line per result."""
    import numpy as np
    from mpi4py import MPI

    from ..comm import MPICommunicator, allreduce

    world = MPI.COMM_WORLD
    comm = MPICommunicator(world)
    n, rank = comm.size, comm.rank
    if rank == 0:
        print(json.dumps({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()}), flush=True)

    def ours(x: Any, out: Any) -> Any:  # the caller's buffer, like MPI's receive buffer
        return allreduce(comm, x, out=out)

    def ours_fresh(x: Any, out: Any) -> Any:  # a new output array every call
        return allreduce(comm, x)

    def native(x: Any, out: Any) -> Any:
        world.Allreduce(x, out, op=MPI.SUM)
        return out

    impls = {"ring": ours, "ring_alloc": ours_fresh, "mpi": native}
    for n_bytes in byte_sizes:
        count = n_bytes // ITEM_BYTES
        x = np.full(count, rank + 1, dtype=np.float32)
        out = np.empty_like(x)
        expected = n * (n + 1) / 2
        for fn in impls.values():  # warm-up, and check both give the right answer
            for _ in range(warmup):
                result = fn(x, out)
            if count and not np.all(result == expected):
                raise AssertionError(f"rank {rank}: wrong allreduce result at {n_bytes} bytes")
        times: dict[str, list[float]] = {name: [] for name in impls}
        for _ in range(repeats_for(n_bytes)):
            for name, fn in impls.items():
                world.Barrier()
                t0 = time.perf_counter()
                fn(x, out)
                elapsed = time.perf_counter() - t0
                times[name].append(world.allreduce(elapsed, op=MPI.MAX))
        if rank == 0:
            for name, ts in times.items():
                t = statistics.median(ts)
                algbw, busbw = bandwidths(n_bytes, t, n)
                print(json.dumps({
                    "ranks": n, "bytes": n_bytes, "impl": name, "time_s": t,
                    "algbw_GBps": algbw, "busbw_GBps": busbw, "repeats": len(ts),
                }), flush=True)


# ----------------------------------------------------------------- the driver


def _launch(ranks: int, byte_sizes: list[int], warmup: int, timeout: float, progress: Any) -> tuple[list[dict], str]:
    """Run one ``mpiexec`` job and collect rank 0's JSON lines as they arrive."""
    from ..comm.mpi import mpiexec_command

    cmd = mpiexec_command(
        ranks, "-m", "reference_impl.bench.allreduce", "--worker",
        "--sizes", ",".join(map(str, byte_sizes)), "--warmup", str(warmup),
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    # A watchdog kills the whole job at the deadline, even if it hangs printing nothing.
    watchdog = threading.Timer(timeout, os.killpg, args=(proc.pid, signal.SIGKILL))
    watchdog.start()
    results, library = [], "unknown"
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            record = json.loads(line)
            if "mpi_library" in record:
                library = record["mpi_library"]
                continue
            results.append(record)
            progress.update(1)
        proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode == -signal.SIGKILL:
        raise TimeoutError(f"allreduce benchmark on {ranks} ranks ran past {timeout:g} s and was killed")
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark job failed (exit {proc.returncode}): {' '.join(cmd)}")
    return results, library


def summarise(results: list[dict], min_bytes: int = 1 << 20, impl_name: str = "ring") -> dict[int, float]:
    """Median over sizes >= ``min_bytes`` of ``impl_name`` busbw / MPI busbw, per rank count."""
    by_key = {(r["ranks"], r["bytes"], r["impl"]): r["busbw_GBps"] for r in results}
    ratios: dict[int, list[float]] = {}
    for (ranks, n_bytes, impl), busbw in by_key.items():
        if impl == impl_name and n_bytes >= min_bytes and (ranks, n_bytes, "mpi") in by_key:
            ratios.setdefault(ranks, []).append(busbw / by_key[(ranks, n_bytes, "mpi")])
    return {ranks: statistics.median(v) for ranks, v in sorted(ratios.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impl.bench allreduce", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES)
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mpiexec job")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    tmp.replace(args.out)

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
