"""Consistency rules on real parameter-server ranks: wall-clock time to a target loss with a straggler.

``python -m benchmarks ps_cluster`` runs the embedding model of
``reference_impl.ps.training`` (a sparse table ``emb`` and dense ``w``, ``b`` on one server
rank) with 4 worker ranks (threads of this process) on the synthetic click log, under
BSP, ASP, SSP (s = 1, 4, 16), backup workers (4 + 1 workers, the first 4 gradients of
each step used) and EASGD (tau = 4, alpha = 0.25). The messages, the servers' queueing
and the rules are real; a worker's *compute* is padded to ``--step-time`` seconds by
``Pace`` (the model's own arithmetic takes well under a millisecond, and two shared cores
would otherwise measure only the interpreter's lock), and worker 0 takes ``--slowdown``
times as long.

The server takes a snapshot of the whole model every ``--every`` seconds of wall time
(``ParameterServer.observer``); test log-losses are computed from the snapshots after the
run, outside the timed region. For each repeat (its own data sample) the target is the
level straggler-free BSP's test loss sits at between 25% and 50% of its run (the mean
there, not its luckiest dip); the figure of merit is the wall-clock time at which each
rule, with the straggler, first reaches that target, next to straggler-free BSP's own.
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np

from reference_impl.comm import Communicator, run_threads
from reference_impl.models.click_log import ClickLog, logloss
from reference_impl.ps import SGD, ClusterSpec, Consistency, ParameterServer
from reference_impl.ps.training import Pace, model_spec, run_ps_rank
from .harness import bench_parser, write_json
from .machine import machine_info

RULES = {
    "bsp": Consistency("bsp"),
    "asp": Consistency("asp"),
    "ssp s=1": Consistency("ssp", staleness=1),
    "ssp s=4": Consistency("ssp", staleness=4),
    "ssp s=16": Consistency("ssp", staleness=16),
    "backup b=1": Consistency("backup", backups=1),
    "easgd": Consistency("easgd", tau=4, alpha=0.25),
}


class Problem:
    """Training and test data of one repeat, and the test loss of a snapshot."""

    def __init__(self, seed: int, n_train: int = 32_768, n_test: int = 4096):
        log = ClickLog(vocab_size=2000)
        self.ids, self.labels = log.sample(n_train, seed=2 * seed)
        test_ids, self.test_labels = log.sample(n_test, seed=2 * seed + 1)
        self.test_unique, where = np.unique(test_ids, return_inverse=True)
        self.test_where = where.reshape(test_ids.shape)

    def test_loss(self, rows: np.ndarray, w: np.ndarray, b: np.ndarray) -> float:
        return logloss(rows[self.test_where].sum(axis=1) @ w + b[0], self.test_labels)


def _rank(comm: Communicator, cluster: ClusterSpec, problem: Problem, rule: Consistency, pace: Pace,
          steps: int, per_worker: int, lr: float, every: float) -> Any:
    """A server that snapshots the model every ``every`` seconds; workers as ``run_ps_rank``."""
    spec = model_spec(4, SGD(lr), SGD(lr))
    if comm.rank not in cluster.servers:
        return run_ps_rank(comm, cluster, spec, problem.ids, problem.labels, steps,
                           per_worker * cluster.n_workers, True, "ps", None, rule, pace)
    snapshots: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []
    start = time.monotonic()

    def snapshot(server: ParameterServer) -> None:
        now = time.monotonic() - start
        if not snapshots or now - snapshots[-1][0] >= every:
            snapshots.append((now, server.tables[0].pull(problem.test_unique), server.dense[0].copy(),
                              server.dense[1].copy()))

    server = ParameterServer(comm, cluster, spec, consistency=rule)
    server.observer = snapshot
    server.serve()
    return {"snapshots": snapshots, "seconds": time.monotonic() - start, "dropped": len(server.dropped)}


def run_rule(problem: Problem, rule: Consistency, workers: int, pace: Pace, steps: int, per_worker: int,
             lr: float, every: float) -> dict[str, Any]:
    """One training run: its loss curve against wall time and what happened."""
    n = workers + (rule.backups if rule.rule == "backup" else 0)
    cluster = ClusterSpec(1, n)
    ranks = run_threads(cluster.size, _rank, cluster, problem, rule, pace, steps, per_worker, lr, every,
                        timeout=120)
    server = ranks[0]
    times = [t for t, *_ in server["snapshots"]]
    losses = [problem.test_loss(rows, w, b) for _, rows, w, b in server["snapshots"]]
    return {"curve_time": times, "curve_logloss": losses, "seconds": server["seconds"],
            "dropped": server["dropped"], "steps_per_worker": [r["steps_done"] for r in ranks[1:]]}


def time_to(run: dict[str, Any], target: float) -> float | None:
    """Wall seconds at which the run's test loss first reached ``target`` (None if never)."""
    for t, loss in zip(run["curve_time"], run["curve_logloss"]):
        if loss <= target:
            return t
    return None


def median_time(times: list[float | None]) -> float | None:
    """The median, a run that never reached the target counting as the slowest (None if most did not)."""
    value = statistics.median(float("inf") if t is None else t for t in times)
    return None if value == float("inf") else value


def level(run: dict[str, Any], start: float, end: float) -> float:
    """Mean test loss between fractions ``start`` and ``end`` of the run's duration."""
    t_end = run["curve_time"][-1]
    window = [loss for t, loss in zip(run["curve_time"], run["curve_logloss"]) if start * t_end <= t <= end * t_end]
    if not window:
        raise RuntimeError("ps_cluster: no snapshot in the target window; lower --every")
    return float(np.mean(window))


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.2f} s"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("ps_cluster", __doc__)
    parser.add_argument("--workers", type=int, default=4, help="worker ranks")
    parser.add_argument("--steps", type=int, default=60, help="steps per worker (rounds under bsp/backup)")
    parser.add_argument("--per-worker", type=int, default=32, help="examples per worker per step")
    parser.add_argument("--lr", type=float, default=2.0, help="SGD learning rate (servers, and EASGD's workers)")
    parser.add_argument("--step-time", type=float, default=0.01, help="seconds of compute per step")
    parser.add_argument("--slowdown", type=float, default=3.0, help="worker 0 is this many times slower")
    parser.add_argument("--every", type=float, default=0.02, help="seconds between model snapshots")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per consistency rule")
    parser.add_argument("--quick", action="store_true", help="one repeat of 24 steps (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.steps = 1, 24
    if min(args.workers, args.steps, args.per_worker, args.repeats) < 1 or args.slowdown < 1 or args.step_time <= 0:
        parser.error("need positive --workers, --steps, --per-worker, --repeats, --step-time and --slowdown >= 1")

    common = (args.steps, args.per_worker, args.lr, args.every)
    straggler = Pace(args.step_time, straggler=0, slowdown=args.slowdown)
    reference, targets = [], []
    rows = {label: {"rule": label, "time_to_target": [], "seconds": [], "dropped": [], "steps_per_worker": []}
            for label in RULES}
    for r in range(args.repeats):
        problem = Problem(seed=r)
        ref = run_rule(problem, RULES["bsp"], args.workers, Pace(args.step_time), *common)
        target = level(ref, 0.25, 0.5)
        reference.append({**ref, "time_to_target": time_to(ref, target)})
        targets.append(target)
        print(f"repeat {r}: target {target:.4f}, straggler-free bsp reaches it at {_s(time_to(ref, target))}",
              flush=True)
        for label, rule in RULES.items():
            run = run_rule(problem, rule, args.workers, straggler, *common)
            row = rows[label]
            for key in ("seconds", "dropped", "steps_per_worker"):
                row[key].append(run[key])
            row["time_to_target"].append(time_to(run, target))
            if r == 0:
                row["curve_time"], row["curve_logloss"] = run["curve_time"], run["curve_logloss"]
            print(f"  {label:>10}: target at {_s(row['time_to_target'][-1])}, run {run['seconds']:.2f} s, "
                  f"{run['dropped']} dropped", flush=True)
    ref_median = median_time([r["time_to_target"] for r in reference])
    if ref_median is None:
        raise RuntimeError("ps_cluster: straggler-free bsp never reached its own level; more --steps")
    for row in rows.values():
        row["median_time_to_target"] = median_time(row["time_to_target"])
        row["ratio_to_straggler_free_bsp"] = (None if row["median_time_to_target"] is None
                                              else row["median_time_to_target"] / ref_median)
    document = {
        "benchmark": "ps_cluster",
        "machine": machine_info(mpi_library="not used (thread ranks in one process)"),
        "settings": {"workers": args.workers, "servers": 1, "steps": args.steps, "per_worker": args.per_worker,
                     "lr": args.lr, "step_time_s": args.step_time, "slowdown": args.slowdown,
                     "every_s": args.every, "repeats": args.repeats, "quick": args.quick,
                     "rules": {label: vars(rule) for label, rule in RULES.items()},
                     "target": "mean test log-loss of straggler-free bsp between 25% and 50% of its run"},
        "target_logloss_per_repeat": targets,
        "reference": {"rule": "bsp, no straggler", "time_to_target": [r["time_to_target"] for r in reference],
                      "median_time_to_target": ref_median, "seconds": [r["seconds"] for r in reference],
                      "curve_time": reference[0]["curve_time"], "curve_logloss": reference[0]["curve_logloss"]},
        "rows": list(rows.values()),
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
