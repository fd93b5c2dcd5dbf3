"""Mixed precision: float16 compute, float32 master weights, and dynamic loss scaling.

``LossScaleOptimizer`` builds graph ops and runs on PyTorch through ``Session(device=...)``
(not on ``array_api_strict``: the standard has no float16); the NumPy helpers are NumPy-only.

Why float16: half the bytes per activation and per gradient (less memory, less traffic),
and on GPUs with tensor cores several times the arithmetic throughput.  It is *not* a
stability feature; float16 is the less stable format, and two of its limits need handling:

* **rounding**: float16 has 11 significant bits, so adding an update ``lr * g`` of 1e-4 to a
  weight of 1.0 rounds back to 1.0.  Fix: keep a float32 *master* copy of every weight,
  cast it to float16 for the forward and backward pass, and apply updates to the master.
* **underflow**: the smallest positive float16 is about 6e-8; backpropagated gradients are
  often smaller and become 0.  Fix: *loss scaling*: multiply the loss by ``S`` before
  differentiating (every gradient is multiplied by ``S`` too, by linearity), then divide the
  float32 gradients by ``S`` before the update.

Too large an ``S`` overflows float16 (max 65504) into inf/NaN.  *Dynamic* loss scaling finds
``S`` by trial: if any gradient is not finite, skip the step and halve ``S``; after
``growth_interval`` finite steps in a row, double ``S``.  ``update_loss_scale`` is that state
machine in plain Python; ``LossScaleOptimizer`` builds the same rules into the graph.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import reference_impl.graph as g

from .optimizers import Adam, IndexedSlices, Optimizer, cast, where


# --8<-- [start:loss_scale]
def update_loss_scale(scale: float, good_steps: int, grads_finite: bool, growth_interval: int = 2000,
                      factor: float = 2.0, min_scale: float = 1.0) -> tuple[float, int, bool]:
    """One step of dynamic loss scaling: ``(new scale, new good-step count, apply this step?)``.

    * gradients not finite: skip the step, divide the scale by ``factor`` (not below
      ``min_scale``) and restart the count;
    * finite: apply the step and count it; the ``growth_interval``-th finite step in a row
      multiplies the scale by ``factor`` and restarts the count.
    """
    if not grads_finite:
        return max(scale / factor, min_scale), 0, False
    good_steps += 1
    if good_steps >= growth_interval:
        return scale * factor, 0, True
    return scale, good_steps, True


def unscale_gradients(scaled_grads: list[np.ndarray], scale: float) -> tuple[list[np.ndarray], bool]:
    """Float16 gradients of the scaled loss -> (float32 true gradients, are they all finite?).

    Cast to float32 *first*, then divide: dividing in float16 would push the small values
    back below float16's smallest subnormal, undoing the scaling.
    """
    grads = [np.asarray(gr, dtype=np.float32) / np.float32(scale) for gr in scaled_grads]
    return grads, all(bool(np.isfinite(gr).all()) for gr in grads)
# --8<-- [end:loss_scale]


def all_finite(tensors: list[g.Tensor]) -> g.Tensor:
    """A boolean scalar: are all elements of ``tensors`` finite?"""
    return g.all_finite(list(tensors))


def half(x: Any) -> g.Tensor:
    """``x`` (typically a float32 master weight) as float16, for the forward pass.

    The cast's gradient casts back, so the master weight's gradient arrives as float32.
    """
    return cast(x, "float16")


# --8<-- [start:optimizer]
class LossScaleOptimizer:
    """Wraps an optimiser: scale the loss, unscale the float32 gradients, skip non-finite steps.

    ``dynamic=False`` keeps the scale fixed at ``initial_scale`` (``initial_scale=1`` is plain
    mixed precision with no scaling, the configuration whose gradients underflow).
    """

    def __init__(self, optimizer: Optimizer, initial_scale: float = 2.0 ** 15, dynamic: bool = True,
                 growth_interval: int = 2000, factor: float = 2.0, min_scale: float = 1.0) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"LossScaleOptimizer wraps an Optimizer, got {type(optimizer).__name__}")
        if not (np.isfinite(initial_scale) and initial_scale >= min_scale > 0):
            raise ValueError(f"LossScaleOptimizer: need finite initial_scale >= min_scale > 0, "
                             f"got {initial_scale} and {min_scale}")
        if int(growth_interval) < 1 or not factor > 1:
            raise ValueError(f"LossScaleOptimizer: need growth_interval >= 1 and factor > 1, "
                             f"got {growth_interval} and {factor}")
        self.optimizer, self.dynamic = optimizer, bool(dynamic)
        self.initial_scale, self.growth_interval = float(initial_scale), int(growth_interval)
        self.factor, self.min_scale = float(factor), float(min_scale)
        self.loss_scale: g.Variable | None = None
        self.good_steps: g.Variable | None = None
        self.grads_finite: g.Tensor | None = None

    def minimize(self, loss: g.Tensor, var_list: list[g.Variable] | None = None) -> g.Operation:
        """The train op: one scaled backward pass, and the update only if its gradients are finite."""
        if loss.dtype != "float32":
            raise g.GraphError(f"LossScaleOptimizer: compute the loss in float32 (cast the float16 logits "
                               f"first), got a {loss.dtype} loss; a scaled float16 loss overflows at 65504")
        graph = loss.graph
        with graph.as_default():
            name = self.optimizer.name
            self.loss_scale = g.Variable(np.float32(self.initial_scale), name=f"{name}/loss_scale", trainable=False)
            self.good_steps = g.Variable(np.float32(0), name=f"{name}/good_steps", trainable=False)
            scale = self.loss_scale.value()
            scaled = self.optimizer.compute_gradients(loss * scale, var_list)
            grads = []
            for grad, var in scaled:
                if grad is None:
                    grads.append((None, var))
                elif isinstance(grad, IndexedSlices):
                    unscaled = grad.values / cast(scale, var.dtype)
                    grads.append((IndexedSlices(grad.indices, unscaled, grad.dense_shape), var))
                else:
                    grads.append((grad / cast(scale, var.dtype), var))
            ok = all_finite([gr.values if isinstance(gr, IndexedSlices) else gr for gr, _ in grads if gr is not None])
            self.grads_finite = ok
            train = self.optimizer.apply_gradients(grads, condition=ok)
            if not self.dynamic:
                return train
            good = self.good_steps.value() + 1.0
            grow = g.apply_op("GreaterEqual", [good, g.constant(np.float32(self.growth_interval))])
            shrunk = g.maximum(scale / self.factor, self.min_scale)
            new_scale = where(ok, where(grow, scale * self.factor, scale), shrunk)
            new_good = where(ok, where(grow, g.constant(np.float32(0)), good), g.constant(np.float32(0)))
            return g.group(train, g.assign(self.loss_scale, new_scale), g.assign(self.good_steps, new_good),
                           name=f"{name}/loss_scaled_update")
# --8<-- [end:optimizer]


def underflow_demo(loss_scale: float, steps: int = 150, n: int = 2048, d: int = 16, seed: int = 0,
                   learning_rate: float = 5e-7) -> dict[str, Any]:
    """Fit a linear model whose per-example gradients lie below float16's smallest subnormal.

    The targets are ``x @ w_true`` with ``w_true`` of size about 1e-5, so the gradient of the
    mean squared error with respect to each prediction, ``(pred - y) / n``, is about 2e-8:
    under half of float16's smallest positive value (2^-24, about 6e-8), so it rounds to 0 when
    the backward pass casts it to float16.  Returns the loss before each step and
    ``zero_grad_fraction``: the share of those gradient entries that are exactly 0 in float16
    at the first step, after multiplying by ``loss_scale``.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = x @ (rng.standard_normal((d, 1)) * 1e-5).astype(np.float32)
    first_grad = ((np.zeros_like(y) - y) / n * np.float32(loss_scale)).astype(np.float16)
    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(np.zeros((d, 1), np.float32), name="w")
        pred = cast(g.matmul(half(g.constant(x)), half(w)), "float32")
        loss = 0.5 * g.reduce_mean(g.square(pred - g.constant(y)))
        train = LossScaleOptimizer(Adam(learning_rate), initial_scale=loss_scale, dynamic=False).minimize(loss)
        with g.Session(graph) as sess:
            sess.run(g.global_variables_initializer())
            losses = [float(sess.run([loss, train])[0]) for _ in range(steps)]
    return {"losses": losses, "zero_grad_fraction": float(np.mean(first_grad == 0)), "loss_scale": loss_scale}
