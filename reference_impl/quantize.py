"""Post-training int8 quantisation of an MLP: symmetric per-channel weights, calibrated activations.

A float32 weight ``w`` becomes ``q = round(w / s)`` clipped to [-127, 127] with one scale per
output channel (column ``j`` of ``x @ W``): ``s_j = max_k |W[k, j]| / 127``. One scale per
channel instead of per tensor matters because channels differ in range: a single scale set
by the largest channel would leave the small ones a handful of levels. Activations get one
scale per layer input, *calibrated*: run the float model on a few hundred real inputs and
take the largest magnitude each layer input reaches (``calibrate``). Symmetric scales keep
zero exactly representable (a pruned weight stays 0) and make the integer product simple::

    y[j] = s_x · s_j · Σ_k q_x[k] · q_W[k, j]  + b[j]      (the sum in int32: no overflow
                                                           below 2^31 / 127² ≈ 133,000 terms)

``QuantizedMLP`` runs that in NumPy (the reference), and ``compile_int8`` generates C with
the int8 weights as ``static const int8_t`` arrays (a quarter of the float bytes), built by
``reference_impl.toolchain``: the speed side of the trade.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

QMAX = 127


# --8<-- [start:quantize]
def quantize_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weights, float32 scale per column) for a K×N weight matrix; all-zero columns get scale 1."""
    if w.ndim != 2:
        raise ValueError(f"per-channel quantisation needs a K×N matrix, got shape {w.shape}")
    peak = np.abs(w).max(axis=0)
    scale = np.where(peak > 0, peak / QMAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale), -QMAX, QMAX).astype(np.int8)
    return q, scale


def quantize_activation(x: np.ndarray, scale: float) -> np.ndarray:
    """``x`` as int8 with one symmetric scale (values beyond the calibrated range saturate)."""
    return np.clip(np.rint(x / scale), -QMAX, QMAX).astype(np.int8)


def float_mlp(params: Sequence[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The float reference: ``relu(x @ W + b)`` per hidden layer, logits from the last."""
    h = x
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i < len(params) - 2:
            h = np.maximum(h, 0)
    return h


def calibrate(params: Sequence[np.ndarray], x_calib: np.ndarray) -> list[float]:
    """One activation scale per layer input: its largest magnitude on ``x_calib``, over 127."""
    scales, h = [], x_calib
    for i in range(0, len(params), 2):
        peak = float(np.abs(h).max())
        scales.append(peak / QMAX if peak > 0 else 1.0)
        h = h @ params[i] + params[i + 1]
        if i < len(params) - 2:
            h = np.maximum(h, 0)
    return scales


@dataclass
class QuantizedMLP:
    weights: list[np.ndarray]        # int8, K×N
    weight_scales: list[np.ndarray]  # float32, per output channel
    biases: list[np.ndarray]         # float32 (kept in float: they are few)
    act_scales: list[float]          # per layer input

    @classmethod
    def from_float(cls, params: Sequence[np.ndarray], x_calib: np.ndarray) -> "QuantizedMLP":
        qs = [quantize_per_channel(params[i]) for i in range(0, len(params), 2)]
        return cls([q for q, _ in qs], [s for _, s in qs], [np.asarray(params[i], np.float32)
                                                            for i in range(1, len(params), 2)],
                   calibrate(params, x_calib))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = np.asarray(x, np.float32)
        for i, (q, sw, b, sx) in enumerate(zip(self.weights, self.weight_scales, self.biases, self.act_scales)):
            acc = quantize_activation(h, sx).astype(np.int32) @ q.astype(np.int32)
            h = acc.astype(np.float32) * (np.float32(sx) * sw) + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0)
        return h

    def weight_bytes(self) -> int:
        return sum(q.nbytes + s.nbytes + b.nbytes for q, s, b in zip(self.weights, self.weight_scales, self.biases))
# --8<-- [end:quantize]


def _c_array(ctype: str, name: str, values: np.ndarray, fmt: Any) -> str:
    flat = values.ravel()
    rows = [", ".join(fmt(v) for v in flat[i:i + 16]) for i in range(0, flat.size, 16)]
    return f"static const {ctype} {name}[{flat.size}] = {{\n    " + ",\n    ".join(rows) + "\n};"


def int8_c_source(model: QuantizedMLP) -> str:
    """C for ``int qmlp(int64_t n, const float *x, float *y)``: the int8 MLP, weights compiled in."""
    from .compiler.c_codegen import c_float  # noqa: PLC0415 (exact float literals)

    widths = [model.weights[0].shape[0]] + [q.shape[1] for q in model.weights]
    lines = ["#include <math.h>", "#include <stdint.h>", "#include <string.h>", ""]
    for i, (q, sw, b) in enumerate(zip(model.weights, model.weight_scales, model.biases)):
        # pre-packed as N×K (one contiguous row of K weights per output): the inner loop is then
        # a dot product of int8 vectors that compilers turn into multiply-add-pairs instructions
        lines.append(_c_array("int8_t", f"Q{i}", np.ascontiguousarray(q.T), str))
        lines.append(_c_array("float", f"S{i}", sw * np.float32(model.act_scales[i]), c_float))
        lines.append(_c_array("float", f"B{i}", b, c_float))
    lines += ["", "int qmlp(int64_t n, const float *restrict x, float *restrict y) {",
              f"    float h[{max(widths)}], out[{max(widths)}];",
              f"    int8_t hq[{max(widths)}];", f"    int32_t acc[{max(widths)}];",
              "    for (int64_t r = 0; r < n; r++) {",
              f"        memcpy(h, x + r*{widths[0]}, sizeof(float)*{widths[0]});"]
    for i, (K, N) in enumerate(zip(widths[:-1], widths[1:])):
        inv = c_float(1.0 / model.act_scales[i])
        last = i == len(model.weights) - 1
        lines += [
            f"        for (int k = 0; k < {K}; k++) {{  /* layer {i}: quantise the input */",
            f"            float v = rintf(h[k] * {inv});",
            f"            hq[k] = (int8_t)(v > {QMAX} ? {QMAX} : v < -{QMAX} ? -{QMAX} : v);",
            "        }",
            f"        for (int j = 0; j < {N}; j++) {{",
            f"            const int8_t *restrict wj = Q{i} + j*{K};",
            "            int32_t s = 0;",
            f"            for (int k = 0; k < {K}; k++) s += (int16_t)hq[k] * (int16_t)wj[k];",
            "            acc[j] = s;",
            "        }",
            f"        for (int j = 0; j < {N}; j++) {{",
            f"            float v = (float)acc[j] * S{i}[j] + B{i}[j];",
            f"            {'out[j] = v;' if last else 'h[j] = v > 0.0f ? v : 0.0f;'}",
            "        }",
        ]
    lines += [f"        memcpy(y + r*{widths[-1]}, out, sizeof(float)*{widths[-1]});", "    }", "    return 0;", "}"]
    return "\n".join(lines) + "\n"


def compile_int8(model: QuantizedMLP, cache_dir: Any = None) -> Any:
    """A callable ``f(x)`` (x: float32, n × K, C-contiguous) running the int8 MLP in compiled C."""
    from .toolchain import build_shared_library, load_library  # noqa: PLC0415

    lib = load_library(build_shared_library(int8_c_source(model), name="qmlp", flags=("-O3", "-march=native"),
                                            cache_dir=cache_dir))
    fn = lib.qmlp
    k, n_out = model.weights[0].shape[0], model.weights[-1].shape[1]

    def run(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != k:
            raise ValueError(f"int8 MLP input must be float32 of shape (n, {k}), got {x.dtype} {x.shape}")
        x = np.ascontiguousarray(x)
        y = np.empty((x.shape[0], n_out), np.float32)
        fn(ctypes.c_int64(x.shape[0]), x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p))
        return y

    run.library = lib
    return run
