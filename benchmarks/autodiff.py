"""The cost of a gradient: reverse mode against finite differences, as the parameter count grows.

``python -m benchmarks autodiff`` builds, for each hidden width ``h``, the loss of a
tanh MLP ``h -> h -> h -> 1`` with mean squared error on a fixed batch, in float64, with every
weight and bias a fed placeholder (so finite differences can perturb them), and times in one
process, interleaved repeat by repeat:

* ``forward``: ``Session.run(loss)``, one evaluation of the loss;
* ``gradient``: ``Session.run([loss, *gradients(loss, params)])``, reverse mode: the forward
  pass plus one backward pass give all ``n`` partial derivatives;

then the whole central-difference gradient, ``(L(θ + ε e_i) − L(θ − ε e_i)) / 2ε`` for each
of the ``n`` parameters (``2n`` runs of the same forward plan), and compares it with the
reverse-mode gradient (the largest difference relative to the largest component), so the
run also checks the gradient it times. Forward mode is not timed: like finite differences
it needs one pass per input direction, so its cost grows with ``n`` the same way.

Each ratio divides by the forward time measured in the same run. Times are this process's
CPU time (``time.process_time``) with BLAS on one thread (set through the environment by
re-starting this process): on a machine shared with other work, time spent waiting for a
core is not counted, so the seconds-long finite-difference loop and the sub-millisecond
forward runs are measured alike.
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time
from typing import Any

import numpy as np

from .harness import bench_parser, restart_with_blas_threads, write_json
from .machine import machine_info

HIDDEN = (2, 4, 8, 16, 32, 72)  # n = 2h^2 + 3h + 1 parameters: 15 ... 10 585
QUICK_HIDDEN = (2, 4)
BATCH = 128
EPS = 1e-6


class LossModel:
    """The loss graph of one width, its fed parameters, and the session that runs it."""

    def __init__(self, hidden: int, batch: int, seed: int = 0) -> None:
        import reference_impl.graph as G

        rng = np.random.default_rng(seed)
        widths = (hidden, hidden, hidden, 1)
        self.graph = G.Graph()
        with self.graph.as_default():
            x = G.placeholder("float64", [batch, hidden], name="x")
            y = G.placeholder("float64", [batch, 1], name="y")
            self.params: list[Any] = []
            for i, (a, b) in enumerate(itertools.pairwise(widths)):
                self.params += [G.placeholder("float64", [a, b], name=f"w{i}"),
                                G.placeholder("float64", [b], name=f"b{i}")]
            h = x
            for i in range(0, len(self.params) - 2, 2):
                h = G.tanh(G.matmul(h, self.params[i]) + self.params[i + 1])
            out = G.matmul(h, self.params[-2]) + self.params[-1]
            self.loss = G.reduce_mean(G.square(out - y), name="loss")
            self.grads = G.gradients(self.loss, self.params)
        self.values = [rng.normal(size=p.shape) / np.sqrt(p.shape[0]) for p in self.params]
        self.feed = {x: rng.normal(size=(batch, hidden)), y: rng.normal(size=(batch, 1)),
                     **dict(zip(self.params, self.values))}  # the arrays themselves: perturbing one is seen
        self.n = sum(v.size for v in self.values)
        self.session = G.Session(self.graph)

    def forward(self) -> float:
        return float(self.session.run(self.loss, self.feed))

    def gradient(self) -> np.ndarray:
        """Reverse mode: the loss and all n partial derivatives from one run, flattened."""
        _, *grads = self.session.run([self.loss, *self.grads], self.feed)
        return np.concatenate([g.ravel() for g in grads])

    def finite_differences(self, eps: float = EPS) -> np.ndarray:
        """Central differences, one parameter at a time: 2n forward runs."""
        out = np.empty(self.n)
        i = 0
        for v in self.values:
            flat = v.reshape(-1)  # a view: writing it changes the fed array
            for j in range(flat.size):
                old = flat[j]
                flat[j] = old + eps
                up = self.forward()
                flat[j] = old - eps
                down = self.forward()
                flat[j] = old
                out[i] = (up - down) / (2 * eps)
                i += 1
        return out


def measure(hidden: int, batch: int, repeats: int) -> dict[str, Any]:
    """One width: forward and reverse-mode times (interleaved), the finite-difference gradient's
    time and its agreement with reverse mode."""
    model = LossModel(hidden, batch)
    ops = {}
    for name, fn in (("forward", model.forward), ("gradient", model.gradient)):
        fn()  # warm-up: each signature's plan is built (and its passes run) on its first run
        ops[name] = model.session.last_report[-1][2]  # ops the plan executes
    times: dict[str, list[float]] = {"forward": [], "gradient": []}
    for _ in range(repeats):
        for name, fn in (("forward", model.forward), ("gradient", model.gradient)):
            t0 = time.process_time()
            fn()
            times[name].append(time.process_time() - t0)
    fd_times = []
    for _ in range(3 if model.n <= 1000 else 1):  # the large ones are thousands of runs already
        t0 = time.process_time()
        fd = model.finite_differences()
        fd_times.append(time.process_time() - t0)
    reverse = model.gradient()
    model.session.close()
    fwd, grad, fd_s = (statistics.median(times["forward"]), statistics.median(times["gradient"]),
                       statistics.median(fd_times))
    return {
        "hidden": hidden, "params": model.n, "ops": ops,
        "forward_s": times["forward"], "gradient_s": times["gradient"], "fd_runs_s": fd_times,
        "forward_median_s": fwd, "gradient_median_s": grad, "fd_median_s": fd_s,
        "fd_evaluations": 2 * model.n,
        "gradient_over_forward": grad / fwd, "fd_over_forward": fd_s / fwd,
        "max_rel_error": float(np.max(np.abs(reverse - fd)) / np.max(np.abs(fd))),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("autodiff", __doc__)
    parser.add_argument("--repeats", type=int, default=30, help="timed forward and gradient runs per width")
    parser.add_argument("--quick", action="store_true", help=f"hidden widths {QUICK_HIDDEN} only")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("need --repeats >= 1")
    restart_with_blas_threads("autodiff", argv)  # CPU time measures the work only on one BLAS thread

    rows = []
    for h in QUICK_HIDDEN if args.quick else HIDDEN:
        rows.append(measure(h, BATCH, args.repeats))
        r = rows[-1]
        print(f"n={r['params']:>6}: forward {r['forward_median_s'] * 1e6:7.0f} us, gradient "
              f"{r['gradient_over_forward']:.2f}x forward, finite differences {r['fd_over_forward']:.0f}x "
              f"forward, max relative difference {r['max_rel_error']:.1e}", flush=True)
    document = {
        "benchmark": "autodiff",
        "machine": machine_info(mpi_library="not used (single process)"),
        "settings": {"model": "tanh MLP h-h-h-1, mean squared error", "batch": BATCH, "dtype": "float64",
                     "repeats": args.repeats, "fd_eps": EPS, "blas_threads": 1,
                     "clock": "time.process_time (CPU time of this process)"},
        "results": rows,
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
