"""Parameter servers, sparse tables, consistency models and Wide & Deep, measured.

``python -m benchmarks ps`` runs these parts in one process and writes
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
* ``wide_deep``: on InstEval and on the synthetic click log (with informative crosses,
  ``CLICK_LOG``), the LR peer (scikit-learn ``LogisticRegression`` on one-hot ids, the
  feature set and ``C`` chosen on validation) and wide-only, deep-only and joint Wide & Deep
  (FTRL wide part, Adagrad embeddings, Adam MLP), each tuned with the same budget on a
  validation split cut from the training data (random search over ``SEARCH_SPACE``, early
  stopping on validation AUC), then retrained on train + validation and scored on the test
  split: test AUC and log-loss, and on the click log the gap to the Bayes AUC and log-loss;
  the fraction of test values of each InstEval column and cross seen in training; and the
  tuned joint model again on 2 parameter servers + 2 workers and on 2 mirrored workers
  (thread ranks). The joint model's chosen settings are ``models.insteval.JOINT_CONFIG``,
  the defaults of ``python -m reference_impl.train wide_deep``. ``--quick`` tunes 2
  candidates for at most 2 epochs on 20,000 InstEval ratings and 10,000 click-log examples.
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

from reference_impl.comm import CountingCommunicator, allreduce, run_threads
from reference_impl.models import ClickLog
from reference_impl.models import feature_columns as fc
from reference_impl.models.click_log import logloss
from reference_impl.models.insteval import (
    CROSSES,
    insteval_columns,
    insteval_model,
    load_insteval,
    seen_in_training,
    train_test_split,
    train_validation_split,
)
from reference_impl.models.strategies import mirrored_rank, ps_rank
from reference_impl.models.wide_deep import WideDeep, WideDeepConfig, auc, build, early_stopping, fit
from reference_impl.ps import (
    SGD,
    ClusterSpec,
    ShardedSparseTable,
    sparse_table_pull,
    sparse_table_push,
)
from reference_impl.models.hashed_logreg import HashedLogReg
from reference_impl.ps.consistency import simulate
from reference_impl.ps.embedding import embedding_lookup, embedding_lookup_grad
from reference_impl.ps.hashing import uniform_from_ids
from reference_impl.ps.training import loss_and_grads, model_spec, run_ps_rank
from .harness import add_sections_argument, bench_parser, sectioned_document, sections_to_run, write_json
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
    make = lambda s: HashedLogReg(n_buckets=1024, batch=128, log=ClickLog(vocab_size=300), seed=s)  # noqa: E731
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

WD_MODELS = {"wide": "wide only (base + crosses, FTRL)", "deep": "deep only (embeddings + MLP, Adagrad/Adam)",
             "joint": "wide & deep (joint)"}
LR_PEER = "logistic regression (scikit-learn, tuned)"
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
# The search space every W&D model draws its candidates from (log-uniform ranges, one choice).
SEARCH_SPACE = {"ftrl_alpha": [0.3, 30.0], "ftrl_l1": [1e-4, 1e-2], "ftrl_l2": [1e-3, 1.0],
                "embedding_dim": [4, 8, 16, 32], "embedding_lr": [0.01, 0.3], "mlp_lr": [1e-4, 3e-3],
                "embedding_l2": [0.01, 10.0]}
# The synthetic click log of the Wide & Deep demonstration: additive per-id weights plus, for
# every pair of fields, a random weight per pair of ids (memorisable) and a low-rank part
# (generalisable): see ``models.click_log``.
CLICK_LOG = {"n_fields": 3, "vocab_size": 300, "zipf_exponent": 1.0, "weight_scale": 1.5, "bias": -1.0,
             "cross_scale": 1.0, "latent_dim": 4, "latent_scale": 1.0}


def draw_configs(n: int, seed: int = 2016) -> list[WideDeepConfig]:
    """``n`` candidate configurations drawn from ``SEARCH_SPACE`` (random search). Wide-only,
    deep-only and joint models all get this same list, each reading its own settings, so
    every model has the same budget."""
    rng = np.random.default_rng(seed)
    log_uniform = lambda lo, hi: float(f"{10 ** rng.uniform(np.log10(lo), np.log10(hi)):.3g}")  # noqa: E731
    out = []
    for _ in range(n):
        draw = {k: int(rng.choice(v)) if k == "embedding_dim" else log_uniform(*v) for k, v in SEARCH_SPACE.items()}
        out.append(WideDeepConfig(**draw))
    return out


def tune_wide_deep(mode: str, make: Callable[[str, WideDeepConfig], WideDeep], candidates: list[WideDeepConfig],
                   train: dict[str, np.ndarray], ytrain: np.ndarray, valid: dict[str, np.ndarray],
                   yvalid: np.ndarray, max_epochs: int, patience: int) -> dict[str, Any]:
    """Every candidate trained on ``train`` with early stopping on ``valid`` (validation AUC);
    the best one, its epoch count set to where its validation AUC peaked. Sees no test data."""
    trials = []
    for config in candidates:
        result = early_stopping(lambda: make(mode, config), train, ytrain, valid, yvalid, max_epochs, patience)
        trials.append({"config": config.with_epochs(result["epochs"]).relevant(mode), **result})
    best = max(trials, key=lambda t: t["valid_auc"])
    return {"config": best["config"], "valid_auc": best["valid_auc"], "valid_logloss": best["valid_logloss"],
            "trials": trials}


def _id_matrix(columns: list, features: dict[str, np.ndarray]) -> np.ndarray:
    return np.stack([c.ids(features) for c in columns], axis=1)


def _fit_lr(columns: list, c: float, features: dict[str, np.ndarray], labels: np.ndarray):
    """scikit-learn's LogisticRegression on the one-hot ids of ``columns`` (L2 penalty ``1/C``,
    liblinear, which solves to its tolerance); returns a function from features to logits."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import OneHotEncoder

    encoder = OneHotEncoder(handle_unknown="ignore").fit(_id_matrix(columns, features))
    model = LogisticRegression(C=c, solver="liblinear", max_iter=1000)
    model.fit(encoder.transform(_id_matrix(columns, features)), labels)
    if model.n_iter_.max() >= model.max_iter:
        raise RuntimeError(f"LogisticRegression did not converge (C={c})")
    return lambda feats: model.decision_function(encoder.transform(_id_matrix(columns, feats))), int(model.n_iter_.max())


def tune_lr_peer(feature_sets: dict[str, list], train: dict[str, np.ndarray], ytrain: np.ndarray,
                 valid: dict[str, np.ndarray], yvalid: np.ndarray, c_grid: tuple[float, ...]) -> dict[str, Any]:
    """The LR peer: every (feature set, C) fitted on ``train`` and scored on ``valid``; the one
    with the best validation AUC. Sees no test data."""
    trials = []
    for name, columns in feature_sets.items():
        for c in c_grid:
            predict, iters = _fit_lr(columns, c, train, ytrain)
            z = predict(valid)
            trials.append({"config": {"features": name, "C": c}, "valid_auc": auc(z, yvalid),
                           "valid_logloss": logloss(z, yvalid), "iterations": iters})
    best = max(trials, key=lambda t: t["valid_auc"])
    return {"config": best["config"], "valid_auc": best["valid_auc"], "valid_logloss": best["valid_logloss"],
            "trials": trials}


def compare(make: Callable[[str, WideDeepConfig], WideDeep], feature_sets: dict[str, list],
            train: dict[str, np.ndarray], ytrain: np.ndarray, test: dict[str, np.ndarray], ytest: np.ndarray,
            trials: int, max_epochs: int, patience: int, c_grid: tuple[float, ...], label: str) -> list[dict[str, Any]]:
    """The LR peer and the three W&D models: each tuned on a validation split cut from
    ``train`` (the test split is not passed to the tuning), then retrained with its chosen
    configuration on the whole of ``train`` (train + validation) and scored on the test split."""
    fit_x, fit_y, valid_x, valid_y = train_validation_split(train, ytrain)
    rows = []
    t0 = time.perf_counter()
    tuned = tune_lr_peer(feature_sets, fit_x, fit_y, valid_x, valid_y, c_grid)
    predict, _ = _fit_lr(feature_sets[tuned["config"]["features"]], tuned["config"]["C"], train, ytrain)
    z = predict(test)
    rows.append({"key": "lr_peer", "model": LR_PEER, **tuned, "auc": auc(z, ytest), "logloss": logloss(z, ytest),
                 "seconds": time.perf_counter() - t0})
    candidates = draw_configs(trials)
    for mode, name in WD_MODELS.items():
        t0 = time.perf_counter()
        tuned = tune_wide_deep(mode, make, candidates, fit_x, fit_y, valid_x, valid_y, max_epochs, patience)
        config = WideDeepConfig.from_dict({**WideDeepConfig().as_dict(), **tuned["config"]})
        model = make(mode, config)
        fit(model, train, ytrain, epochs=config.epochs, batch=256)
        rows.append({"key": mode, "model": name, **tuned, **model.evaluate(test, ytest),
                     "seconds": time.perf_counter() - t0})
    for r in rows:
        print(f"  wide_deep {label} {r['model']}: valid AUC {r['valid_auc']:.4f}, test AUC {r['auc']:.4f}, "
              f"log-loss {r['logloss']:.4f} ({r['config']})", flush=True)
    return rows


def wide_deep(quick: bool) -> dict[str, Any]:
    """InstEval and the synthetic click log: the LR peer and wide-only, deep-only and joint
    Wide & Deep, each tuned on a validation split (random search, early stopping), then the
    joint model again on parameter servers and on mirrored workers.

    BLAS runs on one thread here: the MLP's matrices are small (batch 256, width 64), so
    more threads only wait for each other, and on a loaded machine much longer."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _wide_deep(quick)


def _wide_deep(quick: bool) -> dict[str, Any]:
    trials, max_epochs, patience = (2, 2, 1) if quick else (8, 20, 3)
    c_grid = (0.1, 1.0) if quick else C_GRID
    tr, ytr, te, yte = train_test_split(load_insteval())
    if quick:  # a smoke run: the first 20,000 training ratings
        tr, ytr = {k: v[:20_000] for k, v in tr.items()}, ytr[:20_000]
    base, wide, _ = insteval_columns()
    rows = compare(lambda mode, config, **kw: insteval_model(mode, config, **kw),
                   {"base one-hot": base, "base + crosses one-hot": wide}, tr, ytr, te, yte, trials, max_epochs,
                   patience, c_grid, "insteval")
    joint = rows[-1]
    config = WideDeepConfig.from_dict({**WideDeepConfig().as_dict(), **joint["config"]})
    # The joint model again, with its tables on 2 parameter servers and the MLP all-reduced
    # between 2 workers (thread ranks): same batches, so the same model up to rounding.
    build_joint = lambda **kw: insteval_model("joint", config, **kw)  # noqa: E731
    t0 = time.perf_counter()
    ranks = run_threads(4, ps_rank, ClusterSpec(2, 2), build_joint, tr, ytr, te, yte, config.epochs, 256,
                        timeout=600)
    strategy = {"model": "wide & deep (joint), 2 servers + 2 workers", "auc": ranks[2]["auc"],
                "logloss": ranks[2]["logloss"], "seconds": time.perf_counter() - t0,
                "auc_minus_local": ranks[2]["auc"] - joint["auc"],
                "ids_sent_per_worker": [r["ids_sent"] for r in ranks[2:]]}
    print(f"  wide_deep on parameter servers: AUC {strategy['auc']:.4f} "
          f"({strategy['auc_minus_local']:+.2e} vs one process)", flush=True)
    t0 = time.perf_counter()
    ranks = run_threads(2, mirrored_rank, build_joint, tr, ytr, te, yte, config.epochs, 256, timeout=600)
    mirrored = {"model": "wide & deep (joint), 2 mirrored workers", "auc": ranks[0]["auc"],
                "logloss": ranks[0]["logloss"], "seconds": time.perf_counter() - t0,
                "auc_minus_local": ranks[0]["auc"] - joint["auc"],
                "rows_stored_per_worker": [r["rows_stored"] for r in ranks],
                "rows_received_per_worker": [r["rows_received"] for r in ranks]}
    print(f"  wide_deep mirrored: AUC {mirrored['auc']:.4f} ({mirrored['auc_minus_local']:+.2e} vs one process)",
          flush=True)
    seen = {" x ".join(keys): seen_in_training(tr, te, keys)
            for keys in (("s",), ("d",), *CROSSES)}
    insteval = {"train": len(ytr), "valid": int(round(0.2 * len(ytr))), "test": len(yte), "rows": rows,
                "seen_in_training": seen, "parameter_servers": strategy, "mirrored": mirrored}

    log = ClickLog(**CLICK_LOG)
    n_train, n_test = (10_000, 5_000) if quick else (60_000, 20_000)
    ids, labels = log.sample(n_train, seed=1)
    test_ids, test_labels = log.sample(n_test, seed=2)
    fields = [fc.dynamic_categorical_column(f"f{k}") for k in range(log.n_fields)]
    pairs = [(f, g) for f in range(log.n_fields) for g in range(f + 1, log.n_fields)]
    crosses = [fc.crossed_column([fields[f], fields[g]], 2**20) for f, g in pairs]
    feats = lambda x: {f"f{k}": x[:, k] for k in range(log.n_fields)}  # noqa: E731

    def make_click(mode: str, config: WideDeepConfig, **kw: Any) -> WideDeep:
        deep = [fc.embedding_column(c, config.embedding_dim) for c in fields]
        return build(fields + crosses, deep, mode, config, **kw)

    click_rows = compare(make_click, {"base one-hot": fields, "base + crosses one-hot": fields + crosses},
                         feats(ids), labels, feats(test_ids), test_labels, trials, max_epochs, patience, c_grid,
                         "click log")
    bayes = {"bayes_auc": auc(log.true_logit(test_ids), test_labels),
             "bayes_logloss": log.bayes_logloss(test_ids, test_labels)}
    for r in click_rows:
        r["auc_gap_to_bayes"] = bayes["bayes_auc"] - r["auc"]
        r["logloss_gap_to_bayes"] = r["logloss"] - bayes["bayes_logloss"]
    additive = log.bias + log.true_weight(test_ids.ravel()).reshape(test_ids.shape).sum(axis=1)
    train_pairs = {(f, g): set(zip(ids[:, f].tolist(), ids[:, g].tolist())) for f, g in pairs}
    click = {"generator": CLICK_LOG, "train": n_train, "valid": int(round(0.2 * n_train)), "test": n_test, **bayes,
             "additive_part_auc": auc(additive, test_labels), "rows": click_rows,
             "pairs_seen_in_training": float(np.mean([[p in train_pairs[f, g] for p in zip(test_ids[:, f].tolist(),
                                                                                             test_ids[:, g].tolist())]
                                                      for f, g in pairs]))}
    protocol = {"valid_fraction": 0.2, "trials": trials, "max_epochs": max_epochs, "patience": patience,
                "c_grid": list(c_grid), "search_space": SEARCH_SPACE, "batch": 256,
                "lr_peer": "scikit-learn LogisticRegression(C, penalty l2, solver liblinear) on "
                           "OneHotEncoder(handle_unknown='ignore') of the columns' ids; features and C chosen",
                "selection": "validation AUC", "retrained_on": "train + validation (the whole training split)"}
    return {"protocol": protocol, "insteval": insteval, "click_log": click}


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
    add_sections_argument(parser, SECTIONS)
    args = parser.parse_args(argv)
    q = args.quick
    run = sections_to_run(parser, args, SECTIONS)
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
        parts["wide_deep"] = wide_deep(q)
    machine = machine_info(mpi_library="not used (thread ranks)")
    document = sectioned_document(args, "ps", parts, machine, {"quick": q})
    write_json(args.out, document)
    print(f"wrote {args.out}")
    for t in parts.get("throughput", []):
        print(f"batch {t['batch']} (table of {t['table_rows_before']} rows): "
              f"{t['keys_per_s']['sparse_table']:.3g} keys/s, {t['slowdown_vs_lower_bound']:.2f}x the NumPy "
              f"lower bound's time (mean {t['mean_slowdown_vs_lower_bound']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
