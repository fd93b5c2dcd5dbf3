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
import os
import statistics
import sys
import time
from typing import Any, Callable

from .harness import (add_sections_argument, bench_parser, emit, mpi_job, repeats_for, sectioned_document,
                      sections_to_run, sizes, time_interleaved, write_json)
from .machine import machine_info

SECTIONS = ("alltoall",)
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


def _int_list(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("model_parallel", __doc__)
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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup < 1:
        parser.error(f"--warmup must be at least 1 (the checked call), got {args.warmup}")

    if args.worker:
        run_rank(_int_list(args.sizes), _int_list(args.v_sizes), args.scale, args.warmup)
        return 0

    forced = tuple(a for a in args.forced.split(",") if a)
    unknown = [a for a in forced if a not in MPICH_ALGORITHMS]
    if unknown:
        parser.error(f"--forced {args.forced}: unknown MPICH algorithm(s) {unknown}; expected some of {MPICH_ALGORITHMS}")
    run = sections_to_run(parser, args, SECTIONS)
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
