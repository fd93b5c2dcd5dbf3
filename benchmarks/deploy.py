"""Deployment: JIT with inlined weights vs the interpreter, sparse kernels vs dense, pruning and int8.

``python -m benchmarks deploy`` measures, in one process (implementations timed in
turn, repeat by repeat, so they share the machine's state):

Times are the best of ``--repeats`` batches of calls (see ``per_call``); the MLP's calls take
microseconds, so its section takes ``MLP_REPEAT_FACTOR`` times as many batches (a few seconds),
which makes its best less sensitive to other work on a shared machine, and runs ``--rounds``
such measurements one after another: each round is recorded, so the spread between runs is in
the file, and the median round is the headline.

* ``mlp``: batch-1 inference of a 256-256-256-10 ReLU MLP: the graph interpreter
  (``Session.run``), hand-written NumPy, ``jit`` to NumPy source, ``jit`` to C with the weights
  compiled in (the whole call through its C entry point, the whole call through ctypes, and
  the library call alone; ``jit_c_plain``: the plain path, ``jit(..., fast=False)``, plain
  kernels and a checked ctypes call), and the int8 model in NumPy and in C (VNNI and portable
  loops); plus the floor: a C loop that only reads as many floats as the MLP has weights;
* ``sweep``: ``x @ W`` for a 1024×1024 ``W`` at densities 1–100 %, batch 1 and 64: dense BLAS
  (NumPy's ``@``), our NumPy CSR kernel, our NumPy BSR kernel on a 4×4-block-pruned ``W`` of
  the same density (structured vs unstructured), SciPy's CSR kernel, and the JIT's sparse kernels
  (CSR with inlined arrays and the 16-bit-mask form at every density; unrolled code with the weights as literals
  where the non-zeros are few enough to compile quickly); the crossover density of each
  against dense BLAS;
* ``compile``: code-generation + compile time and library size against the number of non-zeros;
* ``paths``: one 256×256 layer in each of the forms dense, CSR and unrolled, batch 1 and 64,
  through the JIT's fast path (``fast_kernels`` + ``fast_call``, the default) and its plain
  path (``fast=False``): what the speed tricks are worth, form by form;
* ``roofline``: this machine's read bandwidth (summing a 64 MiB array) and GEMM rate
  (1024³ float32 product) on the BLAS thread count used;
* ``accuracy``: test accuracy of the digits MLP against sparsity, for gradual pruning by
  layer, global, 4×4-block and row magnitude, and one-shot pruning without retraining;
* ``quantisation``: the digits MLP in float32 and post-training int8.

BLAS runs on ``--blas-threads`` threads (default 1: the C kernels are single-threaded too).
"""
from __future__ import annotations

import ctypes
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .harness import bench_parser, restart_with_blas_threads, write_json
from .machine import machine_info

MLP_WIDTHS = (256, 256, 256, 10)
SHAPE = (1024, 1024)
DENSITIES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
BATCHES = (1, 64)
UNROLLED_NNZ = (1024, 2048, 4096, 8192)  # unrolled kernels compiled for the compile-time curve
SPARSITIES = (0.5, 0.8, 0.9, 0.95, 0.98)
MLP_REPEAT_FACTOR = 4


def per_call(impls: dict[str, Callable[[], Any]], repeats: int, budget_s: float = 0.005) -> dict[str, float]:
    """Best seconds per call over ``repeats``; each repeat runs every implementation in turn, a
    batch of calls long enough (about ``budget_s``) that the timer's resolution does not matter.

    The best, not the median: on a machine shared with other work, a batch that the scheduler
    interrupts is slower for reasons that have nothing to do with the code, never faster."""
    inner = {}
    for name, fn in impls.items():
        fn()
        t0 = time.perf_counter()
        fn()
        inner[name] = max(1, min(10_000, int(budget_s / max(time.perf_counter() - t0, 1e-7))))
    times: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(repeats):
        for name, fn in impls.items():
            t0 = time.perf_counter()
            for _ in range(inner[name]):
                fn()
            times[name].append((time.perf_counter() - t0) / inner[name])
    return {name: min(ts) for name, ts in times.items()}


# ---------------------------------------------------------------- batch-1 MLP
#: the floor of a batch-1 MLP: each weight is used once, so the kernel can be no faster than
#: reading every weight once. 128 partial sums (8 AVX-512 registers): no addition waits for
#: the previous one, so the loop runs at the speed the cache delivers the floats.
READ_WEIGHTS_C = """#include <stdint.h>
float read_weights(const float *restrict w, int64_t n) {
    float acc[128] = {0.0f};
    for (int64_t i = 0; i + 128 <= n; i += 128)
        for (int64_t j = 0; j < 128; j++) acc[j] += w[i + j];
    float s = 0.0f;
    for (int64_t j = 0; j < 128; j++) s += acc[j];
    return s;
}
"""


def read_weights_call(params: list[np.ndarray], cache_dir: Path) -> Callable[[], float]:
    """A call that reads as many float32 values as ``params`` hold (rounded down to 128), from a
    64-byte-aligned copy, through the same ctypes path as the JIT's library: the time the MLP's
    compiled kernel could not beat however its loops were written."""
    from reference_impl.compiler.fast_kernels import FAST_C_FLAGS
    from reference_impl.toolchain import build_shared_library, load_library

    flat = np.concatenate([p.ravel() for p in params]).astype(np.float32)
    n = flat.size - flat.size % 128
    raw = np.zeros(n + 16, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    w = raw[start:start + n]
    w[:] = flat[:n]
    fn = load_library(build_shared_library(READ_WEIGHTS_C, name="read_weights", flags=FAST_C_FLAGS,
                                           cache_dir=cache_dir)).read_weights
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_int64]
    args = (ctypes.c_void_p(w.ctypes.data), ctypes.c_int64(n))
    want = float(np.sum(w, dtype=np.float64))
    if abs(fn(*args) - want) > 1e-3 * max(1.0, float(np.abs(w).sum())):
        raise AssertionError("read_weights does not sum the weights")

    def call() -> float:
        return fn(*args)

    call.keep = (raw, fn)  # the buffer and the library live as long as the call
    return call


def bench_mlp(repeats: int, cache_dir: Path, rounds_n: int = 5) -> dict[str, Any]:
    """The batch-1 MLP section: ``rounds_n`` independent rounds of ``per_call`` over every
    implementation (each round interleaves them), every round recorded, the median one the headline."""
    import reference_impl.graph as G
    from reference_impl.compiler import jit
    from reference_impl.quantize import QuantizedMLP, compile_int8, float_mlp

    rng = np.random.default_rng(0)
    params = []
    for a, b in zip(MLP_WIDTHS[:-1], MLP_WIDTHS[1:]):
        params += [(rng.normal(size=(a, b)) * np.sqrt(2 / a)).astype(np.float32),
                   (rng.normal(size=b) * 0.1).astype(np.float32)]
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, MLP_WIDTHS[0]), name="x")
        h = x
        for i in range(0, len(params), 2):
            h = G.matmul(h, G.Variable(params[i])) + G.Variable(params[i + 1])
            if i < len(params) - 2:
                h = G.relu(h)
        sess = G.Session(g)
        sess.run(G.global_variables_initializer())
    xs = rng.normal(size=(1, MLP_WIDTHS[0])).astype(np.float32)
    f_c, f_np = jit(sess, h, [x], "c", cache_dir=cache_dir), jit(sess, h, [x], "numpy")
    # the same library called through ctypes, as where Python's headers are missing (c_entry)
    f_ctypes = jit(sess, h, [x], "c", cache_dir=cache_dir, c_entry=False)
    # the plain path: c_codegen's plain kernels, CompiledFunction's Python check, a plain ctypes call
    f_plain = jit(sess, h, [x], "c", cache_dir=cache_dir, fast=False)
    q = QuantizedMLP.from_float(params, rng.normal(size=(256, MLP_WIDTHS[0])).astype(np.float32))
    q_c = compile_int8(q, cache_dir=cache_dir)
    q_portable = compile_int8(q, cache_dir=cache_dir, simd=False)  # the same bytes, plain loops
    # the compiled kernel alone: the same library call with the checks and allocation done once,
    # to split jit_c's time into the C code and the cost of crossing from Python into it
    lib = f_c._run.library.graph_main
    out = np.empty((1, MLP_WIDTHS[-1]), np.float32)
    args = (ctypes.c_int64(1), ctypes.c_void_p(xs.ctypes.data), ctypes.c_void_p(out.ctypes.data))

    def kernel_only() -> np.ndarray:
        lib(*args)
        return out

    impls = {"interpreter": lambda: sess.run(h, {x: xs}), "numpy": lambda: float_mlp(params, xs),
             "jit_numpy": lambda: f_np(xs), "jit_c": lambda: f_c(xs), "jit_c_ctypes": lambda: f_ctypes(xs),
             "jit_c_kernel_only": kernel_only, "jit_c_plain": lambda: f_plain(xs),
             "int8_numpy": lambda: q(xs), "int8_c": lambda: q_c(xs), "int8_c_portable": lambda: q_portable(xs)}
    want = sess.run(h, {x: xs})
    errors = {k: float(np.abs(fn() - want).max()) for k, fn in impls.items()}
    int8_want = q(xs)
    int8_exact = all(np.array_equal(f(xs), int8_want) for f in (q_c, q_portable))
    if not int8_exact:
        raise AssertionError("the int8 C kernels do not reproduce QuantizedMLP bit for bit")
    impls["read_weights_only"] = read_weights_call(params, cache_dir)
    rounds = []
    for _ in range(rounds_n):
        seconds = per_call(impls, repeats)
        rounds.append({"seconds": seconds, "speedup_vs_interpreter": {k: seconds["interpreter"] / v
                                                                      for k, v in seconds.items()}})
    # the headline is one whole round (its numbers were measured together): the median by the
    # JIT's speed-up, so neither the luckiest nor the unluckiest round
    order = sorted(range(rounds_n), key=lambda r: rounds[r]["speedup_vs_interpreter"]["jit_c"])
    median = order[(rounds_n - 1) // 2]
    spread = {k: [min(r["speedup_vs_interpreter"][k] for r in rounds), max(r["speedup_vs_interpreter"][k]
                                                                           for r in rounds)] for k in impls}
    return {"widths": list(MLP_WIDTHS), "batch": 1, "seconds": rounds[median]["seconds"],
            "speedup_vs_interpreter": rounds[median]["speedup_vs_interpreter"], "median_round": median,
            "rounds": rounds, "speedup_range": spread, "max_abs_error_vs_interpreter": errors,
            "int8_matches_numpy_reference": int8_exact, "uses_vnni": q_c.uses_vnni,
            "weight_bytes": int(sum(p.nbytes for p in params)), "int8_weight_bytes": q.weight_bytes(),
            "report": [list(r) for r in f_c.report]}


# ---------------------------------------------------------------- density sweep + compile cost
def _sparse_weight(density: float, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=SHAPE).astype(np.float32)
    return w * (rng.random(SHAPE) < density)


def _jit_layer(w: np.ndarray, form: str, cache_dir: Path, fast: bool = True) -> tuple[Any, dict[str, Any]]:
    import reference_impl.graph as G
    from reference_impl.compiler import jit

    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, w.shape[0]), name="x")
        y = G.matmul(x, G.constant(w))
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    f = jit(G.Session(g), y, [x], "c", matmul_format=form, cache_dir=cache_dir, fast=fast)
    seconds, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    so = Path(f._run.library._name)
    # the compiler's own CPU time: on a shared machine wall time also counts other people's work
    compiler_cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    return f, {"form": form, "nnz": int(np.count_nonzero(w)), "seconds": seconds, "compiler_cpu_s": compiler_cpu,
               "so_bytes": so.stat().st_size, "source_chars": len(f.source)}


def crossover(densities: list[float], sparse: list[float | None], dense: list[float]) -> float | None:
    """The density where ``sparse`` stops beating ``dense`` (linear interpolation of the time ratio
    between the last win and the first loss); None if it never wins, 1.0 if it always wins."""
    prev = None
    for d, s, t in zip(densities, sparse, dense):
        if s is None:
            return None if prev is None else prev[0]
        r = s / t
        if r >= 1:
            if prev is None:
                return None
            (d0, r0) = prev
            return d0 + (1 - r0) * (d - d0) / (r - r0)
        prev = (d, r)
    return 1.0


def bench_sweep(repeats: int, cache_dir: Path, densities: tuple, unrolled_nnz: tuple) -> dict[str, Any]:
    from reference_impl.sparsity import BSR, CSR, block_mask

    try:
        import scipy.sparse as sp
    except ImportError:  # SciPy is optional: the generic peer is then ours alone
        sp = None
    rng = np.random.default_rng(2)
    xs = {b: rng.normal(size=(b, SHAPE[0])).astype(np.float32) for b in BATCHES}
    seconds: dict[str, dict[str, list]] = {str(b): {} for b in BATCHES}
    compiles = []
    for d in densities:
        w = _sparse_weight(d)
        wt = np.ascontiguousarray(w.T)
        ours = CSR.from_dense(wt)
        # the same density with structure: whole 4x4 tiles kept or dropped, in our BSR kernel
        w_blocks = _sparse_weight(1.0) * block_mask(_sparse_weight(1.0), 1 - d, (4, 4))
        bsr = BSR.from_dense(np.ascontiguousarray(w_blocks.T), (4, 4))
        f_csr, info = _jit_layer(w, "csr", cache_dir)
        f_bitmask, info_bitmask = _jit_layer(w, "bitmask", cache_dir)
        compiles += [info, info_bitmask]
        for b in BATCHES:
            x, xt = xs[b], np.ascontiguousarray(xs[b].T)
            impls: dict[str, Callable[[], Any]] = {"dense_blas": lambda: x @ w, "jit_csr": lambda: f_csr(x),
                                                 "jit_bitmask": lambda: f_bitmask(x)}
            if ours.nnz * b <= 16_000_000:  # ours materialise nnz × batch products
                impls["csr_numpy"] = lambda: ours.matmul(xt)
                impls["bsr_numpy"] = lambda: bsr.matmul(xt)
            if sp is not None:
                theirs = sp.csr_matrix(wt)
                impls["csr_scipy"] = lambda: theirs @ xt
            for name, fn in impls.items():
                out = fn()
                out = out.T if name.startswith(("csr_", "bsr_")) else out
                ref = x @ (w_blocks if name.startswith("bsr_") else w)
                if not np.allclose(out, ref, rtol=1e-3, atol=1e-3):
                    raise AssertionError(f"{name} at density {d}, batch {b} disagrees with x @ W")
            for name, t in per_call(impls, repeats).items():
                seconds[str(b)].setdefault(name, [None] * len(densities))[densities.index(d)] = t
    # the dense C kernel once (its time does not depend on the zeros), and unrolled kernels
    f_dense, info = _jit_layer(_sparse_weight(1.0), "dense", cache_dir)
    compiles.append(info)
    unrolled: dict[str, dict[str, float]] = {str(b): {} for b in BATCHES}
    unrolled_s: dict[str, dict[str, float]] = {str(b): {} for b in BATCHES}
    for nnz in unrolled_nnz:
        w = _sparse_weight(nnz / (SHAPE[0] * SHAPE[1]), seed=3)
        f, info = _jit_layer(w, "unrolled", cache_dir)
        compiles.append(info)
        for b in BATCHES:
            x = xs[b]
            t = per_call({"jit_unrolled": lambda: f(x), "dense_blas": lambda: x @ w}, repeats)
            unrolled[str(b)][str(info["nnz"])] = t["jit_unrolled"] / t["dense_blas"]
            unrolled_s[str(b)][str(info["nnz"])] = t["jit_unrolled"]
    for b in BATCHES:
        x = xs[b]
        seconds[str(b)]["jit_dense"] = [per_call({"d": lambda: f_dense(x)}, repeats)["d"]] * len(densities)
    dens = list(densities)
    cross = {b: {k: crossover(dens, v, seconds[b]["dense_blas"]) for k, v in seconds[b].items()
                 if k not in ("dense_blas", "jit_dense")} for b in seconds}
    return {"shape": list(SHAPE), "batches": list(BATCHES), "densities": dens, "seconds": seconds,
            "crossover_density": cross, "unrolled_time_ratio_to_dense": unrolled, "unrolled_seconds": unrolled_s,
            "compile": compiles}


#: the ``paths`` section: one PATH_SHAPE layer per form, at a density that form is chosen for
PATH_SHAPE = (256, 256)
PATH_FORMS = {"dense": 1.0, "csr": 0.2, "unrolled": 0.03}


def bench_paths(repeats: int, cache_dir: Path) -> dict[str, Any]:
    """Seconds per call of the fast path (the default) and the plain path (``fast=False``) for
    each form of ``PATH_FORMS``, batch by batch, and their ratio (plain / fast)."""
    rng = np.random.default_rng(4)
    seconds: dict[str, dict[str, dict[str, float]]] = {}
    for form, density in PATH_FORMS.items():
        w = (rng.normal(size=PATH_SHAPE) * (rng.random(PATH_SHAPE) < density)).astype(np.float32)
        f_fast, _ = _jit_layer(w, form, cache_dir)
        f_plain, _ = _jit_layer(w, form, cache_dir, fast=False)
        seconds[form] = {}
        for b in BATCHES:
            x = rng.normal(size=(b, PATH_SHAPE[0])).astype(np.float32)
            for f in (f_fast, f_plain):
                if not np.allclose(f(x), x @ w, rtol=1e-4, atol=1e-4):
                    raise AssertionError(f"the {f.call_path} path of the {form} form disagrees with x @ W")
            t = per_call({"fast": lambda: f_fast(x), "plain": lambda: f_plain(x)}, repeats)
            seconds[form][str(b)] = {**t, "plain_over_fast": t["plain"] / t["fast"]}
    return {"shape": list(PATH_SHAPE), "densities": dict(PATH_FORMS), "batches": list(BATCHES), "seconds": seconds}


def bench_roofline() -> dict[str, float]:
    a = np.ones(16 << 20, np.float32)  # 64 MiB
    a.sum()
    t = min(_timed(a.sum) for _ in range(5))
    m = np.random.default_rng(0).normal(size=(1024, 1024)).astype(np.float32)
    m @ m
    tg = min(_timed(lambda: m @ m) for _ in range(3))
    return {"read_gb_s": a.nbytes / t / 1e9, "gemm_gflop_s": 2 * 1024 ** 3 / tg / 1e9}


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------- accuracy: pruning and int8
def bench_accuracy(sparsities: tuple, epochs: int, methods: tuple) -> dict[str, Any]:
    from reference_impl.quantize import QuantizedMLP, float_mlp
    from reference_impl.sparsity import digits_split, masks_for, polynomial_sparsity, steps_per_epoch, train_digits

    data = digits_split(seed=0)
    xtr, _, xte, yte = data
    kw = dict(epochs=epochs, batch=64, lr=0.3, data=data)
    dense = train_digits(**kw)
    weights = dense.weight_values()
    g = dense.session.graph
    biases = [dense.session.run(g.get_tensor_by_name(f"b{i}:0")) for i in range(len(weights))]
    params = [p for wb in zip(weights, biases) for p in wb]

    def acc(ps: list) -> float:
        return float((float_mlp(ps, xte).argmax(1) == yte).mean())

    one_shot = []
    for s in sparsities:
        ms = masks_for(weights, s, "layer")
        one_shot.append(acc([p for w, m, b in zip(weights, ms, biases) for p in (w * m, b)]))
    end = int(0.7 * steps_per_epoch(len(xtr), 64) * epochs)
    gradual = {m: [train_digits(**kw, method=m, prune_every=10,
                                schedule=lambda t, s=s: polynomial_sparsity(t, 0, end, s)).accuracy(xte, yte)
                   for s in sparsities] for m in methods}
    q = QuantizedMLP.from_float(params, xtr[:300])
    return {
        "task": "scikit-learn digits (8x8), 75/25 split, MLP 64-128-128-10, SGD", "epochs": epochs,
        "dense_accuracy": dense.accuracy(xte, yte), "sparsities": list(sparsities),
        "one_shot_layer": one_shot, "gradual": gradual,
        "quantisation": {"float32_accuracy": acc(params), "int8_accuracy": float((q(xte).argmax(1) == yte).mean()),
                         "float32_weight_bytes": int(sum(p.nbytes for p in params)),
                         "int8_weight_bytes": q.weight_bytes(), "calibration_samples": 300},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("deploy", __doc__)
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per implementation")
    parser.add_argument("--rounds", type=int, default=5, help="independent rounds of the batch-1 MLP section")
    parser.add_argument("--epochs", type=int, default=12, help="digits training epochs per model")
    parser.add_argument("--quick", action="store_true", help="fewer densities, sparsities and methods (a smoke run)")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads (0: library default)")
    args = parser.parse_args(argv)
    from reference_impl.compiler.fast_kernels import FAST_C_FLAGS
    from reference_impl.compiler.jit import C_FLAGS, C_FLAGS_UNROLLED
    if args.repeats < 1 or args.epochs < 1 or args.blas_threads < 0 or args.rounds < 1:
        parser.error("need --repeats >= 1, --rounds >= 1, --epochs >= 1 and --blas-threads >= 0")
    if args.blas_threads:
        restart_with_blas_threads("deploy", argv, args.blas_threads)
    densities = (0.01, 0.1, 0.3, 1.0) if args.quick else DENSITIES
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lab-deploy-") as tmp:  # compile times are real, not cache hits
        cache = Path(tmp)
        print("batch-1 MLP ...", flush=True)
        mlp = bench_mlp(MLP_REPEAT_FACTOR * args.repeats, cache, args.rounds)
        print("density sweep ...", flush=True)
        sweep = bench_sweep(args.repeats, cache, densities, UNROLLED_NNZ[:2] if args.quick else UNROLLED_NNZ)
        print("fast path vs plain path ...", flush=True)
        paths = bench_paths(args.repeats, cache)
    print("roofline ...", flush=True)
    roof = bench_roofline()
    print("accuracy vs sparsity ...", flush=True)
    accuracy = bench_accuracy((0.9,) if args.quick else SPARSITIES, 3 if args.quick else args.epochs,
                              ("layer",) if args.quick else ("layer", "global", "block", "row"))
    document = {
        "benchmark": "deploy",
        "machine": machine_info(mpi_library="not used (single process)"),
        "settings": {"repeats": args.repeats, "mlp_repeats": MLP_REPEAT_FACTOR * args.repeats,
                     "mlp_rounds": args.rounds, "quick": args.quick,
                     "blas_threads": args.blas_threads or "library default",
                     "c_flags": " ".join(FAST_C_FLAGS) + f" (unrolled kernels: {' '.join(C_FLAGS_UNROLLED)})",
                     "plain_path_c_flags": " ".join(C_FLAGS), "dtype": "float32"},
        "mlp": mlp, "sweep": sweep, "paths": paths, "roofline": roof, "accuracy": accuracy,
        "total_seconds": time.perf_counter() - t_start,
    }
    write_json(args.out, document)
    b1 = sweep["crossover_density"]["1"]
    print(f"MLP batch 1: C {mlp['speedup_vs_interpreter']['jit_c']:.1f}x faster than the interpreter; "
          f"crossover vs dense BLAS at batch 1: {b1}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
