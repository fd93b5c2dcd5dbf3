"""The real task for accuracy-vs-sparsity: an MLP on scikit-learn's handwritten digits.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

The digits data (1,797 8×8 images, 10 classes) ships inside scikit-learn, so nothing is
downloaded. ``train_digits`` builds the MLP in the graph runtime and trains it with
mini-batch SGD; every ``prune_every`` steps it asks ``schedule(step)`` for the target
sparsity, recomputes the masks with the chosen ``method`` and stores them in mask
variables. The update itself is ``w ← (w − lr·g) ⊙ mask``, so pruned weights stay zero
between mask updates. The trained session can be handed to ``reference_impl.compiler.jit``.

Methods: ``"layer"`` (magnitude, same sparsity per layer), ``"global"`` (one magnitude
threshold over all layers), ``"block"`` (4×4 tiles by L2 norm), ``"row"`` (whole input rows
of each weight matrix: for the first layer that is feature selection, dropping pixels).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

import reference_impl.graph as G

from .pruning import block_mask, global_magnitude_masks, magnitude_mask

METHODS = ("layer", "global", "block", "row")


def digits_split(seed: int = 0, test_fraction: float = 0.25) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): pixels scaled to [0, 1] as float32, a seeded split."""
    from sklearn.datasets import load_digits  # bundled data, read from disk

    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    te, tr = order[:n_test], order[n_test:]
    return x[tr], y[tr], x[te], y[te]


def masks_for(weights: list[np.ndarray], sparsity: float, method: str) -> list[np.ndarray]:
    """Masks giving each weight matrix (or all together, ``global``) the target sparsity."""
    if method == "layer":
        return [magnitude_mask(w, sparsity) for w in weights]
    if method == "global":
        return global_magnitude_masks(weights, sparsity)
    if method == "block":
        return [block_mask(w, sparsity, (4, 2 if w.shape[1] % 4 else 4)) for w in weights]
    if method == "row":
        return [block_mask(w, sparsity, (1, w.shape[1])) for w in weights]
    raise ValueError(f"pruning method must be one of {METHODS}, got {method!r}")


@dataclass
class DigitsModel:
    session: G.Session
    x: G.Tensor          # placeholder (None, 64)
    logits: G.Tensor
    weights: list        # the weight Variables (biases are not pruned)

    def weight_values(self) -> list[np.ndarray]:
        return [self.session.run(w) for w in self.weights]

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float((self.session.run(self.logits, {self.x: x}).argmax(1) == y).mean())


def train_digits(widths: tuple[int, ...] = (64, 128, 128, 10), epochs: int = 30, lr: float = 0.1,
                 batch: int = 32, seed: int = 0, method: str = "layer",
                 schedule: Callable[[int], float] | None = None, prune_every: int = 20,
                 data: tuple | None = None) -> DigitsModel:
    """Train (and, with ``schedule``, gradually prune) the digits MLP; returns the model."""
    if method not in METHODS:
        raise ValueError(f"pruning method must be one of {METHODS}, got {method!r}")
    xtr, ytr, _, _ = data if data is not None else digits_split(seed)
    rng = np.random.default_rng(seed)
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, widths[0]), name="x")
        labels = G.placeholder("int64", (None,), name="labels")
        h, weights, biases, masks = x, [], [], []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            weights.append(G.Variable((rng.normal(size=(a, b)) * np.sqrt(2 / a)).astype(np.float32), name=f"w{i}"))
            biases.append(G.Variable(np.zeros(b, np.float32), name=f"b{i}"))
            masks.append(G.Variable(np.ones((a, b), np.float32), name=f"mask{i}", trainable=False))
            h = G.matmul(h, weights[-1]) + biases[-1]
            if i < len(widths) - 2:
                h = G.relu(h)
        logits = h
        loss = G.reduce_mean(G.sparse_softmax_cross_entropy(labels, logits))
        grads = G.gradients(loss, weights + biases)
        updates = [G.assign(w, (w - lr * gw) * m) for w, gw, m in zip(weights, grads, masks)]
        updates += [G.assign_sub(b, lr * gb) for b, gb in zip(biases, grads[len(weights):])]
        train_op = G.group(*updates)
        new_masks = [G.placeholder("float32", m.shape) for m in masks]
        set_masks = G.group(*[G.assign(m, nm) for m, nm in zip(masks, new_masks)])
        apply_masks = G.group(*[G.assign(w, w.value() * m.value()) for w, m in zip(weights, masks)])
        sess = G.Session(g)
        sess.run(G.global_variables_initializer())
    model = DigitsModel(sess, x, logits, weights)
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(xtr))
        for start in range(0, len(order) - batch + 1, batch):
            if schedule is not None and step % prune_every == 0:
                ms = masks_for(model.weight_values(), schedule(step), method)
                sess.run(set_masks, {nm: m.astype(np.float32) for nm, m in zip(new_masks, ms)})
                sess.run(apply_masks)
            idx = order[start:start + batch]
            sess.run(train_op, {x: xtr[idx], labels: ytr[idx]})
            step += 1
    return model


def steps_per_epoch(n_train: int, batch: int = 32) -> int:
    return n_train // batch
