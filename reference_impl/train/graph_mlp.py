"""A small MLP classifier built in the graph runtime: the model the optimiser, schedule,
mixed-precision and hyper-parameter-search examples train.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

``build_classifier`` makes the variables (float32 master weights from an initialiser), the
input placeholders, the logits (computed in ``compute_dtype``: float16 for mixed precision)
and a float32 mean cross-entropy loss.  ``train_classifier`` runs an optimiser's train op over
seeded mini-batches of ``reference_impl.train.data.synthetic_classification`` and returns the
loss curve, so every caller measures the same task the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import reference_impl.graph as g

from .data import batch_indices
from .initializers import Zeros, get_initializer, variable
from .optimizers import Optimizer, cast


@dataclass
class Classifier:
    graph: g.Graph
    x: g.Tensor
    y: g.Tensor
    logits: g.Tensor
    loss: g.Tensor
    params: list[g.Variable] = field(default_factory=list)


def build_classifier(widths: tuple[int, ...], initializer: str = "he_normal", activation: str = "relu",
                     compute_dtype: str = "float32", seed: int = 0) -> Classifier:
    """An MLP ``widths[0] -> ... -> widths[-1]`` classes in a new graph (float32 loss)."""
    if len(widths) < 2:
        raise ValueError(f"build_classifier: need at least input and output widths, got {widths}")
    if activation not in ("relu", "tanh"):
        raise ValueError(f"build_classifier: activation must be relu or tanh, got {activation!r}")
    act = g.relu if activation == "relu" else g.tanh
    graph = g.Graph()
    with graph.as_default():
        init = get_initializer(initializer, seed=seed)
        x = g.placeholder("float32", [None, widths[0]], name="x")
        y = g.placeholder("int64", [None], name="y")
        h = cast(x, compute_dtype)
        params = []
        for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
            w = variable(init, (fan_in, fan_out), name=f"dense{i}/kernel")
            b = variable(Zeros(), (fan_out,), name=f"dense{i}/bias")
            params += [w, b]
            h = g.matmul(h, cast(w, compute_dtype)) + cast(b, compute_dtype)
            if i < len(widths) - 2:
                h = act(h)
        logits = cast(h, "float32")  # the softmax and the loss in float32, as mixed precision requires
        loss = g.reduce_mean(g.sparse_softmax_cross_entropy(y, logits))
    return Classifier(graph, x, y, logits, loss, params)


def train_classifier(model: Classifier, make_train_op: Callable[[g.Tensor], Any], data: tuple[np.ndarray, np.ndarray],
                     steps: int, batch_size: int, seed: int = 0, fetch: dict[str, Any] | None = None,
                     eval_data: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """Run ``steps`` steps of ``make_train_op(model.loss)``; the loss before each step, and the final loss.

    ``final_loss`` is measured on ``eval_data`` (a validation set) if given, else on ``data``.
    ``fetch`` adds tensors to read after every step (``{"scale": opt.loss_scale}``).
    A non-finite loss stops training early (``"diverged": True``), as a real job would.
    """
    x, y = data
    with model.graph.as_default():
        train = make_train_op(model.loss)
        with g.Session(model.graph) as sess:
            sess.run(g.global_variables_initializer())
            losses, extra = [], {k: [] for k in fetch or {}}
            diverged = False
            for step in range(steps):
                idx = batch_indices(len(x), batch_size, step, seed)
                loss, _ = sess.run([model.loss, train], {model.x: x[idx], model.y: y[idx]})
                losses.append(float(loss))
                for k, t in (fetch or {}).items():
                    extra[k].append(float(sess.run(t)))
                if not np.isfinite(loss):
                    diverged = True
                    break
            ex, ey = eval_data if eval_data is not None else data
            final = float(sess.run(model.loss, {model.x: ex, model.y: ey}))
    return {"losses": losses, "final_loss": final, "diverged": diverged or not np.isfinite(final), **extra}


def train_with(optimizer: Optimizer) -> Callable[[g.Tensor], Any]:
    """``make_train_op`` for ``train_classifier`` from a plain optimiser."""
    return lambda loss: optimizer.minimize(loss)
