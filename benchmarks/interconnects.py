"""Benchmark (simulated): ring allreduce time on each interconnect profile, from 4 KiB to 1 GiB.

``python -m benchmarks interconnects`` needs no network: it asks what the same
gradient allreduce would cost on 10/25/100 Gb Ethernet (TCP), RoCE and InfiniBand HDR/NDR
(the profiles of ``comm/simnet.py``), in two ways that must agree:

1. **closed form** (``cost_model.ring_allreduce_time``) on 8, 64 and 512 ranks, every size;
2. **simulated runs**: the real ring allreduce on 2, 4 and 8 thread ranks, each wrapped in
   a ``SimulatedNetwork`` with a virtual clock, for sizes up to 16 MiB (the arrays are
   real, so memory bounds the size). The simulated time must equal the closed form to
   within rounding; the run stops with an error if it does not.

It also prices **splitting**: one 100 MiB gradient allreduced as k separate tensors, the
fixed cost that gradient bucketing removes. Results go to
``bench-results/interconnects.json`` (with ``--publish``, the site's
``docs/assets/bench/interconnects.json``); the machine only matters for provenance.
"""
from __future__ import annotations

import sys

from .harness import bench_parser, sizes, write_json
from .machine import machine_info

MIN_BYTES, MAX_BYTES = 4 << 10, 1 << 30
SIM_MAX_BYTES = 16 << 20
MODEL_RANKS = (8, 64, 512)
SIM_RANKS = (2, 4, 8)
SPLIT_TOTAL = 100 << 20
SPLIT_COUNTS = (1, 4, 16, 64, 256, 1024)
SPLIT_RANKS = 64
TOLERANCE = 1e-9  # relative: the two must agree up to floating-point rounding


def simulated_ring_time(profile: str, ranks: int, n_bytes: int) -> tuple[float, int]:
    """Simulated seconds of one float32 ring allreduce of ``n_bytes`` per rank, and bytes sent per rank.

    Checks the sum against NumPy, so the timing is of an allreduce that worked.
    """
    import numpy as np

    from reference_impl.comm import allreduce, run_threads
    from reference_impl.comm.simnet import SimulatedNetwork

    count = n_bytes // 4

    def step(comm: SimulatedNetwork) -> tuple[float, int, bool]:
        x = np.full(count, comm.rank + 1, dtype=np.float32)
        out = allreduce(comm, x, algorithm="ring")
        return comm.now(), comm.bytes_sent, bool(np.all(out == ranks * (ranks + 1) / 2))

    results = run_threads(ranks, step, timeout=120, wrap=lambda c: SimulatedNetwork(c, profile))
    if not all(ok for _, _, ok in results):
        raise AssertionError(f"simulated ring allreduce on {ranks} ranks of {n_bytes} bytes gave a wrong sum")
    return max(t for t, _, _ in results), results[0][1]


def main(argv: list[str] | None = None) -> int:
    from reference_impl.comm.cost_model import ring_allreduce_time
    from reference_impl.comm.simnet import INTERCONNECTS

    parser = bench_parser("interconnects", __doc__)
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES, help="smallest message, in bytes (sizes double from here)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest message, in bytes")
    parser.add_argument("--sim-max-bytes", type=int, default=SIM_MAX_BYTES,
                        help="largest size run on simulated thread ranks (default 16 MiB)")
    parser.add_argument("--profiles", default=",".join(INTERCONNECTS),
                        help=f"comma-separated profiles (default: all of {', '.join(INTERCONNECTS)})")
    args = parser.parse_args(argv)

    profiles = args.profiles.split(",")
    unknown = [p for p in profiles if p not in INTERCONNECTS]
    if unknown:
        parser.error(f"unknown profile(s) {unknown}; known: {', '.join(INTERCONNECTS)}")
    all_sizes = sizes(args.min_bytes, args.max_bytes)
    if not all_sizes or args.min_bytes % (4 * max(SIM_RANKS)):
        parser.error(f"--min-bytes must be a positive multiple of {4 * max(SIM_RANKS)} "
                     "(float32, equal chunks on every simulated rank count)")
    sim_sizes = [s for s in all_sizes if s <= args.sim_max_bytes][::2]  # every 4x: enough to check

    from tqdm import tqdm

    rows = []
    worst = 0.0
    with tqdm(total=len(profiles) * len(SIM_RANKS) * len(sim_sizes), desc="interconnects",
              unit="run") as progress:
        for name in profiles:
            link = INTERCONNECTS[name].link
            for ranks in MODEL_RANKS:
                for n_bytes in all_sizes:
                    t = ring_allreduce_time(n_bytes, ranks, link)
                    rows.append({"kind": "model", "profile": name, "ranks": ranks, "bytes": n_bytes,
                                 "time_s": t, "latency_share": 2 * (ranks - 1) * link.alpha / t})
            for ranks in SIM_RANKS:
                progress.set_postfix(profile=name, ranks=ranks)
                for n_bytes in sim_sizes:
                    simulated, sent = simulated_ring_time(name, ranks, n_bytes)
                    model = ring_allreduce_time(n_bytes, ranks, link)
                    error = abs(simulated - model) / model
                    worst = max(worst, error)
                    if error > TOLERANCE or sent != 2 * (ranks - 1) * n_bytes // ranks:
                        raise AssertionError(
                            f"{name}, {ranks} ranks, {n_bytes} bytes: simulated {simulated!r} s and "
                            f"{sent} bytes sent, closed form {model!r} s and "
                            f"{2 * (ranks - 1) * n_bytes // ranks} bytes")
                    rows.append({"kind": "simulated", "profile": name, "ranks": ranks, "bytes": n_bytes,
                                 "time_s": simulated, "model_s": model, "relative_error": error,
                                 "bytes_sent_per_rank": sent})
                    progress.update(1)
            for k in SPLIT_COUNTS:
                rows.append({"kind": "split", "profile": name, "ranks": SPLIT_RANKS, "tensors": k,
                             "bytes": SPLIT_TOTAL, "time_s": k * ring_allreduce_time(SPLIT_TOTAL / k, SPLIT_RANKS, link)})

    write_json(args.out, {
        "benchmark": "interconnects",
        "dtype": "float32",
        "machine": machine_info(mpi_library="none (simulated on thread ranks)"),
        "profiles": {name: {"link_gbps": INTERCONNECTS[name].link_gbps,
                            "latency_s": INTERCONNECTS[name].latency_s,
                            "transport": INTERCONNECTS[name].transport} for name in profiles},
        "max_relative_error": worst,
        "results": rows,
    })
    print(f"wrote {args.out}")
    print(f"simulated runs agree with the closed form: worst relative difference {worst:.1e}")
    print(f"ring allreduce on {MODEL_RANKS[1]} ranks:")
    print(f"{'profile':>10} " + " ".join(f"{b:>12}" for b in (all_sizes[0], 1 << 20, all_sizes[-1])))
    for name in profiles:
        by_size = {r["bytes"]: r["time_s"] for r in rows
                   if r["kind"] == "model" and r["profile"] == name and r["ranks"] == MODEL_RANKS[1]}
        print(f"{name:>10} " + " ".join(f"{by_size.get(b, float('nan')):12.3e}"
                                         for b in (all_sizes[0], 1 << 20, all_sizes[-1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
