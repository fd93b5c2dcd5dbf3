"""A small multilayer perceptron in NumPy whose backward pass hands out gradients layer by layer.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Data-parallel training can only overlap communication with computation if the gradients
become available *during* the backward pass rather than all at once at its end. Autograd
engines (PyTorch, TensorFlow) produce them in reverse layer order, and DDP/Horovod hook
into that stream. This module writes the backward pass by hand as a generator, so a caller
gets each gradient the moment it is computed:

    for index, grad in backward(params, activations, dlogits):
        ...  # grad of params[index]; the next layer's backward has not run yet

The network is ``Linear -> ReLU -> ... -> Linear`` with a softmax cross-entropy loss.
``params`` is a flat list ``[W0, b0, W1, b1, ...]`` (``W`` of shape ``(fan_in, fan_out)``),
the order the optimiser and the bucketing code index by. Gradients are checked against
finite differences in the tests.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np


def init_mlp(widths: list[int] | tuple[int, ...], seed: int = 0, dtype: type = np.float32) -> list[np.ndarray]:
    """He-initialised parameters ``[W0, b0, W1, b1, ...]`` for layer widths ``widths``.

    ``widths = (784, 256, 10)`` is one hidden layer of 256 units. He initialisation
    (std = sqrt(2 / fan_in)) keeps the activations' scale constant through ReLU layers.
    The same ``seed`` gives the same parameters on every rank: replicas must start equal.
    """
    if len(widths) < 2 or any(int(w) < 1 for w in widths):
        raise ValueError(f"init_mlp: need at least two positive layer widths, got {tuple(widths)}")
    rng = np.random.default_rng(seed)
    params: list[np.ndarray] = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        params.append((rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(dtype))
        params.append(np.zeros(fan_out, dtype=dtype))
    return params


def forward(params: list[np.ndarray], x: np.ndarray,
            relu_last: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits for the batch ``x``, and the activations backward needs (the input of each layer).

    ``relu_last=True`` puts a ReLU after the last layer too: a pipeline stage other than the
    last one is a block of hidden layers (``pipeline.py`` runs each stage through here).
    """
    if len(params) % 2 or not params:
        raise ValueError(f"forward: params must be [W0, b0, W1, b1, ...], got {len(params)} arrays")
    activations = []
    h = x
    n_layers = len(params) // 2
    for layer in range(n_layers):
        w, b = params[2 * layer], params[2 * layer + 1]
        if h.shape[1] != w.shape[0]:
            raise ValueError(f"forward: layer {layer} expects {w.shape[0]} inputs, got {h.shape[1]}")
        activations.append(h)
        h = h @ w + b
        if layer < n_layers - 1 or relu_last:
            h = np.maximum(h, 0)
    return h, activations


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean softmax cross-entropy over the batch, and its gradient with respect to ``logits``."""
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"cross_entropy: logits {logits.shape} and labels {labels.shape} do not match")
    shifted = logits - logits.max(axis=1, keepdims=True)  # exp cannot overflow
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(logits.shape[0])
    loss = float(-log_probs[rows, labels].mean())
    dlogits = np.exp(log_probs)
    dlogits[rows, labels] -= 1
    dlogits /= logits.shape[0]
    return loss, dlogits.astype(logits.dtype, copy=False)


def backward(
    params: list[np.ndarray], activations: list[np.ndarray], dlogits: np.ndarray, input_grad: bool = False
) -> Iterator[tuple[int | None, np.ndarray]]:
    """Yield ``(index, gradient of params[index])``, last layer first, each as soon as computed.

    For layer ``l`` with input ``a`` and output gradient ``delta``: dW = a^T delta and
    db = sum(delta); then delta for the layer below is (delta W^T) masked by the ReLU.
    That last product is the work that runs while the caller ships dW and db away.

    ``dlogits`` is the gradient of the last layer's output before any ReLU.  With
    ``input_grad=True``, for a pipeline stage whose input ``activations[0]`` is the ReLU
    output of the stage before, the chain goes on through the first layer and the last item
    is ``(None, delta)``: the gradient that stage's own backward starts from.
    """
    delta = dlogits
    for layer in reversed(range(len(params) // 2)):
        a_in = activations[layer]
        yield 2 * layer, a_in.T @ delta
        yield 2 * layer + 1, delta.sum(axis=0)
        if layer > 0 or input_grad:
            delta = (delta @ params[2 * layer].T) * (a_in > 0)
    if input_grad:
        yield None, delta


def backward_order(n_params: int) -> list[int]:
    """The parameter indices in the order ``backward`` yields them: [W_{L-1}, b_{L-1}, ..., W0, b0]."""
    return [i for layer in reversed(range(n_params // 2)) for i in (2 * layer, 2 * layer + 1)]


def loss_and_grads(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
    """The loss on ``(x, y)`` and every gradient, indexed like ``params`` (no overlap: for checks)."""
    logits, activations = forward(params, x)
    loss, dlogits = cross_entropy(logits, y)
    grads: list[np.ndarray] = [np.empty(0)] * len(params)
    for index, grad in backward(params, activations, dlogits):
        grads[index] = grad
    return loss, grads


def sgd_update(params: list[np.ndarray], grads: list[np.ndarray], lr: float) -> None:
    """Plain SGD, in place: ``p -= lr * g`` for every parameter."""
    for p, g in zip(params, grads):
        p -= np.asarray(lr, dtype=p.dtype) * g
