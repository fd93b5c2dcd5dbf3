"""Where a training step's bytes go: parameters, gradients, optimiser state, activations, temporaries.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

A model "does not fit" when one rank's bytes exceed its device memory. Those bytes have five
parts, and each memory-saving strategy attacks one of them:

* **model states**, proportional to the parameter count Ψ. Mixed-precision Adam holds
  ``2Ψ`` bytes of 16-bit parameters, ``2Ψ`` of 16-bit gradients and ``KΨ`` of float32
  optimiser state, ``K = 12`` (master weights, momentum, variance): ``16Ψ`` bytes, 120 GB for
  a 7.5B-parameter model. Plain data parallelism replicates all of it on every rank. ZeRO
  (Rajbhandari et al., SC'20, arXiv:1910.02054, section 5 and Figure 1) partitions it over the
  ``N_d`` data-parallel ranks: stage 1 (P_os) the optimiser state, stage 2 (P_os+g) the
  gradients too, stage 3 (P_os+g+p, PyTorch's FSDP ``FULL_SHARD``) the parameters too::

      baseline  (2 + 2 + K) Ψ         stage 2   2Ψ + (2 + K) Ψ / N_d
      stage 1   4Ψ + K Ψ / N_d        stage 3   (2 + 2 + K) Ψ / N_d

  ``zero_paper_memory`` reproduces the paper's numbers (7.5B, N_d = 64: 120, 31.4, 16.6,
  1.9 GB).
* **activations**, proportional to batch × sequence × layers: what the forward keeps for
  the backward. Counted here array by array from ``transformer.block_forward``'s cache
  (``block_cache_elements``); ZeRO-DP does not touch them (each rank keeps its own
  micro-batch's), activation recomputation keeps only each block's input.
* **temporaries**: arrays that live for part of a step (the attention scores and their
  gradient, the logits and their softmax, GELU's intermediates, Adam's scratch array).

``memory_breakdown`` gives the five parts per rank, for plain data parallelism or a ZeRO
stage. Their sum is an upper bound on the step's peak, not the peak: activations are freed
during backward while gradients appear. ``step_peak_elements`` follows the step instead,
phase by phase, from the arrays ``transformer.py`` allocates and frees, and
``measure_peak_bytes`` measures the real peak with ``tracemalloc`` (NumPy reports its array
buffers to it) so the two can be compared: ``tests/test_parallel_memory.py`` holds the
prediction within 10% of the measurement; ``python -m reference_impl.parallel`` prints the table.
"""
from __future__ import annotations

import math
import time
import tracemalloc
from dataclasses import asdict, dataclass

import numpy as np

from . import transformer as tf
from .adam import Adam

# bytes per parameter: (compute copy, gradient, float32 master copy); optimiser slots are float32
PRECISIONS = {"fp32": (4, 4, 0), "fp16": (2, 2, 4), "bf16": (2, 2, 4)}
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}


def optimizer_k(optimizer: str, precision: str) -> int:
    """The ZeRO paper's K: bytes of optimiser state per parameter (float32 master copy included)."""
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZER_SLOTS)}, got {optimizer!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision][2] + 4 * OPTIMIZER_SLOTS[optimizer]


# --8<-- [start:zero_paper]
def zero_paper_memory(psi: float, ranks: int, k: int = 12) -> dict[str, float]:
    """Model-state bytes per device for the baseline and ZeRO's three stages, mixed-precision Adam.

    ``zero_paper_memory(7.5e9, 64)``: 120e9, 31.4e9, 16.6e9, 1.9e9 bytes (the paper's Figure 1).
    """
    return {"baseline": (2 + 2 + k) * psi,
            "P_os": 2 * psi + 2 * psi + k * psi / ranks,
            "P_os+g": 2 * psi + (2 + k) * psi / ranks,
            "P_os+g+p": (2 + 2 + k) * psi / ranks}
# --8<-- [end:zero_paper]


# ------------------------------------------------------------------ activations, from the cache
# --8<-- [start:activations]
def block_cache_elements(config: tf.GPTConfig, batch: int, seq: int) -> int:
    """Values one block's forward keeps (``block_forward``'s cache): ``16 N C + 2 N + B n_head T^2``.

    Per token: xhat1, a1, y, xhat2, a2 (C each), qkv (3C), h and g (4C each), rstd1 and rstd2
    (1 each), and one row of attention probabilities per head (T).
    """
    N, C = batch * seq, config.n_embd
    return 16 * N * C + 2 * N + batch * config.n_head * seq * seq


def head_cache_elements(config: tf.GPTConfig, batch: int, seq: int) -> int:
    """Values the head keeps: ln_f's xhat and output (C each), rstd (1), the softmax (V) per token."""
    N = batch * seq
    return N * (2 * config.n_embd + 1 + config.vocab_size)


def activation_elements(config: tf.GPTConfig, batch: int, seq: int, *, recompute: bool = False) -> int:
    """Values kept from the forward for the backward: every block's cache (or, with recomputation,
    every block's input ``N C``) plus the head's."""
    per_block = batch * seq * config.n_embd if recompute else block_cache_elements(config, batch, seq)
    return config.n_layer * per_block + head_cache_elements(config, batch, seq)
# --8<-- [end:activations]


def _layer_param_elements(config: tf.GPTConfig) -> tuple[int, int, int]:
    """(embed, one block, head-owned) parameter counts."""
    shapes = tf.param_shapes(config)
    embed = math.prod(shapes["wte.weight"]) + math.prod(shapes["wpe.weight"])
    block = sum(math.prod(shapes[f"h.0.{n}"]) for n in tf._BLOCK_PARAMS)
    return embed, block, 2 * config.n_embd


def step_phases(config: tf.GPTConfig, batch: int, seq: int, *,
                recompute: bool = False) -> dict[str, tuple[int, int]]:
    """Values alive at the fullest moment of each phase of a step: ``{phase: (gradients, other)}``.

    Parameters and optimiser state are not counted (they live throughout). The phases follow
    the order ``transformer.py`` allocates and frees arrays (``N = B T``, ``A = B n_head T^2``,
    ``Kb`` = one block's cache, ``kept`` = what a block leaves for backward: ``Kb``, or its
    input ``N C`` with recomputation):

    * forward, last block and head: every block's ``kept``, the working block's cache and
      residual stream, then the head's cache (its softmax ``N V``);
    * head backward: the softmax turned into ``dlogits`` in place, ``dwte`` (V C) and
      ``d(ln_f output)``;
    * block ``i``'s backward: blocks below it kept, its own cache (recomputed if need be),
      the gradients so far, the incoming gradient ``N C``, plus the larger of two moments:
      GELU's backward (``+12 N C``: dg and three 4C intermediates, less g already freed) and
      the softmax backward (``A - 6 N C - N``: the probabilities' gradient next to them,
      after the MLP's cache is freed). Linear in ``i``, so the top and bottom blocks bound it;
    * embedding backward and the optimiser: every gradient, plus Adam's scratch array the
      size of the largest parameter.
    """
    N, C, V, L = batch * seq, config.n_embd, config.vocab_size, config.n_layer
    A = batch * config.n_head * seq * seq
    Kb = block_cache_elements(config, batch, seq)
    kept = N * C if recompute else Kb
    P_embed, P_block, P_head = _layer_param_elements(config)
    P = P_embed + L * P_block + P_head
    phases = {
        "forward: last block": (0, (L - 1) * kept + (N * C if recompute else 0) + Kb + 3 * N * C),
        "forward: head": (0, L * kept + N * C + head_cache_elements(config, batch, seq) + 3 * N),
        "backward: head": (V * C, L * kept + N * C + N + N * V + N * C),
    }
    for i in (L - 1, 0):
        grads = P_head + V * C + (L - 1 - i) * P_block
        base = i * kept + Kb + N * C  # blocks below, this block's cache, the incoming gradient
        gelu = (4 * C * C + C, 12 * N * C)
        softmax = (12 * C * C + 9 * C, A - 6 * N * C - N)  # MLP, ln_2 and attn.c_proj gradients done
        phases[f"backward: block {i}"] = max(((grads + g, base + o) for g, o in (gelu, softmax)), key=sum)
    phases["backward: embedding"] = (P, N * C + seq * C)
    phases["optimizer"] = (P, max(math.prod(s) for s in tf.param_shapes(config).values()))
    return phases


def step_peak_elements(config: tf.GPTConfig, batch: int, seq: int, *,
                       recompute: bool = False) -> tuple[int, str]:
    """The most values alive at once in a step (gradients, activations, temporaries: not the
    parameters or optimiser state), and the phase where that happens (``step_phases``)."""
    phases = step_phases(config, batch, seq, recompute=recompute)
    phase = max(phases, key=lambda k: sum(phases[k]))
    return sum(phases[phase]), phase


def temporary_elements(config: tf.GPTConfig, batch: int, seq: int, *, recompute: bool = False) -> int:
    """The largest set of transient arrays a step holds at once (neither kept activations nor gradients).

    The largest of: GELU's backward (``12 N C``), the softmax backward (the probabilities'
    gradient ``A`` plus ``dy``, ``dqkv`` and the residual gradient, ``5 N C``), the head's
    logits being turned into probabilities (``N V``, counted with the activations since the
    head keeps them) and Adam's scratch array (the largest parameter). With recomputation,
    one block's cache rebuilt during backward (``Kb``) comes on top.
    """
    N, C = batch * seq, config.n_embd
    A = batch * config.n_head * seq * seq
    largest = max(math.prod(s) for s in tf.param_shapes(config).values())
    rebuilt = block_cache_elements(config, batch, seq) if recompute else 0
    return max(12 * N * C, A + 5 * N * C, largest) + rebuilt


# ------------------------------------------------------------------ the breakdown
@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per rank. ``total`` sums the parts (an upper bound); ``peak`` follows the step."""

    parameters: float
    gradients: float
    optimizer_state: float
    activations: float
    temporaries: float
    peak: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_state + self.activations + self.temporaries

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def memory_breakdown(config: tf.GPTConfig, optimizer: str = "adam", precision: str = "fp32", batch: int = 1,
                     seq: int | None = None, *, stage: int = 0, ranks: int = 1,
                     recompute: bool = False) -> MemoryBreakdown:
    """Predicted bytes per rank for training ``config`` on a per-rank micro-batch ``batch x seq``.

    ``precision``: ``fp32`` (everything float32) or ``fp16``/``bf16`` (mixed: 16-bit parameters,
    gradients and activations, float32 master weights and optimiser state). ``stage``: 0 is
    plain data parallelism (every rank holds everything); 1, 2, 3 are ZeRO's stages, dividing
    the optimiser state, then the gradients, then the parameters by ``ranks``.

    Activations and temporaries are those of ``transformer.py``, in the compute precision.
    Stage 2 adds one layer's full gradients to the temporaries (they exist in full until
    reduce-scattered), stage 3 also one layer's full parameters (gathered, used, freed).
    ``peak`` follows the step (``step_phases``) with the gradients sharded as the stage says:
    exact for stages 0 and 1 in float32 (validated against ``measure_peak_bytes``); for 2 and
    3 a prediction the ZeRO trainers will check.
    """
    seq = config.block_size if seq is None else seq
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (plain data parallel), 1, 2 or 3, got {stage!r}")
    if ranks < 1 or batch < 1 or not 1 <= seq <= config.block_size:
        raise ValueError(f"need ranks >= 1, batch >= 1 and 1 <= seq <= {config.block_size}, "
                         f"got {ranks}, {batch}, {seq}")
    k = optimizer_k(optimizer, precision)
    param_bytes, grad_bytes, _ = PRECISIONS[precision]
    psi = tf.n_params(config)
    layer_max = max(sum(math.prod(tf.param_shapes(config)[n]) for n in layer.uses) for layer in tf.layers(config))
    params = param_bytes * psi / (ranks if stage >= 3 else 1)
    grads = grad_bytes * psi / (ranks if stage >= 2 else 1)
    state = k * psi / (ranks if stage >= 1 else 1)
    acts = param_bytes * activation_elements(config, batch, seq, recompute=recompute)
    temps = param_bytes * temporary_elements(config, batch, seq, recompute=recompute)
    extra = (grad_bytes * layer_max if stage >= 2 else 0) + (param_bytes * layer_max if stage >= 3 else 0)
    grad_share = 1 / ranks if stage >= 2 else 1
    step = max(grad_bytes * g * grad_share + param_bytes * o
               for g, o in step_phases(config, batch, seq, recompute=recompute).values())
    return MemoryBreakdown(params, grads, state, acts, temps + extra, params + state + step + extra)


# ------------------------------------------------------------------ measuring
# (config, batch, seq) whose predicted peak tests/test_parallel_memory.py checks against
# tracemalloc: layers, width, batch and sequence varied; attention-, MLP- and optimiser-bound.
VALIDATION_CONFIGS = (
    (tf.GPTConfig(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=64), 8, 64),
    (tf.GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=64), 8, 64),
    (tf.GPTConfig(vocab_size=96, block_size=128, n_layer=2, n_head=4, n_embd=128), 4, 128),
    (tf.GPTConfig(vocab_size=96, block_size=32, n_layer=2, n_head=2, n_embd=128), 16, 32),
    (tf.GPTConfig(vocab_size=96, block_size=256, n_layer=2, n_head=8, n_embd=64), 2, 256),
    (tf.GPTConfig(vocab_size=96, block_size=16, n_layer=2, n_head=4, n_embd=256), 2, 16),
)


def train_step(params: dict[str, np.ndarray], opt: Adam, tokens: np.ndarray, targets: np.ndarray,
               config: tf.GPTConfig, *, recompute: bool = False) -> float:
    """One step: forward, backward (the cache consumed as it goes), Adam update; the loss."""
    loss, cache = tf.forward(params, tokens, targets, config, keep="inputs" if recompute else "all")
    grads = tf.backward(params, cache, config)
    del cache
    opt.step(params, grads)
    return loss


def measure_peak_bytes(config: tf.GPTConfig, batch: int, seq: int, *, recompute: bool = False,
                       dtype: type = np.float32, seed: int = 0, repeats: int = 1) -> dict[str, float]:
    """Run one training step and measure its memory with ``tracemalloc``.

    Parameters, Adam's state (allocated up front, ``Adam.init_state``) and the batch exist
    before tracing starts, so ``peak`` is what the step adds on top of them: gradients,
    activations and temporaries, comparable to ``step_peak_elements * itemsize``.
    ``persistent`` is the bytes of parameters and optimiser state, so the rank's peak is
    ``persistent + peak``. ``seconds`` is the median time of ``repeats`` more steps, untraced.
    """
    params = tf.init_params(config, seed=seed, dtype=dtype)
    opt = Adam(lr=1e-3)
    opt.init_state(params)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, (batch, seq))
    targets = rng.integers(0, config.vocab_size, (batch, seq))
    train_step(params, opt, tokens, targets, config, recompute=recompute)  # warm: masks, lazy imports
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        train_step(params, opt, tokens, targets, config, recompute=recompute)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        train_step(params, opt, tokens, targets, config, recompute=recompute)
        times.append(time.perf_counter() - t0)
    seconds = float(np.median(times))
    persistent = sum(p.nbytes for p in params.values()) + sum(m.nbytes + v.nbytes for m, v in opt.state.values())
    return {"peak": float(peak), "persistent": float(persistent), "seconds": seconds}


def compare(config: tf.GPTConfig, batch: int, seq: int, *, recompute: bool = False) -> dict[str, float]:
    """Predicted and measured step peak (float32), their ratio, and the predicted phase."""
    measured = measure_peak_bytes(config, batch, seq, recompute=recompute)
    elems, phase = step_peak_elements(config, batch, seq, recompute=recompute)
    predicted = 4 * elems
    return {"predicted": predicted, "measured": measured["peak"], "ratio": predicted / measured["peak"],
            "phase": phase, "persistent": measured["persistent"], "seconds": measured["seconds"]}


def recompute_cost(config: tf.GPTConfig, batch: int, seq: int, *, repeats: int = 5) -> dict[str, float]:
    """What activation recomputation saves and costs on one step, predicted and measured (float32).

    ``flops_ratio``: step FLOPs with recomputation over without (``transformer.step_flops``);
    ``time_ratio``: the same for the median measured step time; ``peak_ratio``: measured peak
    step memory with over without.
    """
    plain = measure_peak_bytes(config, batch, seq, recompute=False, repeats=repeats)
    recomputed = measure_peak_bytes(config, batch, seq, recompute=True, repeats=repeats)
    flops = tf.step_flops(config, batch, seq, recompute=True)
    return {"flops": flops["total"] - flops["recompute"], "flops_recompute": flops["total"],
            "flops_ratio": flops["total"] / (flops["total"] - flops["recompute"]),
            "seconds": plain["seconds"], "seconds_recompute": recomputed["seconds"],
            "time_ratio": recomputed["seconds"] / plain["seconds"],
            "peak": plain["peak"], "peak_recompute": recomputed["peak"],
            "peak_ratio": recomputed["peak"] / plain["peak"]}

