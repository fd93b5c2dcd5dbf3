"""Where bit-for-bit reproducibility of distributed training comes from, and where it is lost.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Floating-point addition is not associative: ``(a + b) + c`` and ``a + (b + c)`` can differ
in the last bit. A training run is reproducible bit for bit exactly when every sum in it
is computed in the same order every time. Synchronous data-parallel training with a fixed
rank count, a fixed bucket layout and a fixed allreduce algorithm has that property: the
ring adds the ranks' contributions in an order fixed by rank numbers and chunk positions,
never by timing. The order changes, and with it the last bits, when

* the **rank count** changes (each rank averages a different slice of the batch, and the
  ring adds a different number of partial sums);
* the **reduction order** changes at a fixed rank count (another algorithm, or another
  bucket layout, which moves an element to another ring chunk with another starting rank);
* updates are **asynchronous**: a gradient computed on old parameters is applied to newer
  ones (``stale_sgd`` fixes the staleness to isolate its effect; in a real asynchronous
  system it depends on timing, so even the amount of staleness is not reproducible);
* contributions are **accumulated in arrival order**, as a parameter server adding pushes
  as they come, or GPU atomics do (``arrival_order_sum``).

Tiny differences do not stay tiny: training amplifies them step by step, which is why
"identical up to rounding" runs end with visibly different weights.
"""
from __future__ import annotations

import hashlib
import threading
import time

import numpy as np

from .data import batch_indices, synthetic_classification
from .mlp import init_mlp, loss_and_grads, sgd_update


def params_digest(params: list[np.ndarray]) -> str:
    """A SHA-256 of the parameters' bytes: equal digests mean bit-for-bit equal models."""
    h = hashlib.sha256()
    for p in params:
        h.update(np.ascontiguousarray(p).tobytes())
    return h.hexdigest()


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """``max |a - b|`` over every parameter (0.0 exactly when the models are bit-for-bit equal)."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise ValueError("max_abs_diff: the two parameter lists have different shapes")
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in zip(a, b))


# --8<-- [start:order]
def sum_in_order(arrays: list[np.ndarray], order: list[int]) -> np.ndarray:
    """``arrays[order[0]] + arrays[order[1]] + ...``, added left to right in that order."""
    if sorted(order) != list(range(len(arrays))):
        raise ValueError(f"sum_in_order: order must be a permutation of 0..{len(arrays) - 1}, got {order}")
    total = arrays[order[0]].copy()
    for i in order[1:]:
        total += arrays[i]
    return total


def arrival_order_sum(arrays: list[np.ndarray], jitter_s: float = 1e-3, seed: int | None = None) -> tuple[np.ndarray, list[int]]:
    """Add ``arrays`` into one accumulator from one thread each, in whatever order they finish.

    Every thread "computes" for a random time up to ``jitter_s`` (a sleep standing in for a
    worker's step), then adds its array under a lock. The lock makes each addition atomic
    but not the order: that is set by timing. Returns the sum and the order of arrival, so
    a caller can check ``sum == sum_in_order(arrays, order)``: the result is a function of
    the order, and the order is not a function of the program.
    """
    rng = np.random.default_rng(seed)
    delays = rng.uniform(0, jitter_s, size=len(arrays))
    total = np.zeros_like(arrays[0])
    order: list[int] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        time.sleep(delays[i])
        with lock:
            if order:
                total[...] += arrays[i]
            else:
                total[...] = arrays[i]
            order.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(arrays))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return total, order
# --8<-- [end:order]


def stale_sgd(
    widths: tuple[int, ...] = (32, 64, 64, 10),
    steps: int = 20,
    batch: int = 64,
    lr: float = 0.1,
    staleness: int = 0,
    seed: int = 0,
    n_samples: int = 2048,
) -> list[list[np.ndarray]]:
    """SGD in which step ``t`` applies the gradient computed at the parameters of step ``t - staleness``.

    That is what an asynchronous worker does: it reads the parameters, computes for a while,
    and by the time its gradient arrives other workers have applied ``staleness`` updates.
    ``staleness = 0`` is plain synchronous SGD on the same batches as ``data_parallel.train``
    with the same arguments. Returns the parameters after every step (``steps + 1`` lists).
    """
    if staleness < 0:
        raise ValueError(f"stale_sgd: staleness must be >= 0, got {staleness}")
    x_all, y_all = synthetic_classification(n_samples, widths[0], widths[-1], seed=seed, dtype=np.float32)
    params = init_mlp(widths, seed=seed + 1, dtype=np.float32)
    history = [[p.copy() for p in params]]
    for t in range(steps):
        idx = batch_indices(n_samples, batch, t, seed=seed)
        seen = history[max(0, t - staleness)]  # the parameters the gradient was computed on
        _, grads = loss_and_grads(seen, x_all[idx], y_all[idx])
        sgd_update(params, grads, lr)
        history.append([p.copy() for p in params])
    return history
