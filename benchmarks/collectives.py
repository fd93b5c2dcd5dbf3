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

3. (section ``torch``) one ``torchrun`` job timing all our algorithms on ``TorchCommunicator``
   (gloo), ``algorithm="library"`` and ``torch.distributed.all_reduce`` called directly
   (``torch``), interleaved the same way; under the document's ``torch`` key.

Which algorithm the library's default picks is not reported by MPICH; the forced runs are
how to tell (the default's curve coincides with one of them). The figures are plotted on
the page "Allreduce algorithms and their cost", next to the cost model's prediction.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from .allreduce import library_overhead, torch_job
from .harness import (
    add_sections_argument, bandwidths, bench_parser, emit, mpi_job, repeats_for, sectioned_document, sections_to_run,
    sizes, time_interleaved, warm_up_and_check, write_json,
)
from .machine import machine_info

MIN_BYTES, MAX_BYTES = 8, 256 << 20
ITEM_BYTES = 4  # float32
OURS = ("ring", "recursive_doubling", "rabenseifner", "tree", "auto")
# MPICH's names for its allreduce algorithms (reduce_scatter_allgather is Rabenseifner's).
MPICH_FORCED = ("ring", "recursive_doubling", "reduce_scatter_allgather", "tree")
SECTIONS = ("mpi", "torch")
TORCH_IMPLS = (*OURS, "library", "torch")


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
        warm_up_and_check(impls, out, warmup, n * (n + 1) / 2, f"rank {rank}, {n_bytes} bytes")
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
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per mpiexec or torchrun job")
    add_sections_argument(parser, SECTIONS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=SECTIONS, default="mpi", help=argparse.SUPPRESS)
    parser.add_argument("--impls", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        byte_sizes = [int(s) for s in args.sizes.split(",")]
        if args.engine == "torch":
            from .allreduce import run_torch_rank

            run_torch_rank(byte_sizes, args.warmup, tuple(args.impls.split(",")))
        else:
            run_rank(byte_sizes, args.impls.split(","), args.warmup)
        return 0

    from tqdm import tqdm

    rank_counts = [int(r) for r in args.ranks.split(",")]
    byte_sizes = sizes(args.min_bytes, args.max_bytes)
    if not byte_sizes or args.min_bytes < ITEM_BYTES or any(b % ITEM_BYTES for b in byte_sizes):
        parser.error(f"sizes must be multiples of {ITEM_BYTES} bytes (float32), from --min-bytes to --max-bytes")
    run = sections_to_run(parser, args, SECTIONS)
    forced = () if args.no_forced else MPICH_FORCED
    # (label prefix, implementations, environment) per job
    jobs = [("", [*OURS, "mpi"], {})] + [
        (f"mpi:{alg}", ["mpi"], {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": alg, "MPIR_CVAR_DEVICE_COLLECTIVES": "none"})
        for alg in forced
    ]
    if "mpi" not in run:
        jobs = []
    total = len(rank_counts) * len(byte_sizes) * (sum(len(impls) for _, impls, _ in jobs)
                                                  + len(TORCH_IMPLS) * ("torch" in run))
    results: list[dict] = []
    torch_results: list[dict] = []
    meta = {"mpi_library": "unknown", "torch_library": "unknown"}
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
            if "torch" in run:
                progress.set_postfix(ranks=ranks, job="torch")

                def on_torch(record: dict) -> None:
                    if "torch_library" in record:
                        meta.update(record)
                        return
                    torch_results.append(record)
                    progress.update(1)

                torch_job(ranks, "benchmarks.collectives",
                          ["--worker", "--engine", "torch", "--impls", ",".join(TORCH_IMPLS),
                           "--sizes", ",".join(map(str, byte_sizes)), "--warmup", str(args.warmup)],
                          on_torch, args.timeout)

    parts: dict[str, Any] = {}
    if "mpi" in run:
        parts.update(dtype="float32", forced_algorithm_variable="MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
                     results=results)
    if "torch" in run:
        parts["torch"] = {"library": meta["torch_library"], "results": torch_results,
                          "machine": machine_info(torch_library=meta["torch_library"])}
    machine = machine_info(**{k: v for k, v in meta.items() if k == "mpi_library" or "mpi" not in run})
    document = sectioned_document(args, "collectives", parts, machine, {})
    if not args.only:
        document.pop("settings")
    write_json(args.out, document)
    print(f"wrote {args.out}")
    for ranks, ratio in library_overhead(torch_results, "torch").items():
        print(f"torch.distributed, {ranks} ranks: time of algorithm='library' / all_reduce, median over all sizes "
              f"= {ratio['all_sizes']:.3f}, over sizes >= 1 MiB = {ratio['sizes_from_1MiB']:.3f}")
    if "mpi" not in run:
        return 0
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
