"""Adam in NumPy, in place, with one scratch array: the optimiser whose state ZeRO shards.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Adam (Kingma & Ba 2015, as ``torch.optim.Adam`` computes it) keeps two arrays per parameter,
the moving averages ``m`` of the gradient and ``v`` of its square::

    m = b1 m + (1 - b1) g
    v = b2 v + (1 - b2) g^2
    p = p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

Those two arrays are twice the parameters' own size, and in mixed precision (float32 ``m``,
``v`` and master weights next to 16-bit parameters) they are most of a model's memory: the
``K = 12`` bytes per parameter of the ZeRO paper, the part ZeRO stage 1 shards first.

Each update here allocates exactly one temporary the size of the parameter it updates (the
state is updated in place), so the optimiser step's transient memory is one array the size
of the largest parameter: ``memory.py`` counts it. The state has the parameters' dtype.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
from ..backend import require_numpy

_MODULE = "reference_impl.parallel.adam"  # NumPy-only: other arrays are refused, naming it


class Adam:
    """``Adam(lr).step(params, grads)`` updates every ``params[name]`` in place from ``grads[name]``."""

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if not lr > 0 or not all(0 <= b < 1 for b in betas) or not eps > 0:
            raise ValueError(f"Adam: need lr > 0, 0 <= betas < 1, eps > 0; got {lr}, {betas}, {eps}")
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t = 0
        self.state: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def init_state(self, params: Mapping[str, np.ndarray]) -> None:
        """Allocate ``m`` and ``v`` (zeros) for every parameter now, not at the first step."""
        for name, p in params.items():
            if name not in self.state:
                self.state[name] = (np.zeros_like(p), np.zeros_like(p))

    def step(self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray]) -> None:
        """One update of every parameter that has a gradient."""
        require_numpy(_MODULE, *params.values(), *grads.values())
        self.init_state(params)
        self.t += 1
        b1, b2 = self.betas
        step_size = self.lr / (1 - b1 ** self.t)
        bias2 = math.sqrt(1 - b2 ** self.t)
        for name, g in grads.items():
            p = params[name]
            m, v = self.state[name]
            tmp = np.multiply(g, 1 - b1, dtype=p.dtype)
            m *= b1
            m += tmp
            np.multiply(g, g, out=tmp)
            tmp *= 1 - b2
            v *= b2
            v += tmp
            np.sqrt(v, out=tmp)  # sqrt(v / (1 - b2^t)) = sqrt(v) / bias2
            tmp /= bias2
            tmp += self.eps
            np.divide(m, tmp, out=tmp)
            tmp *= step_size
            p -= tmp
