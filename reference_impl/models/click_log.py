"""A synthetic click log whose true model is known, for any number of distinct ids.

Each example has ``n_fields`` categorical features (think user, ad, site, ...). Field
``f`` draws a rank ``r`` from a Zipf-like law over ``vocab_size`` values (a few ids are
very common, most are rare, as in real logs) and the feature id is the 64-bit hash of
``(f, r)``, so ids look like real hashed ids: large, unordered, no vocabulary needed.

The label follows a logistic model that is known exactly: every id has a true weight
``true_weight(ids)`` (a pure function of the id), and

    P(click | x) = sigmoid(bias + sum_f true_weight(id_f))

so a trained model can be checked against the truth: its log-loss against the Bayes
log-loss (the truth's own), and its learned per-id weights against ``true_weight``.
Nothing is stored: example ``i`` of seed ``s`` is the same on every machine.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ps.hashing import splitmix64, uniform_from_ids


@dataclass(frozen=True)
class ClickLog:
    """The generator's settings; ``sample(n, seed)`` draws examples."""

    n_fields: int = 4
    vocab_size: int = 10_000
    zipf_exponent: float = 1.1
    weight_scale: float = 1.5
    bias: float = -1.0
    truth_seed: int = 7

    def __post_init__(self) -> None:
        if self.n_fields < 1 or self.vocab_size < 1:
            raise ValueError(f"ClickLog: need n_fields >= 1 and vocab_size >= 1, got "
                             f"{self.n_fields}, {self.vocab_size}")

    def feature_ids(self, field: int, ranks: np.ndarray) -> np.ndarray:
        """The 64-bit id of value ``ranks`` of field ``field``."""
        return splitmix64(np.int64(field) << np.int64(40) | ranks.astype(np.int64)).view(np.int64)

    def true_weight(self, ids: np.ndarray) -> np.ndarray:
        """The true logit contribution of each id."""
        return self.weight_scale * uniform_from_ids(ids, 1, self.truth_seed)[:, 0]

    def true_logit(self, ids: np.ndarray) -> np.ndarray:
        """``bias + sum_f true_weight(id_f)`` for a ``(n, n_fields)`` id matrix."""
        return self.bias + self.true_weight(ids.ravel()).reshape(ids.shape).sum(axis=1)

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, labels)``: an ``(n, n_fields)`` int64 id matrix and 0/1 float labels."""
        rng = np.random.default_rng(seed)
        p = 1.0 / np.arange(1, self.vocab_size + 1) ** self.zipf_exponent
        cdf = np.cumsum(p / p.sum())
        ranks = np.searchsorted(cdf, rng.random((n, self.n_fields)))
        ranks = np.minimum(ranks, self.vocab_size - 1)
        ids = np.stack([self.feature_ids(f, ranks[:, f]) for f in range(self.n_fields)], axis=1)
        prob = 1.0 / (1.0 + np.exp(-self.true_logit(ids)))
        labels = (rng.random(n) < prob).astype(np.float64)
        return ids, labels

    def bayes_logloss(self, ids: np.ndarray, labels: np.ndarray) -> float:
        """The log-loss of the true model on these examples: what no model can beat on average."""
        return logloss(self.true_logit(ids), labels)


def logloss(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy from logits, computed stably."""
    return float(np.mean(np.logaddexp(0.0, logits) - labels * logits))
