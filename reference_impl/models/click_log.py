"""A synthetic click log whose true model is known, for any number of distinct ids.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

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

By default the truth is additive, so a linear model over one-hot ids is the right model
and crosses have nothing to learn. Two options add interactions between every pair of
fields ``f < g``, so that crossed features carry information no per-id weight can:

* ``cross_scale``: every pair of ids ``(id_f, id_g)`` has its own random weight,
  ``cross_scale * u`` with ``u`` uniform in [-1, 1) (a pure function of the pair). Nothing
  about one pair tells anything about another: only a model that has seen the pair (a
  crossed column, which *memorises*) can learn it.
* ``latent_dim`` and ``latent_scale``: every id has a true latent vector of ``latent_dim``
  unit-variance entries, and a pair adds ``latent_scale * <v(id_f), v(id_g)> /
  sqrt(latent_dim)``. This part is low-rank: a model that learns embeddings of the ids can
  predict it for pairs it has never seen (it *generalises*).

    P(click | x) = sigmoid(bias + sum_f w(id_f)
                           + sum_{f<g} [cross_scale * u(id_f, id_g)
                                        + latent_scale * <v(id_f), v(id_g)> / sqrt(latent_dim)])
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
    cross_scale: float = 0.0
    latent_dim: int = 0
    latent_scale: float = 0.0

    def __post_init__(self) -> None:
        if self.n_fields < 1 or self.vocab_size < 1:
            raise ValueError(f"ClickLog: need n_fields >= 1 and vocab_size >= 1, got "
                             f"{self.n_fields}, {self.vocab_size}")
        if self.cross_scale < 0 or self.latent_dim < 0 or self.latent_scale < 0:
            raise ValueError(f"ClickLog: need cross_scale, latent_dim, latent_scale >= 0, got "
                             f"{self.cross_scale}, {self.latent_dim}, {self.latent_scale}")
        if self.latent_scale > 0 and self.latent_dim < 1:
            raise ValueError("ClickLog: latent_scale > 0 needs latent_dim >= 1")

    def feature_ids(self, field: int, ranks: np.ndarray) -> np.ndarray:
        """The 64-bit id of value ``ranks`` of field ``field``."""
        return splitmix64(np.int64(field) << np.int64(40) | ranks.astype(np.int64)).view(np.int64)

    def true_weight(self, ids: np.ndarray) -> np.ndarray:
        """The true logit contribution of each id."""
        return self.weight_scale * uniform_from_ids(ids, 1, self.truth_seed)[:, 0]

    def true_pair_weight(self, ids_f: np.ndarray, ids_g: np.ndarray) -> np.ndarray:
        """The true weight of each pair ``(ids_f[i], ids_g[i])`` (``cross_scale`` part)."""
        pair = splitmix64(ids_f.astype(np.int64) ^ splitmix64(ids_g.astype(np.int64)).view(np.int64)).view(np.int64)
        return self.cross_scale * uniform_from_ids(pair, 1, self.truth_seed + 1)[:, 0]

    def true_latent(self, ids: np.ndarray) -> np.ndarray:
        """``(len(ids), latent_dim)`` true latent vectors, entries of unit variance."""
        return np.sqrt(3.0) * uniform_from_ids(ids, self.latent_dim, self.truth_seed + 2)

    def true_logit(self, ids: np.ndarray) -> np.ndarray:
        """The true logit of each row of a ``(n, n_fields)`` id matrix (the module's formula)."""
        logit = self.bias + self.true_weight(ids.ravel()).reshape(ids.shape).sum(axis=1)
        if self.cross_scale or self.latent_scale:
            latent = [self.true_latent(ids[:, f]) for f in range(self.n_fields)] if self.latent_scale else []
            for f in range(self.n_fields):
                for g in range(f + 1, self.n_fields):
                    if self.cross_scale:
                        logit = logit + self.true_pair_weight(ids[:, f], ids[:, g])
                    if self.latent_scale:
                        dot = np.einsum("ij,ij->i", latent[f], latent[g])
                        logit = logit + self.latent_scale * dot / np.sqrt(self.latent_dim)
        return logit

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
