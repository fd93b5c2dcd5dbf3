"""Post-training int8 quantisation of an MLP: symmetric per-channel weights, calibrated activations.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

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
the int8 weights as ``static const int8_t`` arrays (a quarter of the float bytes), packed for
the CPU's int8 dot-product instruction (AVX-512 VNNI's ``vpdpbusd``: 64 byte products summed
into 16 int32 lanes per instruction) with a portable fallback that computes the same integers,
built by ``reference_impl.toolchain`` and entered through the JIT's C entry point: the speed
side of the trade. The C output equals the NumPy reference bit for bit.
"""
from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

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
    def from_float(cls, params: Sequence[np.ndarray], x_calib: np.ndarray) -> QuantizedMLP:
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


#: inputs per group of the packed weights: one ``vpdpbusd`` multiplies 4 adjacent bytes of the
#: activations with 4 adjacent weights of each of 16 outputs and adds the 4 products to a lane
GROUP = 4
#: outputs per panel: the 16 int32 lanes of one AVX-512 register
LANES = 16
#: independent sums per panel (groups dealt round-robin): one ``vpdpbusd`` takes about 5 cycles
#: to produce its result, so 4 chains keep the multiply-add unit busy instead of waiting
CHAINS = 4
#: flags of the int8 build: no contraction of ``a*b + c`` into one fused multiply-add, so the
#: dequantisation rounds twice exactly as NumPy does and the outputs match bit for bit
INT8_FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=off")


def _c_array(ctype: str, name: str, values: np.ndarray, fmt: Any) -> str:
    flat = values.ravel()
    rows = [", ".join(fmt(v) for v in flat[i:i + 16]) for i in range(0, flat.size, 16)]
    return f"_Alignas(64) static const {ctype} {name}[{flat.size}] = {{\n    " + ",\n    ".join(rows) + "\n};"


# --8<-- [start:pack]
def pack_int8(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(packed weights, column offsets) of a K×N int8 matrix in the layout the C kernel reads.

    K is padded with zero weights to a multiple of ``GROUP`` and N to one of ``LANES``; then
    ``packed[p, g, l, t] = q[GROUP*g + t, LANES*p + l]``: panel ``p`` (16 outputs) is one
    contiguous run of 64-byte rows, row ``g`` holding for each of its 16 outputs the 4 weights of
    input group ``g``: exactly one ``vpdpbusd`` operand. That instruction multiplies *unsigned*
    bytes by signed ones, so the kernel feeds it ``q_x + 128`` (1..255) and subtracts
    ``128 · Σ_k q[k, j]``, the column offset returned here, computed once at compile time."""
    k, n = q.shape
    kp, n_pad = -(-k // GROUP) * GROUP, -(-n // LANES) * LANES
    padded = np.zeros((kp, n_pad), np.int8)
    padded[:k, :n] = q
    packed = padded.reshape(kp // GROUP, GROUP, n_pad // LANES, LANES).transpose(2, 0, 3, 1)
    offsets = 128 * padded.astype(np.int32).sum(axis=0)
    return np.ascontiguousarray(packed), offsets
# --8<-- [end:pack]


def _pad(v: int, m: int) -> int:
    return -(-v // m) * m


def _layer_kernel(i: int, kp: int, np_: int) -> list[str]:
    """C of ``layer{i}(a, acc)``: ``acc[j] = Σ_k (a[k] − 128) · q[k, j]`` over the packed panels
    ``Q{i}`` (``kp`` inputs, ``np_`` outputs, both padded), every size a constant.

    VNNI: four panels at a time share each broadcast of 4 activation bytes, their four sums
    being independent chains of ``vpdpbusd``; a remaining panel deals its groups round-robin to
    ``CHAINS`` sums instead. Portable: the same bytes in plain loops."""
    groups, panels = kp // GROUP, np_ // LANES
    quads = panels - panels % 4  # panels done four at a time
    row = f"(int64_t){kp * LANES}"  # bytes per panel
    lines = [f"static void layer{i}(const uint8_t *restrict a, int32_t *restrict acc) {{", "#if QMLP_VNNI"]
    if quads:
        lines += [
            f"    for (int64_t p = 0; p < {quads}; p += 4) {{",
            f"        const int8_t *restrict w = Q{i} + p * {row};",
            "        __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;",
            f"        for (int64_t g = 0; g < {groups}; g++) {{",
            "            int32_t a4;",
            "            memcpy(&a4, a + 4 * g, 4);",
            "            const __m512i av = _mm512_set1_epi32(a4);",
        ] + [f"            s{c} = _mm512_dpbusd_epi32(s{c}, av, _mm512_loadu_si512(w + {c} * {row} + 64 * g));"
             for c in range(4)] + ["        }"] + [
            f"        _mm512_storeu_si512(acc + 16 * (p + {c}), _mm512_sub_epi32(s{c}, "
            f"_mm512_loadu_si512(O{i} + 16 * (p + {c}))));" for c in range(4)] + ["    }"]
    if panels > quads:
        lines += [
            f"    for (int64_t p = {quads}; p < {panels}; p++) {{",
            f"        const int8_t *restrict w = Q{i} + p * {row};",
            "        __m512i s[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),",
            "                        _mm512_setzero_si512()};",
            f"        for (int64_t g = 0; g < {groups}; g++) {{",
            "            int32_t a4;",
            "            memcpy(&a4, a + 4 * g, 4);",
            (f"            s[g % {CHAINS}] = _mm512_dpbusd_epi32(s[g % {CHAINS}], _mm512_set1_epi32(a4), "
             "_mm512_loadu_si512(w + 64 * g));"),
            "        }",
            "        __m512i t = _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));",
            f"        _mm512_storeu_si512(acc + 16 * p, _mm512_sub_epi32(t, _mm512_loadu_si512(O{i} + 16 * p)));",
            "    }",
        ]
    lines += [
        "#else  /* portable: the same bytes, the same exact integer sums */",
        f"    for (int64_t p = 0; p < {panels}; p++) {{",
        f"        const int8_t *restrict w = Q{i} + p * {row};",
        "        int32_t s[16] = {0};",
        f"        for (int64_t g = 0; g < {groups}; g++) {{",
        "            const int32_t a0 = a[4 * g], a1 = a[4 * g + 1], a2 = a[4 * g + 2], a3 = a[4 * g + 3];",
        "            const int8_t *restrict wg = w + 64 * g;",
        "            for (int l = 0; l < 16; l++)",
        "                s[l] += a0 * wg[4 * l] + a1 * wg[4 * l + 1] + a2 * wg[4 * l + 2] + a3 * wg[4 * l + 3];",
        "        }",
        f"        for (int l = 0; l < 16; l++) acc[16 * p + l] = s[l] - O{i}[16 * p + l];",
        "    }",
        "#endif",
        "}",
        "",
    ]
    return lines


def int8_c_source(model: QuantizedMLP) -> str:
    """C for ``int graph_main(int64_t n, const float *x, float *y)``: the int8 MLP, weights
    compiled in (packed by ``pack_int8``), the same arithmetic as ``QuantizedMLP.__call__``.

    Per layer: quantise the input (divide by the calibrated scale, round half to even, clip, add
    128), the integer sums (``layer{i}``, see ``_layer_kernel``), then dequantise, add the bias
    and apply ReLU. With AVX-512 VNNI (``__AVX512VNNI__``, from ``-march=native`` on such a CPU)
    each 64-byte row of a panel is one ``vpdpbusd``; otherwise (or with ``-DQMLP_PORTABLE``)
    plain loops over the same packed bytes. Integer sums are exact in any order, so both give
    identical results, and the float steps are NumPy's own (no fused multiply-add, see
    ``INT8_FLAGS``), so the output equals ``QuantizedMLP.__call__`` bit for bit."""
    from .compiler.c_codegen import c_float  # exact float literals

    widths = [model.weights[0].shape[0]] + [q.shape[1] for q in model.weights]
    if max(widths[:-1]) * 255 * QMAX >= 2 ** 31:
        raise ValueError(f"int8 MLP: a layer with {max(widths[:-1])} inputs could overflow the int32 sums "
                         f"(at most {(2 ** 31 - 1) // (255 * QMAX)} inputs)")
    lines = ["#include <math.h>", "#include <stdint.h>", "#include <string.h>",
             "#if defined(__AVX512VNNI__) && !defined(QMLP_PORTABLE)", "#define QMLP_VNNI 1",
             "#include <immintrin.h>", "#else", "#define QMLP_VNNI 0", "#endif", ""]
    for i, (q, sw, b) in enumerate(zip(model.weights, model.weight_scales, model.biases)):
        packed, offsets = pack_int8(q)
        lines.append(_c_array("int8_t", f"Q{i}", packed, str))
        lines.append(_c_array("int32_t", f"O{i}", offsets, str))
        lines.append(_c_array("float", f"S{i}", sw * np.float32(model.act_scales[i]), c_float))
        lines.append(_c_array("float", f"B{i}", b, c_float))
    kmax, nmax = max(_pad(w, GROUP) for w in widths[:-1]), max(_pad(w, LANES) for w in widths[1:])
    lines += ["", "int qmlp_uses_vnni(void) { return QMLP_VNNI; }", ""]
    for i, (k, n) in enumerate(pairwise(widths)):
        lines += _layer_kernel(i, _pad(k, GROUP), _pad(n, LANES))
    lines += ["int graph_main(int64_t n, const float *restrict x, float *restrict y) {",
              f"    float h[{max(widths)}];",
              f"    _Alignas(64) uint8_t a[{kmax}];",
              f"    _Alignas(64) int32_t acc[{nmax}];",
              "    for (int64_t r = 0; r < n; r++) {",
              f"        memcpy(h, x + r*{widths[0]}, sizeof(float)*{widths[0]});"]
    for i, (K, N) in enumerate(pairwise(widths)):
        last = i == len(model.weights) - 1
        lines += [
            f"        for (int k = 0; k < {K}; k++) {{  /* layer {i}: quantise the input, shifted by 128 */",
            f"            float v = rintf(h[k] / {c_float(model.act_scales[i])});",
            f"            a[k] = (uint8_t)((int)(v > {QMAX} ? {QMAX} : v < -{QMAX} ? -{QMAX} : v) + 128);",
            "        }",
            f"        for (int k = {K}; k < {_pad(K, GROUP)}; k++) a[k] = 128;  /* padding: q_x = 0 */",
            f"        layer{i}(a, acc);",
            f"        for (int j = 0; j < {N}; j++) {{",
            f"            float v = (float)acc[j] * S{i}[j] + B{i}[j];",
            f"            {f'y[r*{N} + j] = v;' if last else 'h[j] = v > 0.0f ? v : 0.0f;'}",
            "        }",
        ]
    lines += ["    }", "    return 0;", "}"]
    return "\n".join(lines) + "\n"


_LOADED: dict[Path, Any] = {}  # library path -> its loaded entry module (an extension loads once)


def compile_int8(model: QuantizedMLP, cache_dir: Any = None, *, simd: bool | None = None) -> Any:
    """A callable ``f(x)`` (x: float32, n × K) running the int8 MLP in compiled C.

    The call enters C through the JIT's entry point (``compiler.c_entry``: the feed is checked
    and the output allocated in C) where Python's headers are, else through ``ctypes``.
    ``simd=False`` builds the portable loops even on a CPU with VNNI (to compare the two);
    by default it follows the JIT's fast-path switch (``LAB_JIT_FAST``, see
    ``compiler.jit.fast_path_enabled``). ``f.uses_vnni`` says which one runs."""
    from .compiler.c_entry import entry_source, load_entry, python_include_dir
    from .compiler.jit import fast_path_enabled, host_cpu
    from .toolchain import CompileError, build_shared_library, load_library

    simd = fast_path_enabled(simd)

    k, n_out = model.weights[0].shape[0], model.weights[-1].shape[1]
    flags = INT8_FLAGS + (() if simd else ("-DQMLP_PORTABLE",))
    # -march=native: the code depends on this CPU, which the library cache's key does not cover
    source = f"/* for {host_cpu()} */\n" + int8_c_source(model)
    include, entry = python_include_dir(), None
    if include is not None:
        module = "qmlp_entry_" + hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:20]
        try:
            path = build_shared_library(source + entry_source(module, [(None, k)], [(None, n_out)]), name="qmlp",
                                        flags=flags + (f"-I{include}",), cache_dir=cache_dir)
            if path not in _LOADED:
                _LOADED[path] = load_entry(path, module)
            entry = _LOADED[path].run
        except (CompileError, ImportError):
            path = None
    if entry is None:
        path = build_shared_library(source, name="qmlp", flags=flags, cache_dir=cache_dir)
    lib = load_library(path)
    fn = lib.graph_main
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]

    def run(x: np.ndarray) -> np.ndarray:
        if entry is not None:
            out = entry(x)  # None unless x is exactly a C-contiguous float32 (n, k) array
            if out is not None:
                return out[0]
        x = np.asarray(x)
        if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != k:
            raise ValueError(f"int8 MLP input must be float32 of shape (n, {k}), got {x.dtype} {x.shape}")
        x = np.ascontiguousarray(x)
        y = np.empty((x.shape[0], n_out), np.float32)
        fn(x.shape[0], x.ctypes.data, y.ctypes.data)
        return y

    run.library, run.entry = lib, entry
    run.uses_vnni = bool(lib.qmlp_uses_vnni())
    return run
