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
from .checkpoint import (CheckpointError, ModelMismatchError, Partitioned, latest_step, load_checkpoint,
                         partition_rows, save_checkpoint)
from .dataset import Dataset, stack
from .records import BadRecord, Field, ParseStats, RecordParser
from .estimator import EVAL, PREDICT, TRAIN, Estimator, EstimatorSpec, InputContext, load_exported
from .pipeline import (SCHEDULES, StageResult, bubble_fraction, gpipe_schedule, measured_bubble,
                       one_f_one_b_schedule, pipeline_step, simulate, split_layers)
from .pipeline import data_parallel_memory, median_cost_bubble
__all__ += [
    "CheckpointError", "ModelMismatchError", "Partitioned", "latest_step", "load_checkpoint", "partition_rows",
    "save_checkpoint", "Dataset", "stack", "BadRecord", "Field", "ParseStats", "RecordParser", "EVAL", "PREDICT",
    "TRAIN", "Estimator", "EstimatorSpec", "InputContext", "load_exported", "SCHEDULES", "StageResult",
    "bubble_fraction", "gpipe_schedule", "measured_bubble", "one_f_one_b_schedule", "pipeline_step", "simulate",
    "split_layers", "data_parallel_memory", "median_cost_bubble",
]
from . import hparam_search, initializers, mixed_precision, optimizers, schedules
from .graph_mlp import Classifier, build_classifier, train_classifier
from .mixed_precision import LossScaleOptimizer, update_loss_scale
from .optimizers import (Adagrad, Adam, AdamW, Ftrl, GradientDescent, IndexedSlices, Momentum, Optimizer,
                         RMSProp)
from .schedules import (CosineDecay, ExponentialDecay, LinearWarmup, Schedule, StepDecay,
                        linear_scaling_rule)
__all__ += [
    "hparam_search", "initializers", "mixed_precision", "optimizers", "schedules", "Classifier",
    "build_classifier", "train_classifier", "LossScaleOptimizer", "update_loss_scale", "Adagrad", "Adam",
    "AdamW", "Ftrl", "GradientDescent", "IndexedSlices", "Momentum", "Optimizer", "RMSProp", "CosineDecay",
    "ExponentialDecay", "LinearWarmup", "Schedule", "StepDecay", "linear_scaling_rule",
]
