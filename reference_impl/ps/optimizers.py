"""Server-side optimisers: the update rule runs where the variable lives, with per-row state.

A parameter server does not send weights back to be updated; workers push gradients and
the server applies them. For a sparse table the optimiser state (Adagrad's accumulator,
FTRL's ``z`` and ``n``, Adam's moments *and step count*) is stored per row, next to the
row, and only the rows in a push are touched: a row that no batch used keeps its state,
which is what "lazy" Adam in TensorFlow and PyTorch's ``SparseAdam`` do.

Every optimiser has the same three parts, so the dense chunks and the sparse rows of a
server share one implementation:

* ``slots``: the names of the state arrays, each shaped like the variable;
* ``init_slots(shape)``: their initial values;
* ``apply(w, g, slots, t)``: update ``w`` and ``slots`` in place from gradient ``g``, where
  ``t`` (an int, or an array with one count per row) is the number of updates *including*
  this one, which only Adam uses for bias correction.

``apply`` is array-API code (``xp`` is the namespace of ``w``; in-place operators such as
``w -= ...`` are part of the standard), so the same rule updates rows held by NumPy, a GPU
library or PyTorch; the sparse tables that call it keep their rows in host memory
(``sparse_table``), and ``init_slots`` makes NumPy state for them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import namespace_of


class Optimizer:
    """Base class: no state; subclasses set ``slots`` and implement ``apply``."""

    slots: tuple[str, ...] = ()

    def init_slots(self, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        return {name: np.zeros(shape) for name in self.slots}

    def apply(self, w: np.ndarray, g: np.ndarray, slots: dict[str, np.ndarray], t: Any) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class SGD(Optimizer):
    """``w -= lr * g``."""

    def __init__(self, lr: float = 0.1):
        self.lr = lr

    def apply(self, w, g, slots, t):
        w -= self.lr * g


class Adagrad(Optimizer):
    """``acc += g**2; w -= lr * g / sqrt(acc)`` with ``acc`` starting at ``initial_accumulator``.

    Each coordinate's step shrinks with the gradient it has seen, so rare features (a
    seldom-seen id) keep large steps while frequent ones settle: why the deep part of
    Wide & Deep is trained with it. A positive start value avoids dividing by zero.
    """

    slots = ("accumulator",)

    def __init__(self, lr: float = 0.1, initial_accumulator: float = 0.1):
        if initial_accumulator <= 0:
            raise ValueError(f"Adagrad: initial_accumulator must be > 0, got {initial_accumulator}")
        self.lr = lr
        self.initial_accumulator = initial_accumulator

    def init_slots(self, shape):
        return {"accumulator": np.full(shape, self.initial_accumulator)}

    def apply(self, w, g, slots, t):
        acc = slots["accumulator"]
        acc += g * g
        w -= self.lr * g / namespace_of(acc).sqrt(acc)


class Adam(Optimizer):
    """Adam with per-row step counts (lazy Adam when applied to sparse rows).

    ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g**2``;
    ``w -= lr * (m / (1-b1**t)) / (sqrt(v / (1-b2**t)) + eps)``.
    """

    slots = ("m", "v")

    def __init__(self, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps

    def apply(self, w, g, slots, t):
        m, v = slots["m"], slots["v"]
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        v += (1 - self.beta2) * g * g
        xp = namespace_of(w)
        t = xp.asarray(t, dtype=xp.float64)
        if t.ndim == 1:  # one count per row: broadcast over the row's columns
            t = xp.reshape(t, (-1, 1))
        m_hat = m / (1 - self.beta1**t)
        v_hat = v / (1 - self.beta2**t)
        w -= self.lr * m_hat / (xp.sqrt(v_hat) + self.eps)


# --8<-- [start:ftrl]
class FTRL(Optimizer):
    """FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches", 2013).

    Per coordinate, with ``n`` the sum of squared gradients and ``z`` the adjusted sum of
    gradients::

        sigma = (sqrt(n + g**2) - sqrt(n)) / alpha
        z += g - sigma * w
        n += g**2
        w = 0                                                  if |z| <= l1
        w = -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)   otherwise

    The L1 term sets weights to exactly zero, so the wide part of Wide & Deep stays sparse
    over millions of crossed features. ``w`` is a function of ``(z, n)`` alone: the server
    overwrites it each update.
    """

    slots = ("z", "n")

    def __init__(self, alpha: float = 0.1, beta: float = 1.0, l1: float = 0.0, l2: float = 0.0):
        if alpha <= 0 or beta < 0 or l1 < 0 or l2 < 0:
            raise ValueError(f"FTRL: need alpha > 0 and beta, l1, l2 >= 0, got {alpha}, {beta}, {l1}, {l2}")
        self.alpha, self.beta, self.l1, self.l2 = alpha, beta, l1, l2

    def apply(self, w, g, slots, t):
        z, n = slots["z"], slots["n"]
        xp = namespace_of(w)
        sigma = (xp.sqrt(n + g * g) - xp.sqrt(n)) / self.alpha
        z += g - sigma * w
        n += g * g
        shrunk = z - xp.sign(z) * self.l1
        w[...] = xp.where(xp.abs(z) <= self.l1, xp.zeros_like(z),
                          -shrunk / ((self.beta + xp.sqrt(n)) / self.alpha + self.l2))
# --8<-- [end:ftrl]


OPTIMIZERS = {"sgd": SGD, "adagrad": Adagrad, "adam": Adam, "ftrl": FTRL}
