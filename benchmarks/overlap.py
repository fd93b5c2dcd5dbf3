"""Benchmark: tensor fusion, overlap of backward with allreduce, and the cluster simulator.

``python -m benchmarks overlap`` writes ``bench-results/overlap.json`` (with
``--publish``, the site's ``docs/assets/bench/overlap.json``) with four parts, all from one
invocation:

(a) **fusion** (``mpiexec -n 2`` and ``-n 4``): 1000 tensors of 4 KiB allreduced one call
    per tensor, against the same tensors packed into buckets of 64 KiB to 4 MiB (packing and
    unpacking included), timed interleaved repeat by repeat. Both with our ring and with the
    MPI library's ``Allreduce``: the library pays its latency per call too.
(b) **overlap** (``mpiexec -n 2``): step time of ``DataParallelTrainer`` in ``"overlap"``
    and ``"end"`` modes on a simulated network in sleep timing (``comm.simnet``: a message
    costs alpha + m beta of wall time but no CPU, like a network card doing the copy). The
    network speed beta is chosen per point so that communication takes ``ratio`` times the
    backward pass, for ratios around 1.
(c) **prediction**: for every point of (b), ``comm.cluster_sim`` predicts both step times
    from the compute profile measured in the same run (forward, the backward time up to
    each bucket, update) and the network's alpha and beta, which the simulated network
    makes known. The same comparison runs on 3 and 4 ranks at ratio 1.
(d) **simulation** up to 1024 workers: scaling efficiency with and without overlap on the
    interconnect profiles of ``comm.simnet``, and the overlap gain against the
    compute/communication ratio, for a stated hypothetical model (``SIM_MODEL``).

Workers run with one BLAS thread each (``OPENBLAS_NUM_THREADS=1``), so ranks do not fight
over cores inside a matrix product.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from .harness import bench_parser, emit, mpi_job, time_interleaved, write_json
from .machine import machine_info

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
N_TENSORS, TENSOR_BYTES = 1000, 4096
FUSION_BUCKETS = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
DP_WIDTHS = (256, 512, 512, 512, 512, 10)
DP_BATCH_PER_RANK = 1024
DP_BUCKET_BYTES = 1 << 20
DP_ALPHA = 100e-6  # the simulated network's latency per message
CALIBRATION_SIZES = tuple(4**k for k in range(2, 11)) + (2 << 20,)  # 16 B .. 2 MiB, past the buckets
RATIOS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)
# (d): a hypothetical model, stated, not measured: 100 MB of float32 gradients in 50 equal
# layers, 40 ms forward and 80 ms backward per step, 25 MiB buckets (PyTorch DDP's default).
SIM_MODEL = {"layers": 50, "grad_bytes": 100_000_000, "forward_s": 0.040, "backward_s": 0.080,
             "bucket_bytes": 25 << 20, "algorithm": "ring"}
SIM_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SIM_INTERCONNECTS = ("10GbE", "25GbE", "100GbE", "IB-HDR")
SIM_GAIN_WORKERS = 64


# ----------------------------------------------------------------- (a) fusion, in the MPI job


def run_fusion(repeats: int) -> None:
    """Time 1000 separate allreduces against fused buckets; rank 0 prints JSON lines."""
    import numpy as np
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator, allreduce
    from reference_impl.comm.bucketing import plan_buckets

    world = MPI.COMM_WORLD
    comm = MPICommunicator(world)
    rank, n = comm.rank, comm.size
    if rank == 0:
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})
    count = TENSOR_BYTES // 4
    grads = [np.full(count, rank + 1 + i % 7, np.float32) for i in range(N_TENSORS)]  # integers: exact sums
    outs = [np.empty_like(g) for g in grads]

    def separate(reduce: Any) -> Any:
        def run() -> None:
            for g, o in zip(grads, outs):
                reduce(g, o)
        return run

    def fused(reduce: Any, bucket_bytes: int) -> Any:
        plan = plan_buckets([g.nbytes for g in grads], bucket_bytes)
        flats = [np.empty(len(b) * count, np.float32) for b in plan]
        reduced = [np.empty_like(f) for f in flats]

        def run() -> None:
            for bucket, flat, red in zip(plan, flats, reduced):
                for k, i in enumerate(bucket):  # pack
                    flat[k * count:(k + 1) * count] = grads[i]
                reduce(flat, red)
                for k, i in enumerate(bucket):  # unpack
                    outs[i][...] = red[k * count:(k + 1) * count]
        return run

    def ours(x: Any, out: Any) -> None:
        allreduce(comm, x, out=out)

    def library(x: Any, out: Any) -> None:
        world.Allreduce(x, out, op=MPI.SUM)

    impls = {("ours", 0): separate(ours), ("mpi", 0): separate(library)}
    for cap in FUSION_BUCKETS:
        impls[("ours", cap)] = fused(ours, cap)
        impls[("mpi", cap)] = fused(library, cap)
    expected = [np.full(count, sum(r + 1 + i % 7 for r in range(n)), np.float32) for i in range(N_TENSORS)]
    for key, run in impls.items():  # warm-up, and every variant must give the exact sums
        run()
        if not all(np.array_equal(o, e) for o, e in zip(outs, expected)):
            raise AssertionError(f"rank {rank}: fusion variant {key} gave wrong sums")
    named = {f"{impl}:{cap}": run for (impl, cap), run in impls.items()}
    times = time_interleaved(world, named, repeats)
    if rank == 0:
        for (impl, cap) in impls:
            emit({"part": "fusion", "ranks": n, "impl": impl, "bucket_bytes": cap, "tensors": N_TENSORS,
                  "tensor_bytes": TENSOR_BYTES, "time_s": times[f"{impl}:{cap}"], "repeats": repeats})


# ----------------------------------------------------------------- (b, c) overlap, in the MPI job


def profile_from_traces(traces: list[Any]) -> dict[str, Any]:
    """Median compute profile of ``StepTrace``s: forward, backward up to each bucket, tail, update.

    ``segments[k]`` is the backward time between bucket ``k - 1`` becoming ready (or the
    end of forward, for ``k = 0``) and bucket ``k`` becoming ready: packing included, so it
    is exactly the compute the communication thread can hide behind.
    """
    med = statistics.median
    k_buckets = len(traces[0].buckets)
    segments = []
    for k in range(k_buckets):
        segments.append(med((t.buckets[k].ready - (t.buckets[k - 1].ready if k else t.forward_end)) for t in traces))
    return {
        "forward_s": med(t.forward_end - t.start for t in traces),
        "segments_s": segments,
        "bucket_bytes": [b.nbytes for b in traces[0].buckets],
        "tail_s": med(t.backward_end - t.buckets[-1].ready for t in traces),
        "update_s": med(t.end - t.comm_end for t in traces),
        "comm_s": med(sum(b.end - b.start for b in t.buckets) for t in traces),
    }


def simulator_layers(profile: dict[str, Any]) -> list[Any]:
    """``cluster_sim.Layer``s reproducing a measured profile: one per bucket, input side first."""
    from reference_impl.comm.cluster_sim import Layer

    per_bucket = [Layer(0.0, s, (b,)) for s, b in zip(profile["segments_s"], profile["bucket_bytes"])]
    layers = [Layer(profile["forward_s"], profile["tail_s"], ())] + per_bucket[::-1]
    return layers


def beta_for_ratio(profile: dict[str, Any], ranks: int, alpha: float, ratio: float) -> float:
    """The beta that makes the ring allreduces of the profile's buckets take ``ratio`` x backward."""
    backward = sum(profile["segments_s"]) + profile["tail_s"]
    k = len(profile["bucket_bytes"])
    latency = 2 * (ranks - 1) * alpha * k
    volume = 2 * (ranks - 1) / ranks * sum(profile["bucket_bytes"])
    target = ratio * backward
    if target <= latency:
        raise ValueError(f"ratio {ratio}: the latency alone ({latency * 1e3:.2f} ms) exceeds the target "
                         f"communication time ({target * 1e3:.2f} ms); lower the simulated alpha")
    return (target - latency) / volume


def run_overlap(ratios: list[float], repeats: int, warmup: int) -> None:
    """Step time in overlap and end modes per ratio, and the simulator's predictions of both."""
    from mpi4py import MPI

    from reference_impl.comm import MPICommunicator
    from reference_impl.comm.calibrate import calibrate
    from reference_impl.comm.cluster_sim import simulate_step
    from reference_impl.comm.cost_model import LinkParams
    from reference_impl.comm.simnet import SimulatedNetwork
    from reference_impl.train.data import shard, synthetic_classification
    from reference_impl.train.data_parallel import DataParallelTrainer
    from reference_impl.train.mlp import init_mlp

    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    if rank == 0:
        emit({"mpi_library": MPI.Get_library_version().splitlines()[0].strip()})
    x_all, y_all = synthetic_classification(DP_BATCH_PER_RANK * n, DP_WIDTHS[0], DP_WIDTHS[-1], seed=0)
    x, y = shard(x_all, y_all, rank, n)

    def trainer(mode: str, comm: Any) -> DataParallelTrainer:
        return DataParallelTrainer(comm, init_mlp(DP_WIDTHS, seed=1), lr=0.01, mode=mode, bucket_bytes=DP_BUCKET_BYTES)

    probe = trainer("end", MPICommunicator(world.Dup()))
    for ratio in ratios:
        # The compute profile now, on the real communicator, sizes the simulated network.
        for _ in range(warmup + 3):
            world.Barrier()
            probe.step(x, y)
        profile = world.bcast(profile_from_traces(probe.traces[-3:]))  # every rank builds the same network
        link = LinkParams(DP_ALPHA, beta_for_ratio(profile, n, DP_ALPHA, ratio))
        with trainer("overlap", SimulatedNetwork(MPICommunicator(world.Dup()), link, timing="sleep")) as ov, \
                trainer("end", SimulatedNetwork(MPICommunicator(world.Dup()), link, timing="sleep")) as end:
            for _ in range(warmup):
                ov.step(x, y)
                end.step(x, y)
            times = time_interleaved(world, {"overlap": lambda: ov.step(x, y), "end": lambda: end.step(x, y)}, repeats)
            measured_profile = profile_from_traces(end.traces[warmup:])
            overlap_profile = profile_from_traces(ov.traces[warmup:])
            early = sum(t.comm_started_before_backward_end for t in ov.traces[warmup:])
            # The link as this machine delivers it: the simulated alpha and beta plus the
            # software's own cost per message and per byte (and gamma, the reduction).
            measured_link = calibrate(end.comm, sizes=CALIBRATION_SIZES, repeats=5,
                                      reduction_sizes=CALIBRATION_SIZES[-4:])
        layers = simulator_layers(measured_profile)
        update = measured_profile["update_s"]
        predicted = {(m, which): simulate_step(layers, n, lk, 0, overlap=(m == "overlap"), update_s=update).step_s
                     for m in ("overlap", "end") for which, lk in (("calibrated", measured_link), ("nominal", link))}
        model_comm = simulate_step(layers, n, measured_link, 0).comm_s
        if rank == 0:
            backward = sum(measured_profile["segments_s"]) + measured_profile["tail_s"]
            emit({
                "part": "overlap", "ranks": n, "target_ratio": ratio, "alpha": link.alpha, "beta": link.beta,
                "measured_overlap_s": times["overlap"], "measured_end_s": times["end"],
                "predicted_overlap_s": predicted[("overlap", "calibrated")],
                "predicted_end_s": predicted[("end", "calibrated")],
                "nominal_overlap_s": predicted[("overlap", "nominal")], "nominal_end_s": predicted[("end", "nominal")],
                "calibrated_alpha": measured_link.alpha, "calibrated_beta": measured_link.beta,
                "calibrated_gamma": measured_link.gamma,
                "forward_s": measured_profile["forward_s"], "backward_s": backward,
                "update_s": update, "comm_measured_s": measured_profile["comm_s"], "comm_model_s": model_comm,
                "backward_in_overlap_mode_s": sum(overlap_profile["segments_s"]) + overlap_profile["tail_s"],
                "buckets": len(measured_profile["bucket_bytes"]), "grad_bytes": sum(measured_profile["bucket_bytes"]),
                "steps_with_early_comm": early, "repeats": repeats,
            })


# ----------------------------------------------------------------- (d) the simulator, in the driver


def simulated_curves() -> dict[str, Any]:
    """Scaling to 1024 workers per interconnect, and the overlap gain against the ratio."""
    from reference_impl.comm.cluster_sim import Layer, gain_vs_ratio, scaling
    from reference_impl.comm.simnet import INTERCONNECTS

    m = SIM_MODEL
    per_layer = m["grad_bytes"] // m["layers"]
    layers = [Layer(m["forward_s"] / m["layers"], m["backward_s"] / m["layers"], (per_layer,))
              for _ in range(m["layers"])]
    scaling_rows = []
    for name in SIM_INTERCONNECTS:
        link = INTERCONNECTS[name].link
        for row in scaling(layers, link, list(SIM_WORKERS), m["bucket_bytes"], m["algorithm"]):
            scaling_rows.append({"interconnect": name, "alpha": link.alpha, "beta": link.beta, **row})
    base = INTERCONNECTS["100GbE"].link
    factors = [2 ** (k / 4) for k in range(-12, 29)]  # link speeds from 8x faster to 128x slower
    gain_rows = gain_vs_ratio(layers, SIM_GAIN_WORKERS, base, m["bucket_bytes"], factors, m["algorithm"])
    return {"model": {**m, "workers_for_gain": SIM_GAIN_WORKERS, "gain_base_interconnect": "100GbE"},
            "scaling": scaling_rows, "gain": gain_rows}


# ----------------------------------------------------------------- the driver


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("overlap", __doc__, mpi=True)
    parser.add_argument("--fusion-ranks", default="2,4", help="rank counts for part (a) (default 2,4)")
    parser.add_argument("--overlap-ranks", default="2", help="rank counts for the ratio sweep (b, c) (default 2)")
    parser.add_argument("--validate-ranks", default="3,4", help="more rank counts at ratio 1 for (c) (default 3,4)")
    parser.add_argument("--ratios", default=",".join(map(str, RATIOS)), help="communication / backward ratios for (b)")
    parser.add_argument("--repeats", type=int, default=9, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mpiexec job")
    parser.add_argument("--worker", choices=("fusion", "overlap"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ratios = [float(r) for r in args.ratios.split(",")] if args.ratios else []
    if args.repeats < 1 or args.warmup < 0 or any(r <= 0 for r in ratios):
        parser.error("need --repeats >= 1, --warmup >= 0 and positive --ratios")

    if args.worker == "fusion":
        run_fusion(args.repeats)
        return 0
    if args.worker == "overlap":
        run_overlap(ratios, args.repeats, args.warmup)
        return 0

    from tqdm import tqdm

    def ranks_of(text: str) -> list[int]:
        return [int(r) for r in text.split(",") if r]

    jobs = [(n, "fusion", []) for n in ranks_of(args.fusion_ranks)]
    jobs += [(n, "overlap", ratios) for n in ranks_of(args.overlap_ranks)]
    jobs += [(n, "overlap", [1.0]) for n in ranks_of(args.validate_ranks)]
    results: list[dict] = []
    library = "unknown"
    with tqdm(total=len(jobs), desc="overlap", unit="job") as progress:
        for n, part, job_ratios in jobs:
            progress.set_postfix(part=part, ranks=n)

            def on_record(record: dict) -> None:
                nonlocal library
                if "mpi_library" in record:
                    library = record["mpi_library"]
                else:
                    results.append(record)

            argv = ["-m", "benchmarks.overlap", "--worker", part, "--repeats", str(args.repeats),
                    "--warmup", str(args.warmup), "--ratios", ",".join(map(str, job_ratios))]
            mpi_job(n, argv, on_record, args.timeout, env=ONE_THREAD)
            progress.update(1)
    document = {
        "benchmark": "overlap",
        "machine": machine_info(mpi_library=library),
        "settings": {"tensors": N_TENSORS, "tensor_bytes": TENSOR_BYTES, "dp_widths": list(DP_WIDTHS),
                     "dp_batch_per_rank": DP_BATCH_PER_RANK, "dp_bucket_bytes": DP_BUCKET_BYTES,
                     "dp_alpha": DP_ALPHA, "repeats": args.repeats, "blas_threads": 1},
        "results": results,
        "simulation": simulated_curves(),
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    report(results)
    return 0


def report(results: list[dict]) -> None:
    """The headline numbers on the terminal."""
    fusion = {(r["ranks"], r["impl"], r["bucket_bytes"]): r["time_s"] for r in results if r["part"] == "fusion"}
    for (ranks, impl, cap), t in sorted(fusion.items()):
        if cap:
            print(f"fusion  {ranks} ranks {impl:>4}: {N_TENSORS} separate / buckets of {cap >> 10:>5} KiB "
                  f"= {fusion[(ranks, impl, 0)] / t:6.1f}x")
    for r in results:
        if r["part"] == "overlap":
            err = [r[f"predicted_{m}_s"] / r[f"measured_{m}_s"] - 1 for m in ("overlap", "end")]
            print(f"overlap {r['ranks']} ranks ratio {r['target_ratio']:>4}: end / overlap = "
                  f"{r['measured_end_s'] / r['measured_overlap_s']:.2f}x measured, "
                  f"{r['predicted_end_s'] / r['predicted_overlap_s']:.2f}x predicted; "
                  f"prediction error overlap {err[0]:+.0%}, end {err[1]:+.0%}")


if __name__ == "__main__":
    sys.exit(main())
