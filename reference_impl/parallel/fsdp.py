"""ZeRO stage 3 / FSDP: gather a layer, run it, free it; prefetch the next gather; reduce-scatter.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

A stage-3 rank holds only its slice of every unit (``zero.Unit``: one layer's parameters,
flat and padded). One training step is ``2 (L + 2)`` computations, each of one layer::

    forward:  embed, h.0, ..., h.{L-1}, head      backward: head, h.{L-1}, ..., h.0, embed

and every computation ``k`` needs its layer's unit whole: it is all-gathered just before,
and freed just after (so every unit is gathered twice a step, once per pass). The one
exception is the tied ``wte.weight``: the head uses it and the embedding owns it, so the
embedding's gathered unit stays alive from the embedding's forward to the end of the head's
backward (PyTorch FSDP keeps a root unit holding the embedding unsharded in the same way).
After a backward computation, its layer's gradients are packed into one full-size vector
and reduce-scattered; the full vector dies when the reduce-scatter ends.

Prefetch (FSDP's ``forward_prefetch`` and ``BACKWARD_PRE``; DeepSpeed stage 3's prefetch
bucket): the gather of computation ``k + 1`` is handed to the communication thread of
``train/data_parallel.py`` (``CommThread``) before computation ``k`` starts, and the
reduce-scatter of ``k`` after it ends, so both run while ``k + 1`` computes::

    comm thread:   G0 | G1          | G2  RS1     | G3  RS2     | ...
    training:         | compute 0   | compute 1   | compute 2   | ...
                 wait^           wait^         wait^

The jobs run in submission order, the same on every rank, which is what keeps the ranks'
ring messages matched. The price is memory: two gathered units at once, and the previous
layer's full gradient vector while the next layer computes (``transient_phases``).
Without prefetch every collective runs on the training thread, in the same order, between
the computations.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..backend import require_numpy
from . import memory as mm
from . import transformer as tf

_MODULE = "reference_impl.parallel.fsdp"  # NumPy-only: other arrays are refused, naming it

if TYPE_CHECKING:
    from .zero import ZeroTrainer


def compute_order(config: tf.GPTConfig) -> list[tuple[str, str]]:
    """``(pass, layer)`` of every computation of a step, in order."""
    names = [layer.name for layer in tf.layers(config)]
    return [("forward", n) for n in names] + [("backward", n) for n in reversed(names)]


# --8<-- [start:schedule]
def fsdp_step(t: "ZeroTrainer", tokens: np.ndarray, targets: np.ndarray) -> float:
    """Forward and backward of one stage-3 step; afterwards ``t.gshard`` holds the summed gradient slices."""
    require_numpy(_MODULE, tokens, targets)
    config, order = t.config, compute_order(t.config)
    gathered: dict[int, np.ndarray] = {}

    def gather(k: int) -> None:
        phase, layer = order[k]
        gathered[k] = t.gather_unit(layer, phase)

    def reduce_scatter(layer: str, box: list) -> None:
        t.reduce_scatter_unit(layer, box.pop())  # the box empties, so the full vector dies with the job

    x = dx = dwte = tied = head_cache = loss = None
    caches = []
    for k, (phase, layer) in enumerate(order):
        if not t.prefetch:
            gather(k)
        elif k == 0:
            t.comm_thread.submit(lambda: gather(0))
            t.wait()
        if t.prefetch and k + 1 < len(order):
            t.comm_thread.submit(lambda k=k: gather(k + 1))  # overlaps computation k
        full = gathered.pop(k)
        p = t.units[layer].views(full)
        grads = None
        if layer == "embed" and phase == "forward":
            x = tf.embed_forward(p, tokens)
            tied = full  # the head uses wte: keep the gathered embedding until the head's backward
        elif layer == "head":
            p["wte.weight"] = t.units["embed"].views(tied)["wte.weight"]
            if phase == "forward":
                loss, head_cache = tf.head_forward(p, x, targets)
                x = None
            else:
                dx, grads = tf.head_backward(p, head_cache)
                dwte = grads.pop("wte.weight")  # the head's part; the embedding adds its own
                tied = head_cache = None
        elif layer == "embed":
            grads = tf.embed_backward(p, tokens, dx, dwte)
            dx = dwte = None
        else:
            i = int(layer.split(".")[1])
            if phase == "forward":
                x, cache = tf.block_forward(p, i, x, config)
                caches.append(cache)
                del cache
            else:
                dx, grads = tf.block_backward(p, i, dx, caches.pop(), config)
        del p, full  # free the gathered unit (the tied embedding lives on in ``tied``)
        if t.prefetch:
            t.wait()  # the gather of k + 1 (and the reduce-scatter of k - 1) are done
        if grads is not None:
            box = [t.units[layer].pack(grads, t.dtype)]
            grads.clear()
            if t.prefetch:
                t.comm_thread.submit(lambda layer=layer, box=box: reduce_scatter(layer, box))
            else:
                reduce_scatter(layer, box)
            del box
    if t.prefetch:
        t.wait()
    return loss
# --8<-- [end:schedule]


# ------------------------------------------------------------------ what a step holds on top
def transient_phases(config: tf.GPTConfig, batch: int, seq: int, *, stage: int, ranks: int,
                     prefetch: bool = True) -> dict[str, int]:
    """Values a ``ZeroTrainer`` step holds beyond its persistent arrays, at each phase's fullest moment.

    Built on ``memory.step_phases`` (``other``: activations and temporaries, unchanged). Its
    gradient part assumes every gradient lives until the optimizer; here finished layers leave
    at once (into the flat gradient vector, stages 0-1, or reduce-scattered, 2-3), so backward
    holds only the tied ``wte`` gradient (``V C``, from the head to the embedding) and the
    current block's partial gradients. On top, with ``U`` a padded unit:

    * stages 2-3, right after a layer's backward: its gradients and their packed copy (``P + U``);
    * stage 3, while a layer computes: its gathered unit; the embedding's from the embedding's
      forward to the head's backward (tied ``wte``); with prefetch, the next computation's unit
      and, in backward, the previous layer's packed gradients still being reduce-scattered
      (the worst case: that reduce-scatter may already have ended);
    * the optimizer: Adam's one scratch array, the size of the largest array it updates.
    """
    from .zero import flat_units  # zero imports this module

    units = {u.name: u for u in flat_units(config, ranks)}
    C, V, L, NC = config.n_embd, config.vocab_size, config.n_layer, batch * seq * config.n_embd
    Ue, Ub, Uh = units["embed"].padded, units["h.0"].padded, units["head"].padded
    Pe, Pb, Ph = units["embed"].numel, units["h.0"].numel, units["head"].numel
    kept = mm.block_cache_elements(config, batch, seq)
    steps = mm.step_phases(config, batch, seq)
    s3, pf = stage == 3, stage == 3 and prefetch
    out = {}
    # forward: gradients none; stage 3 holds the tied embedding, the working unit, the next one
    other = steps["forward: last block"][1]
    out["forward: last block"] = other + s3 * (Ue + Ub) + pf * Uh
    if pf and L >= 2:
        out["forward: block L-2"] = other - kept + Ue + 2 * Ub
    out["forward: head"] = steps["forward: head"][1] + s3 * (Ue + Uh) + pf * Uh
    grads, other = steps["backward: head"]
    out["backward: head"] = grads + other + s3 * (Ue + Uh) + pf * Ub
    # a block's backward: blocks below it kept (step_phases is linear in i), the moment's
    # temporaries, the tied gradient and the block's partial ones (finished layers are gone)
    g_top, o_top = steps[f"backward: block {L - 1}"]

    def block(i: int, previous: int) -> int:  # ``previous``: the unit whose packed gradients may be in flight
        return g_top - Ph + o_top - (L - 1 - i) * kept + s3 * Ub + pf * ((Ub if i > 0 else Ue) + previous)

    out[f"backward: block {L - 1}"] = block(L - 1, Uh)
    if L >= 2:
        out[f"backward: block {L - 2}"] = block(L - 2, Ub)
        out["backward: block 0"] = block(0, Ub)
    if stage >= 2:  # packing the top block's gradients: blocks below kept, dx, dwte, its gradients twice
        out[f"pack: block {L - 1}"] = (L - 1) * kept + NC + V * C + Pb + Ub + pf * (Ub if L > 1 else Ue)
        out["pack: embedding"] = Pe + Ue + NC
    out["backward: embedding"] = Pe + steps["backward: embedding"][1] + s3 * Ue + pf * Ub
    out["optimizer"] = max(u.padded if stage == 0 else u.shard for u in units.values())
    return out
