"""``python -m reference_impl.train wide_deep``: train Wide & Deep on InstEval with a strategy.

    python -m reference_impl.train wide_deep --strategy local
    python -m reference_impl.train wide_deep --strategy ps --servers 2 --workers 2 --consistency bsp
    python -m reference_impl.train wide_deep --strategy allreduce --workers 2 --json
    python -m reference_impl.train wide_deep --strategy ps --workers 4 --consistency ssp --staleness 4

``local`` trains in this process; ``ps`` puts every sparse table on ``--servers`` server
ranks and all-reduces the MLP among ``--workers`` workers (``--consistency bsp``: servers
aggregate each round then apply; ``asp``: servers apply each push on arrival); ``allreduce``
is the mirrored strategy (full replicas, sparse gradients all-gathered, dense all-reduced).
Ranks are threads of this process. It prints test AUC and log-loss, training throughput,
and the bytes the ranks sent (counted by ``CountingCommunicator``); ``--json`` prints one
JSON object instead.

The real servers implement BSP and ASP only. ``--consistency ssp|backup|easgd`` therefore
runs the *consistency simulator* (``reference_impl.ps.consistency``: hashed logistic
regression on the synthetic click log, ``--workers`` simulated workers, a simulated clock,
worker 0 ``--slowdown`` times slower) and says so in its output (``"engine": "simulator"``
in the JSON): it never quietly trains something other than what was asked for.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..comm import CountingCommunicator, run_threads
from ..models.insteval import insteval_columns, load_insteval, train_test_split
from ..models.strategies import mirrored_rank, ps_rank
from ..models.wide_deep import WideDeep, auc, fit
from ..ps import FTRL, ClusterSpec
from ..ps.consistency import MODELS, HashedLogReg, simulate

STRATEGIES = ("local", "ps", "allreduce")
ON_REAL_SERVERS = ("bsp", "asp")
SIMULATED = tuple(m for m in MODELS if m not in ON_REAL_SERVERS)


def run(strategy: str, workers: int, servers: int, consistency: str, epochs: int, batch: int,
        limit: int | None, show_progress: bool) -> dict[str, Any]:
    """Train and evaluate once; returns the numbers the command prints."""
    tr, ytr, te, yte = train_test_split(load_insteval())
    if limit is not None:
        tr, ytr = {k: v[:limit] for k, v in tr.items()}, ytr[:limit]
    _, wide, deep = insteval_columns()

    def build(**kw: Any) -> WideDeep:
        return WideDeep(wide, deep, mode="joint", wide_optimizer=FTRL(alpha=0.3, beta=1.0, l1=0.0, l2=3.0), **kw)

    from tqdm import tqdm

    steps = epochs * -(-len(ytr) // batch)
    bar = tqdm(total=steps, desc=f"wide_deep {strategy}", unit="step", disable=not show_progress, file=sys.stderr)
    counters: list[CountingCommunicator] = []

    def wrap(c: Any) -> CountingCommunicator:
        counters.append(CountingCommunicator(c))
        return counters[-1]

    t0 = time.perf_counter()
    if strategy == "local":
        model = build()
        fit(model, tr, ytr, epochs=epochs, batch=batch, progress=bar.update)
        metrics = model.evaluate(te, yte)
    elif strategy == "ps":
        ranks = run_threads(servers + workers, ps_rank, ClusterSpec(servers, workers), build, tr, ytr, te, yte,
                            epochs, batch, 0, consistency == "bsp", bar.update, timeout=600, wrap=wrap)
        metrics = ranks[servers]
    else:
        ranks = run_threads(workers, mirrored_rank, build, tr, ytr, te, yte, epochs, batch, 0, bar.update,
                            timeout=600, wrap=wrap)
        metrics = ranks[0]
    seconds = time.perf_counter() - t0
    bar.close()
    return {"strategy": strategy, "engine": "threads", "workers": 1 if strategy == "local" else workers,
            "servers": servers if strategy == "ps" else 0,
            "consistency": consistency if strategy == "ps" else "bsp", "epochs": epochs, "batch": batch,
            "train_examples": len(ytr), "test_examples": len(yte), "auc": metrics["auc"],
            "logloss": metrics["logloss"], "seconds": seconds,
            "examples_per_s": epochs * len(ytr) / seconds, "bytes_sent": sum(c.bytes_sent for c in counters)}


def run_simulated(consistency: str, workers: int, horizon: float, slowdown: float, staleness: int,
                  backups: int) -> dict[str, Any]:
    """Run ``consistency`` on the consistency simulator; the result names the engine and model."""
    problem = HashedLogReg(seed=0)
    t0 = time.perf_counter()  # well under a second: no progress bar
    result = simulate(consistency, problem, n_workers=workers, horizon=horizon,
                      straggler=0 if slowdown != 1.0 else None, slowdown=slowdown,
                      staleness=staleness, backups=backups)
    seconds = time.perf_counter() - t0
    scores = problem.test_scores(result.final_weights)
    return {"strategy": "ps", "engine": "simulator",
            "note": (f"consistency '{consistency}' is not implemented on the real parameter servers; this ran the "
                     "consistency simulator (hashed logistic regression on the synthetic click log, simulated "
                     "clock, free communication), not Wide & Deep on InstEval"),
            "workers": workers, "servers": 0, "consistency": consistency, "slowdown_worker0": slowdown,
            "staleness": staleness if consistency == "ssp" else None,
            "backups": backups if consistency == "backup" else None, "horizon": horizon,
            "updates_applied": len(result.losses) - 1 if consistency != "easgd" else None,
            "dropped_gradients": result.dropped, "train_examples": len(problem.y),
            "test_examples": len(problem.test_y), "auc": auc(scores, problem.test_y),
            "logloss": result.losses[-1], "seconds": seconds,
            "examples_per_simulated_unit": problem.gradients_computed * problem.batch / horizon, "bytes_sent": 0}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m reference_impl.train", description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["wide_deep"])
    parser.add_argument("--strategy", choices=STRATEGIES, default="local")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2, help="server ranks (ps only)")
    parser.add_argument("--consistency", choices=MODELS, default="bsp",
                        help=f"ps only; {', '.join(SIMULATED)} run on the consistency simulator")
    parser.add_argument("--staleness", type=int, default=4, help="SSP bound s (simulated ssp only)")
    parser.add_argument("--backups", type=int, default=1, help="backup workers b (simulated backup only)")
    parser.add_argument("--slowdown", type=float, default=3.0,
                        help="worker 0 is this many times slower (simulated modes only; 1 = no straggler)")
    parser.add_argument("--horizon", type=float, default=200.0, help="simulated time units (simulated modes only)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--limit", type=int, default=None, help="train on the first N training examples")
    parser.add_argument("--json", action="store_true", help="print one JSON object, no progress bar")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.servers < 1 or args.epochs < 1 or args.batch < args.workers:
        parser.error("need --workers >= 1, --servers >= 1, --epochs >= 1 and --batch >= --workers")
    if args.limit is not None and args.limit < args.batch:
        parser.error("--limit must be at least --batch")
    if args.consistency != "bsp" and args.strategy != "ps":
        parser.error(f"--consistency {args.consistency} needs --strategy ps ({args.strategy} is always synchronous)")
    if args.consistency in SIMULATED:
        if args.staleness < 0 or args.backups < 0 or args.slowdown < 1.0 or args.horizon <= 0:
            parser.error("need --staleness >= 0, --backups >= 0, --slowdown >= 1 and --horizon > 0")
        result = run_simulated(args.consistency, args.workers, args.horizon, args.slowdown, args.staleness,
                               args.backups)
        if args.json:
            print(json.dumps(result))
        else:
            print(f"NOTE: {result['note']}.")
            print(f"ps/{result['consistency']} (simulated): test AUC {result['auc']:.4f}, "
                  f"log-loss {result['logloss']:.4f}, {result['examples_per_simulated_unit']:.0f} examples per "
                  f"simulated time unit, {result['dropped_gradients']} gradients dropped, bytes not modelled "
                  f"({result['workers']} workers, worker 0 {result['slowdown_worker0']:g}x slower)")
        return 0
    result = run(args.strategy, args.workers, args.servers, args.consistency, args.epochs, args.batch,
                 args.limit, show_progress=not args.json)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['strategy']}: test AUC {result['auc']:.4f}, log-loss {result['logloss']:.4f}, "
              f"{result['examples_per_s']:.0f} examples/s, {result['bytes_sent'] / 2**20:.1f} MiB sent "
              f"({result['workers']} workers, {result['servers']} servers, {result['consistency']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
