"""fp8 matrix products with per-tensor delayed scaling, as NVIDIA Transformer Engine's recipe does them.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Two 8-bit formats, real ``ml_dtypes`` arrays (``ml_dtypes.finfo``):

* **E4M3** (``float8_e4m3fn``): 4 exponent bits, 3 mantissa bits, largest 448, smallest
  normal 2^-6, smallest subnormal 2^-9; *no inf* (the "fn": finite, one NaN pattern).
* **E5M2** (``float8_e5m2``): 5 exponent bits, 2 mantissa bits, largest 57344, smallest
  subnormal 2^-16; has inf.

With 16 binades (E4M3) or 32 (E5M2) a tensor only survives the cast if it is first
multiplied by a *scale* that brings its largest magnitude ``amax`` near the format's
maximum. Transformer Engine's ``DelayedScaling`` recipe (read at NVIDIA/TransformerEngine
``transformer_engine/common/recipe/__init__.py``, commit 000b637e, and
``transformer_engine/common/recipe/delayed_scaling.cu``, commit 6b71a0ad) does it per tensor:

* ``fp8_format=HYBRID`` (the default): E4M3 for forward tensors (weights, inputs), E5M2
  for backward ones (the gradient arriving at a linear layer), whose range matters more
  than their precision;
* each tensor keeps an ``amax_history`` of ``amax_history_len`` (default 1024) values; the
  cast uses the *current* scale, computed from earlier steps (hence "delayed": one read of
  the tensor, not two), and records this step's amax in slot 0;
* after the step the history is rolled (slot 0's value moves to the end, slot 0 restarts at
  0, the oldest value drops) and the amax used is the history's ``max`` (default) or the
  ``most_recent``; the new scale is ``(fp8_max / amax) / 2^margin``, kept unchanged when
  amax is 0 or not finite, and float32's max if it would be inf. Scales start at 1.
* values beyond the range after scaling are clipped (TE's docs,
  ``docs/features/low_precision_training/fp8_delayed_scaling/fp8_delayed_scaling.rst``:
  "Values exceeding FP8 range are clipped"): the CUDA cast saturates.

``ml_dtypes`` does *not* saturate: a float32 above 464 (448 and half a step) cast to E4M3FN
becomes NaN, and one of 61440 or more cast to E5M2 becomes inf. So ``quantize`` never
lets it: it counts the values beyond ``fp8_max`` after scaling (``FP8Context.overflows``, by
tensor name) and either clips them (``overflow="saturate"``, TE's behaviour) or raises
``FP8OverflowError`` naming the tensor (``overflow="raise"``, the default when scaling is
disabled, ``DelayedScaling(enabled=False)``: scale fixed at 1).

``fp8_linear`` / ``fp8_linear_backward``: ``y = x @ W.T`` with ``x`` and ``W`` quantised to
E4M3, the product of the dequantised values in float32 (fp8 products are exact in float32;
the sum accumulates in float32, as the tensor cores' FP32 accumulator), ``y`` in the compute
dtype. Backward: the output gradient quantised to E5M2; ``dx = dy @ W`` and
``dW = dy^T x`` from the same fp8 ``x`` and ``W`` saved by the forward (the activation the
backward keeps is the 1-byte copy); ``dW`` in float32 for the master update.

``FP8Context.wrap`` makes the four linear layers of every transformer block (c_attn,
attn.c_proj, c_fc, mlp.c_proj) fp8 *inside the unchanged* ``transformer.py``: their weights
become objects whose ``W.T`` product (``x @ W.T``: the forward) and ``W`` product
(``dy @ W``: the input gradient) run the fp8 GEMMs above; the weight gradient is computed at
the ``dy @ W`` call, and ``weight_grads`` returns it to replace the one ``block_backward``
computed in the compute dtype (a wasted GEMM: the price of not editing the model). The
attention products, the embeddings and the tied output layer stay in the compute dtype, as
in TE (``fp8_dpa`` is off by default). Only ``keep="all"`` forwards (no recomputation).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

import ml_dtypes
import numpy as np

from ..backend import require_numpy
from .low_precision import LOW, as_low

_MODULE = "reference_impl.parallel.fp8"  # NumPy-only: other arrays are refused, naming it

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
FP8_MAX = {E4M3: float(ml_dtypes.finfo(E4M3).max), E5M2: float(ml_dtypes.finfo(E5M2).max)}  # 448, 57344
FORMATS = {"HYBRID": (E4M3, E5M2), "E4M3": (E4M3, E4M3)}  # (forward, backward), TE's Format
LINEAR = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
OVERFLOW = ("saturate", "raise")
_DECODE = {dt: np.arange(256, dtype=np.uint8).view(dt).astype(np.float32) for dt in (E4M3, E5M2)}


class FP8OverflowError(FloatingPointError):
    """A tensor's scaled values exceed the fp8 format's range (or are not finite)."""

    def __init__(self, tensor: str, count: int, amax: float, scale: float, fp8_max: float):
        self.tensor, self.count, self.amax, self.scale = tensor, count, amax, scale
        super().__init__(f"fp8 overflow in tensor {tensor!r}: {count} value(s) beyond {fp8_max:g} after scaling "
                         f"(amax {amax:.6g} x scale {scale:.6g})")


@dataclass(frozen=True)
class DelayedScaling:
    """Transformer Engine's ``DelayedScaling`` recipe (same names and defaults); ``enabled=False``
    fixes every scale at 1 (no scaling)."""

    margin: int = 0
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    enabled: bool = True

    def __post_init__(self):
        if self.fp8_format not in FORMATS:
            raise ValueError(f"DelayedScaling: fp8_format must be one of {tuple(FORMATS)}, got {self.fp8_format!r}")
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"DelayedScaling: amax_compute_algo must be 'max' or 'most_recent', "
                             f"got {self.amax_compute_algo!r}")
        if self.amax_history_len < 1 or self.margin < 0:
            raise ValueError(f"DelayedScaling: need amax_history_len >= 1 and margin >= 0, got {self}")


# --8<-- [start:delayed_scaling]
class TensorScaling:
    """One tensor's scaling state: its fp8 dtype, ``amax_history`` (slot 0: this step) and ``scale``."""

    def __init__(self, dtype: np.dtype, recipe: DelayedScaling):
        self.dtype, self.recipe = np.dtype(dtype), recipe
        self.amax_history = np.zeros(recipe.amax_history_len, dtype=np.float32)
        self.scale = 1.0

    def record(self, amax: float) -> None:
        self.amax_history[0] = max(self.amax_history[0], amax)

    def update(self) -> None:
        """End of step: roll the history and recompute the scale (``delayed_scaling.cu``'s kernel)."""
        h = self.amax_history
        last = float(h[0])
        amax = float(h.max()) if self.recipe.amax_compute_algo == "max" else last
        rolled = np.concatenate([h[1:], [last]]).astype(np.float32)
        rolled[0] = 0.0
        self.amax_history = rolled
        if not self.recipe.enabled:
            return
        if np.isfinite(amax) and amax > 0:
            scale = FP8_MAX[self.dtype] * 2.0 ** -self.recipe.margin / amax
            self.scale = float(np.float32(scale)) if np.isfinite(np.float32(scale)) else float(np.finfo(np.float32).max)
# --8<-- [end:delayed_scaling]


def compute_scale(amax_history: np.ndarray, dtype, margin: int = 0, algo: str = "max") -> float:
    """The scale a history gives: ``(fp8_max / amax) / 2^margin``, amax the history's max or slot 0."""
    amax = float(np.max(amax_history)) if algo == "max" else float(amax_history[0])
    return FP8_MAX[np.dtype(dtype)] / amax / 2.0 ** margin


@dataclass
class Quantized:
    """An fp8 tensor: the 1-byte codes and the scale they were cast with (value = codes / scale)."""

    codes: np.ndarray
    scale: float

    def dequantize(self) -> np.ndarray:
        """``codes / scale`` in float32 (the codes decoded through a 256-entry table: the same values
        as ``codes.astype(float32)``, faster)."""
        out = _DECODE[self.codes.dtype][self.codes.view(np.uint8)]
        out *= np.float32(1.0 / self.scale)
        return out


def quantize(x: np.ndarray, scale: float, dtype, *, name: str = "tensor",
             overflow: str = "saturate") -> tuple[Quantized, dict]:
    """``x * scale`` cast to ``dtype`` (E4M3 or E5M2), never NaN or inf: ``(Quantized, stats)``.

    ``stats``: ``amax`` of ``x``, ``overflow`` (values beyond ``fp8_max`` after scaling, clipped
    to +-``fp8_max`` or, with ``overflow="raise"``, an ``FP8OverflowError``), ``underflow``
    (non-zero values that became 0) and ``nonzero``. A non-finite ``x`` always raises.
    """
    require_numpy(_MODULE, x)
    dtype = np.dtype(dtype)
    fmax = FP8_MAX[dtype]
    x32 = np.asarray(x.view(np.ndarray) if isinstance(x, np.ndarray) else x).astype(np.float32)
    amax = float(np.max(np.abs(x32))) if x32.size else 0.0
    if not np.isfinite(amax):
        raise FP8OverflowError(name, int(np.sum(~np.isfinite(x32))), amax, scale, fmax)
    xs = x32 * np.float32(scale)
    beyond = int(np.count_nonzero(np.abs(xs) > fmax))
    if beyond:
        if overflow == "raise":
            raise FP8OverflowError(name, beyond, amax, scale, fmax)
        np.clip(xs, -fmax, fmax, out=xs)
    codes = xs.astype(dtype)
    nonzero = x32 != 0
    return Quantized(codes, scale), {"amax": amax, "overflow": beyond, "nonzero": int(nonzero.sum()),
                                     "underflow": int(np.count_nonzero(nonzero & (codes == 0)))}


def fp8_matmul(a: Quantized, b: Quantized) -> np.ndarray:
    """``a @ b`` of two fp8 tensors: dequantised products summed in float32."""
    return a.dequantize() @ b.dequantize()


def _like(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``y`` (float32) in ``ref``'s compute dtype."""
    return as_low(y, ref.dtype) if ref.dtype in LOW else y.astype(ref.dtype, copy=False)


class FP8Context:
    """The fp8 state of a training run: one ``TensorScaling`` per tensor, named
    ``{linear}.input``, ``{linear}.weight``, ``{linear}.grad_output``; counts of overflows and
    underflows per tensor; the fp8 inputs saved for the backward; the weight gradients."""

    def __init__(self, recipe: DelayedScaling | None = None, overflow: str | None = None):
        self.recipe = recipe or DelayedScaling()
        self.overflow = overflow or ("saturate" if self.recipe.enabled else "raise")
        if self.overflow not in OVERFLOW:
            raise ValueError(f"FP8Context: overflow must be one of {OVERFLOW}, got {self.overflow!r}")
        self.fwd, self.bwd = FORMATS[self.recipe.fp8_format]
        self.states: dict[str, TensorScaling] = {}
        self.overflows: dict[str, int] = {}
        self.underflow_counts: dict[str, list[int]] = {}  # name -> [underflowed, nonzero], summed over steps
        self._weights: dict[str, Quantized] = {}
        self._saved: dict[str, Quantized] = {}
        self._wgrads: dict[str, np.ndarray] = {}
        self.steps = 0

    def quantize(self, name: str, x: np.ndarray, dtype: np.dtype) -> Quantized:
        """Cast ``x`` with tensor ``name``'s current scale; record its amax and the events."""
        state = self.states.setdefault(name, TensorScaling(dtype, self.recipe))
        q, stats = quantize(x, state.scale, dtype, name=name, overflow=self.overflow)
        state.record(stats["amax"])
        if stats["overflow"]:
            self.overflows[name] = self.overflows.get(name, 0) + stats["overflow"]
        counts = self.underflow_counts.setdefault(name, [0, 0])
        counts[0] += stats["underflow"]
        counts[1] += stats["nonzero"]
        return q

    # -- the linear layer
    def linear(self, name: str, x: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        """``fp8_linear``: ``x @ W.T`` for layer ``name`` (weight ``w``, or the one ``wrap`` quantised)."""
        if w is not None:
            self._weights[name] = self.quantize(f"{name}.weight", w, self.fwd)
        qx = self.quantize(f"{name}.input", x, self.fwd)
        self._saved[name] = qx
        y = qx.dequantize() @ self._weights[name].dequantize().T
        return _like(y, x)

    def linear_backward(self, name: str, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``fp8_linear_backward``: ``(dx, dW)`` from the output gradient, ``dW`` float32 ``(out, in)``."""
        if name not in self._saved:
            raise RuntimeError(f"fp8 linear {name!r}: backward without a forward (recomputation is not supported)")
        qdy = self.quantize(f"{name}.grad_output", dy, self.bwd)
        g = qdy.dequantize()
        w = self._weights[name].dequantize()
        x = self._saved.pop(name).dequantize()
        dx = g @ w
        dw = g.reshape(-1, g.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        return _like(dx, dy), dw

    # -- inside transformer.py
    def wrap(self, params: Mapping[str, np.ndarray]) -> dict:
        """``params`` with every block's linear weights replaced by fp8 ones (each quantised once, now)."""
        out = dict(params)
        for name, w in params.items():
            if LINEAR.match(name):
                layer = name[: -len(".weight")]
                self._weights[layer] = self.quantize(f"{layer}.weight", w, self.fwd)
                out[name] = _FP8Weight(self, layer, w.shape)
        return out

    def weight_grads(self) -> dict[str, np.ndarray]:
        """The fp8 weight gradients of this step's backward, by parameter name (then forgotten)."""
        grads, self._wgrads = self._wgrads, {}
        return grads

    def end_step(self) -> None:
        """Roll every amax history and update every scale (after forward and backward)."""
        for state in self.states.values():
            state.update()
        self._saved.clear()
        self._weights.clear()
        self.steps += 1

    def report(self) -> dict:
        return {"overflows": dict(self.overflows),
                "underflow_fraction": {n: (u / z if z else 0.0) for n, (u, z) in self.underflow_counts.items()},
                "fp8_scales": {n: s.scale for n, s in self.states.items()},
                "recipe": {**self.recipe.__dict__, "overflow": self.overflow}}


class _FP8Weight:
    """Stands for a linear weight inside ``transformer.py``: ``x @ W.T`` is the fp8 forward,
    ``dy @ W`` the fp8 backward (input and weight gradients)."""

    __array_ufunc__ = None  # so that ``ndarray @ self`` calls ``self.__rmatmul__``

    def __init__(self, ctx: FP8Context, layer: str, shape: tuple[int, ...]):
        self.ctx, self.layer, self.shape = ctx, layer, shape

    @property
    def T(self) -> "_FP8WeightT":
        return _FP8WeightT(self)

    def __rmatmul__(self, dy: np.ndarray) -> np.ndarray:
        dx, dw = self.ctx.linear_backward(self.layer, dy)
        self.ctx._wgrads[f"{self.layer}.weight"] = dw
        return dx


class _FP8WeightT:
    __array_ufunc__ = None

    def __init__(self, weight: _FP8Weight):
        self.weight = weight

    def __rmatmul__(self, x: np.ndarray) -> np.ndarray:
        return self.weight.ctx.linear(self.weight.layer, x)
