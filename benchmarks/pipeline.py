"""Pipeline parallelism and checkpoint I/O, measured: ``python -m benchmarks pipeline``.

(a) **Bubble**: an 8-layer MLP pipelined over p = 1, 2, 4, 8 thread ranks with m micro-batches
    (fixed micro-batch size, so every op costs the same whatever m), both schedules. Each
    configuration is executed twice: with unit op costs (forward 1, backward 2), where the
    measured idle share must equal (p-1)/(m+p-1), and with every op's measured CPU time;
    the latter is also replayed with each stage's median op time, which drops the odd slow
    op (``median_cost_bubble``). The per-stage medians are kept, so the imbalance between
    stages that raises the measured bubble above the formula can be read off.
(b) **Memory per rank**: peak bytes of stashed activations per stage for GPipe and 1F1B at
    p = 4 over m, against one data-parallel rank of the same model and global batch
    (all parameters and gradients, activations of its batch share).
(c) **Checkpoint throughput**: ``save_checkpoint`` (sharded, CRC-32, fsync, atomic rename)
    and ``load_checkpoint`` (with verification) against the peer in the same run,
    ``np.savez`` / ``np.load`` of the same arrays into one file with no fsync.
"""
from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .harness import bench_parser, restart_with_blas_threads, write_json
from .machine import machine_info

WIDTH, N_LAYERS, MICRO = 256, 8, 32
STAGES = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
MEMORY_P, MEMORY_M = 4, (4, 8, 16, 32)
CKPT_MIB = (4, 32, 128)


def bubble_sweep(stages: tuple[int, ...], micro: tuple[int, ...], repeats: int) -> list[dict]:
    from reference_impl.comm import run_threads
    from reference_impl.train.mlp import init_mlp
    from reference_impl.train.pipeline_parallel import bubble_fraction, measured_bubble, median_cost_bubble, pipeline_step

    params = init_mlp((WIDTH,) * (N_LAYERS + 1), seed=0)
    rows = []
    for p in stages:
        for m in micro:
            rng = np.random.default_rng(m)
            x = rng.standard_normal((MICRO * m, WIDTH)).astype(np.float32)
            y = rng.integers(0, WIDTH, MICRO * m)
            for schedule in ("gpipe", "1f1b"):
                unit = run_threads(p, pipeline_step, params, x, y, m, schedule, timeout=120)
                runs = [run_threads(p, pipeline_step, params, x, y, m, schedule, "measured", timeout=120)
                        for _ in range(repeats)]
                replayed = [median_cost_bubble(r, schedule) for r in runs]
                best = runs[int(np.argsort(replayed)[len(replayed) // 2])]  # the median run
                rows.append({
                    "p": p, "m": m, "schedule": schedule, "predicted": bubble_fraction(p, m),
                    "unit_cost": measured_bubble(unit),
                    "measured_raw": [measured_bubble(r) for r in runs],
                    "measured_median_cost": replayed,
                    "stage_forward_s": [statistics.median(e - s for k, _, s, e in r.timeline if k == "F")
                                        for r in best],
                    "stage_backward_s": [statistics.median(e - s for k, _, s, e in r.timeline if k == "B")
                                         for r in best],
                })
                print(f"p={p} m={m:>2} {schedule:>5}: predicted {rows[-1]['predicted']:.3f}  "
                      f"unit {rows[-1]['unit_cost']:.3f}  measured {statistics.median(replayed):.3f}", flush=True)
    return rows


def memory_sweep() -> list[dict]:
    from reference_impl.comm import run_threads
    from reference_impl.train.mlp import init_mlp
    from reference_impl.train.pipeline_parallel import data_parallel_memory, pipeline_step

    params = init_mlp((WIDTH,) * (N_LAYERS + 1), seed=0)
    rows = []
    for m in MEMORY_M:
        x = np.random.default_rng(m).standard_normal((MICRO * m, WIDTH)).astype(np.float32)
        y = np.zeros(MICRO * m, np.int64)
        row = {"p": MEMORY_P, "m": m, "global_batch": MICRO * m}
        for schedule in ("gpipe", "1f1b"):
            res = run_threads(MEMORY_P, pipeline_step, params, x, y, m, schedule, timeout=120)
            row[schedule] = {"peak_stash_bytes": [r.peak_stash_bytes for r in res],
                             "peak_stashed": [r.peak_stashed for r in res],
                             "param_bytes": [r.param_bytes for r in res]}
        row["data_parallel"] = data_parallel_memory(params, x[: MICRO * m // MEMORY_P])
        rows.append(row)
    return rows


def checkpoint_throughput(sizes_mib: tuple[int, ...], repeats: int) -> list[dict]:
    from reference_impl.train.checkpoint import load_checkpoint, save_checkpoint

    rows = []
    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    try:
        for mib in sizes_mib:
            n = mib * (1 << 20) // 4 // 8
            state = {f"layer{i}/kernel": np.random.default_rng(i).standard_normal(n).astype(np.float32)
                     for i in range(8)}
            nbytes = sum(a.nbytes for a in state.values())
            times: dict[str, list[float]] = {"save": [], "load": [], "savez": [], "npload": []}
            for r in range(repeats):  # interleaved, so drift on the machine hits both alike
                t = time.perf_counter()
                save_checkpoint(root / f"ckpt-{mib}", state, r, keep_last=1, max_shard_bytes=16 << 20)
                times["save"].append(time.perf_counter() - t)
                t = time.perf_counter()
                loaded, _ = load_checkpoint(root / f"ckpt-{mib}")
                times["load"].append(time.perf_counter() - t)
                t = time.perf_counter()
                np.savez(root / "plain.npz", **{k.replace("/", "_"): v for k, v in state.items()})
                times["savez"].append(time.perf_counter() - t)
                t = time.perf_counter()
                with np.load(root / "plain.npz") as f:
                    _ = {k: f[k] for k in f.files}
                times["npload"].append(time.perf_counter() - t)
                assert all(np.array_equal(loaded[k], state[k]) for k in state)
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append({"mib": mib, "bytes": nbytes, "seconds": times,
                         "mb_per_s": {k: nbytes / v / 1e6 for k, v in med.items()}})
            print(f"{mib:>4} MiB: save {rows[-1]['mb_per_s']['save']:.0f} MB/s (savez "
                  f"{rows[-1]['mb_per_s']['savez']:.0f}), load {rows[-1]['mb_per_s']['load']:.0f} MB/s "
                  f"(np.load {rows[-1]['mb_per_s']['npload']:.0f})", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("pipeline", __doc__)
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per configuration")
    parser.add_argument("--quick", action="store_true", help="a small sweep (p <= 4, m <= 8, 4 MiB checkpoint)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("need --repeats >= 1")
    restart_with_blas_threads("pipeline", argv)  # CPU time measures the work only on one BLAS thread

    stages = STAGES[:3] if args.quick else STAGES
    micro = MICRO_BATCHES[:4] if args.quick else MICRO_BATCHES
    document = {
        "benchmark": "pipeline",
        "machine": machine_info(mpi_library="not used (thread ranks)"),
        "settings": {"width": WIDTH, "layers": N_LAYERS, "micro_batch": MICRO, "dtype": "float32",
                     "repeats": args.repeats, "blas_threads": 1, "op_time": "time.thread_time per op",
                     "checkpoint_shard_bytes": 16 << 20},
        "bubble": bubble_sweep(stages, micro, args.repeats),
        "memory": memory_sweep(),
        "checkpoint": checkpoint_throughput(CKPT_MIB[:1] if args.quick else CKPT_MIB, args.repeats),
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
