"""Optimisers compared on a real task, and what each costs per step: ``python -m benchmarks optimizers``.

Two experiments, one JSON file (``bench-results/optimizers.json``; with ``--publish``, the
site's ``docs/assets/bench/optimizers.json``):

* ``tuning`` + ``curves``: the graph MLP (64 -> 64 -> 10, ReLU) on scikit-learn's
  handwritten digits (the data ships inside the package; nothing is downloaded), trained
  with each optimiser of ``reference_impl.train.optimizers`` for the same number of steps.
  Each optimiser gets its own learning rate, the one with the lowest *validation* loss on a
  shared grid (powers of ten and their half-decades); that rate is then run again with
  several seeds (initialisation and batch order), and the curves and the *test* loss and
  accuracy of those runs are recorded. Picking each optimiser's best rate is what makes the
  comparison fair: an optimiser run at another's rate says nothing about the optimiser.
* ``cost``: for a model of ``--params`` float32 parameters, the bytes of optimiser state
  per parameter (read back from the slot variables in the session), the peak memory of one
  update (``tracemalloc``, which sees NumPy's buffers: the composed ops' temporaries), the
  number of graph nodes the update adds, and the time of one update step relative to plain
  SGD, timed interleaved (every repeat runs each optimiser once, in turn) on the same
  gradients.

BLAS runs single-threaded (the process restarts itself with the thread variables set) so
the losses are reproducible and the timings are not at the mercy of a shared machine's
other processes stealing BLAS threads.
"""
from __future__ import annotations

import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from .harness import bench_parser, restart_with_blas_threads, write_json
from .machine import machine_info



def optimiser_factories() -> dict[str, Callable[[float], Any]]:
    """Name -> ``make(learning_rate)`` for every optimiser the page discusses (TF's default settings)."""
    from reference_impl.train import optimizers as opt

    return {
        "SGD": lambda lr: opt.GradientDescent(lr),
        "Momentum": lambda lr: opt.Momentum(lr, 0.9),
        "Nesterov": lambda lr: opt.Momentum(lr, 0.9, use_nesterov=True),
        "Adagrad": lambda lr: opt.Adagrad(lr),
        "RMSProp": lambda lr: opt.RMSProp(lr),
        "Adam": lambda lr: opt.Adam(lr),
        "AdamW": lambda lr: opt.AdamW(lr, weight_decay=0.01),
        "FTRL": lambda lr: opt.Ftrl(lr),
    }


TRAINED = ("SGD", "Momentum", "Nesterov", "Adagrad", "RMSProp", "Adam")  # AdamW/FTRL: cost only


def digits_splits(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's digits (1 797 images of 8 x 8 pixels), scaled to [0, 1], split 60/20/20 with a seed."""
    from sklearn.datasets import load_digits  # bundled with the package, read from disk

    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    a, b = int(0.6 * len(x)), int(0.8 * len(x))
    return {"train": (x[order[:a]], y[order[:a]]), "val": (x[order[a:b]], y[order[a:b]]),
            "test": (x[order[b:]], y[order[b:]])}


def train_run(make: Callable[[float], Any], lr: float, data: dict[str, tuple[np.ndarray, np.ndarray]],
              widths: tuple[int, ...], steps: int, batch: int, seed: int) -> dict[str, Any]:
    """Train the graph MLP; the mini-batch loss before each step, then loss and accuracy on val and test.

    A non-finite loss stops the run (``diverged``), as a real job would.
    """
    import reference_impl.graph as g
    from reference_impl.train import graph_mlp as gm
    from reference_impl.train.data import batch_indices

    model = gm.build_classifier(widths, seed=seed)
    x, y = data["train"]
    with model.graph.as_default():
        train_op = make(lr).minimize(model.loss)
        init = g.global_variables_initializer()
    losses: list[float] = []
    with g.Session(model.graph) as sess, np.errstate(all="ignore"):
        sess.run(init)
        for step in range(steps):
            idx = batch_indices(len(x), batch, step, seed)
            loss, _ = sess.run([model.loss, train_op], {model.x: x[idx], model.y: y[idx]})
            losses.append(float(loss))
            if not np.isfinite(loss):
                break
        out: dict[str, Any] = {"losses": losses, "diverged": not all(np.isfinite(losses))}
        for split in ("val", "test"):
            ex, ey = data[split]
            loss, logits = sess.run([model.loss, model.logits], {model.x: ex, model.y: ey})
            out[f"{split}_loss"] = float(loss) if np.isfinite(loss) else None
            out[f"{split}_accuracy"] = float(np.mean(np.argmax(logits, axis=1) == ey))
    return out


def tuning(widths: tuple[int, ...], steps: int, batch: int, rates: list[float], seeds: int) -> dict[str, Any]:
    """Per optimiser: validation loss for every rate of the grid (seed 0), the best rate, its seeded runs."""
    data = digits_splits()
    factories = optimiser_factories()
    out: dict[str, Any] = {}
    for name in TRAINED:
        grid = []
        for lr in rates:
            r = train_run(factories[name], lr, data, widths, steps, batch, seed=0)
            grid.append({"learning_rate": lr, "val_loss": None if r["diverged"] else r["val_loss"]})
        usable = [row for row in grid if row["val_loss"] is not None]
        if not usable:
            raise RuntimeError(f"optimizers benchmark: {name} diverged at every learning rate of {rates}")
        best = min(usable, key=lambda row: row["val_loss"])["learning_rate"]
        runs = [train_run(factories[name], best, data, widths, steps, batch, seed=s) for s in range(seeds)]
        out[name] = {"grid": grid, "best_learning_rate": best, "runs": runs}
        print(f"  {name}: best rate {best:g}, test loss "
              f"{statistics.median(r['test_loss'] for r in runs):.4f}, test accuracy "
              f"{statistics.median(r['test_accuracy'] for r in runs):.4f}", flush=True)
    return out


def cost(params: int, repeats: int) -> dict[str, Any]:
    """State bytes, update nodes, peak update memory and update time per optimiser, on ``params`` parameters."""
    import reference_impl.graph as g

    side = round((params // 4) ** 0.5)
    shapes = [(side, side)] * 4  # four weight matrices, as a small MLP has
    n_params = sum(a * b for a, b in shapes)
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(s).astype(np.float32) * 0.01 for s in shapes]
    steps: dict[str, Callable[[], Any]] = {}
    out: dict[str, Any] = {"params": n_params, "optimisers": {}}
    sessions = []
    for name, make in optimiser_factories().items():
        graph = g.Graph()
        with graph.as_default():
            variables = [g.Variable(rng.standard_normal(s).astype(np.float32), name=f"w{i}")
                         for i, s in enumerate(shapes)]
            fed = [g.placeholder("float32", list(s), name=f"grad{i}") for i, s in enumerate(shapes)]
            before = len(graph.operations)
            update = make(1e-3).apply_gradients(list(zip(fed, variables)))
            nodes = len(graph.operations) - before
            init = g.global_variables_initializer()
        sess = g.Session(graph)
        sess.run(init)
        feed = dict(zip(fed, grads))
        sess.run(update, feed)  # compile the plan outside the measurement
        state = [v for v in graph.variables if not v.trainable]
        state_bytes = sum(np.asarray(x).nbytes for x in sess.run([v.value() for v in state])) if state else 0
        tracemalloc.start()
        sess.run(update, feed)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out["optimisers"][name] = {"state_bytes": state_bytes, "state_bytes_per_param": state_bytes / n_params,
                                   "update_nodes": nodes, "peak_update_bytes_per_param": peak / n_params,
                                   "step_seconds": []}
        steps[name] = lambda sess=sess, update=update, feed=feed: sess.run(update, feed)
        sessions.append(sess)
    for _ in range(repeats):  # interleaved: every repeat times each optimiser once, in turn
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            out["optimisers"][name]["step_seconds"].append(time.perf_counter() - t0)
    for sess in sessions:
        sess.close()
    sgd = statistics.median(out["optimisers"]["SGD"]["step_seconds"])
    for name, row in out["optimisers"].items():
        row["time_vs_sgd"] = statistics.median(row["step_seconds"]) / sgd
        print(f"  {name}: {row['state_bytes_per_param']:.2f} state bytes/param, {row['update_nodes']} nodes, "
              f"peak {row['peak_update_bytes_per_param']:.1f} B/param, {row['time_vs_sgd']:.2f}x SGD's time",
              flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("optimizers", __doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test (seconds)")
    parser.add_argument("--steps", type=int, default=600, help="training steps per run (default 600)")
    parser.add_argument("--seeds", type=int, default=5, help="seeded runs at each optimiser's best rate")
    parser.add_argument("--params", type=int, default=1 << 20, help="parameters of the cost model (default 2^20)")
    parser.add_argument("--repeats", type=int, default=30, help="timed update steps per optimiser")
    args = parser.parse_args(argv)
    if min(args.steps, args.seeds, args.params, args.repeats) < 1:
        parser.error("--steps, --seeds, --params and --repeats must be >= 1")
    restart_with_blas_threads("optimizers", argv)  # CPU time measures the work only on one BLAS thread

    q = args.quick
    settings = {"widths": [64, 64, 10], "batch": 32, "steps": 20 if q else args.steps,
                "rates": [1e-3, 1e-1] if q else [float(f"{r:.3g}") for r in np.geomspace(1e-4, 10.0, 11)],
                "seeds": 1 if q else args.seeds, "params": 4096 if q else args.params,
                "repeats": 3 if q else args.repeats, "blas_threads": 1, "quick": q}
    started = time.time()
    print("tuning each optimiser's learning rate on the digits ...", flush=True)
    document: dict[str, Any] = {
        "benchmark": "optimizers",
        "machine": machine_info(mpi_library="not used (single process)"),
        "settings": settings,
        "tuning": tuning(tuple(settings["widths"]), settings["steps"], settings["batch"], settings["rates"],
                         settings["seeds"]),
    }
    print("state and update cost ...", flush=True)
    document["cost"] = cost(settings["params"], settings["repeats"])
    document["seconds"] = time.time() - started
    write_json(args.out, document)
    print(f"wrote {args.out} in {document['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
