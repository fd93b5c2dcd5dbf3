"""Benchmark: the same allreduce program on one host and on a (virtual) cluster.

``python -m benchmarks cluster`` (root: it creates network namespaces) runs the
allreduce benchmark's worker, unchanged, in three settings for 2 and 4 ranks:

* ``shared memory``: every rank on this machine, as ``make bench`` runs it;
* ``TCP``: one rank per host of a ``VirtualCluster`` (network namespaces on a virtual
  switch), every message through the TCP stack and a veth cable;
* ``TCP, 1 Gbit/s``: the same with each host's link capped at 1 Gbit/s (``tc tbf``),
  an ordinary Ethernet port.

Only the launch line and two environment variables differ between them; the ratio of our
ring to the MPI library's ``Allreduce`` is measured within each job.

With ``--launcher`` (e.g. ``"srun --mpi=pmi2"`` inside a Slurm allocation) or ``--hostfile``,
a fourth setting, ``launched by CMD``, runs the same worker through that launcher right after
the local ``mpiexec`` job of each rank count, so the two are measured side by side.

``--rounds K`` runs every job K times, the settings taking turns round after round, and keeps
for each point (setting, ranks, size) the round whose MPI ``Allreduce`` took the median time:
on a machine shared with other work, a burst of load then spoils one round of one setting,
not the comparison.
"""
from __future__ import annotations

import os
import sys

from reference_impl.comm.launch import Launcher, wheel_mpiexec
from reference_impl.comm.virtual_cluster import ClusterUnavailable, VirtualCluster
from .allreduce import summarise
from .harness import bench_parser, mpi_job, sizes, write_json
from .machine import machine_info

SETTINGS = (("shared memory", None, False), ("TCP", None, True), ("TCP, 1 Gbit/s", "1gbit", True))


def median_rounds(rows: list[dict]) -> list[dict]:
    """Per point (setting, ranks, bytes), the rows of the round whose MPI ``Allreduce`` took the
    median time: every implementation of a point comes from the same job, so ring / MPI stays a
    ratio measured side by side. Each kept row also gets ``round_spread``, the slowest round's
    MPI time over the fastest's at that point."""
    rounds: dict[tuple, dict[int, list[dict]]] = {}
    for row in rows:
        rounds.setdefault((row["setting"], row["ranks"], row["bytes"]), {}).setdefault(row["round"], []).append(row)
    kept = []
    for by_round in rounds.values():
        mpi_time = {k: next(r["time_s"] for r in rows if r["impl"] == "mpi") for k, rows in by_round.items()}
        order = sorted(by_round, key=mpi_time.get)
        # how far apart the rounds were: the noise any comparison between settings must exceed
        spread = mpi_time[order[-1]] / mpi_time[order[0]]
        kept += [{**r, "round_spread": spread} for r in by_round[order[len(order) // 2]]]
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("cluster", __doc__, mpi=True)
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts, one host per rank (default 2,4)")
    parser.add_argument("--min-bytes", type=int, default=8, help="smallest message, in bytes (sizes double from here)")
    parser.add_argument("--max-bytes", type=int, default=16 << 20, help="largest message, in bytes")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mpiexec job")
    parser.add_argument("--rounds", type=int, default=3,
                        help="jobs per setting and rank count, taking turns; each point keeps its median round "
                             "(default 3; odd)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.rounds % 2 == 0:
        parser.error(f"--rounds must be a positive odd number (the median round is kept), got {args.rounds}")

    from tqdm import tqdm

    rank_counts = [int(r) for r in args.ranks.split(",")]
    byte_sizes = sizes(args.min_bytes, args.max_bytes)
    worker = ["-m", "benchmarks.allreduce", "--worker", "--sizes", ",".join(map(str, byte_sizes)),
              "--warmup", "2"]
    settings = list(SETTINGS)
    if not args.launch.is_local_default:  # right after the local mpiexec job, so both see the same machine
        settings.insert(1, (f"launched by {args.launch.describe()}", None, False))
    results: list[dict] = []
    meta = {"mpi_library": "unknown"}
    load_before = os.getloadavg()[0]  # how busy the machine was: other work shares the cores
    try:
        total = args.rounds * len(settings) * len(rank_counts) * len(byte_sizes) * 3
        with tqdm(total=total, desc="cluster", unit="point") as bar:
            for ranks, round_, (name, rate, networked) in (
                    (r, k, s) for r in rank_counts for k in range(args.rounds) for s in settings):
                bar.set_postfix(setting=name, ranks=ranks, round=round_ + 1)

                def on_record(record: dict, name: str = name, round_: int = round_) -> None:
                    if "mpi_library" in record:
                        meta.update(record)
                    else:
                        results.append({**record, "setting": name, "round": round_})
                        bar.update(1)

                if networked:
                    with VirtualCluster(hosts=ranks, rate=rate) as cluster:
                        mpi_job(ranks, worker, on_record, args.timeout, launcher=cluster.launch)
                else:
                    local = name == "shared memory"
                    mpi_job(ranks, worker, on_record, args.timeout,
                            launcher=Launcher((wheel_mpiexec(),)) if local else args.launch)
    except ClusterUnavailable as exc:
        print(f"cluster benchmark not run: {exc}", file=sys.stderr)
        return 2

    results = median_rounds(results)
    write_json(args.out, {
        "benchmark": "cluster",
        "rounds": args.rounds,
        "load_average_1min": {"start": load_before, "end": os.getloadavg()[0]},
        "dtype": "float32",
        "machine": machine_info(mpi_library=meta["mpi_library"]),
        "settings": {name: {"rate": rate, "networked": networked} for name, rate, networked in settings},
        "results": results,
    })
    print(f"wrote {args.out}")
    for name, _, _ in settings:
        rows = [r for r in results if r["setting"] == name]
        for ranks, ratio in summarise(rows).items():
            best = max(r["busbw_GBps"] for r in rows if r["ranks"] == ranks and r["impl"] == "mpi")
            print(f"{name:>15}, {ranks} ranks: best MPI busbw {best:.3f} GB/s; "
                  f"ring / MPI busbw, median over sizes >= 1 MiB = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
