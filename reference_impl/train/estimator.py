"""An Estimator in the style of ``tf.estimator``: ``model_fn`` + ``input_fn``, train, evaluate, export.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

The user writes two functions and the Estimator owns everything else:

* ``input_fn(ctx)`` returns an iterable of ``(features, labels)`` batches (dict of NumPy
  arrays, array), usually a ``Dataset``. ``ctx`` (an ``InputContext``) says which worker
  of how many is asking and the global step training resumes from, so the input can be
  sharded per worker and fast-forwarded after a restart.
* ``model_fn(features, labels, mode, params)`` builds the graph for one ``mode`` (``TRAIN``,
  ``EVAL``, ``PREDICT``) from placeholders and returns an ``EstimatorSpec``: the loss, the
  predictions, metrics, and the optimiser (a learning rate for plain gradient descent, or
  an object with ``apply_gradients``, such as the optimisers of ``optimizers.py``).

``train`` builds a fresh graph, restores the newest checkpoint in ``model_dir`` if there is
one (so a crashed job started again with the same arguments continues where it left off),
runs steps, and saves a checkpoint every ``save_checkpoints_steps`` and at the end. Every
call of ``train``/``evaluate``/``export`` rebuilds the graph and reloads the checkpoint: that
is how ``tf.estimator`` works, and one of its real costs (evaluation during training pays a
graph build and a restore each time).

**Distribution.** With ``comm`` (a ``Communicator``), every rank runs the same Estimator on
its shard of the input; after computing its gradients, each rank averages them with an
allreduce before the update, so the replicas stay identical (synchronous data parallelism,
what ``MirroredStrategy``/``MultiWorkerMirroredStrategy`` do). Rank 0 writes the
checkpoints and the progress bar; the others wait at a barrier so nobody races ahead of a
checkpoint it may have to restore. The update is applied by feeding the averaged gradients
into the update op, so the same ``apply_gradients`` serves local and distributed runs.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
from tqdm import tqdm

import reference_impl.graph as g

from ..comm.allreduce import allreduce
from ..comm.communicator import Communicator
from .checkpoint import (
    ModelMismatchError,
    latest_step,
    load_checkpoint,
    save_checkpoint,
)

TRAIN, EVAL, PREDICT = "train", "eval", "predict"


@dataclass
class EstimatorSpec:
    """What ``model_fn`` returns: the graph's loss, predictions, metrics and how to optimise."""

    loss: Any = None
    predictions: Any = None
    optimizer: Any = 0.1  # a learning rate (plain gradient descent) or an object with apply_gradients
    eval_metrics: dict[str, Any] = field(default_factory=dict)  # name -> scalar tensor, batch-averaged


@dataclass(frozen=True)
class InputContext:
    """What ``input_fn`` is told: which worker of how many, and the step training starts at."""

    num_workers: int = 1
    worker_index: int = 0
    start_step: int = 0


class _Built:
    """One mode's graph, its session, and the ops the Estimator runs in it."""

    def __init__(self, model_fn: Callable, params: dict, mode: str, features: dict, labels: Any) -> None:
        self.graph = g.Graph()
        with self.graph.as_default():
            self.features = {k: g.placeholder(str(v.dtype), [None, *v.shape[1:]], name=f"features/{k}")
                             for k, v in features.items()}
            self.labels = None if labels is None else g.placeholder(str(labels.dtype), [None, *labels.shape[1:]],
                                                                     name="labels")
            spec = model_fn(self.features, self.labels, mode, params)
            if not isinstance(spec, EstimatorSpec):
                raise TypeError(f"model_fn must return an EstimatorSpec in mode {mode!r}, got {type(spec).__name__}")
            if mode in (TRAIN, EVAL) and spec.loss is None:
                raise ValueError(f"model_fn returned no loss in mode {mode!r}")
            self.spec = spec
            self.grads_fed: list[Any] = []
            if mode == TRAIN:
                self._build_update(spec)
            self.variables = list(self.graph.variables)
            self.restore_feeds = [g.placeholder(v.dtype, list(v.shape), name=f"save/value_{i}")
                                  for i, v in enumerate(self.variables)]
            self.restore_op = g.group(*[g.assign(v, p) for v, p in zip(self.variables, self.restore_feeds)],
                                      name="save/restore_all")
            self.init_op = g.global_variables_initializer()
        self.session = g.Session(self.graph)
        self.session.run(self.init_op)

    def _build_update(self, spec: EstimatorSpec) -> None:
        trainable = [v for v in self.graph.variables if v.trainable]
        if not trainable:
            raise ValueError("model_fn created no trainable variable")
        grads = g.gradients(spec.loss, trainable)
        missing = [v.name for v, gr in zip(trainable, grads) if gr is None]
        if missing:
            raise ValueError(f"the loss does not depend on trainable variable(s) {missing}")
        self.trainable, self.grads = trainable, grads
        self.grads_fed = [g.placeholder(v.dtype, list(v.shape), name=f"averaged_grad_{i}")
                          for i, v in enumerate(trainable)]
        opt = spec.optimizer
        if isinstance(opt, (int, float)):
            if not np.isfinite(opt) or opt <= 0:
                raise ValueError(f"EstimatorSpec.optimizer: learning rate must be a positive number, got {opt!r}")
            self.update_op = g.group(*[g.assign_sub(v, g.mul(g.constant(np.asarray(opt, v.dtype)), gf))
                                       for v, gf in zip(trainable, self.grads_fed)], name="sgd_update")
        elif hasattr(opt, "apply_gradients"):
            self.update_op = opt.apply_gradients(list(zip(self.grads_fed, trainable)))
        else:
            raise TypeError(f"EstimatorSpec.optimizer must be a learning rate or have apply_gradients, got {opt!r}")

    def state(self) -> dict[str, np.ndarray]:
        """Every variable's value (weights, optimiser slots, step counters), by name."""
        values = self.session.run([v.value() for v in self.variables])
        return {v.op.name: np.asarray(x) for v, x in zip(self.variables, values)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.session.run(self.restore_op, {p: state[v.op.name] for v, p in zip(self.variables, self.restore_feeds)})


class Estimator:
    """Train, evaluate and export a model given by ``model_fn``, checkpointing into ``model_dir``."""

    def __init__(self, model_fn: Callable, model_dir: str | Path, params: dict | None = None,
                 save_checkpoints_steps: int = 100, keep_checkpoint_max: int = 5,
                 comm: Communicator | None = None, progress: bool = True) -> None:
        if save_checkpoints_steps < 1:
            raise ValueError(f"Estimator: save_checkpoints_steps must be >= 1, got {save_checkpoints_steps}")
        self.model_fn, self.model_dir, self.params = model_fn, Path(model_dir), dict(params or {})
        self.save_checkpoints_steps, self.keep_checkpoint_max = save_checkpoints_steps, keep_checkpoint_max
        self.comm, self.progress = comm, progress
        self.rank, self.size = (comm.rank, comm.size) if comm is not None else (0, 1)
        self.history: list[tuple[int, float]] = []  # (global step after the update, mean loss over ranks)

    # ------------------------------------------------------------------ helpers

    def _context(self, start_step: int = 0) -> InputContext:
        return InputContext(self.size, self.rank, start_step)

    @staticmethod
    def _split(batch: Any) -> tuple[dict, Any]:
        features, labels = batch if isinstance(batch, tuple) else (batch, None)
        if not isinstance(features, dict):
            raise TypeError("input_fn must yield (features dict, labels) or a features dict, "
                            f"got {type(features).__name__}")
        return {k: np.asarray(v) for k, v in features.items()}, None if labels is None else np.asarray(labels)

    def _restore_latest(self, built: _Built, training: bool = True) -> int:
        """Load the newest good checkpoint into ``built``; its step, or 0 when there is none.

        A training graph must match the checkpoint exactly. An evaluation or prediction graph
        has no optimiser, so the checkpoint's optimiser state (slots, step counter) is left
        out; every variable the graph does have must still be there, with its shape and dtype.
        """
        if latest_step(self.model_dir) is None:
            return 0
        like = built.state()
        if training:
            state, step = load_checkpoint(self.model_dir, like=like)
        else:
            state, step = load_checkpoint(self.model_dir)
            problems = [f"missing in checkpoint: {k!r} {v.shape}" for k, v in like.items() if k not in state] + [
                f"{k!r}: checkpoint has {state[k].shape} {state[k].dtype}, the model has {v.shape} {v.dtype}"
                for k, v in like.items() if k in state and (state[k].shape, state[k].dtype) != (v.shape, v.dtype)]
            if problems:
                raise ModelMismatchError(f"{self.model_dir} (step {step}): checkpoint is from a different model:\n  "
                                         + "\n  ".join(problems))
        built.restore(state)
        return step

    def _save(self, built: _Built, step: int) -> None:
        if self.rank == 0:
            save_checkpoint(self.model_dir, built.state(), step, keep_last=self.keep_checkpoint_max)
        if self.comm is not None:
            self.comm.barrier()

    def _mean_over_ranks(self, x: np.ndarray) -> np.ndarray:
        return x if self.comm is None else allreduce(self.comm, x, op="mean")

    # ------------------------------------------------------------------ the three verbs

    def train(self, input_fn: Callable[[InputContext], Iterable], steps: int | None = None,
              max_steps: int | None = None) -> "Estimator":
        """Run ``steps`` more steps, or until global step ``max_steps``, resuming from the newest checkpoint."""
        if (steps is None) == (max_steps is None):
            raise ValueError("Estimator.train: give exactly one of steps or max_steps")
        start = latest_step(self.model_dir) or 0
        batches = iter(input_fn(self._context(start)))
        first = next(batches, None)
        if first is None:
            raise ValueError("Estimator.train: input_fn yielded no batch")
        built = _Built(self.model_fn, self.params, TRAIN, *self._split(first))
        step = self._restore_latest(built)
        if step != start:  # the newest checkpoint was damaged and an older one restored: rewind the input
            batches = iter(input_fn(self._context(step)))
            first = next(batches, None)
        end = step + steps if steps is not None else max_steps
        resumed_at = step
        bar = tqdm(total=max(end - step, 0), desc="train", unit="step", file=sys.stderr,
                   disable=not self.progress or self.rank != 0)
        batch, examples, t0 = first, 0, time.perf_counter()
        try:
            while step < end:
                if batch is None:
                    batch = next(batches, None)
                    if batch is None:
                        break  # input exhausted: TF stops too
                # --8<-- [start:train_step]
                features, labels = self._split(batch)
                feed = {built.features[k]: v for k, v in features.items()}
                if built.labels is not None:
                    feed[built.labels] = labels
                loss, grads = built.session.run([built.spec.loss, built.grads], feed)
                if not np.isfinite(loss):
                    raise FloatingPointError(f"Estimator.train: loss is {loss} at step {step} on rank {self.rank}")
                packed = self._mean_over_ranks(np.concatenate([np.ravel(x) for x in grads] + [np.ravel(loss)]))
                offsets = np.cumsum([0] + [x.size for x in grads])
                averaged = {p: packed[a:b].reshape(x.shape).astype(x.dtype, copy=False)
                            for p, x, a, b in zip(built.grads_fed, grads, offsets[:-1], offsets[1:])}
                built.session.run(built.update_op, averaged)
                step += 1
                examples += len(next(iter(features.values()))) * self.size
                self.history.append((step, float(packed[-1])))
                bar.update(1)
                bar.set_postfix(loss=f"{packed[-1]:.4f}", ex_per_s=f"{examples / (time.perf_counter() - t0):.0f}")
                if step % self.save_checkpoints_steps == 0:
                    self._save(built, step)
                # --8<-- [end:train_step]
                batch = None
        finally:
            bar.close()
        if step > resumed_at and step % self.save_checkpoints_steps:
            self._save(built, step)  # the final state, unless the loop just saved it
        built.session.close()
        return self

    def evaluate(self, input_fn: Callable[[InputContext], Iterable], steps: int | None = None) -> dict[str, float]:
        """Mean loss and metrics over the input (or its first ``steps`` batches) at the newest checkpoint."""
        totals: dict[str, float] = {}
        count, built = 0, None
        for i, batch in enumerate(input_fn(self._context())):
            if steps is not None and i >= steps:
                break
            features, labels = self._split(batch)
            if built is None:
                built = _Built(self.model_fn, self.params, EVAL, features, labels)
                global_step = self._restore_latest(built, training=False)
            fetches = {"loss": built.spec.loss, **built.spec.eval_metrics}
            feed = {built.features[k]: v for k, v in features.items()}
            if built.labels is not None:
                feed[built.labels] = labels
            n = len(next(iter(features.values())))
            for k, v in built.session.run(fetches, feed).items():
                totals[k] = totals.get(k, 0.0) + float(v) * n
            count += n
        if built is None:
            raise ValueError("Estimator.evaluate: input_fn yielded no batch")
        built.session.close()
        summed = self._mean_over_ranks(np.array([count] + list(totals.values()), dtype=np.float64) * self.size)
        return {**{k: float(v / summed[0]) for k, v in zip(totals, summed[1:])}, "global_step": global_step}

    def predict(self, features: dict[str, np.ndarray]) -> Any:
        """The model's predictions for one batch of ``features``, at the newest checkpoint."""
        built = _Built(self.model_fn, self.params, PREDICT, {k: np.asarray(v) for k, v in features.items()}, None)
        self._restore_latest(built, training=False)
        out = built.session.run(built.spec.predictions, {built.features[k]: v for k, v in features.items()})
        built.session.close()
        return out

    def export(self, export_dir: str | Path, example_features: dict[str, np.ndarray]) -> Path:
        """Write the PREDICT graph (GraphDef JSON) and the newest checkpoint's variables to ``export_dir``."""
        built = _Built(self.model_fn, self.params, PREDICT, {k: np.asarray(v) for k, v in example_features.items()},
                       None)
        step = self._restore_latest(built, training=False)
        preds = built.spec.predictions
        outputs = {k: t.name for k, t in preds.items()} if isinstance(preds, dict) else {"predictions": preds.name}
        export_dir = Path(export_dir)
        save_checkpoint(export_dir / "variables", built.state(), step, keep_last=1)
        signature = {"inputs": {k: t.name for k, t in built.features.items()}, "outputs": outputs,
                     "restore_op": built.restore_op.name,
                     "variables": [[v.op.name, p.name] for v, p in zip(built.variables, built.restore_feeds)],
                     "graph": json.loads(g.to_json(built.graph)), "global_step": step}
        (export_dir / "saved_model.json").write_text(json.dumps(signature))
        built.session.close()
        return export_dir


def load_exported(export_dir: str | Path) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A predict function from an ``Estimator.export`` directory: no model_fn needed, only the files."""
    export_dir = Path(export_dir)
    signature = json.loads((export_dir / "saved_model.json").read_text())
    graph = g.import_graph_def(signature["graph"])
    session = g.Session(graph)
    state, _ = load_checkpoint(export_dir / "variables")
    session.run(signature["restore_op"], {feed: state[name] for name, feed in signature["variables"]})
    inputs, outputs = signature["inputs"], signature["outputs"]

    def predict(features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = sorted(set(inputs) - set(features))
        if missing:
            raise KeyError(f"exported model needs features {sorted(inputs)}; missing {missing}")
        return session.run(outputs, {inputs[k]: features[k] for k in inputs})

    return predict
