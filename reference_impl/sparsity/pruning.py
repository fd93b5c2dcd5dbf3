"""Pruning: choose which weights become zero.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

* ``magnitude_mask(w, sparsity)``: zero the ``sparsity`` fraction of ``w`` with the smallest
  ``|w|`` (per layer: every layer ends equally sparse);
* ``global_magnitude_masks(ws, sparsity)``: one threshold over all layers together, so a layer
  with many small weights loses more of them than a layer whose weights all matter;
* ``block_mask(w, sparsity, block)``: structured pruning, whole ``block = (rows, cols)`` tiles
  by their L2 norm; ``block=(1, w.shape[1])`` removes whole rows (an input feature of
  ``x @ w`` is dropped), ``(w.shape[0], 1)`` whole columns (an output neuron is dropped).
  Structured zeros are what a dense or block kernel can skip cheaply, at some accuracy cost;
* ``polynomial_sparsity(step, ...)``: the gradual-pruning schedule of Zhu and Gupta (2017),
  ``s_t = s_f + (s_i - s_f)(1 - (t - t_0)/(n Δt))^3``: prune fast early, when the network has
  many redundant weights, and slowly near the end, so training can recover.

A mask is a boolean array, ``True`` where a weight is kept; ties at the threshold are broken
by position so the achieved sparsity is exact.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def _check_sparsity(sparsity: float) -> None:
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")


# --8<-- [start:keep]
def _keep_largest(scores: np.ndarray, sparsity: float) -> np.ndarray:
    """A mask keeping the ``1 - sparsity`` fraction of entries with the largest score."""
    n_prune = int(round(sparsity * scores.size))
    mask = np.ones(scores.size, dtype=bool)
    mask[np.argsort(scores.ravel(), kind="stable")[:n_prune]] = False
    return mask.reshape(scores.shape)


def magnitude_mask(w: np.ndarray, sparsity: float) -> np.ndarray:
    """Keep the largest-magnitude ``1 - sparsity`` fraction of ``w``."""
    _check_sparsity(sparsity)
    return _keep_largest(np.abs(w), sparsity)


def global_magnitude_masks(ws: Sequence[np.ndarray], sparsity: float) -> list[np.ndarray]:
    """Masks for all of ``ws`` from one magnitude threshold: ``sparsity`` of all weights go."""
    _check_sparsity(sparsity)
    flat = _keep_largest(np.concatenate([np.abs(w).ravel() for w in ws]), sparsity)
    out, start = [], 0
    for w in ws:
        out.append(flat[start:start + w.size].reshape(w.shape))
        start += w.size
    return out


def block_mask(w: np.ndarray, sparsity: float, block: tuple[int, int]) -> np.ndarray:
    """Keep the ``1 - sparsity`` fraction of ``block``-shaped tiles of ``w`` with the largest L2 norm."""
    _check_sparsity(sparsity)
    if w.ndim != 2:
        raise ValueError(f"block pruning needs a matrix, got shape {w.shape}")
    r, c = block
    if r <= 0 or c <= 0 or w.shape[0] % r or w.shape[1] % c:
        raise ValueError(f"block {block} does not tile a matrix of shape {w.shape}")
    tiles = w.reshape(w.shape[0] // r, r, w.shape[1] // c, c)
    norms = np.sqrt((tiles.astype(np.float64) ** 2).sum(axis=(1, 3)))
    keep = _keep_largest(norms, sparsity)
    return np.repeat(np.repeat(keep, r, axis=0), c, axis=1)
# --8<-- [end:keep]


def polynomial_sparsity(step: int, begin_step: int, end_step: int, final_sparsity: float,
                        initial_sparsity: float = 0.0, power: int = 3) -> float:
    """The target sparsity at ``step`` of gradual pruning (constant before ``begin``, after ``end``)."""
    _check_sparsity(final_sparsity)
    if end_step <= begin_step:
        raise ValueError(f"end_step ({end_step}) must come after begin_step ({begin_step})")
    frac = min(max((step - begin_step) / (end_step - begin_step), 0.0), 1.0)
    return final_sparsity + (initial_sparsity - final_sparsity) * (1.0 - frac) ** power


def sparsity_of(w: np.ndarray) -> float:
    """The fraction of exact zeros in ``w``."""
    return 1.0 - np.count_nonzero(w) / w.size
