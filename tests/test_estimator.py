"""Estimator: train/evaluate/predict/export, checkpoints, resume after kill -9, data parallel on thread ranks."""
import os
import signal
import time

import numpy as np
import pytest

import reference_impl.graph as g
from reference_impl.comm import run_threads
from reference_impl.train import (Dataset, Estimator, EstimatorSpec, ModelMismatchError, latest_step,
                                  load_checkpoint, load_exported, synthetic_classification)
from reference_impl.train.optimizers import Adam

pytestmark = pytest.mark.timeout(90)

X, Y = synthetic_classification(512, 8, 3, seed=1)


def model_fn(features, labels, mode, params):
    rng = np.random.default_rng(0)
    w1 = g.Variable((rng.standard_normal((8, params.get("hidden", 16))) * 0.3).astype(np.float32), name="dense/kernel")
    b1 = g.Variable(np.zeros(params.get("hidden", 16), np.float32), name="dense/bias")
    w2 = g.Variable((rng.standard_normal((params.get("hidden", 16), 3)) * 0.3).astype(np.float32), name="out/kernel")
    logits = g.matmul(g.relu(g.add(g.matmul(features["x"], w1), b1)), w2)
    if mode == "predict":
        return EstimatorSpec(predictions={"logits": logits})
    loss = g.reduce_mean(g.sparse_softmax_cross_entropy(labels, logits))
    optimizer = Adam(0.01) if params.get("adam") else params.get("lr", 0.1)
    return EstimatorSpec(loss=loss, optimizer=optimizer, eval_metrics={"loss_again": loss})


def input_fn(ctx):
    return (Dataset.from_arrays(X, Y).shuffle(64, seed=0).repeat().shard(ctx.num_workers, ctx.worker_index)
            .batch(32 // ctx.num_workers).map(lambda b: ({"x": b[0]}, b[1])).skip(ctx.start_step))


def numpy_forward(state, x):
    h = np.maximum(x @ state["dense/kernel"] + state["dense/bias"], 0)
    return h @ state["out/kernel"]


def test_train_evaluate_predict_and_checkpoints(tmp_path, capsys):
    est = Estimator(model_fn, tmp_path, save_checkpoints_steps=10)
    est.train(input_fn, steps=25)
    assert [s for s, _ in est.history] == list(range(1, 26))
    assert np.mean([l for _, l in est.history[-5:]]) < 0.6 * est.history[0][1]
    assert sorted(p.name for p in tmp_path.glob("*.manifest.json")) == [
        f"ckpt-{s:010d}.manifest.json" for s in (10, 20, 25)]
    err = capsys.readouterr().err
    assert "25/25" in err and "loss=" in err and "ex_per_s=" in err
    state, step = load_checkpoint(tmp_path)
    assert step == 25
    result = est.evaluate(lambda ctx: Dataset.from_arrays(X, Y).batch(100).map(lambda b: ({"x": b[0]}, b[1])))
    logits = numpy_forward(state, X).astype(np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    assert result["global_step"] == 25
    assert result["loss"] == pytest.approx(-logp[np.arange(512), Y].mean(), rel=1e-5)
    assert result["loss_again"] == pytest.approx(result["loss"], rel=1e-6)
    np.testing.assert_allclose(est.predict({"x": X[:7]})["logits"], numpy_forward(state, X[:7]), rtol=1e-5, atol=1e-6)
    est.train(input_fn, steps=5)  # a second call resumes at 25
    assert est.history[-1][0] == 30 and latest_step(tmp_path) == 30


def test_export_and_load_without_the_model_fn(tmp_path):
    est = Estimator(model_fn, tmp_path / "model", progress=False)
    est.train(input_fn, steps=5)
    predict = load_exported(est.export(tmp_path / "export", {"x": X[:2]}))
    np.testing.assert_allclose(predict({"x": X[:9]})["logits"], est.predict({"x": X[:9]})["logits"], rtol=1e-6)
    with pytest.raises(KeyError, match="missing \\['x'\\]"):
        predict({"y": X[:2]})


def _fork_training(model_dir, max_steps, hang_at_batch):
    """A child process that trains, and stops (to be killed) when it asks for batch ``hang_at_batch``."""
    pid = os.fork()
    if pid == 0:
        try:
            served = iter(range(10**9))

            def stall(b):
                if next(served) >= hang_at_batch:
                    time.sleep(60)
                return b

            Estimator(model_fn, model_dir, save_checkpoints_steps=5, progress=False).train(
                lambda ctx: input_fn(ctx).map(stall), max_steps=max_steps)
        finally:
            os._exit(0)
    return pid


def test_resume_after_kill_9_reproduces_the_uninterrupted_run(tmp_path):
    whole = Estimator(model_fn, tmp_path / "whole", save_checkpoints_steps=5, progress=False)
    whole.train(input_fn, max_steps=40)
    crashed = tmp_path / "crashed"
    pid = _fork_training(crashed, 40, hang_at_batch=18)  # killed in the middle of step 18
    deadline = time.monotonic() + 30
    while (latest_step(crashed) or 0) < 15 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    resumed_from = latest_step(crashed)
    assert resumed_from == 15, resumed_from
    again = Estimator(model_fn, crashed, save_checkpoints_steps=5, progress=False)
    again.train(input_fn, max_steps=40)
    assert again.history[0][0] == resumed_from + 1
    assert again.history == whole.history[resumed_from:]  # the same losses, bit for bit
    a, b = load_checkpoint(tmp_path / "whole")[0], load_checkpoint(crashed)[0]
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_optimizer_slots_are_checkpointed_so_resume_with_adam_is_exact(tmp_path):
    whole = Estimator(model_fn, tmp_path / "whole", params={"adam": True}, progress=False)
    whole.train(input_fn, steps=12)
    split = Estimator(model_fn, tmp_path / "split", params={"adam": True}, progress=False)
    split.train(input_fn, steps=7)
    Estimator(model_fn, tmp_path / "split", params={"adam": True}, progress=False).train(input_fn, steps=5)
    a, b = load_checkpoint(tmp_path / "whole")[0], load_checkpoint(tmp_path / "split")[0]
    assert any("Adam" in k or "adam" in k.lower() for k in a)  # the moments are in the checkpoint
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_data_parallel_on_thread_ranks_equals_one_rank_on_the_global_batch(tmp_path):
    single = Estimator(model_fn, tmp_path / "single", progress=False)
    single.train(input_fn, steps=10)

    def rank(comm):
        est = Estimator(model_fn, tmp_path / "dp", comm=comm, progress=False)
        est.train(input_fn, steps=10)
        return est.history

    histories = run_threads(2, rank, timeout=60)
    assert histories[0] == histories[1]
    np.testing.assert_allclose([l for _, l in histories[0]], [l for _, l in single.history], rtol=1e-5)
    a, b = load_checkpoint(tmp_path / "single")[0], load_checkpoint(tmp_path / "dp")[0]
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_bad_input_is_named(tmp_path):
    Estimator(model_fn, tmp_path, progress=False).train(input_fn, steps=2)
    mismatch = "'dense/kernel': checkpoint has \\(8, 16\\) float32, the model has \\(8, 32\\)"
    with pytest.raises(ModelMismatchError, match=mismatch):
        Estimator(model_fn, tmp_path, params={"hidden": 32}, progress=False).train(input_fn, steps=1)
    with pytest.raises(ValueError, match="learning rate must be a positive number, got nan"):
        Estimator(model_fn, tmp_path / "nan", params={"lr": float("nan")}, progress=False).train(input_fn, steps=1)
    with pytest.raises(ValueError, match="exactly one of steps or max_steps"):
        Estimator(model_fn, tmp_path).train(input_fn)


def test_a_damaged_newest_checkpoint_resumes_from_the_older_one_with_the_input_rewound(tmp_path):
    whole = Estimator(model_fn, tmp_path / "whole", save_checkpoints_steps=5, progress=False)
    whole.train(input_fn, max_steps=15)
    damaged = Estimator(model_fn, tmp_path / "damaged", save_checkpoints_steps=5, progress=False)
    damaged.train(input_fn, max_steps=10)
    manifest = tmp_path / "damaged" / "ckpt-0000000010.manifest.json"
    manifest.write_text(manifest.read_text()[:40])  # step 10 is unreadable: resume from 5
    again = Estimator(model_fn, tmp_path / "damaged", save_checkpoints_steps=5, progress=False)
    with pytest.warns(UserWarning, match="step 10: .*not valid JSON"):
        again.train(input_fn, max_steps=15)
    assert again.history == whole.history[5:]


def test_evaluate_predict_and_export_after_training_with_a_slot_optimiser(tmp_path):
    """The checkpoint holds Adam's moments and step counter; the evaluation and prediction graphs
    have no optimiser, so those are left out there, and the weights still come back exactly."""
    est = Estimator(model_fn, tmp_path / "model", params={"adam": True}, progress=False)
    est.train(input_fn, steps=6)
    state, _ = load_checkpoint(tmp_path / "model")
    assert any("/Adam/" in k for k in state)
    result = est.evaluate(lambda ctx: Dataset.from_arrays(X, Y).batch(128).map(lambda b: ({"x": b[0]}, b[1])))
    logits = numpy_forward(state, X).astype(np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    assert result["global_step"] == 6
    assert result["loss"] == pytest.approx(-logp[np.arange(512), Y].mean(), rel=1e-5)
    np.testing.assert_allclose(est.predict({"x": X[:5]})["logits"], numpy_forward(state, X[:5]), rtol=1e-5, atol=1e-6)
    predict = load_exported(est.export(tmp_path / "export", {"x": X[:2]}))
    np.testing.assert_allclose(predict({"x": X[:5]})["logits"], numpy_forward(state, X[:5]), rtol=1e-5, atol=1e-6)
    wider = Estimator(model_fn, tmp_path / "model", params={"adam": True, "hidden": 32}, progress=False)
    with pytest.raises(ModelMismatchError, match="'dense/kernel': checkpoint has \\(8, 16\\) float32, the model has "
                                                 "\\(8, 32\\) float32"):
        wider.predict({"x": X[:2]})
