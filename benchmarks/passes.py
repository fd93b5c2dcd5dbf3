"""What the graph passes do to real graphs: op counts after each pass, and interpreter time per step.

``python -m benchmarks passes`` builds two graphs and, for each, records how many
ops remain after every pass and times the graph interpreter (``Session.run``) before and
after, interleaved repeat by repeat in one process:

* ``training``: one Adam step of a 64-128-128-10 ReLU classifier
  (``train.graph_mlp.build_classifier`` + ``train.optimizers.Adam``), fetching the loss and
  the train op. Passes: the Session's own (pruning, CSE, constant folding, dead-node removal).
  The op types CSE removed are recorded. Timed: ``Session(optimize=False)`` (pruning only)
  against ``Session()``; each session has its own variables, started from the same values,
  and the losses they report must agree.
* ``inference``: a 256-256-256-10 ReLU MLP with inference-mode batch normalisation after each
  hidden layer, ``relu((x W + b − mean) · γ / sqrt(var + ε) + β)``, the weights and statistics
  variables holding non-trivial values (as after training), fetching the logits. Passes: the
  inference pipeline of ``compiler.optimize_for_inference`` (freeze, constant folding,
  algebraic simplification, CSE, dead-code elimination, elementwise fusion). Timed at batch 1
  and ``INFERENCE_BATCH``: pruning only, the Session's default passes, the pipeline's graph
  without and with fusion, all run by the same interpreter; the outputs must agree.

The op counts are exact and machine-independent; the times are what the interpreter pays per
op it dispatches (Python overhead) plus the kernels, on this machine. BLAS runs on
``--blas-threads`` threads (default 1), set through the environment by re-starting this process.
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from .harness import bench_parser, restart_with_blas_threads, write_json
from .machine import machine_info

TRAIN_WIDTHS, TRAIN_BATCH = (64, 128, 128, 10), 64
INFER_WIDTHS, INFERENCE_BATCH = (256, 256, 256, 10), 256
BN_EPS = 1e-3


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, budget_s: float = 0.005) -> dict[str, Any]:
    """Seconds per call of each function, one timing per repeat with the functions in turn, and
    the best and the median per function.

    A timing runs the function enough times to take about ``budget_s`` (a step of 0.1 ms is
    too short to time alone). The best is the figure to compare: on a machine shared with
    other work, a run that the scheduler interrupts is slower for reasons that have nothing
    to do with the graph, never faster."""
    inner = {}
    for k, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        inner[k] = max(1, round(budget_s / (time.perf_counter() - t0)))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner[k]):
                fn()
            times[k].append((time.perf_counter() - t0) / inner[k])
    return {"seconds": times, "best_s": {k: min(v) for k, v in times.items()},
            "median_s": {k: statistics.median(v) for k, v in times.items()}}


def training_graph(repeats: int) -> dict[str, Any]:
    """The Adam training step: op counts per Session pass, what CSE removed, time per step."""
    import reference_impl.graph as G

    from reference_impl.train.data import synthetic_classification
    from reference_impl.train.graph_mlp import build_classifier
    from reference_impl.train.optimizers import Adam

    model = build_classifier(TRAIN_WIDTHS, seed=0)
    with model.graph.as_default():
        train = Adam(1e-3).minimize(model.loss)
        init = G.global_variables_initializer()
    fetches = [model.loss, train]
    keep = [model.loss.op.name, train.name]
    _, report = G.optimize(model.graph, keep)
    pruned = G.dead_node_removal(model.graph, keep)
    after_cse = G.common_subexpression_elimination(pruned, keep)
    cse_removed = Counter(op.type for op in pruned.operations) - Counter(op.type for op in after_cse.operations)
    x, y = synthetic_classification(TRAIN_BATCH, TRAIN_WIDTHS[0], TRAIN_WIDTHS[-1], seed=1)
    feed = {model.x: x, model.y: y}
    sessions = {"prune only": G.Session(model.graph, optimize=False), "session passes": G.Session(model.graph)}
    losses = {}
    for name, sess in sessions.items():
        sess.run(init)
        losses[name] = [float(sess.run(fetches, feed)[0]) for _ in range(2)]  # warm-up: builds the plan
    if not np.allclose(losses["prune only"], losses["session passes"], rtol=1e-6):
        raise RuntimeError(f"passes benchmark: the Session's passes changed the training losses: {losses}")
    times = interleaved({k: (lambda s=s: s.run(fetches, feed)) for k, s in sessions.items()}, repeats)
    plan_ops = {k: s.last_report[-1][2] for k, s in sessions.items()}  # ops after the last pass
    for s in sessions.values():
        s.close()
    return {"graph": "training", "description": f"one Adam step, MLP {'-'.join(map(str, TRAIN_WIDTHS))}",
            "batch": TRAIN_BATCH, "ops_built": len(model.graph),
            "passes": [list(r) for r in report], "ops_run": plan_ops, "cse_removed": dict(cse_removed),
            "losses": losses, "timings": [{"batch": TRAIN_BATCH, **times}]}


def _inference_model(seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """The batch-normalised MLP with 'trained' values: (graph, logits, initialiser, session)."""
    import reference_impl.graph as G

    rng = np.random.default_rng(seed)
    graph = G.Graph()
    with graph.as_default():
        x = G.placeholder("float32", [None, INFER_WIDTHS[0]], name="x")
        h = x
        for i, (a, b) in enumerate(itertools.pairwise(INFER_WIDTHS)):
            def var(value: np.ndarray, name: str, i: int = i) -> Any:
                return G.Variable(value.astype(np.float32), name=f"layer{i}/{name}")
            w = var(rng.normal(size=(a, b)) * np.sqrt(2 / a), "kernel")
            h = G.matmul(h, w) + var(rng.normal(size=b) * 0.1, "bias")
            if i < len(INFER_WIDTHS) - 2:
                mean, variance = var(rng.normal(size=b) * 0.1, "bn/mean"), var(rng.uniform(0.5, 2, b), "bn/var")
                gamma, beta = var(rng.uniform(0.5, 1.5, b), "bn/gamma"), var(rng.normal(size=b) * 0.1, "bn/beta")
                scale = gamma / G.sqrt(variance + G.constant(BN_EPS, dtype="float32"))
                h = G.relu((h - mean) * scale + beta)
        logits = G.identity(h, name="logits")
        init = G.global_variables_initializer()
    sess = G.Session(graph)
    sess.run(init)
    return graph, logits, init, sess


def inference_graph(repeats: int, batches: tuple[int, ...]) -> dict[str, Any]:
    """The batch-normalised MLP: op counts per inference pass, time per step at each batch size."""
    import reference_impl.graph as G

    from reference_impl.compiler import optimize_for_inference

    graph, logits, init, sess = _inference_model()
    optimised, report = optimize_for_inference(sess, [logits])
    unfused, _ = optimize_for_inference(sess, [logits], fuse=False)
    _, session_report = G.optimize(graph, [logits.op.name])
    sessions = {"prune only": G.Session(graph, optimize=False), "session passes": G.Session(graph),
                "pipeline without fusion": G.Session(unfused, optimize=False),
                "inference pipeline": G.Session(optimised, optimize=False)}
    for name in ("prune only", "session passes"):
        sessions[name].run(init)  # the same initial values the frozen graph holds as constants
    def run(sess: Any, batch: np.ndarray) -> np.ndarray:  # by name: every graph keeps "x" and "logits"
        return sess.run("logits:0", {"x:0": batch})

    timings, max_diff = [], 0.0
    for batch in batches:
        data = np.random.default_rng(batch).normal(size=(batch, INFER_WIDTHS[0])).astype(np.float32)
        outs = {k: run(s, data) for k, s in sessions.items()}  # warm-up: builds each plan
        max_diff = max(max_diff, *(float(np.max(np.abs(o - outs["prune only"]))) for o in outs.values()))
        times = interleaved({k: (lambda s=s, data=data: run(s, data)) for k, s in sessions.items()}, repeats)
        timings.append({"batch": batch, **times})
    scale = max(1.0, float(np.max(np.abs(outs["prune only"]))))
    if max_diff > 1e-5 * scale:
        raise RuntimeError(f"passes benchmark: the optimised inference graph's logits differ from the "
                           f"original's by up to {max_diff:g}")
    plan_ops = {k: s.last_report[-1][2] for k, s in sessions.items()}  # ops after the last pass
    for s in (*sessions.values(), sess):
        s.close()
    return {"graph": "inference", "batch": list(batches),
            "description": f"MLP {'-'.join(map(str, INFER_WIDTHS))} with batch norm, frozen for inference",
            "ops_built": len(graph), "passes": [list(r) for r in report],
            "session_passes": [list(r) for r in session_report], "ops_run": plan_ops,
            "max_abs_diff": max_diff, "timings": timings,
            "fused_ops": sum(op.type == "FusedElementwise" for op in optimised.operations)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("passes", __doc__)
    parser.add_argument("--repeats", type=int, default=100, help="timed runs per configuration")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads (0: library default)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.blas_threads < 0:
        parser.error("need --repeats >= 1 and --blas-threads >= 0")
    if args.blas_threads:
        restart_with_blas_threads("passes", argv, args.blas_threads)

    results = [training_graph(args.repeats), inference_graph(args.repeats, (1, INFERENCE_BATCH))]
    document = {
        "benchmark": "passes",
        "machine": machine_info(mpi_library="not used (single process)"),
        "settings": {"repeats": args.repeats, "blas_threads": args.blas_threads or "library default",
                     "bn_eps": BN_EPS},
        "results": results,
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    for r in results:
        print(f"{r['graph']}: " + ", ".join(f"{name} {before}->{after}" for name, before, after in r["passes"]))
        for t in r["timings"]:
            print(f"  batch {t['batch']}, best of {args.repeats}: "
                  + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in t["best_s"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
