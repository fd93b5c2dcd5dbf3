"""Parameter servers, sparse tables, consistency models and Wide & Deep, measured.

``python -m reference_impl.bench ps`` runs these parts in one process and writes
``bench-results/ps.json`` (with ``--publish``, the site's ``docs/assets/bench/ps.json``;
``--only PART`` runs one and replaces it in that file):

* ``throughput``: ``sparse_table_pull`` + ``sparse_table_push`` (dedupe, index lookup,
  row creation, gather, duplicate-summing gradient, SGD) in keys per second, against a
  NumPy lower bound timed in the same run, interleaved: ``np.unique`` + ``take`` + gather
  + scatter-add by ``np.bincount`` + SGD on a dense table that already holds every row
  (so it pays no index lookup and no row creation); for a table that starts empty and
  for one that already holds ~175,000 rows (``--only throughput`` re-measures just this);
* ``traffic``: bytes sent per training step and step time on thread ranks (2 servers +
  2 workers for the parameter server; the same 2 workers all-reducing for the mirrored
  strategy), for a sparse embedding model at several vocabulary sizes and for a
  dense-only model, counted by ``CountingCommunicator``;
* ``consistency``: BSP, ASP, SSP (s = 1, 4, 16), backup workers and EASGD on 4 workers,
  with one persistent 3x straggler and with transient 3x stragglers (each step, each
  worker with probability 0.1), in *simulated* time (one unit = one normal worker step):
  loss curves, time to a target test log-loss, and staleness histograms;
* ``collisions``: the measured fraction of distinct values that share a hash bucket
  with another (``categorical_column_with_hash_bucket``), against the birthday formula;
  ``collisions_by_buckets``: the same against the bucket count, also for a crossed column
  over every pair of small ids and for a polynomial cross that does not mix;
* ``wide_deep``: test AUC and log-loss on InstEval of plain logistic regression (one-hot
  base columns), wide-only (with crosses), deep-only and joint Wide & Deep, and the joint
  model again on 2 parameter servers + 2 workers and on 2 mirrored workers (thread
  ranks); and on the synthetic
  click log, a wide model's log-loss against the true model's (Bayes) log-loss.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from ..comm import CountingCommunicator, allreduce, run_threads
from ..models import ClickLog
from ..models import feature_columns as fc
from ..models.insteval import insteval_columns, load_insteval, train_test_split
from ..models.strategies import mirrored_rank, ps_rank
from ..models.wide_deep import WideDeep, auc, fit
from ..ps import (
    FTRL,
    SGD,
    Adagrad,
    ClusterSpec,
    ShardedSparseTable,
    sparse_table_pull,
    sparse_table_push,
)
from ..ps.consistency import HashedLogReg, simulate
from ..ps.embedding import embedding_lookup, embedding_lookup_grad
from ..ps.hashing import uniform_from_ids
from ..ps.training import loss_and_grads, model_spec, run_ps_rank
from .harness import bench_parser, write_json
from .machine import machine_info



# --------------------------------------------------------------------------- throughput


def throughput(batch: int, vocab: int, dim: int, repeats: int, warm_draws: int = 0,
               seed: int = 0) -> dict[str, Any]:
    """keys/s of pull+push through the temporary matrix vs the NumPy lower bound.

    ``warm_draws == 0``: the table starts empty, so each batch creates the rows of its
    first-seen ids (the start of training). Otherwise the table first pulls the distinct
    ids of ``warm_draws`` earlier draws from the same distribution, untimed, so it holds
    many more rows than a batch touches and fewer ids per batch are new (a long run).

    Times are this thread's CPU time (``time.thread_time``), both implementations timed
    in turn on every batch: on a machine shared with other work, being preempted does
    not count, and both see the same cache and memory traffic. Both are single-threaded.
    """
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.05
    p /= p.sum()
    batches = [rng.choice(vocab, batch, p=p) for _ in range(repeats + 1)]
    table = ShardedSparseTable(1, dim, SGD(0.01))
    if warm_draws:
        table.pull(np.unique(rng.choice(vocab, warm_draws, p=p)))
    rows_before = len(table)
    dense = np.full((vocab, dim), 0.0)  # np.full writes every page now: no first-touch faults in the timing
    grad_out = rng.standard_normal((batch, dim))
    columns = np.arange(dim)

    def ours(ids):
        temp = sparse_table_pull(table, ids)
        embedding_lookup(temp)
        sparse_table_push(table, temp, embedding_lookup_grad(temp, grad_out))

    def lower_bound(ids):  # the cheapest plain-NumPy unique + take + gather + scatter-add + SGD
        unique, inverse = np.unique(ids, return_inverse=True)
        rows = dense.take(unique, axis=0)
        rows[inverse]
        flat = (inverse[:, None] * dim + columns).ravel()  # scatter-add by bincount (add.at is ~4x slower)
        g = np.bincount(flat, weights=grad_out.ravel(), minlength=rows.size).reshape(rows.shape)
        dense[unique] -= 0.01 * g

    ours(batches[0]), lower_bound(batches[0])  # warm up
    times: dict[str, list[float]] = {"sparse_table": [], "numpy_lower_bound": []}
    for ids in batches[1:]:
        for name, fn in (("sparse_table", ours), ("numpy_lower_bound", lower_bound)):
            t0 = time.thread_time()
            fn(ids)
            times[name].append(time.thread_time() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    mean = {k: statistics.fmean(v) for k, v in times.items()}
    return {"batch": batch, "vocab": vocab, "dim": dim, "repeats": repeats, "warm_draws": warm_draws,
            "table_rows_before": rows_before, "table_rows_after": len(table),
            "unique_per_batch": float(np.mean([len(np.unique(b)) for b in batches])),
            "median_s": med, "mean_s": mean, "keys_per_s": {k: batch / v for k, v in med.items()},
            "slowdown_vs_lower_bound": med["sparse_table"] / med["numpy_lower_bound"],
            "mean_slowdown_vs_lower_bound": mean["sparse_table"] / mean["numpy_lower_bound"]}


# --------------------------------------------------------------------------- traffic


def _mirrored_rank(comm, vocab_ids, ids, labels, steps, batch, dim):
    """Mirrored strategy: every worker holds the whole table densely and all-reduces its gradient."""
    spec = model_spec(dim)
    row_of = {k: i for i, k in enumerate(vocab_ids.tolist())}
    table = spec.sparse[0].init_scale * uniform_from_ids(vocab_ids, dim, spec.sparse[0].seed)
    w, b = spec.dense[0].initial.copy(), spec.dense[1].initial.copy()
    per = batch // comm.size
    for step in range(steps):
        lo = (step * batch + comm.rank * per) % len(ids)
        rows = np.vectorize(row_of.__getitem__)(ids[lo:lo + per])
        _, d_emb, dw, db = loss_and_grads(table[rows], w, b, labels[lo:lo + per], 1.0 / batch)
        g_table = np.zeros_like(table)
        np.add.at(g_table, rows.ravel(), d_emb.reshape(-1, dim))
        flat = allreduce(comm, np.concatenate([g_table.ravel(), dw, db]))
        table -= 0.5 * flat[:table.size].reshape(table.shape)
        w -= 0.5 * flat[table.size:table.size + dim]
        b -= 0.5 * flat[-1:]


def _timed_threads(n, fn, *args):
    counters: list[CountingCommunicator] = []

    def wrap(c):
        counters.append(CountingCommunicator(c))
        return counters[-1]

    t0 = time.perf_counter()
    run_threads(n, fn, *args, timeout=120, wrap=wrap)
    return time.perf_counter() - t0, sum(c.bytes_sent for c in counters)


def traffic(vocabs: list[int], steps: int, batch: int, dim: int) -> list[dict[str, Any]]:
    """Bytes per step and seconds per step: PS (2 servers + 2 workers) vs mirrored (2 workers)."""
    out = []
    for vocab in vocabs:
        log = ClickLog(n_fields=4, vocab_size=vocab)
        ids, labels = log.sample(steps * batch, seed=1)
        vocab_ids = np.unique(np.concatenate([log.feature_ids(f, np.arange(vocab)) for f in range(4)]))
        ps_t, ps_b = _timed_threads(4, run_ps_rank, ClusterSpec(2, 2), model_spec(dim), ids, labels,
                                    steps, batch, True, "ps")
        mr_t, mr_b = _timed_threads(2, _mirrored_rank, vocab_ids, ids, labels, steps, batch, dim)
        out.append({"model": "sparse embedding", "vocab_rows": len(vocab_ids), "dim": dim, "batch": batch,
                    "unique_ids_per_step": float(np.mean([len(np.unique(ids[i:i + batch]))
                                                          for i in range(0, len(ids), batch)])),
                    "ps_bytes_per_step": ps_b / steps, "mirrored_bytes_per_step": mr_b / steps,
                    "ps_s_per_step": ps_t / steps, "mirrored_s_per_step": mr_t / steps})
    return out


# --------------------------------------------------------------------------- consistency

CONSISTENCY_RUNS = [("bsp", {}), ("asp", {}), ("ssp", {"staleness": 1}), ("ssp", {"staleness": 4}),
                    ("ssp", {"staleness": 16}), ("backup", {"backups": 1}), ("easgd", {})]
SCENARIOS = {"persistent": {"straggler": 0, "straggle_prob": 0.0},
             "transient": {"straggler": None, "straggle_prob": 0.1}}


def consistency(horizon: float, seeds: int) -> dict[str, Any]:
    """Each model under each straggler scenario. Seed ``s`` draws its own data, so its target
    is the level straggler-free BSP's test loss sits at around 15% of the horizon (its mean
    over 10%..20%, not the luckiest dip of a noisy curve). BSP with a persistent 3x straggler
    pays 3x per round, so it needs ~45% of the horizon for the same loss: every model has room
    to get there, and the time it takes is the measurement."""
    make = lambda s: HashedLogReg(n_buckets=1024, batch=128, log=ClickLog(vocab_size=300), seed=s)
    out: dict[str, Any] = {"horizon": horizon, "seeds": seeds, "workers": 4, "slowdown": 3.0, "scenarios": {}}
    refs = [simulate("bsp", make(s), horizon=horizon, straggler=None, seed=s) for s in range(seeds)]
    targets = [r.mean_loss(0.10 * horizon, 0.20 * horizon) for r in refs]  # per seed
    out["target_logloss"] = float(np.mean(targets))
    out["target_logloss_per_seed"] = targets
    out["bayes_logloss"] = make(0).bayes
    for scenario, kw in SCENARIOS.items():
        rows = []
        for model, extra in CONSISTENCY_RUNS:
            runs = [simulate(model, make(s), horizon=horizon, seed=s, **kw, **extra) for s in range(seeds)]
            label = model + (f" s={extra['staleness']}" if "staleness" in extra else "")
            hist = np.bincount(np.concatenate([r.staleness for r in runs]).astype(int)) if runs[0].staleness else []
            grid = np.linspace(0, horizon, 61)
            curve = np.mean([[min([l for t, l in zip(r.times, r.losses) if t <= g] or [r.losses[0]])
                              for g in grid] for r in runs], axis=0)
            reached = [r.time_to(target) for r, target in zip(runs, targets)]
            rows.append({"model": label, "time_to_target": reached,
                         "updates": [len(r.losses) - 1 for r in runs], "final_logloss": [r.losses[-1] for r in runs],
                         "staleness_histogram": [int(v) for v in hist], "dropped": sum(r.dropped for r in runs),
                         "curve_time": grid.tolist(), "curve_best_logloss": curve.tolist()})
            print(f"  consistency {scenario:>10} {label:>8}: time to target {statistics.median(reached):.1f}",
                  flush=True)
        out["scenarios"][scenario] = rows
    return out


# --------------------------------------------------------------------------- Wide & Deep


def wide_deep(epochs: int) -> dict[str, Any]:
    tr, ytr, te, yte = train_test_split(load_insteval())
    base, wide, deep = insteval_columns()
    ftrl = lambda: FTRL(alpha=0.3, beta=1.0, l1=0.0, l2=3.0)
    models = {"logistic regression (base one-hot)": WideDeep(base, [], mode="wide", wide_optimizer=ftrl()),
              "wide only (base + crosses, FTRL)": WideDeep(wide, deep, mode="wide", wide_optimizer=ftrl()),
              "deep only (embeddings + MLP, Adagrad/Adam)": WideDeep(wide, deep, mode="deep"),
              "wide & deep (joint)": WideDeep(wide, deep, mode="joint", wide_optimizer=ftrl())}
    rows = []
    for name, model in models.items():
        t0 = time.perf_counter()
        history = fit(model, tr, ytr, epochs=epochs, batch=256)
        metrics = model.evaluate(te, yte)
        rows.append({"model": name, **metrics, "train_loss": history, "seconds": time.perf_counter() - t0})
        print(f"  wide_deep {name}: AUC {metrics['auc']:.4f} log-loss {metrics['logloss']:.4f}", flush=True)
    # The joint model again, with its tables on 2 parameter servers and the MLP all-reduced
    # between 2 workers (thread ranks): same batches, so the same model up to rounding.
    t0 = time.perf_counter()
    build = lambda **kw: WideDeep(wide, deep, mode="joint", wide_optimizer=ftrl(), **kw)
    ranks = run_threads(4, ps_rank, ClusterSpec(2, 2), build, tr, ytr, te, yte, epochs, 256, timeout=600)
    joint = rows[-1]
    strategy = {"model": "wide & deep (joint), 2 servers + 2 workers", "auc": ranks[2]["auc"],
                "logloss": ranks[2]["logloss"], "seconds": time.perf_counter() - t0,
                "auc_minus_local": ranks[2]["auc"] - joint["auc"],
                "ids_sent_per_worker": [r["ids_sent"] for r in ranks[2:]]}
    print(f"  wide_deep on parameter servers: AUC {strategy['auc']:.4f} "
          f"({strategy['auc_minus_local']:+.2e} vs one process)", flush=True)
    t0 = time.perf_counter()
    ranks = run_threads(2, mirrored_rank, build, tr, ytr, te, yte, epochs, 256, timeout=600)
    mirrored = {"model": "wide & deep (joint), 2 mirrored workers", "auc": ranks[0]["auc"],
                "logloss": ranks[0]["logloss"], "seconds": time.perf_counter() - t0,
                "auc_minus_local": ranks[0]["auc"] - joint["auc"],
                "rows_stored_per_worker": [r["rows_stored"] for r in ranks],
                "rows_received_per_worker": [r["rows_received"] for r in ranks]}
    print(f"  wide_deep mirrored: AUC {mirrored['auc']:.4f} ({mirrored['auc_minus_local']:+.2e} vs one process)",
          flush=True)
    log = ClickLog(n_fields=3, vocab_size=200, zipf_exponent=0.5)
    ids, labels = log.sample(60_000, seed=1)
    test_ids, test_labels = log.sample(10_000, seed=2)
    cols = [fc.dynamic_categorical_column(f"f{k}") for k in range(3)]
    feats = lambda x: {f"f{k}": x[:, k] for k in range(3)}
    model = WideDeep(cols, [], mode="wide", wide_optimizer=Adagrad(0.5, 1e-3), deep_optimizer=SGD(0.3))
    fit(model, feats(ids), labels, epochs=2, batch=256)
    click = model.evaluate(feats(test_ids), test_labels)
    click["bayes_logloss"] = log.bayes_logloss(test_ids, test_labels)
    click["bayes_auc"] = auc(log.true_logit(test_ids), test_labels)
    return {"insteval": {"train": len(ytr), "test": len(yte), "epochs": epochs, "rows": rows,
                         "parameter_servers": strategy, "mirrored": mirrored},
            "click_log": click}


def collisions(buckets: int = 100_000) -> list[dict[str, Any]]:
    """Measured fraction of distinct values sharing a hash bucket, against 1 - (1 - 1/m)^(n-1)."""
    out = []
    for n in (1_000, 5_000, 10_000, 50_000, 100_000, 200_000):
        out.append({"values": n, "buckets": buckets, "measured": fc.collision_rate(n, buckets),
                    "birthday_formula": 1 - (1 - 1 / buckets) ** (n - 1)})
    return out


def _shared_fraction(buckets: np.ndarray) -> float:
    """Fraction of entries (distinct values) whose bucket holds another entry too."""
    _, inverse, counts = np.unique(buckets, return_inverse=True, return_counts=True)
    return float(np.mean(counts[inverse] > 1))


def collisions_by_buckets(side: int = 100) -> list[dict[str, Any]]:
    """Collision rate against the bucket count m, for n = side**2 distinct values: random ids
    through a hash-bucket column, and every (i, j) pair of ids below ``side`` through a crossed
    column (the structured input a weak cross would cluster), against the birthday formula and
    against a polynomial cross ``(31 i + j) mod m`` that does not mix its inputs."""
    n = side * side
    grid = np.stack(np.meshgrid(np.arange(side), np.arange(side), indexing="ij"), -1).reshape(-1, 2)
    cross = fc.cross_hash([grid[:, 0], grid[:, 1]])
    out = []
    for m in (2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000):
        out.append({"values": n, "buckets": m, "hash_bucket_measured": fc.collision_rate(n, m),
                    "crossed_pairs_measured": _shared_fraction(fc.hash_to_bucket(cross, m)),
                    "polynomial_cross_measured": _shared_fraction((31 * grid[:, 0] + grid[:, 1]) % m),
                    "birthday_formula": 1 - (1 - 1 / m) ** (n - 1)})
    return out


SECTIONS = ("throughput", "traffic", "consistency", "collisions", "wide_deep")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("ps", __doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not for the site)")
    parser.add_argument("--only", choices=SECTIONS, action="append",
                        help="run only this part (repeatable) and replace it in the existing output file "
                             "(--out, --publish or the default), "
                             "keeping the other parts; its machine goes under 'section_machines'")
    args = parser.parse_args(argv)
    q = args.quick
    run = set(args.only or SECTIONS)
    if args.only and not args.out.exists():
        parser.error(f"--only replaces parts of an existing file, and {args.out} does not exist")
    parts: dict[str, Any] = {}
    if "throughput" in run:
        print("throughput ...", flush=True)
        parts["throughput"] = [throughput(b, 1_000_000, 16, 5 if q else 41, warm)
                               for warm in (0, 1_000_000) for b in ((4096,) if q else (1024, 8192, 65536))]
    if "traffic" in run:
        print("traffic ...", flush=True)
        parts["traffic"] = traffic([100, 1000] if q else [100, 1000, 10_000, 50_000], 3 if q else 8, 256, 8)
    if "consistency" in run:
        print("consistency ...", flush=True)
        parts["consistency"] = consistency(40.0 if q else 300.0, 1 if q else 3)
    if "collisions" in run:
        parts["collisions"] = collisions()
        parts["collisions_by_buckets"] = collisions_by_buckets()
    if "wide_deep" in run:
        print("wide & deep ...", flush=True)
        parts["wide_deep"] = wide_deep(1 if q else 3)
    machine = machine_info(mpi_library="not used (thread ranks)")
    if args.only:
        document = json.loads(args.out.read_text(encoding="utf-8"))
        document.update(parts)
        document.setdefault("section_machines", {}).update({k: machine for k in parts})
    else:
        document = {"benchmark": "ps", "machine": machine, "settings": {"quick": q}, **parts}
    write_json(args.out, document)
    print(f"wrote {args.out}")
    for t in parts.get("throughput", []):
        print(f"batch {t['batch']} (table of {t['table_rows_before']} rows): "
              f"{t['keys_per_s']['sparse_table']:.3g} keys/s, {t['slowdown_vs_lower_bound']:.2f}x the NumPy "
              f"lower bound's time (mean {t['mean_slowdown_vs_lower_bound']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
