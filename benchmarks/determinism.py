"""Measured evidence for the determinism page: how far apart "the same" training runs end up.

``python -m benchmarks determinism`` trains the same MLP on the same seeded data
and batches, for ``--steps`` steps, in pairs of configurations that differ in one thing,
and records ``max |w_a - w_b|`` over all weights after every step:

* ``rerun``: the same configuration twice (4 thread ranks, overlap mode): must stay 0;
* ``bucket layout``: 4 ranks, gradients bucketed vs one allreduce per tensor;
* ``algorithm``: 4 ranks, ring vs recursive-doubling allreduce;
* ``rank count``: 2 ranks vs 4 ranks, same global batch; and the same pair with a learning
  rate of 1.0 instead of 0.1, at the edge of stable training, where small differences grow;
* ``staleness 1`` and ``staleness 4``: synchronous SGD vs SGD applying gradients computed
  1 or 4 steps earlier (what asynchronous workers do);

and, for accumulation in arrival order, the number of distinct results among ``--sums``
runs of ``determinism.arrival_order_sum`` over the per-rank gradients of one step.
Everything runs on thread ranks in this process: the question is about bits, not time.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .harness import bench_parser, write_json
from .machine import machine_info

WIDTHS = (32, 64, 64, 10)
GLOBAL_BATCH = 64
BUCKET_BYTES = 4000


def trajectories(steps: int) -> tuple[dict[str, list[list[np.ndarray]]], dict[str, float]]:
    """Parameters after every step, for each configuration the pairs compare, and rank 0's last loss."""
    from reference_impl.comm import run_threads
    from reference_impl.train.data_parallel import train
    from reference_impl.train.determinism import stale_sgd

    losses: dict[str, float] = {}

    def run(n: int, **kw: Any) -> list[list[np.ndarray]]:
        result = run_threads(n, lambda c: train(c, widths=WIDTHS, steps=steps, global_batch=GLOBAL_BATCH,
                                                keep_history=True, **kw), timeout=300)
        losses[f"{n} ranks, lr {kw.get('lr', 0.1)}, {kw.get('mode')}, {kw.get('algorithm', 'ring')}"] = result[0].losses[-1]
        return result[0].history

    runs = {
        "4 ranks, overlap": run(4, mode="overlap", bucket_bytes=BUCKET_BYTES),
        "4 ranks, overlap, again": run(4, mode="overlap", bucket_bytes=BUCKET_BYTES),
        "4 ranks, per tensor": run(4, mode="per_tensor"),
        "4 ranks, recursive doubling": run(4, mode="overlap", bucket_bytes=BUCKET_BYTES, algorithm="recursive_doubling"),
        "2 ranks, overlap": run(2, mode="overlap", bucket_bytes=BUCKET_BYTES),
        "2 ranks, lr 1.0": run(2, mode="overlap", bucket_bytes=BUCKET_BYTES, lr=1.0),
        "4 ranks, lr 1.0": run(4, mode="overlap", bucket_bytes=BUCKET_BYTES, lr=1.0),
    }
    for tau in (0, 1, 4):
        runs[f"staleness {tau}"] = stale_sgd(WIDTHS, steps, GLOBAL_BATCH, staleness=tau)[1:]
    return runs, losses


PAIRS = {
    "rerun": ("4 ranks, overlap", "4 ranks, overlap, again"),
    "bucket layout": ("4 ranks, overlap", "4 ranks, per tensor"),
    "algorithm": ("4 ranks, overlap", "4 ranks, recursive doubling"),
    "rank count": ("2 ranks, overlap", "4 ranks, overlap"),
    "rank count, lr 1.0": ("2 ranks, lr 1.0", "4 ranks, lr 1.0"),
    "staleness 1": ("staleness 0", "staleness 1"),
    "staleness 4": ("staleness 0", "staleness 4"),
}


def arrival_order_runs(n_sums: int) -> dict[str, Any]:
    """Distinct bit patterns among ``n_sums`` arrival-order sums of 8 ranks' gradients."""
    from reference_impl.train.data import batch_indices, shard, synthetic_classification
    from reference_impl.train.determinism import arrival_order_sum, max_abs_diff, sum_in_order
    from reference_impl.train.mlp import init_mlp, loss_and_grads

    ranks = 8
    x, y = synthetic_classification(512, WIDTHS[0], WIDTHS[-1], seed=0)
    idx = batch_indices(512, GLOBAL_BATCH, 0)
    params = init_mlp(WIDTHS, seed=1)
    grads = [loss_and_grads(params, *shard(x[idx], y[idx], r, ranks))[1][0] for r in range(ranks)]
    fixed = sum_in_order(grads, list(range(ranks)))
    results, orders = {}, set()
    for k in range(n_sums):
        total, order = arrival_order_sum(grads, jitter_s=2e-3, seed=k)
        results.setdefault(total.tobytes(), total)
        orders.add(tuple(order))
    return {
        "ranks": ranks, "runs": n_sums, "distinct_orders": len(orders), "distinct_results": len(results),
        "max_abs_diff_vs_rank_order": max(max_abs_diff([t], [fixed]) for t in results.values()),
        "max_abs_value": float(np.max(np.abs(fixed))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("determinism", __doc__)
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--sums", type=int, default=50, help="arrival-order sums to run")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.sums < 1:
        parser.error("need --steps >= 1 and --sums >= 1")
    from reference_impl.train.determinism import max_abs_diff

    runs, losses = trajectories(args.steps)
    results = []
    for name, (a, b) in PAIRS.items():
        diffs = [max_abs_diff(pa, pb) for pa, pb in zip(runs[a], runs[b])]
        results.append({"pair": name, "a": a, "b": b, "max_abs_diff": diffs})
    weight_scale = max(float(np.max(np.abs(p))) for p in runs["4 ranks, overlap"][-1])
    document = {
        "benchmark": "determinism",
        "machine": machine_info(mpi_library="not used (thread ranks)"),
        "settings": {"widths": list(WIDTHS), "global_batch": GLOBAL_BATCH, "bucket_bytes": BUCKET_BYTES,
                     "steps": args.steps, "dtype": "float32", "lr": 0.1, "max_abs_weight": weight_scale,
                     "final_loss": {name: float(losses[name]) for name in losses}},
        "results": results,
        "arrival_order": arrival_order_runs(args.sums),
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    for r in results:
        d = r["max_abs_diff"]
        print(f"{r['pair']:>14}: max|dw| after 1 step {d[0]:.3g}, after {len(d)} steps {d[-1]:.3g}")
    ao = document["arrival_order"]
    print(f"arrival order: {ao['distinct_results']} distinct results from {ao['distinct_orders']} orders in {ao['runs']} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
