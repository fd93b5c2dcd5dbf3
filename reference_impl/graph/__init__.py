"""A dataflow-graph runtime in the style of TensorFlow 1, small enough to read end to end.

``core`` (the IR), ``registry`` (one entry per op), ``ops`` (the front end and every op, one
module per op family: ``dispatch``, ``state``, ``array``, ``math``, ``nn``, ``training``),
``gradients`` (symbolic reverse mode), ``graphdef`` (JSON GraphDef), ``rewrite`` (copying
ops into a new graph: what every pass is built from), ``passes`` (dead-node removal, CSE,
constant folding), ``executor`` (the one executor: a ready queue over the graph's ops, with
Send/Recv hooks), ``session`` (the static-graph ``Session``), ``eager`` (dynamic graphs with a tape),
``placement`` (device strings, colocation, the placer), ``partition`` (pruning and cutting a
placed graph into per-device graphs joined by ``_Send``/``_Recv``). The pictures of graphs
on the site are drawn by ``docs/generators/graph_pictures.py``.
"""
from .core import Graph, GraphError, Operation, Tensor, get_default_graph, reset_default_graph
from .eager import EagerTensor, GradientTape, eager_mode, executing_eagerly
from .eager import Variable as EagerVariable
from .executor import execute
from .gradients import gradients
from .graphdef import as_graph_def, from_json, import_graph_def, to_json
from .ops import (Variable, add, all_finite, assign, assign_add, assign_sub, cast, concat, constant, div, exp,
                  gather, global_variables_initializer, group, identity, learning_rate, log, log_softmax, matmul,
                  maximum, mul, neg, no_op, ones_like, placeholder, pow, reduce_max, reduce_mean, reduce_sum, relu,
                  reshape, scatter_update, select_if, sigmoid, sign, softmax, sparse_softmax_cross_entropy, sqrt,
                  square, sub, sum_rows, tanh, transpose, unique_rows)
from .ops import Uninitialised, apply_op
from .partition import control_value, count_send_recv, partition, prune, rendezvous_key
from .passes import common_subexpression_elimination, constant_folding, dead_node_removal, optimize
from .placement import DeviceSpec, PlacementError, canonical, colocation_groups, place
from .registry import NO_GRADIENT, REGISTRY, ShapeError, like_input, numpy_kernel, register
from .session import Session

__all__ = [n for n in dir() if not n.startswith("_")]
