"""Custom C kernels vs their NumPy compositions, across sizes, plus the cost of one call.

``python -m benchmarks custom_ops`` times, interleaved repeat by repeat in one
process (float32):

* ``sparse_segment_sum`` (``n`` rows of width 64 summed into ``n / 4`` segments, ids drawn at
  random, so most segments get several rows): the C kernel against ``np.add.at`` (what the
  graph's ``GatherGrad`` uses) and against sort + ``np.add.reduceat`` (the faster NumPy way);
* ``bias_add_relu`` (``n × 256``): the fused C kernel against ``np.maximum(x + b, 0)``;
* the overhead of one call on a 1 × 1 input: the C kernel behind the op (checks + ctypes),
  the same op in eager mode (plus the graph front end and the tape check), and the NumPy
  composition.

"C kernel" times call the op's registered kernel function, so they include the Python-side
checks and the ctypes call, which is what a Session pays per op. Each size records the best
and the median of its interleaved repeats, in CPU time of the calling thread (see
``cpu_interleaved``); the figure uses the best, the medians are in the JSON file.
"""
from __future__ import annotations

import shlex
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

from .harness import bench_parser, write_json
from .machine import machine_info

SEGMENT_ROWS = (256, 1024, 4096, 16384, 65536, 262144)
SEGMENT_WIDTH = 64
BIAS_ROWS = (4, 16, 64, 256, 1024, 4096, 16384)
BIAS_WIDTH = 256


def numpy_segment_sum_add_at(data: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros((k, data.shape[1]), dtype=data.dtype)
    np.add.at(out, ids, data)
    return out


def numpy_segment_sum_sorted(data: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """Sort rows by id, sum each run with ``np.add.reduceat``, scatter the sums."""
    out = np.zeros((k, data.shape[1]), dtype=data.dtype)
    if len(ids):
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        out[sorted_ids[starts]] = np.add.reduceat(data[order], starts, axis=0)
    return out


def _repeats(n_bytes: int, budget: int) -> int:
    """``budget`` repeats for small inputs, fewer (at least 7) for the big, slow ones."""
    return max(7, min(budget, int(4e8 / max(n_bytes, 1))))


def cpu_interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """CPU seconds of this thread per call, each function timed once per repeat, in turn.

    ``time.thread_time`` counts only the time this thread ran, so on a machine shared with
    other work, being preempted does not count as the kernel's time. Every timed function
    here is single-threaded (NumPy's elementwise loops and ``np.add.at`` are; so is the C code).
    """
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.thread_time()
            fn()
            times[k].append(time.thread_time() - t0)
    return times


def _time(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, float]]:
    """{"min_s": {impl: best time}, "median_s": {impl: median time}} over interleaved repeats."""
    for fn in fns.values():
        fn()  # warm-up (page faults of the first allocation, lazy kernel loads)
    times = cpu_interleaved(fns, repeats)
    return {"min_s": {k: min(v) for k, v in times.items()},
            "median_s": {k: statistics.median(v) for k, v in times.items()}}


def _line(timed: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{m} {t * 1e6:9.1f} us (median {timed['median_s'][m] * 1e6:9.1f})"
                     for m, t in timed["min_s"].items())


def run(repeats: int, segment_rows: tuple[int, ...], bias_rows: tuple[int, ...]) -> dict[str, Any]:
    import reference_impl.graph as G
    from reference_impl.custom_ops.bias_relu import BiasAddRelu
    from reference_impl.custom_ops.segment_sum import SparseSegmentSum

    rng = np.random.default_rng(0)
    seg_kernel, bias_kernel = G.REGISTRY["SparseSegmentSum"].kernel, G.REGISTRY["BiasAddRelu"].kernel
    results = []
    for n in segment_rows:
        k = max(1, n // 4)
        data = rng.standard_normal((n, SEGMENT_WIDTH)).astype(np.float32)
        ids = rng.integers(0, k, size=n)
        attrs = {"num_segments": k}
        fns = {"c_kernel": lambda: seg_kernel([data, ids], attrs, {}),
               "numpy_add_at": lambda: numpy_segment_sum_add_at(data, ids, k),
               "numpy_sort_reduceat": lambda: numpy_segment_sum_sorted(data, ids, k)}
        want = numpy_segment_sum_add_at(data, ids, k)
        for name, fn in fns.items():  # the timed functions agree before they are timed
            np.testing.assert_allclose(fn(), want, rtol=1e-4, atol=1e-4, err_msg=name)
        timed = _time(fns, _repeats(data.nbytes, repeats))
        results.append({"op": "sparse_segment_sum", "rows": n, "width": SEGMENT_WIDTH, "segments": k,
                        "bytes": int(data.nbytes), **timed})
        print(f"sparse_segment_sum n={n:>7}: " + _line(timed))
    for n in bias_rows:
        x = rng.standard_normal((n, BIAS_WIDTH)).astype(np.float32)
        b = rng.standard_normal(BIAS_WIDTH).astype(np.float32)
        fns = {"c_kernel": lambda: bias_kernel([x, b], {}, {}), "numpy": lambda: np.maximum(x + b, 0)}
        np.testing.assert_array_equal(fns["c_kernel"](), fns["numpy"]())
        timed = _time(fns, _repeats(x.nbytes, repeats))
        results.append({"op": "bias_add_relu", "rows": n, "width": BIAS_WIDTH, "bytes": int(x.nbytes), **timed})
        print(f"bias_add_relu      n={n:>7}: " + _line(timed))

    x1, b1 = np.ones((1, 1), np.float32), np.ones(1, np.float32)
    xe, be = G.EagerTensor(x1), G.EagerTensor(b1)

    def eager_call() -> Any:
        with G.eager_mode():
            return BiasAddRelu(xe, be)

    per_call = {"numpy": lambda: np.maximum(x1 + b1, 0), "c_kernel": lambda: bias_kernel([x1, b1], {}, {}),
                "eager_op": eager_call}
    calls = _time(per_call, 50 * repeats)
    overhead = {k: v * 1e6 for k, v in calls["median_s"].items()}
    print("one call on a 1 x 1 input (median): " + ", ".join(f"{m} {t:.2f} us" for m, t in overhead.items()))
    assert SparseSegmentSum.kernels and BiasAddRelu.kernels
    return {"results": results, "call_overhead_us": overhead,
            "call_overhead_min_us": {k: v * 1e6 for k, v in calls["min_s"].items()}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("custom_ops", __doc__)
    parser.add_argument("--repeats", type=int, default=41, help="most timed calls per size and implementation")
    parser.add_argument("--quick", action="store_true", help="three small sizes per op (for a smoke test)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("need --repeats >= 1")
    from reference_impl.toolchain import find_c_compiler

    from reference_impl.custom_ops.bias_relu import BiasAddRelu

    cc = find_c_compiler()
    banner = subprocess.run([*shlex.split(cc), "--version"], capture_output=True, text=True, timeout=30)
    compiler = f"{cc}: {(banner.stdout.splitlines() or ['?'])[0]}"
    seg, bias = (SEGMENT_ROWS[:3], BIAS_ROWS[:3]) if args.quick else (SEGMENT_ROWS, BIAS_ROWS)
    measured = run(args.repeats, seg, bias)
    document = {
        "benchmark": "custom_ops",
        "machine": machine_info(mpi_library="not used (single process)"),
        "settings": {"dtype": "float32", "repeats": args.repeats, "compiler": compiler,
                     "flags": " ".join(BiasAddRelu.flags),
                     "segment_width": SEGMENT_WIDTH, "bias_width": BIAS_WIDTH},
        **measured,
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
