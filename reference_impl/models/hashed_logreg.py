"""The training problem of the consistency simulations: hashed logistic regression on a click log.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

``ps.consistency.simulate`` trains it under BSP, ASP, SSP, backup workers and EASGD. The
click log's ids are hashed into ``n_buckets`` weights (one small parameter vector, so EASGD
can keep a copy per worker), and a held-out sample gives the test log-loss and the Bayes
log-loss of the log's true model, the floor every rule is measured against.
"""
from __future__ import annotations

import numpy as np

from ..ps.hashing import splitmix64
from .click_log import ClickLog, logloss


class HashedLogReg:
    """The training problem: hashed logistic regression on a click log, with a test set."""

    def __init__(self, n_buckets: int = 4096, n_train: int = 32_768, n_test: int = 4096,
                 batch: int = 32, seed: int = 0, log: ClickLog | None = None):
        self.log = log or ClickLog(vocab_size=2000)
        self.n_buckets, self.batch = n_buckets, batch
        ids, self.y = self.log.sample(n_train, seed)
        test_ids, self.test_y = self.log.sample(n_test, seed + 1)
        self.x = self._buckets(ids)
        self.test_x = self._buckets(test_ids)
        self.bayes = self.log.bayes_logloss(test_ids, self.test_y)
        self.rng = np.random.default_rng(seed + 2)
        self.gradients_computed = 0

    def _buckets(self, ids: np.ndarray) -> np.ndarray:
        return (splitmix64(ids) % np.uint64(self.n_buckets)).astype(np.int64)

    def init(self) -> np.ndarray:
        return np.zeros(self.n_buckets + 1)  # bucket weights, then the bias

    def grad(self, w: np.ndarray) -> np.ndarray:
        """The mean log-loss gradient on a fresh random batch."""
        self.gradients_computed += 1
        rows = self.rng.integers(0, len(self.y), self.batch)
        x, y = self.x[rows], self.y[rows]
        g_logit = 1 / (1 + np.exp(-(w[x].sum(1) + w[-1]))) - y
        g = np.zeros_like(w)
        np.add.at(g, x.ravel(), np.repeat(g_logit, x.shape[1]) / self.batch)
        g[-1] = g_logit.mean()
        return g

    def test_scores(self, w: np.ndarray) -> np.ndarray:
        """The model's logits on the test set."""
        return w[self.test_x].sum(1) + w[-1]

    def test_loss(self, w: np.ndarray) -> float:
        return logloss(self.test_scores(w), self.test_y)
