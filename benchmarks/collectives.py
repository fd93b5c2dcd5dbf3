"""Benchmark: every allreduce algorithm of ours against the MPI library's, 8 B to 256 MiB.

``python -m benchmarks collectives`` runs, per rank count:

1. one ``mpiexec`` job timing all our algorithms (``ring``, ``recursive_doubling``,
   ``rabenseifner``, ``tree`` and ``auto``) and the library's default ``MPI_Allreduce``
   (``mpi``), interleaved repeat by repeat: the ratios between them come from one run;
2. one job per MPICH algorithm forced through its control variable
   ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM`` (``mpi:ring``, ``mpi:recursive_doubling``,
   ``mpi:reduce_scatter_allgather`` = Rabenseifner, ``mpi:tree``), so each of our algorithms
   can also be set against the library's own implementation of the same algorithm. Those
   come from separate runs; the JSON says so (``job`` field).

Which algorithm the library's default picks is not reported by MPICH; the forced runs are
how to tell (the default's curve coincides with one of them). The figures are plotted on
the page "Allreduce algorithms and their cost", next to the cost model's prediction.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from .harness import bandwidths, bench_parser, emit, mpi_job, repeats_for, sizes, time_interleaved, write_json
from .machine import machine_info

MIN_BYTES, MAX_BYTES = 8, 256 << 20
ITEM_BYTES = 4  # float32
OURS = ("ring", "recursive_doubling", "rabenseifner", "tree", "auto")
# MPICH's names for its allreduce algorithms (reduce_scatter_allgather is Rabenseifner's).
MPICH_FORCED = ("ring", "recursive_doubling", "reduce_scatter_allgather", "tree")


def run_rank(byte_sizes: list[int], impl_names: list[str], warmup: int) -> None:
    """Time ``impl_names`` (ours and/or "mpi") for every size; rank 0 prints JSON lines."""
    import numpy as np
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator, allreduce

    world = MPI.COMM_WORLD
    comm = MPICommunicator(world)
    n, rank = comm.size, comm.rank
    if rank == 0:
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})

    def ours(algorithm: str, x: Any, out: Any) -> Any:
        return lambda: allreduce(comm, x, algorithm=algorithm, out=out)

    for n_bytes in byte_sizes:
        count = n_bytes // ITEM_BYTES
        x = np.full(count, rank + 1, dtype=np.float32)
        out = np.empty_like(x)
        impls = {
            name: (lambda: world.Allreduce(x, out, op=MPI.SUM)) if name == "mpi" else ours(name, x, out)
            for name in impl_names
        }
        for name, fn in impls.items():  # warm-up, and check every implementation is right
            out[...] = 0
            for _ in range(warmup):
                fn()
            if count and not np.all(out == n * (n + 1) / 2):
                raise AssertionError(f"rank {rank}: {name} gave a wrong allreduce at {n_bytes} bytes")
        medians = time_interleaved(world, impls, repeats_for(n_bytes))
        if rank == 0:
            for name, t in medians.items():
                algbw, busbw = bandwidths(n_bytes, t, n)
                emit({"ranks": n, "bytes": n_bytes, "impl": name, "time_s": t,
                      "algbw_GBps": algbw, "busbw_GBps": busbw, "repeats": repeats_for(n_bytes)})


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("collectives", __doc__, mpi=True)
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES, help="smallest message, in bytes (sizes double from here)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest message, in bytes")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs before each timed size")
    parser.add_argument("--no-forced", action="store_true", help="skip the runs with MPICH's algorithms forced")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per mpiexec job")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impls", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        run_rank([int(s) for s in args.sizes.split(",")], args.impls.split(","), args.warmup)
        return 0

    from tqdm import tqdm

    rank_counts = [int(r) for r in args.ranks.split(",")]
    byte_sizes = sizes(args.min_bytes, args.max_bytes)
    if not byte_sizes or args.min_bytes < ITEM_BYTES or any(b % ITEM_BYTES for b in byte_sizes):
        parser.error(f"sizes must be multiples of {ITEM_BYTES} bytes (float32), from --min-bytes to --max-bytes")
    forced = () if args.no_forced else MPICH_FORCED
    # (label prefix, implementations, environment) per job
    jobs = [("", [*OURS, "mpi"], {})] + [
        (f"mpi:{alg}", ["mpi"], {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": alg, "MPIR_CVAR_DEVICE_COLLECTIVES": "none"})
        for alg in forced
    ]
    total = len(rank_counts) * len(byte_sizes) * sum(len(impls) for _, impls, _ in jobs)
    results: list[dict] = []
    meta = {"mpi_library": "unknown"}
    with tqdm(total=total, desc="collectives", unit="point") as progress:
        for ranks in rank_counts:
            for label, impls, env in jobs:
                progress.set_postfix(ranks=ranks, job=label or "ours+mpi")

                def on_record(record: dict, label: str = label, env: dict = env) -> None:
                    if "mpi_library" in record:
                        meta.update(record)
                        return
                    if label:
                        record["impl"] = label
                    record["job"] = "forced" if env else "main"
                    results.append(record)
                    progress.update(1)

                argv = ["-m", "benchmarks.collectives", "--worker", "--impls", ",".join(impls),
                        "--sizes", ",".join(map(str, byte_sizes)), "--warmup", str(args.warmup)]
                mpi_job(ranks, argv, on_record, args.timeout, env=env)

    write_json(args.out, {
        "benchmark": "collectives",
        "dtype": "float32",
        "machine": machine_info(mpi_library=meta["mpi_library"]),
        "forced_algorithm_variable": "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
        "results": results,
    })
    print(f"wrote {args.out}")
    best = _best_of_ours(results)
    for ranks, (ratio_large, ratio_small) in best.items():
        print(f"{ranks} ranks: best of ours / MPI busbw, median over sizes >= 1 MiB = {ratio_large:.2f}; "
              f"best of ours / MPI time at {byte_sizes[0]} B = {ratio_small:.2f}")
    return 0


def _fastest_ours(times: dict[str, float]) -> float:
    return min(t for impl, t in times.items() if impl != "mpi")


def _best_of_ours(results: list[dict]) -> dict[int, tuple[float, float]]:
    """Per rank count: (median over sizes >= 1 MiB of best-of-ours busbw / MPI busbw,
    best-of-ours time / MPI time at the smallest size), from the main job only."""
    main = [r for r in results if r["job"] == "main"]
    out = {}
    for ranks in sorted({r["ranks"] for r in main}):
        rows = [r for r in main if r["ranks"] == ranks]
        by_size: dict[int, dict[str, float]] = {}
        for r in rows:
            by_size.setdefault(r["bytes"], {})[r["impl"]] = r["time_s"]
        large = [v["mpi"] / _fastest_ours(v) for b, v in by_size.items() if b >= 1 << 20]
        small = by_size[min(by_size)]
        out[ranks] = (statistics.median(large) if large else float("nan"), _fastest_ours(small) / small["mpi"])
    return out


if __name__ == "__main__":
    sys.exit(main())
