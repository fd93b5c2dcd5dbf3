"""Training: a small MLP with a layer-by-layer backward, its data, and data-parallel SGD."""
from .data import batch_indices, shard, synthetic_classification
from .data_parallel import MODES, CommThread, DataParallelTrainer, StepTrace, TrainResult, train
from .determinism import arrival_order_sum, max_abs_diff, params_digest, stale_sgd, sum_in_order
from .mlp import backward, backward_order, cross_entropy, forward, init_mlp, loss_and_grads, sgd_update

__all__ = [
    "MODES", "CommThread", "DataParallelTrainer", "StepTrace", "TrainResult", "arrival_order_sum", "backward",
    "backward_order", "batch_indices", "cross_entropy", "forward", "init_mlp", "loss_and_grads", "max_abs_diff",
    "params_digest", "sgd_update", "shard", "stale_sgd", "sum_in_order", "synthetic_classification", "train",
]
