"""Low precision: bf16 and float16 compute with float32 master weights, measured on the transformer.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

The arrays are real 16-bit arrays: ``ml_dtypes.bfloat16`` (8 exponent bits, 7 stored mantissa
bits: float32's range, 3 significant decimal digits) and NumPy's ``float16`` (5 exponent bits,
10 mantissa bits: 65504 at most, 6e-8 at least). Nothing is simulated by rounding by hand.

**What one operation does** (``LowPrecisionArray``). NumPy on ``ml_dtypes.bfloat16`` is not a
GPU: ``bf16 @ bf16`` comes back *float32* from ml_dtypes, ``np.einsum`` refuses the dtype, and
a reduction accumulates in bfloat16 itself (10 000 ones sum to 256). So the transformer's
arrays are a thin ``ndarray`` subclass whose storage is the 16-bit dtype and whose every
ufunc (elementwise, reductions, ``matmul``, ``add.at``) and ``einsum`` reads the 16-bit
inputs, computes in float32 (NumPy/BLAS), and rounds the result to the 16-bit dtype once
(round to nearest even, ml_dtypes' and NumPy's cast). For matrix products that is what
tensor cores do with float32 accumulation: 16-bit operands, exact products, float32 sums,
16-bit output (Micikevicius et al., "Mixed Precision Training", ICLR 2018, arXiv:1710.03740,
section 3.2; Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training",
arXiv:1905.12322, section 3, who emulate bf16 the same way: float32 FMA units on bf16-rounded
inputs, output rounded to bf16). For elementwise ops and reductions it is a GPU kernel that
loads 16-bit, computes in float32 and stores 16-bit, *unfused*: every NumPy statement of
``transformer.py`` (LayerNorm is six of them) rounds its result, more rounding than a fused
kernel or PyTorch autocast's float32 LayerNorm/softmax would do. A pessimistic emulation, then.

**A mixed-precision step** (``train_step``), after Micikevicius et al.: float32 master
weights ``->`` cast to the 16-bit dtype ``->`` forward and backward, every activation and
gradient stored 16-bit ``->`` gradients cast to float32 ``->`` float32 Adam (``adam.Adam``) on
the masters. float16 adds the lab's dynamic loss scaling (``reference_impl.train.
mixed_precision.update_loss_scale`` and ``unscale_gradients``, imported, not rewritten): the
head's gradient ``(p - onehot) / N`` is multiplied by ``S`` in the same operation (so it is
never rounded to float16 unscaled), gradients are unscaled in float32, and a step whose
gradients are not finite is skipped and ``S`` halved. bf16 needs none of it: its exponent is
float32's, so gradients do not underflow; it pays with 8 significant bits instead of 11
(``gradient_underflow`` measures both on the same batch).

fp8 (E4M3 forward, E5M2 backward, per-tensor delayed scaling) is in ``fp8.py``; ``measure``
(the benchmark's entry) runs all four formats and fp8 against float32.
"""
from __future__ import annotations

import math
from typing import Mapping

import ml_dtypes
import numpy as np

from reference_impl.train.mixed_precision import unscale_gradients, update_loss_scale

from ..backend import require_numpy
from . import corpus
from . import transformer as tf
from .adam import Adam
from .memory import OPTIMIZER_SLOTS, PRECISIONS

_MODULE = "reference_impl.parallel.low_precision"  # NumPy-only: other arrays are refused, naming it

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
LOW = (BF16, FP16)  # storage dtypes LowPrecisionArray emulates
DTYPES = {"fp32": np.dtype(np.float32), "bf16": BF16, "fp16": FP16, "e4m3": E4M3, "e5m2": E5M2}
PRECISION_RUNS = ("fp32", "bf16", "fp16", "fp16_noscale")


def finfo(dtype) -> ml_dtypes.finfo:
    """``ml_dtypes.finfo``: max, smallest normal (``tiny``), ``smallest_subnormal``, ``eps``."""
    return ml_dtypes.finfo(np.dtype(dtype))


# ------------------------------------------------------------------ 16-bit storage, float32 arithmetic
def _low(x) -> np.dtype | None:
    dt = getattr(x, "dtype", None)
    return dt if dt in LOW else None


def _f32(x):
    """A 16-bit array as a plain float32 ndarray; anything else unchanged."""
    if isinstance(x, np.ndarray) and x.dtype in LOW:
        return x.view(np.ndarray).astype(np.float32)
    return x


class LowPrecisionArray(np.ndarray):
    """An array stored in bfloat16 or float16 whose operations compute in float32 and round once.

    Make one with ``as_low(x, dtype)``. Every ufunc call (any method: ``__call__``, ``reduce``,
    ``at``...) and ``np.einsum`` reads its 16-bit operands as float32, runs NumPy's float32
    implementation, and rounds a floating result to the 16-bit dtype (into ``out=`` buffers
    too). Boolean and integer results are returned as they are.
    """

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        store = next((d for d in map(_low, (*inputs, *(out or ()))) if d is not None), None)
        kwargs.pop("dtype", None)
        args = [_f32(x) for x in inputs]
        if method == "at":  # in place on inputs[0]: scatter in float32, round once
            target = inputs[0]
            buf = _f32(target)
            getattr(ufunc, method)(buf, *args[1:], **kwargs)
            target.view(np.ndarray)[...] = buf
            return None
        result = getattr(ufunc, method)(*args, **kwargs)
        return _store(result, store, out)

    def __array_function__(self, func, types, args, kwargs):
        if func is np.einsum:
            store = next((d for d in map(_low, args) if d is not None), None)
            out = kwargs.pop("out", None)
            result = np.einsum(*[_f32(a) for a in args], **kwargs)
            return _store(result, store, None if out is None else (out,))
        return super().__array_function__(func, types, args, kwargs)


class RoundingCounter:
    """Counts, over the float32 results ``LowPrecisionArray`` rounds to 16 bits while it is active
    (``with counter:``), those that were not zero (``values``) and of them how many rounded to 0
    (``underflow``: the value was below the format's range), into the subnormals (``subnormal``:
    fewer significant bits) or beyond the largest finite value (``overflow``). Exact cancellation
    (a float32 result that is itself 0) is not underflow and is not counted."""

    active: "RoundingCounter | None" = None

    def __init__(self):
        self.values = self.underflow = self.subnormal = self.overflow = 0

    def __enter__(self):
        self._outer, RoundingCounter.active = RoundingCounter.active, self
        return self

    def __exit__(self, *exc):
        RoundingCounter.active = self._outer

    def add(self, f32: np.ndarray, rounded: np.ndarray) -> None:
        f32 = np.asarray(f32, dtype=np.float32)
        r = np.abs(rounded.view(np.ndarray).astype(np.float32))
        nonzero = (f32 != 0) & np.isfinite(f32)
        self.values += int(nonzero.sum())
        self.underflow += int(np.count_nonzero(nonzero & (r == 0)))
        self.subnormal += int(np.count_nonzero(nonzero & (r > 0) & (r < float(finfo(rounded.dtype).tiny))))
        self.overflow += int(np.count_nonzero(nonzero & ~np.isfinite(r)))

    def fractions(self) -> dict[str, float]:
        n = max(self.values, 1)
        return {"values": self.values, "underflow": self.underflow / n, "subnormal": self.subnormal / n,
                "overflow": self.overflow / n}


def _store(result, store, out):
    if isinstance(result, tuple):
        return tuple(_store(r, store, None if out is None else (o,)) for r, o in zip(result, out or (None,) * len(result)))
    if out is not None and out[0] is not None:
        target = out[0]
        target.view(np.ndarray)[...] = result  # the cast to the buffer's dtype rounds to nearest even
        if RoundingCounter.active is not None and target.dtype in LOW:
            RoundingCounter.active.add(result, target)
        return target
    if store is None or not np.issubdtype(np.asarray(result).dtype, np.floating):
        return result
    rounded = np.asarray(result).astype(store).view(LowPrecisionArray)
    if RoundingCounter.active is not None:
        RoundingCounter.active.add(result, rounded)
    return rounded


def as_low(x: np.ndarray, dtype) -> np.ndarray:
    """``x`` rounded to ``dtype``: a ``LowPrecisionArray`` for bf16/fp16, a plain array otherwise."""
    require_numpy(_MODULE, x)
    dtype = np.dtype(dtype)
    y = np.asarray(x).astype(dtype)
    return y.view(LowPrecisionArray) if dtype in LOW else y


def compute_copy(masters: Mapping[str, np.ndarray], dtype) -> dict[str, np.ndarray]:
    """The working copy of the float32 master weights for the forward and backward, in ``dtype``."""
    return {k: as_low(v, dtype) for k, v in masters.items()}


# ------------------------------------------------------------------ backward with a loss scale
def backward(params: Mapping[str, np.ndarray], cache: dict, config: tf.GPTConfig, *, loss_scale: float = 1.0,
             keep_activation_grads: bool = False) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """``transformer.backward`` with the loss multiplied by ``loss_scale``: gradients of ``S * loss``.

    The head's backward is ``transformer.head_backward`` with ``dlogits = (p - onehot) * (S / N)``
    in one operation (with ``S = 1``, the same ``/= N``: identical results); the blocks and the
    embedding are ``transformer.block_backward`` and ``embed_backward``. Also returns the gradient
    at every block boundary (head input first) when ``keep_activation_grads``.
    """
    head = cache["head"]
    dlogits = head.pop("probs")
    N = dlogits.shape[0]
    dlogits[np.arange(N), head["targets"]] -= 1.0
    if loss_scale == 1.0:
        dlogits /= N
    else:
        dlogits *= loss_scale / N
    a = head.pop("a")
    B, T, C = a.shape
    dwte = dlogits.T @ a.reshape(N, C)
    da = (dlogits @ params["wte.weight"]).reshape(B, T, C)
    del dlogits, a
    dx, dw, db = tf._layer_norm_backward(da, head.pop("xhat"), head.pop("rstd"), params["ln_f.weight"])
    grads = {"ln_f.weight": dw, "ln_f.bias": db}
    act_grads = [dx] if keep_activation_grads else []
    for i in reversed(range(config.n_layer)):
        dx, block_grads = tf.block_backward(params, i, dx, cache["blocks"].pop(), config)
        grads.update(block_grads)
        if keep_activation_grads:
            act_grads.append(dx)
    grads.update(tf.embed_backward(params, cache["tokens"], dx, dwte))
    return grads, act_grads


class DynamicLossScaler:
    """Dynamic loss scaling state for a NumPy loop: the lab's ``update_loss_scale`` rules, held."""

    def __init__(self, initial_scale: float = 2.0 ** 15, growth_interval: int = 2000, dynamic: bool = True):
        self.scale, self.good_steps, self.dynamic, self.growth_interval = float(initial_scale), 0, dynamic, growth_interval

    def unscale(self, names: list[str], grads: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
        """float32 gradients of the loss (``unscale_gradients``: cast first, then divide) and whether all are finite;
        advances the scale."""
        with np.errstate(over="ignore", invalid="ignore"):
            unscaled, finite = unscale_gradients([grads[n] for n in names], self.scale)
        if self.dynamic:
            self.scale, self.good_steps, _ = update_loss_scale(self.scale, self.good_steps, finite,
                                                               self.growth_interval)
        return dict(zip(names, unscaled)), finite


# ------------------------------------------------------------------ training
# --8<-- [start:mixed_step]
def train_step(masters: dict[str, np.ndarray], opt: Adam, tokens: np.ndarray, targets: np.ndarray,
               config: tf.GPTConfig, precision: str, scaler: DynamicLossScaler | None = None,
               fp8=None) -> dict:
    """One mixed-precision step on the float32 ``masters`` (updated in place): ``{loss, applied, scale}``.

    ``precision``: ``fp32`` (plain float32), ``bf16`` or ``fp16`` (16-bit working copy,
    activations and gradients); ``scaler`` scales the loss (fp16). ``fp8``: an ``fp8.FP8Context``
    whose E4M3/E5M2 matrix products replace the four linear layers of every block.
    """
    dtype = DTYPES[precision]
    params = compute_copy(masters, dtype) if dtype != np.float32 else masters
    if fp8 is not None:
        params = fp8.wrap(params)
    scale = scaler.scale if scaler is not None else 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        loss, cache = tf.forward(params, tokens, targets, config)
        grads, _ = backward(params, cache, config, loss_scale=scale)
    if fp8 is not None:
        grads.update(fp8.weight_grads())
        fp8.end_step()
    names = list(masters)
    if scaler is not None:
        grads32, applied = scaler.unscale(names, grads)
    else:
        grads32 = {n: np.asarray(grads[n], dtype=np.float32) for n in names}
        applied = all(bool(np.isfinite(g).all()) for g in grads32.values())
    if applied:
        opt.step(masters, grads32)
    return {"loss": float(loss), "applied": applied, "scale": scale}
# --8<-- [end:mixed_step]


def eval_loss(masters: Mapping[str, np.ndarray], batch: tuple[np.ndarray, np.ndarray], config: tf.GPTConfig) -> float:
    """float32 loss of the master weights on a fixed batch: comparable across formats."""
    return tf.forward(masters, *batch, config)[0]


SMALL = tf.GPTConfig(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=64)


def train(precision: str = "fp32", steps: int = 300, *, config: tf.GPTConfig = SMALL, batch: int = 8,
          seq: int = 64, lr: float = 1e-3, seed: int = 0, eval_every: int = 25, fp8=None,
          initial_scale: float = 2.0 ** 15, growth_interval: int = 2000, return_masters: bool = False) -> dict:
    """Train from the same initialisation on the same batches; the loss curve and what scaling did.

    ``precision``: ``fp32``, ``bf16`` (no scaling), ``fp16`` (dynamic loss scaling from
    ``initial_scale``), ``fp16_noscale`` (float16, scale fixed at 1). ``fp8``: an
    ``fp8.FP8Context`` (then ``precision`` is its compute dtype). Returns ``losses`` (each
    step's training loss in the run's own precision), ``eval`` (``(step, float32 loss of the
    masters on a fixed validation batch)``), ``skipped`` steps, ``scales`` (the loss scale per
    step), ``overflows``/``underflow_fraction``/``fp8_scales`` from the fp8 context, and the final
    float32 ``masters`` if ``return_masters``.
    """
    if precision not in PRECISION_RUNS:
        raise ValueError(f"train: precision must be one of {PRECISION_RUNS}, got {precision!r}")
    masters = tf.init_params(config, seed=seed, dtype=np.float32)
    opt = Adam(lr=lr)
    train_tokens, val_tokens = corpus.split()
    rng = np.random.default_rng(seed + 1)
    val = corpus.get_batch(val_tokens, batch, seq, np.random.default_rng(seed + 2))
    scaler = None
    if precision == "fp16":
        scaler = DynamicLossScaler(initial_scale, growth_interval)
    compute = "fp16" if precision.startswith("fp16") else precision
    losses, scales, skipped, evals = [], [], [], [(0, eval_loss(masters, val, config))]
    for step in range(1, steps + 1):
        tokens, targets = corpus.get_batch(train_tokens, batch, seq, rng)
        r = train_step(masters, opt, tokens, targets, config, compute, scaler, fp8)
        losses.append(r["loss"])
        scales.append(r["scale"])
        if not r["applied"]:
            skipped.append(step)
        if step % eval_every == 0 or step == steps:
            evals.append((step, eval_loss(masters, val, config)))
    out = {"precision": precision if fp8 is None else f"fp8/{precision}", "losses": losses, "eval": evals,
           "skipped": skipped, "scales": scales, "final_eval": evals[-1][1],
           "final_train": float(np.mean(losses[-10:]))}
    if fp8 is not None:
        out.update(fp8.report())
    if return_masters:
        out["masters"] = masters
    return out


# ------------------------------------------------------------------ where values fall out of range
def range_fractions(values: np.ndarray, dtype, scale: float = 1.0) -> dict[str, float]:
    """What casting ``values * scale`` to ``dtype`` does to the values that are not zero.

    ``underflow``: became 0; ``subnormal``: landed below the smallest normal (fewer
    significant bits); ``overflow``: beyond the largest finite value (inf in float16, bf16 and
    E5M2; NaN in E4M3FN, which has no inf: ``ml_dtypes`` does not saturate).
    """
    v = np.asarray(values, dtype=np.float32).ravel() * np.float32(scale)
    v = v[v != 0]
    if v.size == 0:
        return {"underflow": 0.0, "subnormal": 0.0, "overflow": 0.0, "count": 0}
    fi = finfo(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = v.astype(dtype).astype(np.float32)
    mag = np.abs(cast)
    return {"underflow": float(np.mean(cast == 0)),
            "subnormal": float(np.mean((mag > 0) & (mag < float(fi.tiny)))),
            "overflow": float(np.mean(~np.isfinite(cast) | (np.abs(v) > float(fi.max)))),
            "count": int(v.size)}


def step_tensors(config: tf.GPTConfig = SMALL, batch: int = 8, seq: int = 64, seed: int = 0,
                 masters: Mapping[str, np.ndarray] | None = None) -> dict[str, list[tuple[str, np.ndarray]]]:
    """The float32 arrays of one real step, by kind: ``weights``, ``activations`` (every array the
    forward keeps for the backward), ``gradients`` (of the parameters) and ``activation_gradients``
    (at every block boundary)."""
    masters = tf.init_params(config, seed=seed) if masters is None else masters
    tokens, targets = corpus.get_batch(corpus.split()[0], batch, seq, np.random.default_rng(seed + 1))
    loss, cache = tf.forward(masters, tokens, targets, config)
    acts = [(f"h.{i}.{k}", v.copy()) for i, blk in enumerate(cache["blocks"]) for k, v in blk.items()]
    acts += [(f"head.{k}", v.copy()) for k, v in cache["head"].items() if k != "targets"]
    grads, act_grads = backward(masters, cache, config, keep_activation_grads=True)
    return {"weights": list(masters.items()), "activations": acts, "gradients": list(grads.items()),
            "activation_gradients": [(f"d(block boundary {j})", g) for j, g in enumerate(act_grads)]}


def range_table(tensors: Mapping[str, list[tuple[str, np.ndarray]]], loss_scale: float = 2.0 ** 15) -> dict:
    """``range_fractions`` per kind of tensor and per format: raw casts, float16 gradients times
    ``loss_scale``, and fp8 with per-tensor scaling ``scale = fp8_max / amax`` (each tensor its own)."""
    table = {}
    for kind, arrays in tensors.items():
        flat = np.concatenate([np.asarray(a, np.float32).ravel() for _, a in arrays])
        row = {fmt: range_fractions(flat, DTYPES[fmt]) for fmt in ("fp16", "bf16", "e4m3", "e5m2")}
        if "gradients" in kind:
            row[f"fp16 x {loss_scale:g}"] = range_fractions(flat, FP16, loss_scale)
        for fmt in ("e4m3", "e5m2"):
            fmax = float(finfo(DTYPES[fmt]).max)
            scaled = np.concatenate([np.asarray(a, np.float32).ravel() * np.float32(fmax / max(np.abs(a).max(), 1e-30))
                                     for _, a in arrays])
            row[f"{fmt} per-tensor scaled"] = range_fractions(scaled, DTYPES[fmt])
        table[kind] = row
    return table


def gradient_underflow(config: tf.GPTConfig = SMALL, batch: int = 8, seq: int = 64, seed: int = 0,
                       masters: Mapping[str, np.ndarray] | None = None, loss_scale: float = 2.0 ** 15) -> dict:
    """The same batch and weights run forward and backward in float32, bf16, float16, and float16 with
    the loss multiplied by ``loss_scale``.

    Per 16-bit run and phase (``forward``, ``backward``), ``RoundingCounter``'s fractions: of the
    non-zero float32 results every operation rounded to 16 bits, how many underflowed to 0, landed
    in the subnormals, or overflowed. Then, against the float32 backward: ``head_grad_zeroed``
    (entries of ``dlogits = S (p - onehot) / N`` non-zero in float32 and 0 in 16 bits),
    ``param_grad_zeroed`` (likewise for the parameters' gradients; includes exact cancellations)
    and the relative errors of the unscaled gradients.
    """
    masters = tf.init_params(config, seed=seed) if masters is None else masters
    tokens, targets = corpus.get_batch(corpus.split()[0], batch, seq, np.random.default_rng(seed + 1))

    def head_grad(probs, scale):
        d = np.asarray(probs, np.float32).copy()
        d[np.arange(d.shape[0]), targets.reshape(-1)] -= 1.0
        return d * np.float32(scale / d.shape[0])

    _, cache = tf.forward(dict(masters), tokens, targets, config)
    ref_head = head_grad(cache["head"]["probs"], 1.0)
    ref, _ = backward(masters, cache, config)
    ref_flat = np.concatenate([ref[k].ravel() for k in ref])
    out = {}
    for name, dtype, scale in (("bf16", BF16, 1.0), ("fp16", FP16, 1.0), (f"fp16 x {loss_scale:g}", FP16, loss_scale)):
        params = compute_copy(masters, dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            with RoundingCounter() as fwd:
                _, cache = tf.forward(params, tokens, targets, config)
            probs = np.asarray(cache["head"]["probs"], np.float32)
            head = np.asarray((head_grad(probs, scale)).astype(dtype), np.float32)
            with RoundingCounter() as bwd:
                grads, _ = backward(params, cache, config, loss_scale=scale)
        low = np.concatenate([np.asarray(grads[k], np.float32).ravel() for k in ref]) / np.float32(scale)
        nz, nzh = ref_flat != 0, ref_head != 0
        out[name] = {"forward": fwd.fractions(), "backward": bwd.fractions(),
                     "head_grad_zeroed": float(np.mean(head[nzh] == 0)),
                     "param_grad_zeroed": float(np.mean(low[nz] == 0)),
                     "param_grad_rel_error": float(np.linalg.norm(low - ref_flat) / np.linalg.norm(ref_flat)),
                     "finite": bool(np.isfinite(low).all())}
    return out


# ------------------------------------------------------------------ bytes per format
# bytes per parameter, memory.py's convention: (compute copy, gradient, float32 master copy).
# fp8 (Transformer Engine's delayed-scaling recipe on a bf16 model): the weights and gradients stay
# bf16 (the wgrad GEMM writes bf16, the data-parallel all-reduce is bf16), plus a 1-byte E4M3 copy
# of each *linear* weight, cached for the step; activations saved for the linear layers' backward are
# their 1-byte fp8 inputs.
FORMAT_BYTES = {**PRECISIONS, "fp8": (2, 2, 4)}
FP8_EXTRA_WEIGHT_BYTES = 1  # per linear-layer weight element


def linear_weight_elements(config: tf.GPTConfig) -> int:
    """Elements of the four linear weights of every block (what fp8 casts; biases, embeddings,
    LayerNorms and the tied head stay in the compute dtype)."""
    shapes = tf.param_shapes(config)
    return sum(math.prod(shapes[f"h.{i}.{n}"]) for i in range(config.n_layer)
               for n in ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"))


def format_bytes(config: tf.GPTConfig, fmt: str, optimizer: str = "adam", ranks: int = 8) -> dict[str, float]:
    """Model-state bytes of one replica in ``fmt`` and the bytes a data-parallel step communicates.

    ``parameters`` (working copy, plus fp8's weight cache), ``gradients`` (as all-reduced),
    ``optimizer_state`` (float32 master copy if any, plus the optimiser's float32 slots: memory.py's
    ``K``), and per rank ``allreduce_bytes_per_rank = 2 (ranks - 1) / ranks * gradients`` (ring
    all-reduce), ``allgather_bytes_per_rank`` (ZeRO-3/FSDP's parameter all-gather, forward and backward).
    """
    param_b, grad_b, master_b = FORMAT_BYTES[fmt]
    psi = tf.n_params(config)
    params = param_b * psi + (FP8_EXTRA_WEIGHT_BYTES * linear_weight_elements(config) if fmt == "fp8" else 0)
    grads = grad_b * psi
    state = (master_b + 4 * OPTIMIZER_SLOTS[optimizer]) * psi
    return {"n_params": psi, "parameters": params, "gradients": grads, "optimizer_state": state,
            "total": params + grads + state, "allreduce_bytes_per_rank": 2 * (ranks - 1) / ranks * grads,
            "allgather_bytes_per_rank": 2 * (ranks - 1) / ranks * param_b * psi}


# ------------------------------------------------------------------ the benchmark's entry
def measure(steps: int = 300, *, config: tf.GPTConfig = SMALL, batch: int = 8, seq: int = 64, seed: int = 0,
            fp8_compute: str = "bf16") -> dict:
    """Everything measured: loss curves of fp32, bf16, fp16 (scaled), fp16 (unscaled) and fp8 runs,
    the range table and the gradient underflow of one real step (at initialisation and with the
    float32 run's trained weights), and the bytes per format."""
    from .fp8 import FP8Context

    kw = dict(config=config, batch=batch, seq=seq, seed=seed)
    runs = {p: train(p, steps, return_masters=p == "fp32", **kw) for p in PRECISION_RUNS}
    runs["fp8"] = train(fp8_compute, steps, fp8=FP8Context(), **kw)
    trained = runs["fp32"].pop("masters")
    ref = np.array([e for _, e in runs["fp32"]["eval"]])
    for r in runs.values():
        r["eval_gap_vs_fp32"] = float(np.max(np.abs(np.array([e for _, e in r["eval"]]) - ref)))
    return {"config": config.__dict__, "batch": batch, "seq": seq, "steps": steps, "runs": runs,
            "ranges": {"init": range_table(step_tensors(config, batch, seq, seed)),
                       "trained": range_table(step_tensors(config, batch, seq, seed, masters=trained))},
            "gradient_underflow": {"init": gradient_underflow(config, batch, seq, seed),
                                   "trained": gradient_underflow(config, batch, seq, seed, masters=trained)},
            "bytes": {f: format_bytes(config, f) for f in FORMAT_BYTES}}
