"""Wide & Deep (Cheng et al., 2016): a linear model and an MLP trained jointly.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

    logit = wide(x) + deep(x) + b

* **wide**: one weight per id of its categorical and *crossed* columns, summed. A crossed
  column gives a weight to a specific combination ("student 17 rates lecturer 903"), so
  the wide part *memorises* co-occurrences seen in training. It is trained with
  FTRL-Proximal, whose L1 term keeps most of the millions of cross weights at exactly 0.
* **deep**: embeddings of categorical columns (plus numeric and indicator columns),
  concatenated and fed to a ReLU MLP. Similar ids get similar embeddings, so the deep part
  *generalises* to combinations never seen together. Trained with Adagrad or Adam.
* **jointly**: one loss, one gradient ``d loss / d logit`` that flows into both parts
  each step (not an ensemble of two separately trained models).

Every embedding and the wide weights live in sparse tables (``reference_impl.ps``), used
through the temporary embedding matrix; ``mode="wide"`` or ``"deep"`` drops the other part
for the baselines. The model works in one process; the tables are the same objects a
parameter server shards.

``WideDeepConfig`` holds the hyper-parameters a tuning run chooses and ``build`` makes the
model from them; ``early_stopping`` trains one configuration while scoring a validation
split after every epoch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Sequence

import numpy as np

from ..ps.embedding import embedding_lookup, embedding_lookup_grad, sparse_table_pull, sparse_table_push
from ..ps.hashing import splitmix64
from ..ps.optimizers import FTRL, Adagrad, Adam, Optimizer
from ..ps.cluster import SparseVariable
from ..ps.sparse_table import ShardedSparseTable
from .click_log import logloss
from .feature_columns import CategoricalColumn, EmbeddingColumn, IndicatorColumn, NumericColumn

MODES = ("joint", "wide", "deep")


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: P(a random positive scores above a random negative), ties 1/2."""
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("auc: needs both positive and negative labels")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = np.asarray(scores)[order]
    _, start, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = start + (counts + 1) / 2.0  # average 1-based rank of each group of ties
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@dataclass
class _Dense:
    """A dense parameter with its optimiser state (the MLP's weights and the bias)."""

    value: np.ndarray
    optimizer: Optimizer
    slots: dict[str, np.ndarray]
    step: int = 0

    def apply(self, grad: np.ndarray) -> None:
        self.step += 1
        self.optimizer.apply(self.value, grad, self.slots, self.step)


def local_table(spec: SparseVariable) -> ShardedSparseTable:
    """The default table factory: the table lives in this process."""
    return ShardedSparseTable(1, spec.dim, spec.optimizer, spec.init_scale, spec.seed, spec.name)


class WideDeep:
    """A Wide & Deep classifier over feature columns; ``train_step``, ``predict_logits``."""

    def __init__(self, wide_columns: Sequence[CategoricalColumn], deep_columns: Sequence[Any],
                 hidden: Sequence[int] = (64, 32), mode: str = "joint",
                 wide_optimizer: Optimizer | None = None, deep_optimizer: Optimizer | None = None,
                 embedding_optimizer: Optimizer | None = None, seed: int = 0,
                 tables: Callable[[SparseVariable], Any] = local_table,
                 reduce: Callable[[np.ndarray], np.ndarray] | None = None, embedding_l2: float = 0.0):
        """``tables`` makes each sparse table from its spec (``local_table``, or a parameter
        server's ``lambda v: client.table(v.name)``); ``reduce`` sums a dense gradient over
        the workers (an all-reduce) before it is applied, or is None in one process.

        ``embedding_l2`` adds ``embedding_l2 / 2 * ||e||^2`` per example for every embedding
        row ``e`` the example looks up, to the mean loss: a row is pulled towards 0 in
        proportion to how often it is used, and, being a per-example term, the penalty's
        gradient splits over workers like the data gradient (the servers' sum is the same)."""
        if mode not in MODES:
            raise ValueError(f"WideDeep: mode must be one of {MODES}, got {mode!r}")
        if mode != "deep" and not wide_columns:
            raise ValueError("WideDeep: the wide part needs at least one categorical column")
        if embedding_l2 < 0:
            raise ValueError(f"WideDeep: embedding_l2 must be >= 0, got {embedding_l2}")
        if mode != "wide" and not deep_columns:
            raise ValueError("WideDeep: the deep part needs at least one column")
        for col in deep_columns:
            if not isinstance(col, (EmbeddingColumn, NumericColumn, IndicatorColumn)):
                raise TypeError(f"WideDeep: deep column {col!r} must be an embedding, numeric or "
                                f"indicator column")
        self.mode = mode
        self.wide_columns = list(wide_columns) if mode != "deep" else []
        self.deep_columns = list(deep_columns) if mode != "wide" else []
        deep_opt = deep_optimizer or Adam(0.003)
        self.table_specs: list[SparseVariable] = []  # what a parameter server must hold
        if self.wide_columns:
            self.table_specs.append(SparseVariable(
                "wide", 1, wide_optimizer or FTRL(alpha=0.1, beta=1.0, l1=0.01, l2=0.1), init_scale=0.0))
        emb_opt = embedding_optimizer or Adagrad(0.05)
        self.table_specs += [SparseVariable(c.name, c.dimension, emb_opt, init_scale=0.05, seed=seed + i)
                             for i, c in enumerate(self.deep_columns) if isinstance(c, EmbeddingColumn)]
        made = {spec.name: tables(spec) for spec in self.table_specs}
        self.wide = made.get("wide")
        self.embeddings = {name: t for name, t in made.items() if name != "wide"}
        self.reduce = reduce
        self.embedding_l2 = embedding_l2
        rng = np.random.default_rng(seed)
        width = sum(c.width for c in self.deep_columns)
        self.layers: list[tuple[_Dense, _Dense]] = []
        for out in [*hidden, 1] if self.deep_columns else []:
            w = rng.standard_normal((width, out)) * np.sqrt(2.0 / width)
            self.layers.append((_Dense(w, deep_opt, deep_opt.init_slots(w.shape)),
                                _Dense(np.zeros(out), deep_opt, deep_opt.init_slots((out,)))))
            width = out
        self.bias = _Dense(np.zeros(1), deep_opt, deep_opt.init_slots((1,)))

    def _wide_ids(self, features: dict[str, Any]) -> np.ndarray:
        """(batch, n_wide) ids, salted by column so two columns' id 3 are different weights."""
        salts = splitmix64(np.arange(1, len(self.wide_columns) + 1)).view(np.int64)
        cols = [splitmix64(c.ids(features) ^ salt).view(np.int64) for c, salt in zip(self.wide_columns, salts)]
        return np.stack(cols, axis=1)

    def _forward(self, features: dict[str, Any]):
        n = len(next(iter(features.values())))
        logit = np.full(n, self.bias.value[0])
        cache: dict[str, Any] = {}
        if self.wide_columns:
            temp = sparse_table_pull(self.wide, self._wide_ids(features))
            logit += embedding_lookup(temp)[:, :, 0].sum(axis=1)
            cache["wide"] = temp
        if self.deep_columns:
            blocks, temps = [], {}
            for col in self.deep_columns:
                if isinstance(col, EmbeddingColumn):
                    temps[col.name] = sparse_table_pull(self.embeddings[col.name], col.categorical.ids(features))
                    blocks.append(embedding_lookup(temps[col.name]))
                else:
                    blocks.append(col.dense(features))
            h = np.concatenate(blocks, axis=1)
            acts = [h]
            for i, (w, b) in enumerate(self.layers):
                h = h @ w.value + b.value
                if i < len(self.layers) - 1:
                    h = np.maximum(h, 0.0)
                acts.append(h)
            logit += h[:, 0]
            cache["deep"] = (temps, acts)
        return logit, cache

    def predict_logits(self, features: dict[str, Any], batch: int = 4096) -> np.ndarray:
        """Logits for every example (pulls create rows for unseen ids at their initial value)."""
        n = len(next(iter(features.values())))
        return np.concatenate([self._forward({k: v[i:i + batch] for k, v in features.items()})[0]
                               for i in range(0, n, batch)])

    # --8<-- [start:step]
    def train_step(self, features: dict[str, Any], labels: np.ndarray, global_batch: int | None = None) -> float:
        """One joint step on a batch; returns its mean log-loss before the update.

        On one of several workers, ``global_batch`` is the size of the batch all of them
        share: gradients are scaled by ``1 / global_batch``, so the servers' sum (and
        ``reduce``) over workers is the global batch's mean gradient.
        """
        logit, cache = self._forward(features)
        loss = logloss(logit, labels)
        scale = 1.0 / (global_batch or len(labels))
        g = (1.0 / (1.0 + np.exp(-logit)) - labels) * scale  # d mean-loss / d logit
        if "wide" in cache:
            temp = cache["wide"]
            d_out = np.broadcast_to(g[:, None, None], (*temp.local_index.shape, 1))
            sparse_table_push(self.wide, temp, embedding_lookup_grad(temp, d_out))
        if "deep" in cache:
            temps, acts = cache["deep"]
            d = g[:, None]
            for i in range(len(self.layers) - 1, -1, -1):
                w, b = self.layers[i]
                d_in = d @ w.value.T
                w.apply(self._reduced(acts[i].T @ d))
                b.apply(self._reduced(d.sum(axis=0)))
                d = d_in * (acts[i] > 0) if i > 0 else d_in
            start = 0
            for col in self.deep_columns:
                block, rows = d[:, start:start + col.width], acts[0][:, start:start + col.width]
                start += col.width
                if isinstance(col, EmbeddingColumn):
                    temp = temps[col.name]
                    if self.embedding_l2:  # d (l2/2 ||e||^2 per example, averaged over the batch) / d e
                        block = block + (self.embedding_l2 * scale) * rows
                    sparse_table_push(self.embeddings[col.name], temp, embedding_lookup_grad(temp, block))
        self.bias.apply(self._reduced(np.array([g.sum()])))
        return loss
    # --8<-- [end:step]

    def _reduced(self, grad: np.ndarray) -> np.ndarray:
        return grad if self.reduce is None else self.reduce(grad)

    def evaluate(self, features: dict[str, Any], labels: np.ndarray) -> dict[str, float]:
        logits = self.predict_logits(features)
        return {"auc": auc(logits, labels), "logloss": logloss(logits, labels)}


def fit(model: WideDeep, features: dict[str, np.ndarray], labels: np.ndarray, epochs: int = 1,
        batch: int = 256, seed: int = 0, worker: int = 0, n_workers: int = 1,
        progress: Callable[[], None] | None = None,
        on_epoch: Callable[[int], bool | None] | None = None) -> list[float]:
    """Shuffled mini-batch training; returns the mean training loss of each epoch.

    Every worker draws the same shuffled global batches (same ``seed``) and trains on its
    ``worker``-th part of each, so ``n_workers`` synchronous workers follow one process.
    ``on_epoch(k)`` is called after epoch ``k`` (1-based); a true return stops training, so
    the first ``k`` epochs are exactly those of ``fit(..., epochs=k)`` (early stopping).
    """
    rng = np.random.default_rng(seed)
    n = len(labels)
    if n_workers > min(batch, n % batch or batch):
        raise ValueError(f"fit: every global batch must give each of {n_workers} workers an example")
    history = []
    for _ in range(epochs):
        order = rng.permutation(n)
        losses = []
        for i in range(0, n, batch):
            idx = np.array_split(order[i:i + batch], n_workers)[worker]
            losses.append(model.train_step({k: v[idx] for k, v in features.items()}, labels[idx],
                                           global_batch=len(order[i:i + batch])))
            if progress is not None:
                progress()
        history.append(float(np.mean(losses)))
        if on_epoch is not None and on_epoch(len(history)):
            break
    return history


@dataclass(frozen=True)
class WideDeepConfig:
    """The hyper-parameters of a Wide & Deep run (each part reads only its own).

    Wide part: FTRL-Proximal ``ftrl_alpha`` (learning rate), ``ftrl_l1``, ``ftrl_l2`` (its
    ``beta`` is 1). Deep part: ``embedding_dim`` of the high-cardinality embeddings, Adagrad
    ``embedding_lr`` for the embedding tables, Adam ``mlp_lr`` for the MLP and the bias,
    ``embedding_l2`` (see ``WideDeep``), ``hidden`` layer widths. ``epochs``: passes over
    the training data (chosen by early stopping on a validation split).
    """

    ftrl_alpha: float = 0.1
    ftrl_l1: float = 0.0
    ftrl_l2: float = 0.1
    embedding_dim: int = 16
    embedding_lr: float = 0.05
    mlp_lr: float = 0.003
    embedding_l2: float = 0.0
    hidden: tuple[int, ...] = (64, 32)
    epochs: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "WideDeepConfig":
        return cls(**{k: tuple(v) if k == "hidden" else v for k, v in d.items()})

    def with_epochs(self, epochs: int) -> "WideDeepConfig":
        return replace(self, epochs=epochs)

    def relevant(self, mode: str) -> dict[str, Any]:
        """The settings ``mode`` uses (a wide-only model has no embeddings, a deep-only no FTRL)."""
        wide, deep = ("ftrl_alpha", "ftrl_l1", "ftrl_l2"), ("embedding_dim", "embedding_lr", "mlp_lr",
                                                             "embedding_l2", "hidden")
        keep = {"wide": wide, "deep": deep, "joint": wide + deep}[mode] + ("epochs",)
        return {k: v for k, v in self.as_dict().items() if k in keep}


def build(wide_columns: Sequence[CategoricalColumn], deep_columns: Sequence[Any], mode: str,
          config: WideDeepConfig, seed: int = 0, **kw: Any) -> WideDeep:
    """A ``WideDeep`` with ``config``'s optimisers: FTRL for the wide part (as in Cheng et al.),
    Adagrad for the embeddings and Adam for the MLP. ``kw`` goes to ``WideDeep`` (``tables``,
    ``reduce``)."""
    return WideDeep(wide_columns, deep_columns, hidden=config.hidden, mode=mode,
                    wide_optimizer=FTRL(config.ftrl_alpha, 1.0, config.ftrl_l1, config.ftrl_l2),
                    deep_optimizer=Adam(config.mlp_lr), embedding_optimizer=Adagrad(config.embedding_lr),
                    embedding_l2=config.embedding_l2, seed=seed, **kw)


def early_stopping(make: Callable[[], WideDeep], features: dict[str, np.ndarray], labels: np.ndarray,
                   valid_features: dict[str, np.ndarray], valid_labels: np.ndarray, max_epochs: int,
                   patience: int, batch: int = 256, seed: int = 0) -> dict[str, Any]:
    """Train ``make()`` on ``features`` for up to ``max_epochs``, scoring the validation data
    after every epoch; stop once ``patience`` epochs in a row have not beaten the best
    validation AUC. Returns the best epoch, its validation AUC and log-loss, and the curve."""
    model = make()
    curve: list[dict[str, float]] = []

    def score(epoch: int) -> bool:
        curve.append(model.evaluate(valid_features, valid_labels))
        best = max(range(len(curve)), key=lambda i: curve[i]["auc"])
        return epoch - (best + 1) >= patience

    fit(model, features, labels, epochs=max_epochs, batch=batch, seed=seed, on_epoch=score)
    best = max(range(len(curve)), key=lambda i: curve[i]["auc"])
    return {"epochs": best + 1, "valid_auc": curve[best]["auc"], "valid_logloss": curve[best]["logloss"],
            "valid_auc_curve": [c["auc"] for c in curve]}
