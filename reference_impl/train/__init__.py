"""Training: models, optimisers and the strategies that spread a step over workers.

* ``mlp`` (a small MLP with a layer-by-layer backward) and ``data`` (its synthetic data and
  shards): the model most strategies below train;
* ``data_parallel``: synchronous data-parallel SGD on any ``Communicator``, with bucketed
  gradients and communication overlapped with the backward pass;
* ``pipeline_parallel``: the MLP's layers split into stages, GPipe and 1F1B schedules, the
  bubble;
* ``determinism``: arrival-order sums and stale SGD, the sources of run-to-run differences;
* ``graph_mlp``, ``optimizers``, ``schedules``, ``initializers``, ``mixed_precision``: the
  same kind of model built as a dataflow graph, TF1-style optimisers with slot variables,
  learning-rate schedules, initialisers, and loss scaling;
* ``checkpoint`` (sharded, atomic checkpoints), ``dataset`` and ``records`` (input
  pipelines and record parsing), ``estimator`` (an Estimator over graph models),
  ``hparam_search`` (random search and successive halving);
* ``python -m reference_impl.train`` runs the strategies from the command line, Wide & Deep
  among them (its model and its multi-worker strategies are in ``reference_impl.models``:
  ``wide_deep`` and ``strategies``).
"""
from . import hparam_search, initializers, mixed_precision, optimizers, schedules
from .checkpoint import (CheckpointError, ModelMismatchError, Partitioned, latest_step, load_checkpoint,
                         partition_rows, save_checkpoint)
from .data import batch_indices, shard, synthetic_classification
from .data_parallel import MODES, CommThread, DataParallelTrainer, StepTrace, TrainResult, train
from .dataset import Dataset, stack
from .determinism import arrival_order_sum, max_abs_diff, params_digest, stale_sgd, sum_in_order
from .estimator import EVAL, PREDICT, TRAIN, Estimator, EstimatorSpec, InputContext, load_exported
from .graph_mlp import Classifier, build_classifier, train_classifier
from .mixed_precision import LossScaleOptimizer, update_loss_scale
from .mlp import backward, backward_order, cross_entropy, forward, init_mlp, loss_and_grads, sgd_update
from .optimizers import (Adagrad, Adam, AdamW, Ftrl, GradientDescent, IndexedSlices, Momentum, Optimizer,
                         RMSProp)
from .pipeline_parallel import (SCHEDULES, StageResult, bubble_fraction, data_parallel_memory, gpipe_schedule,
                                measured_bubble, median_cost_bubble, one_f_one_b_schedule, pipeline_step,
                                simulate, split_layers)
from .records import BadRecord, Field, ParseStats, RecordParser
from .schedules import CosineDecay, ExponentialDecay, LinearWarmup, Schedule, StepDecay, linear_scaling_rule

__all__ = [n for n in dir() if not n.startswith("_")]
