"""The Wide & Deep part of ``python -m benchmarks ps``: a quick run writes the tuned
LR peer and the three W&D models on InstEval and on the click log; the tuning never sees the
test split; the training command's defaults are the benchmark's chosen joint configuration;
the pages quote the committed figures; the click log's crosses are what its docstring says."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from page_tools import assert_pages_quote
from benchmarks import ps as bench
from reference_impl.models import ClickLog
from reference_impl.models.insteval import JOINT_CONFIG, load_insteval, train_test_split
from reference_impl.models.wide_deep import WideDeepConfig

ROOT = Path(__file__).resolve().parents[1]
PS_JSON = ROOT / "docs" / "assets" / "bench" / "ps.json"
KEYS = ["lr_peer", "wide", "deep", "joint"]

pytestmark = pytest.mark.timeout(120)


def test_quick_wide_deep_section_tunes_on_validation_only(tmp_path, monkeypatch):
    out = tmp_path / "ps.json"
    out.write_text(json.dumps({"benchmark": "ps", "traffic": [{"vocab_rows": 7}]}))
    _, _, te, _ = train_test_split(load_insteval())
    test_pairs = set(zip(te["s"].tolist(), te["d"].tolist()))
    seen: list[tuple[str, int, int]] = []

    def spy(name, real):
        def wrapped(*args, **kw):
            datasets = [a for a in args if isinstance(a, dict) and a and all(isinstance(v, np.ndarray) for v in a.values())]
            assert len(datasets) == 2, name  # the training part and the validation part, nothing else
            for data in datasets:
                if "s" in data:  # InstEval: no test (student, lecturer) pair is in the training split
                    assert not test_pairs & set(zip(data["s"].tolist(), data["d"].tolist())), name
            seen.append((name, *(len(next(iter(d.values()))) for d in datasets)))
            return real(*args, **kw)
        return wrapped

    monkeypatch.setattr(bench, "tune_wide_deep", spy("wide_deep", bench.tune_wide_deep))
    monkeypatch.setattr(bench, "tune_lr_peer", spy("lr_peer", bench.tune_lr_peer))
    assert bench.main(["--only", "wide_deep", "--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["traffic"] == [{"vocab_rows": 7}] and set(doc["section_machines"]) == {"wide_deep"}
    wd = doc["wide_deep"]
    # quick: the first 20,000 InstEval training ratings and 10,000 click-log examples, 80 / 20
    assert sorted(set(seen)) == [("lr_peer", 8000, 2000), ("lr_peer", 16000, 4000),
                                 ("wide_deep", 8000, 2000), ("wide_deep", 16000, 4000)]
    assert len(seen) == 2 * (1 + 3)
    for part in ("insteval", "click_log"):
        rows = wd[part]["rows"]
        assert [r["key"] for r in rows] == KEYS
        for r in rows:
            assert 0.5 < r["auc"] < 1 and r["logloss"] > 0 and 0 < r["valid_auc"] < 1, (part, r["key"])
            assert r["valid_auc"] == max(t["valid_auc"] for t in r["trials"])
        assert rows[0]["config"]["features"] in ("base one-hot", "base + crosses one-hot")
        assert rows[0]["config"]["C"] in wd["protocol"]["c_grid"]
        assert {t["config"]["features"] for t in rows[0]["trials"]} == {"base one-hot", "base + crosses one-hot"}
        assert "ftrl_alpha" in rows[1]["config"] and "embedding_dim" not in rows[1]["config"]
        assert "embedding_dim" in rows[2]["config"] and "ftrl_alpha" not in rows[2]["config"]
        assert {"ftrl_alpha", "embedding_dim", "epochs"} <= set(rows[3]["config"])
    ck = wd["click_log"]
    for r in ck["rows"]:
        assert r["auc_gap_to_bayes"] == pytest.approx(ck["bayes_auc"] - r["auc"])
        assert r["logloss_gap_to_bayes"] == pytest.approx(r["logloss"] - ck["bayes_logloss"])
    ins = wd["insteval"]
    assert abs(ins["parameter_servers"]["auc_minus_local"]) < 1e-9 and abs(ins["mirrored"]["auc_minus_local"]) < 1e-9
    assert ins["seen_in_training"]["s x d"] == 0.0

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import plot_ps
    finally:
        sys.path.pop(0)
    full = json.loads(PS_JSON.read_text())
    full["wide_deep"] = wd
    figures, summary = plot_ps.plot(out, full)
    assert figures["wide-deep"].startswith(b"<?xml") or b"<svg" in figures["wide-deep"][:400]
    assert "| logistic regression (scikit-learn, tuned) |" in summary and "Bayes AUC − test AUC" in summary


def test_the_draws_give_every_model_the_same_candidates():
    a, b = bench.draw_configs(8), bench.draw_configs(8)
    assert a == b and len(set(a)) == 8 and bench.draw_configs(3) == a[:3]
    for c in a:
        assert 0.3 <= c.ftrl_alpha <= 30 and c.embedding_dim in (4, 8, 16, 32)


def test_the_command_defaults_are_the_benchmarks_chosen_joint_configuration():
    from reference_impl.train.__main__ import build_parser, default_config

    joint = {r["key"]: r for r in json.loads(PS_JSON.read_text())["wide_deep"]["insteval"]["rows"]}["joint"]
    chosen = WideDeepConfig.from_dict({**WideDeepConfig().as_dict(), **joint["config"]})
    assert JOINT_CONFIG == chosen
    assert default_config(build_parser().parse_args(["wide_deep"])) == chosen


def test_the_click_logs_crosses_follow_its_formula():
    plain = ClickLog(n_fields=3, vocab_size=50)
    crossed = ClickLog(n_fields=3, vocab_size=50, cross_scale=1.0, latent_dim=4, latent_scale=0.5)
    ids, _ = crossed.sample(200, seed=4)
    assert np.array_equal(ids, plain.sample(200, seed=4)[0])  # the options change the labels, not the ids
    by_hand = plain.true_logit(ids)
    for f in range(3):
        for g in range(f + 1, 3):
            by_hand += crossed.true_pair_weight(ids[:, f], ids[:, g])
            by_hand += 0.5 * np.sum(crossed.true_latent(ids[:, f]) * crossed.true_latent(ids[:, g]), axis=1) / 2.0
    np.testing.assert_allclose(crossed.true_logit(ids), by_hand, rtol=1e-12)
    # a pair's weight depends on the pair only, and differs between pairs that share an id
    w = crossed.true_pair_weight(ids[:5, 0], ids[:5, 1])
    np.testing.assert_array_equal(w, crossed.true_pair_weight(ids[:5, 0].copy(), ids[:5, 1].copy()))
    assert len(np.unique(crossed.true_pair_weight(np.repeat(ids[:1, 0], 5), ids[:5, 1]))) > 1
    with pytest.raises(ValueError, match="latent_dim"):
        ClickLog(latent_scale=1.0)


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def page_figures() -> list[tuple[str, str]]:
    """Sentences the pages quote, formatted from the committed ps.json."""
    wd = json.loads(PS_JSON.read_text())["wide_deep"]
    ins = {r["key"]: r for r in wd["insteval"]["rows"]}
    ck = {r["key"]: r for r in wd["click_log"]["rows"]}
    bayes = wd["click_log"]["bayes_auc"]
    seen = wd["insteval"]["seen_in_training"]
    gap = lambda k: _fmt(bayes - ck[k]["auc"])  # noqa: E731
    j = ins["joint"]["config"]
    quotes = [
        ("concepts/wide-and-deep.md",
         f"LR peer {_fmt(ins['lr_peer']['auc'])}, wide-only {_fmt(ins['wide']['auc'])}, deep-only "
         f"{_fmt(ins['deep']['auc'])} and joint {_fmt(ins['joint']['auc'])} (log-loss "
         f"{_fmt(ins['lr_peer']['logloss'])}, {_fmt(ins['wide']['logloss'])}, {_fmt(ins['deep']['logloss'])} and "
         f"{_fmt(ins['joint']['logloss'])})"),
        ("concepts/wide-and-deep.md",
         f"validation AUC {_fmt(ins['lr_peer']['valid_auc'])}, {_fmt(ins['wide']['valid_auc'])}, "
         f"{_fmt(ins['deep']['valid_auc'])} and {_fmt(ins['joint']['valid_auc'])}"),
        ("concepts/wide-and-deep.md", f"`C` = {ins['lr_peer']['config']['C']:g}"),
        ("concepts/wide-and-deep.md",
         f"(student, department) {seen['s x dept']:.1%}, (lecturer, student age) {seen['d x studage']:.1%}, "
         f"(lecturer, service) {seen['d x service']:.1%}"),
        ("concepts/wide-and-deep.md",
         f"Bayes AUC {_fmt(bayes)}: LR peer {gap('lr_peer')}, wide-only {gap('wide')}, deep-only "
         f"{gap('deep')} and joint {gap('joint')}"),
        ("concepts/wide-and-deep.md",
         f"{wd['click_log']['pairs_seen_in_training']:.1%} of the test examples' pairs"),
        ("concepts/wide-and-deep.md",
         f"({j['epochs']} epochs, FTRL α {j['ftrl_alpha']:g}, embeddings of width {j['embedding_dim']})"),
        ("concepts/wide-and-deep.md", f"{j['embedding_dim']} in the tuned joint model"),
        ("concepts/wide-and-deep.md", f"{wd['insteval']['valid']:,} of the {wd['insteval']['train']:,}"),
        ("questions/n003-q1.md",
         f"joint model's test AUC was {_fmt(ins['joint']['auc'])} against {_fmt(ins['lr_peer']['auc'])} for a "
         f"tuned scikit-learn logistic regression, {_fmt(ins['wide']['auc'])} for wide-only and "
         f"{_fmt(ins['deep']['auc'])} for deep-only"),
        ("questions/n003-q1.md",
         f"gap to the Bayes AUC was {gap('joint')} for the joint model against {gap('deep')} for deep-only, "
         f"{gap('wide')} for wide-only and {gap('lr_peer')} for the logistic regression"),
    ]
    return quotes


def test_pages_quote_the_committed_wide_deep_figures():
    assert_pages_quote((ROOT / "docs" / page, text) for page, text in page_figures())
