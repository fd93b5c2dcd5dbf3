"""Optimisers as graph-building classes, in the style of TensorFlow 1's ``tf.train.Optimizer``.

Portable: an optimiser only builds graph ops, whose kernels are array-API code, so
``Session(device=...)`` runs its updates, dense and sparse, on that namespace.

``opt.minimize(loss)`` adds the gradient nodes and the update nodes to the loss's graph and
returns one train op; running it in a Session takes one step.  An optimiser's state (Adam's
moments, Adagrad's accumulator …) lives in *slot* variables, one set per trained variable,
named ``<variable>/<optimiser>/<slot>``, so it is saved, restored and initialised like any
other variable.

Adding an optimiser is one class: list its ``slots`` (with their initial values) and write
``update(var, grad, slots, lr, t)``, which returns the new variable and the new slots as graph
tensors built from ordinary ops.  The base class does the rest: gradients, slot creation,
the learning rate (a number or a ``Schedule``), the step counter ``t``, dense and sparse
application, and the optional ``condition`` that turns a step into a no-op (used by dynamic
loss scaling to skip a step whose gradients overflowed).

**Sparse (row-wise) updates.**  The graph runtime differentiates ``gather(params, ids)`` into
one dense ``GatherGrad`` node: a zero matrix the size of the whole embedding table with the
used rows added in.  ``compute_gradients`` recognises that node and hands on the
``IndexedSlices(indices, values)`` it was built from instead, so the update touches only the
rows in the batch: it sums the values of repeated ids (``SumRows`` over ``UniqueRows``),
gathers those rows of the variable and of every slot, runs the *same* ``update`` on them, and
writes them back with ``ScatterUpdate``.  Rows not in the batch keep their value and their
slots ("lazy" updates, as TensorFlow's sparse Momentum, Adagrad and FTRL kernels and
TensorFlow Addons' ``LazyAdam`` do; TensorFlow's plain Adam decays the moments of every row
and moves every row): for SGD and Adagrad this equals the dense update exactly; for
optimisers with momentum or a decaying mean square (RMSProp, Adam) it differs, because the
dense update keeps changing rows whose gradient is zero. The step count ``t`` stays global,
as in ``LazyAdam``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import reference_impl.graph as g

from .schedules import Schedule, check_learning_rate


# ------------------------------------------------------------------ graph helpers
# Nodes are added with the graph's ``apply_op``, as every front-end function adds its own;
# ``apply`` is its name here, which the example in docs/concepts/optimisers.md imports.
# The ops of sparse updates (``unique_rows``, ``sum_rows``, ``scatter_update``), ``select_if``
# and ``learning_rate`` are registered with the others, in ``reference_impl/graph/ops/``.
apply = g.apply_op


def cast(x: Any, dtype: str) -> g.Tensor:
    """``x`` converted to ``dtype`` (the runtime's Cast op)."""
    x = x.value() if isinstance(x, g.Variable) else x
    return x if x.dtype == dtype else g.apply_op("Cast", [x], {"dtype": np.dtype(dtype).name})


def where(condition: g.Tensor, x: g.Tensor, y: g.Tensor) -> g.Tensor:
    """``x`` if the boolean scalar ``condition`` holds when run, else ``y``."""
    return g.select_if(condition, x, y)


def _greater(x: Any, y: Any) -> g.Tensor:
    """``x > y`` as 0/1 in x's dtype (``1 - (y >= x)``)."""
    return 1 - cast(g.apply_op("GreaterEqual", [y, x]), x.dtype)


@dataclass
class IndexedSlices:
    """A sparse gradient: ``values[i]`` is the gradient of row ``indices[i]`` (ids may repeat)."""

    indices: g.Tensor
    values: g.Tensor
    dense_shape: tuple


# ------------------------------------------------------------------ the base class
class Optimizer:
    """Base class.  Subclasses set ``slots`` ({name: initial value}) and define ``update``."""

    slots: dict[str, float] = {}

    def __init__(self, learning_rate: float | Schedule, name: str | None = None) -> None:
        if not isinstance(learning_rate, Schedule):
            learning_rate = check_learning_rate(learning_rate, f"{type(self).__name__}: learning_rate")
        self.learning_rate = learning_rate
        self.name = name or type(self).__name__
        self.iterations: g.Variable | None = None  # number of steps applied, created on first use
        self._slots: dict[tuple[str, str], g.Variable] = {}

    def update(self, var: g.Tensor, grad: g.Tensor, slots: dict[str, g.Tensor], lr: g.Tensor,
               t: g.Tensor) -> tuple[g.Tensor, dict[str, g.Tensor]]:
        """The new value of ``var`` and of each slot after one step (``t`` counts from 1)."""
        raise NotImplementedError(f"{type(self).__name__} must define update(var, grad, slots, lr, t)")

    # -- building the step
    def minimize(self, loss: g.Tensor, var_list: list[g.Variable] | None = None,
                 condition: g.Tensor | None = None) -> g.Operation:
        """The train op: gradients of ``loss`` for ``var_list`` (default: all trainable), applied."""
        return self.apply_gradients(self.compute_gradients(loss, var_list), condition)

    def compute_gradients(self, loss: g.Tensor, var_list: list[g.Variable] | None = None
                          ) -> list[tuple[g.Tensor | IndexedSlices | None, g.Variable]]:
        """``[(gradient, variable)]``; a gradient that comes straight from a gather is sparse."""
        if var_list is None:
            var_list = [v for v in loss.graph.variables if v.trainable]
        if not var_list:
            raise g.GraphError(f"{self.name}.minimize: there are no trainable variables to optimise")
        grads = g.gradients(loss, [v.value() for v in var_list])
        out = []
        for grad, var in zip(grads, var_list):
            if grad is not None and grad.op.type == "GatherGrad" and grad.op.inputs[2] is var.value():
                values, indices = grad.op.inputs[0], grad.op.inputs[1]
                with loss.graph.as_default():
                    grad = IndexedSlices(g.reshape(indices, [-1]),
                                         g.reshape(values, [-1] + list(var.shape[1:])), tuple(var.shape))
            out.append((grad, var))
        return out

    def apply_gradients(self, grads_and_vars: list[tuple[Any, g.Variable]],
                        condition: g.Tensor | None = None) -> g.Operation:
        """One op that updates every variable (and its slots) and counts the step.

        With ``condition`` (a boolean scalar tensor), the step is applied only when it holds:
        otherwise every variable, slot and the step counter keep their values.
        """
        pairs = [(grad, var) for grad, var in grads_and_vars if grad is not None]
        if not pairs:
            names = ", ".join(v.name for _, v in grads_and_vars)
            raise g.GraphError(f"{self.name}: no gradient reaches any variable ({names}); "
                               "does the loss depend on them?")
        graph = pairs[0][1].graph
        with graph.as_default():
            if self.iterations is None:
                self.iterations = g.Variable(np.float32(0), name=f"{self.name}/iterations", trainable=False)
            steps_done = self.iterations.value()
            rates: dict[str, g.Tensor] = {}  # one learning-rate node per variable dtype
            updates = []
            for grad, var in pairs:
                if var.dtype not in rates:
                    rates[var.dtype] = self._learning_rate(steps_done, var.dtype)
                lr, t = rates[var.dtype], cast(steps_done + 1.0, var.dtype)
                if isinstance(grad, IndexedSlices):
                    updates += self._apply_sparse(grad, var, lr, t, condition)
                else:
                    updates += self._apply_dense(grad, var, lr, t, condition)
            counted = steps_done + 1.0 if condition is None else where(condition, steps_done + 1.0, steps_done)
            updates.append(g.assign(self.iterations, counted))
            return g.group(*updates, name=f"{self.name}/update")

    # -- helpers
    def _learning_rate(self, steps_done: g.Tensor, dtype: str) -> g.Tensor:
        schedule = self.learning_rate
        if isinstance(schedule, Schedule):
            return g.learning_rate(schedule.config(), steps_done, dtype)
        return g.constant(np.asarray(schedule, dtype=dtype), name=f"{self.name}/learning_rate")

    def get_slot(self, var: g.Variable, slot: str) -> g.Variable:
        """The slot variable ``slot`` of ``var`` (created by ``apply_gradients``)."""
        try:
            return self._slots[(var.name, slot)]
        except KeyError:
            raise g.GraphError(f"{self.name} has no slot {slot!r} for {var.name}; known slots: "
                               f"{', '.join(self.slots) or 'none'}") from None

    def _slot_vars(self, var: g.Variable) -> dict[str, g.Variable]:
        for slot, initial in self.slots.items():
            if (var.name, slot) not in self._slots:
                value = np.full(var.shape, initial, dtype=var.dtype)
                base = var.op.name
                self._slots[(var.name, slot)] = g.Variable(value, name=f"{base}/{self.name}/{slot}", trainable=False)
        return {slot: self._slots[(var.name, slot)] for slot in self.slots}

    def _apply_dense(self, grad: g.Tensor, var: g.Variable, lr: g.Tensor, t: g.Tensor,
                     condition: g.Tensor | None) -> list:
        if grad.dtype != var.dtype:
            raise g.GraphError(f"{self.name}: gradient of {var.name} is {grad.dtype}, the variable is {var.dtype}")
        slots = self._slot_vars(var)
        new_var, new_slots = self.update(var.value(), grad, {k: v.value() for k, v in slots.items()}, lr, t)
        out = []
        for target, new in [(var, new_var)] + [(slots[k], new_slots[k]) for k in slots]:
            if condition is not None:
                new = where(condition, new, target.value())
            out.append(g.assign(target, new))
        return out

    def _apply_sparse(self, grad: IndexedSlices, var: g.Variable, lr: g.Tensor, t: g.Tensor,
                      condition: g.Tensor | None) -> list:
        slots = self._slot_vars(var)
        rows = g.unique_rows(grad.indices)
        summed = g.sum_rows(grad.values, grad.indices)
        old = {k: g.gather(v, rows) for k, v in slots.items()}
        var_rows = g.gather(var, rows)
        new_var, new_slots = self.update(var_rows, summed, old, lr, t)
        out = []
        for target, new, before in [(var, new_var, var_rows)] + [(slots[k], new_slots[k], old[k]) for k in slots]:
            if condition is not None:
                new = where(condition, new, before)
            out.append(g.scatter_update(target, rows, new))
        return out


# ------------------------------------------------------------------ the optimisers
# --8<-- [start:momentum]
class GradientDescent(Optimizer):
    """``w <- w - lr * g``."""

    def update(self, var, grad, slots, lr, t):
        return var - lr * grad, {}


class Momentum(Optimizer):
    """Heavy ball: ``v <- mu v + g``, ``w <- w - lr v``; Nesterov: ``w <- w - lr (g + mu v)``.

    (TensorFlow's form: the learning rate multiplies the velocity, so changing it mid-run
    changes the step size at once.)
    """

    slots = {"momentum": 0.0}

    def __init__(self, learning_rate: float | Schedule, momentum: float = 0.9, use_nesterov: bool = False,
                 name: str | None = None) -> None:
        super().__init__(learning_rate, name)
        if not 0 <= momentum < 1:
            raise ValueError(f"Momentum: momentum must be in [0, 1), got {momentum}")
        self.momentum, self.use_nesterov = float(momentum), bool(use_nesterov)

    def update(self, var, grad, slots, lr, t):
        v = self.momentum * slots["momentum"] + grad
        step = grad + self.momentum * v if self.use_nesterov else v
        return var - lr * step, {"momentum": v}
# --8<-- [end:momentum]


class Adagrad(Optimizer):
    """``a <- a + g^2``, ``w <- w - lr g / sqrt(a)``: a per-coordinate rate that only shrinks.

    The accumulator starts at ``initial_accumulator_value`` (0.1, as in TensorFlow), so the
    first step is not a division by ``|g|``.
    """

    def __init__(self, learning_rate: float | Schedule, initial_accumulator_value: float = 0.1,
                 name: str | None = None) -> None:
        super().__init__(learning_rate, name)
        if not initial_accumulator_value > 0:
            raise ValueError(f"Adagrad: initial_accumulator_value must be > 0, got {initial_accumulator_value}")
        self.slots = {"accumulator": float(initial_accumulator_value)}

    def update(self, var, grad, slots, lr, t):
        a = slots["accumulator"] + g.square(grad)
        return var - lr * grad / g.sqrt(a), {"accumulator": a}


class RMSProp(Optimizer):
    """``ms <- rho ms + (1 - rho) g^2``; ``mom <- mu mom + lr g / sqrt(ms + eps)``; ``w <- w - mom``.

    Adagrad with a moving average instead of a sum, so the rate can grow again.
    """

    slots = {"ms": 0.0, "mom": 0.0}

    def __init__(self, learning_rate: float | Schedule, rho: float = 0.9, momentum: float = 0.0,
                 epsilon: float = 1e-7, name: str | None = None) -> None:
        super().__init__(learning_rate, name)
        if not 0 <= rho < 1 or not 0 <= momentum < 1 or not epsilon > 0:
            raise ValueError(f"RMSProp: need 0 <= rho < 1, 0 <= momentum < 1, epsilon > 0; "
                             f"got rho={rho}, momentum={momentum}, epsilon={epsilon}")
        self.rho, self.momentum, self.epsilon = float(rho), float(momentum), float(epsilon)

    def update(self, var, grad, slots, lr, t):
        ms = self.rho * slots["ms"] + (1 - self.rho) * g.square(grad)
        mom = self.momentum * slots["mom"] + lr * grad / g.sqrt(ms + self.epsilon)
        return var - mom, {"ms": ms, "mom": mom}


# --8<-- [start:adam]
def adam_update(var: g.Tensor, grad: g.Tensor, m: g.Tensor, v: g.Tensor, lr: g.Tensor, t: g.Tensor,
                beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                weight_decay: float = 0.0) -> tuple[g.Tensor, g.Tensor, g.Tensor]:
    """One Adam step as graph tensors: ``(new var, new m, new v)``; ``t`` counts steps from 1.

    Kingma & Ba (2015), Algorithm 1, plus AdamW's decoupled weight decay::

        m <- b1 m + (1 - b1) g          m_hat = m / (1 - b1^t)
        v <- b2 v + (1 - b2) g^2        v_hat = v / (1 - b2^t)
        w <- w - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay w)

    The bias corrections undo the pull towards the zero initial moments in the first steps.
    """
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * g.square(grad)
    m_hat = m / (1 - g.pow(beta1, t))
    v_hat = v / (1 - g.pow(beta2, t))
    step = m_hat / (g.sqrt(v_hat) + epsilon)
    if weight_decay:
        step = step + weight_decay * var
    return var - lr * step, m, v


class Adam(Optimizer):
    """Adam: per-coordinate steps scaled by running estimates of the gradient's first two moments.

    The step ``lr * m_hat / sqrt(v_hat)`` has size about ``lr`` whatever the gradient's scale,
    so one learning rate suits parameters whose gradients differ by orders of magnitude.
    """

    slots = {"m": 0.0, "v": 0.0}

    def __init__(self, learning_rate: float | Schedule = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, name: str | None = None) -> None:
        super().__init__(learning_rate, name)
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1 and epsilon > 0):
            raise ValueError(f"{type(self).__name__}: need 0 <= beta1, beta2 < 1 and epsilon > 0; "
                             f"got beta1={beta1}, beta2={beta2}, epsilon={epsilon}")
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.weight_decay = 0.0

    def update(self, var, grad, slots, lr, t):
        var, m, v = adam_update(var, grad, slots["m"], slots["v"], lr, t, self.beta1, self.beta2, self.epsilon,
                                self.weight_decay)
        return var, {"m": m, "v": v}
# --8<-- [end:adam]


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019): ``w -= lr * weight_decay * w``.

    Adding ``weight_decay * w`` to the *gradient* instead (L2 regularisation) would be
    divided by ``sqrt(v_hat)``, so weights with large gradients would be decayed less.
    """

    def __init__(self, learning_rate: float | Schedule = 0.001, weight_decay: float = 0.01, beta1: float = 0.9,
                 beta2: float = 0.999, epsilon: float = 1e-8, name: str | None = None) -> None:
        super().__init__(learning_rate, beta1, beta2, epsilon, name)
        if not weight_decay >= 0:
            raise ValueError(f"AdamW: weight_decay must be >= 0, got {weight_decay}")
        self.weight_decay = float(weight_decay)


class Ftrl(Optimizer):
    """FTRL-Proximal (McMahan et al., 2013, Algorithm 1), per coordinate, with ``alpha = lr``::

        sigma = (sqrt(n + g^2) - sqrt(n)) / lr
        z <- z + g - sigma w
        n <- n + g^2
        w <- 0                                               if |z| <= l1
             -(z - sign(z) l1) / ((beta + sqrt(n)) / lr + l2)  otherwise

    The L1 threshold sets weights exactly to zero: the reason click-through-rate models with
    billions of sparse features use it.  The new ``w`` depends only on ``z`` and ``n``.
    """

    slots = {"z": 0.0, "n": 0.0}

    def __init__(self, learning_rate: float | Schedule, l1: float = 0.0, l2: float = 0.0, beta: float = 1.0,
                 name: str | None = None) -> None:
        super().__init__(learning_rate, name)
        if not (l1 >= 0 and l2 >= 0 and beta >= 0):
            raise ValueError(f"Ftrl: l1, l2 and beta must be >= 0, got l1={l1}, l2={l2}, beta={beta}")
        self.l1, self.l2, self.beta = float(l1), float(l2), float(beta)

    def update(self, var, grad, slots, lr, t):
        n_new = slots["n"] + g.square(grad)
        sigma = (g.sqrt(n_new) - g.sqrt(slots["n"])) / lr
        z = slots["z"] + grad - sigma * var
        shrunk = z - g.sign(z) * self.l1
        w = _greater(g.sign(z) * z, self.l1 * g.ones_like(z)) * g.neg(shrunk) / (
            (self.beta + g.sqrt(n_new)) / lr + self.l2)
        return w, {"z": z, "n": n_new}


OPTIMIZERS = {cls.__name__: cls for cls in (GradientDescent, Momentum, Adagrad, RMSProp, Adam, AdamW, Ftrl)}
