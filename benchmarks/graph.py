"""Graph mode vs eager mode vs hand-written NumPy: one MLP training step, and per-op overhead.

``python -m benchmarks graph`` times, interleaved repeat by repeat in one process:

* ``numpy``: a hand-written forward, backward and SGD update of a 784-512-512-10 ReLU MLP
  with mean softmax cross-entropy (batch 128, float32): the floor any framework pays;
* ``graph``: the same step as a static graph (``gradients`` + ``assign_sub``), one
  ``Session.run`` per step (the plan is compiled once, on the first run);
* ``eager``: the same step with a ``GradientTape``, ops dispatched one by one in Python;

and the per-op dispatch overhead: a chain of ``--chain`` scalar additions run by a Session,
eagerly, and as plain NumPy calls; (time − NumPy time) / ops is what each mode adds per op.

The BLAS library runs on ``--blas-threads`` threads (default 1, set through the usual
environment variables by re-starting this process): on a small machine shared with other
work, multi-threaded matrix products make step times swing by large factors from one
repeat to the next, which would drown the differences between the modes. ``0`` keeps the
library's default.
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

from .harness import bench_parser, restart_with_blas_threads, write_json
from .machine import machine_info

WIDTHS = (784, 512, 512, 10)
BATCH = 128
LR = 0.01


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, WIDTHS[0])).astype(np.float32)
    y = rng.integers(0, WIDTHS[-1], size=BATCH)
    params = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:]):
        params += [(rng.normal(size=(a, b)) * np.sqrt(2 / a)).astype(np.float32), np.zeros(b, np.float32)]
    return x, y, params


def numpy_step(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Hand-written forward + backward + SGD (in place); returns the loss."""
    w1, b1, w2, b2, w3, b3 = params
    h1p = x @ w1 + b1
    h1 = np.maximum(h1p, 0)
    h2p = h1 @ w2 + b2
    h2 = np.maximum(h2p, 0)
    logits = h2 @ w3 + b3
    z = logits - logits.max(1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(1, keepdims=True)
    n = len(y)
    loss = float(-np.log(p[np.arange(n), y]).mean())
    p[np.arange(n), y] -= 1
    d3 = p / n
    d2 = (d3 @ w3.T) * (h2p > 0)
    d1 = (d2 @ w2.T) * (h1p > 0)
    grads = [x.T @ d1, d1.sum(0), h1.T @ d2, d2.sum(0), h2.T @ d3, d3.sum(0)]
    for p_, g in zip(params, grads):
        p_ -= LR * g
    return loss


def _mlp(G: Any, x: Any, y: Any, ps: list) -> Any:
    h = x
    for i in range(0, len(ps) - 2, 2):
        h = G.relu(G.matmul(h, ps[i]) + ps[i + 1])
    return G.reduce_mean(G.sparse_softmax_cross_entropy(y, G.matmul(h, ps[-2]) + ps[-1]))


def graph_step_fn(x: np.ndarray, y: np.ndarray, params: list[np.ndarray]) -> tuple[Callable[[], float], Any]:
    from reference_impl import graph as G

    g = G.Graph()
    with g.as_default():
        xp, yp = G.placeholder("float32", [None, WIDTHS[0]]), G.placeholder("int64", [None])
        vs = [G.Variable(p) for p in params]
        loss = _mlp(G, xp, yp, vs)
        train = G.group(*[v.assign_sub(gr * LR) for v, gr in zip(vs, G.gradients(loss, vs))])
        init = G.global_variables_initializer()
    sess = G.Session(g)
    sess.run(init)
    feed = {xp: x, yp: y}
    return (lambda: float(sess.run([loss, train], feed)[0])), sess


def eager_step_fn(x: np.ndarray, y: np.ndarray, params: list[np.ndarray]) -> Callable[[], float]:
    from reference_impl import graph as G

    vs = [G.EagerVariable(p) for p in params]
    xe, ye = G.EagerTensor(x), G.EagerTensor(y)

    def step() -> float:
        with G.GradientTape() as tape:
            loss = _mlp(G, xe, ye, vs)
        for v, gr in zip(vs, tape.gradient(loss, vs)):
            v.assign_sub(LR * gr.value)
        return float(loss.value)

    return step


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call for each function, timing each once per repeat, in turn."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


def dispatch_fns(n: int) -> dict[str, Callable[[], Any]]:
    """A chain of ``n`` scalar additions, in each mode."""
    from reference_impl import graph as G

    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", [])
        t = x
        for _ in range(n):
            t = G.add(t, x)
    sess = G.Session(g, optimize=False)
    one = np.float32(1.0)
    xe = G.EagerTensor(np.array(one))

    def numpy_chain() -> Any:
        v = np.asarray(one)
        for _ in range(n):
            v = np.add(v, one)
        return v

    def eager_chain() -> Any:
        v = xe
        for _ in range(n):
            v = G.add(v, xe)
        return v

    return {"numpy": numpy_chain, "graph": lambda: sess.run(t, {x: one}), "eager": eager_chain}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("graph", __doc__)
    parser.add_argument("--repeats", type=int, default=30, help="timed training steps per mode")
    parser.add_argument("--chain", type=int, default=1000, help="ops in the dispatch-overhead chain")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads (0: library default)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.chain < 1 or args.blas_threads < 0:
        parser.error("need --repeats >= 1, --chain >= 1 and --blas-threads >= 0")
    if args.blas_threads:
        restart_with_blas_threads("graph", argv, args.blas_threads)

    x, y, params = _data()
    graph_step, sess = graph_step_fn(x, y, [p.copy() for p in params])
    numpy_params = [p.copy() for p in params]
    fns = {"numpy": lambda: numpy_step(numpy_params, x, y),
           "graph": graph_step, "eager": eager_step_fn(x, y, [p.copy() for p in params])}
    first = {k: fn() for k, fn in fns.items()}  # warm-up (compiles the graph plan); same loss in all
    step_times = interleaved(fns, args.repeats)
    sess.close()
    chain = dispatch_fns(args.chain)
    for fn in chain.values():
        fn()
    chain_times = interleaved(chain, max(5, args.repeats // 3))

    med = {k: statistics.median(v) for k, v in step_times.items()}
    cmed = {k: statistics.median(v) for k, v in chain_times.items()}
    document = {
        "benchmark": "graph",
        "machine": machine_info(mpi_library="not used (single process)"),
        "settings": {"widths": list(WIDTHS), "batch": BATCH, "dtype": "float32", "lr": LR,
                     "repeats": args.repeats, "chain_ops": args.chain,
                     "blas_threads": args.blas_threads or "library default"},
        "first_step_loss": first,
        "step_seconds": step_times,
        "step_median_s": med,
        "ratio_to_numpy": {k: med[k] / med["numpy"] for k in med},
        "chain_median_s": cmed,
        "dispatch_overhead_us_per_op": {k: (cmed[k] - cmed["numpy"]) / args.chain * 1e6
                                        for k in ("graph", "eager")},
        "numpy_us_per_op": cmed["numpy"] / args.chain * 1e6,
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    for k in med:
        print(f"{k:>6}: {med[k] * 1e3:8.2f} ms/step  ({document['ratio_to_numpy'][k]:.3f}x numpy)")
    for k, v in document["dispatch_overhead_us_per_op"].items():
        print(f"{k:>6}: +{v:.2f} us per op over a NumPy call ({document['numpy_us_per_op']:.2f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
