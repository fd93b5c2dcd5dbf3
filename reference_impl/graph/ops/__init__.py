"""Every op: its registration (inference, kernel, gradient) and its front-end function,
one module per op family.

* ``dispatch``: ``apply_op`` (graph node or eager run), shared shape inference, constants;
* ``state``: placeholders, variables and their updates, identity / no_op / group;
* ``array``: reshape, transpose, concat, gather;
* ``math``: elementwise ops, matmul, reductions, casts and comparisons, and the gradient
  helper ops;
* ``nn``: softmax, log-softmax, sparse softmax cross-entropy;
* ``training``: sparse row updates, a run-time choice, a schedule's learning rate (the ops
  the optimisers build).

Gradient functions are written with the same front-end functions, so they build gradient
nodes in graph mode and compute gradient values in eager mode.  Adding an op is one
``register`` call, with keyword arguments, in the module of its family; every built-in op
is registered here (the partitioner's ``_Send``/``_Recv`` too, in ``state``), and code
elsewhere only applies them. Custom ops (``reference_impl.custom_ops``) and the compiler's
fused kernels register themselves, as TensorFlow's custom ops do.
"""
from .dispatch import FLOATS, INTS, _infer, apply_op, constant
from .state import (Uninitialised, Variable, as_tensor, assign, assign_add, assign_sub,
                    global_variables_initializer, group, identity, no_op, placeholder)
from .array import concat, gather, reshape, reshape_like, transpose
from .math import (add, all_finite, broadcast_like, cast, div, equal, exp, greater_equal, log, matmul, maximum,
                   mul, neg, ones_like, pow, reduce_max, reduce_mean, reduce_sum, relu, relu_grad, sigmoid, sign,
                   sqrt, square, sub, sum_to, tanh)
from .nn import log_softmax, softmax, sparse_softmax_cross_entropy
from .training import learning_rate, scatter_update, select_if, sum_rows, unique_rows
