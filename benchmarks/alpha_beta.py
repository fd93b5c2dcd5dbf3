"""Benchmark: fit α, β, γ on this machine, then check the fitted model against ring allreduce.

``python -m benchmarks alpha_beta`` runs three measurements:

1. **ping-pong** on 2 MPI ranks (``mpiexec -n 2``), message sizes from 8 B to 64 MiB: the
   one-way time is half the median round trip (``calibrate.pingpong``);
2. **reduction** on rank 0 of the same job: the median time of ``a += b`` on float32
   arrays from 4 KiB to 64 MiB (``calibrate.reduction_time``);
3. **ring allreduce** on 2 and 4 ranks for a few sizes, timed as the allreduce benchmark
   does (barrier, call, slowest rank, median over repeats).

The driver fits ``t = α + m·β`` to (1) and ``γ`` to (2) (``cost_model.fit_alpha_beta``,
``fit_gamma``), predicts (3) with ``cost_model.ring_allreduce_time`` and stores measured and
predicted times side by side, in ``bench-results/alpha_beta.json`` (with ``--publish``, the
site's ``docs/assets/bench/alpha_beta.json``).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from .harness import bench_parser, emit, mpi_job, repeats_for, sizes, time_interleaved, write_json
from .machine import machine_info

MIN_BYTES, MAX_BYTES = 8, 64 << 20
REDUCTION_MIN, REDUCTION_MAX = 4 << 10, 64 << 20
ALLREDUCE_SIZES = (64, 4 << 10, 256 << 10, 4 << 20, 64 << 20)
ITEM_BYTES = 4  # float32


# ----------------------------------------------------------------- inside the MPI jobs


def run_pingpong(byte_sizes: list[int], reduction_sizes: list[int], warmup: int) -> None:
    """Ping-pong between ranks 0 and 1 per size, then rank 0 times reductions; rank 0 prints."""
    import numpy as np
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator
    from reference_impl.comm.calibrate import pingpong, reduction_time

    comm = MPICommunicator()
    if comm.rank == 0:
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})
    for n_bytes in byte_sizes:
        repeats = repeats_for(n_bytes)
        times = pingpong(comm, [n_bytes], repeats=repeats, warmup=warmup)
        if comm.rank == 0:
            emit({"kind": "pingpong", "bytes": n_bytes, "time_s": times[0], "repeats": repeats})
    comm.barrier()
    if comm.rank == 0:
        for n_bytes in reduction_sizes:
            repeats = repeats_for(n_bytes)
            t = reduction_time(np, [n_bytes], repeats=repeats, warmup=warmup)[0]
            emit({"kind": "reduction", "bytes": n_bytes, "time_s": t, "repeats": repeats})
    comm.barrier()


def run_allreduce(byte_sizes: list[int], warmup: int) -> None:
    """Time our ring allreduce (into a reused output buffer) per size; rank 0 prints."""
    import numpy as np
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator, allreduce

    world = MPI.COMM_WORLD
    comm = MPICommunicator(world)
    for n_bytes in byte_sizes:
        x = np.full(n_bytes // ITEM_BYTES, comm.rank + 1, dtype=np.float32)
        out = np.empty_like(x)
        impls = {"ring": lambda: allreduce(comm, x, algorithm="ring", out=out)}
        for _ in range(warmup):
            impls["ring"]()
        if x.size and not np.all(out == comm.size * (comm.size + 1) / 2):
            raise AssertionError(f"rank {comm.rank}: ring allreduce gave a wrong sum at {n_bytes} bytes")
        repeats = repeats_for(n_bytes)
        t = time_interleaved(world, impls, repeats)["ring"]
        if comm.rank == 0:
            emit({"kind": "allreduce", "ranks": comm.size, "bytes": n_bytes, "time_s": t, "repeats": repeats})


# ----------------------------------------------------------------- the driver


def fit(pingpong_rows: list[dict], reduction_rows: list[dict]) -> dict[str, float]:
    """α, β from the ping-pong rows and γ from the reduction rows, with the fit's quality."""
    from reference_impl.comm.cost_model import fit_alpha_beta, fit_gamma

    link = fit_alpha_beta([r["bytes"] for r in pingpong_rows], [r["time_s"] for r in pingpong_rows])
    gamma = fit_gamma([r["bytes"] for r in reduction_rows], [r["time_s"] for r in reduction_rows])
    assert link.fit is not None
    return {
        "alpha_s": link.alpha,
        "beta_s_per_byte": link.beta,
        "gamma_s_per_byte": gamma,
        "bandwidth_GBps": 1 / link.beta / 1e9,
        "reduction_GBps": 1 / gamma / 1e9,
        "n_half_bytes": link.alpha / link.beta,
        "r_squared": link.fit.r_squared,
        "max_relative_error": link.fit.max_relative_error,
        "relative_residuals": list(link.fit.relative_residuals),
    }


def predict(rows: list[dict], params: dict[str, float]) -> list[dict]:
    """Measured allreduce rows, each with the ring's predicted time (with and without γ)."""
    from reference_impl.comm.cost_model import LinkParams, ring_allreduce_time

    link = LinkParams(params["alpha_s"], params["beta_s_per_byte"], params["gamma_s_per_byte"])
    no_gamma = LinkParams(params["alpha_s"], params["beta_s_per_byte"])
    out = []
    for r in rows:
        predicted = ring_allreduce_time(r["bytes"], r["ranks"], link)
        out.append({
            "ranks": r["ranks"], "bytes": r["bytes"], "measured_s": r["time_s"],
            "predicted_s": predicted, "predicted_alpha_beta_s": ring_allreduce_time(r["bytes"], r["ranks"], no_gamma),
            "measured_over_predicted": r["time_s"] / predicted, "repeats": r["repeats"],
        })
    return out


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("alpha_beta", __doc__, mpi=True)
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES, help="smallest ping-pong size")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest ping-pong and reduction size")
    parser.add_argument("--ranks", default="2,4", help="rank counts for the allreduce check (default 2,4)")
    parser.add_argument("--allreduce-sizes", default=",".join(map(str, ALLREDUCE_SIZES)),
                        help="comma-separated allreduce sizes in bytes")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before each timed size")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mpiexec job")
    parser.add_argument("--worker", choices=("pingpong", "allreduce"), help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--reduction-sizes", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker == "pingpong":
        run_pingpong([int(s) for s in args.sizes.split(",")],
                     [int(s) for s in args.reduction_sizes.split(",")], args.warmup)
        return 0
    if args.worker == "allreduce":
        run_allreduce([int(s) for s in args.sizes.split(",")], args.warmup)
        return 0

    from tqdm import tqdm

    pp_sizes = sizes(args.min_bytes, args.max_bytes)
    red_sizes = sizes(REDUCTION_MIN, max(REDUCTION_MIN * 2, args.max_bytes))
    rank_counts = [int(r) for r in args.ranks.split(",")]
    ar_sizes = [int(s) for s in args.allreduce_sizes.split(",")]
    if len(pp_sizes) < 2:
        parser.error("need at least two ping-pong sizes: --max-bytes must be at least twice --min-bytes")
    if any(r < 2 for r in rank_counts):
        parser.error(f"--ranks: an allreduce check needs at least 2 ranks, got {rank_counts}")
    for s in ar_sizes:
        for r in rank_counts:
            if s <= 0 or s % (ITEM_BYTES * r):
                parser.error(f"--allreduce-sizes: {s} bytes is not a positive multiple of "
                             f"{ITEM_BYTES} x {r} ranks (float32 chunks of equal size)")

    rows: dict[str, list[dict[str, Any]]] = {"pingpong": [], "reduction": [], "allreduce": []}
    meta = {"mpi_library": "unknown"}
    total = len(pp_sizes) + len(red_sizes) + len(rank_counts) * len(ar_sizes)
    with tqdm(total=total, desc="alpha_beta", unit="point") as progress:
        def on_record(record: dict) -> None:
            if "mpi_library" in record:
                meta.update(record)
            else:
                rows[record.pop("kind")].append(record)
                progress.update(1)

        progress.set_postfix(step="ping-pong")
        mpi_job(2, ["-m", "benchmarks.alpha_beta", "--worker", "pingpong",
                    "--sizes", ",".join(map(str, pp_sizes)),
                    "--reduction-sizes", ",".join(map(str, red_sizes)),
                    "--warmup", str(args.warmup)], on_record, args.timeout)
        for ranks in rank_counts:
            progress.set_postfix(step=f"allreduce, {ranks} ranks")
            mpi_job(ranks, ["-m", "benchmarks.alpha_beta", "--worker", "allreduce",
                            "--sizes", ",".join(map(str, ar_sizes)), "--warmup", str(args.warmup)],
                    on_record, args.timeout)

    params = fit(rows["pingpong"], rows["reduction"])
    results = predict(rows["allreduce"], params)
    write_json(args.out, {
        "benchmark": "alpha_beta",
        "dtype": "float32",
        "machine": machine_info(mpi_library=meta["mpi_library"]),
        "fit": params,
        "pingpong": rows["pingpong"],
        "reduction": rows["reduction"],
        "results": results,
    })

    print(f"wrote {args.out}")
    print(f"alpha = {params['alpha_s'] * 1e6:.2f} us, beta = {params['beta_s_per_byte'] * 1e9:.4f} ns/B "
          f"({params['bandwidth_GBps']:.2f} GB/s), gamma = {params['gamma_s_per_byte'] * 1e9:.4f} ns/B "
          f"({params['reduction_GBps']:.2f} GB/s); n_1/2 = alpha/beta = {params['n_half_bytes']:.0f} B; "
          f"worst point off the line by {params['max_relative_error']:.0%}")
    print(f"{'ranks':>5} {'bytes':>10} {'measured':>12} {'predicted':>12} {'ratio':>6}")
    for r in results:
        print(f"{r['ranks']:>5} {r['bytes']:>10} {r['measured_s']:12.3e} {r['predicted_s']:12.3e} "
              f"{r['measured_over_predicted']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
