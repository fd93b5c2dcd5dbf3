"""The fast path of the C target: matmul kernels tuned for the CPU, beside ``c_codegen``'s plain ones.

NumPy-only: the compiler's targets are NumPy source and C compiled for host memory.

``c_codegen`` teaches the three forms (``EMITTERS``: dense, csr, unrolled) in their simplest
loops. ``FAST_EMITTERS`` is that table with the kernels that make the deploy benchmark's
figures, which ``jit`` uses by default:

* ``dense`` (``emit_dense_fast``): ``W`` pre-packed once, here, not per call: when N is a
  multiple of ``PANEL``, as N/PANEL panels of K×PANEL, each contiguous, so that the loop keeps
  PANEL sums in registers while it streams one panel (``emit_dense_panels``); with fewer than
  ``PANEL`` outputs (a classifier's last layer) as ``Wᵀ``, each output one contiguous dot
  product summed in 16 independent lanes (``emit_dense_dots``); otherwise the plain loop;
* ``csr`` (``emit_csr_fast``): four partial sums per output (four independent chains of
  multiply-adds), and for a batch the input transposed once so that each weight is read once
  and applied to the whole batch in a contiguous, vectorisable inner loop;
* ``bitmask`` (``emit_bitmask``, a fourth form): ``Wᵀ`` cut into runs of 16 inputs, each run
  stored as a 16-bit mask of which weights are non-zero plus those weights packed: one 2-byte
  mask replaces up to 16 indices. With AVX-512 one instruction (``vexpandps``) spreads the
  packed weights of a run back into their 16 lanes and one multiply-add applies them to 16
  contiguous inputs, so the work per run is the same at any density and no index gathers
  happen; without AVX-512 the same data drive a portable loop over the set bits. ``auto``
  prefers it to ``csr`` above ``BITMASK_ABOVE`` density on a CPU with AVX-512
  (``prefers_bitmask``; the benchmark measures both). It reads the weights once per input row,
  so at large batches CSR's batch loop (or dense BLAS) is faster.

Arrays over ``INLINE_MAX`` elements are embedded from a binary file with the assembler's
``.incbin`` (``embedded_array``) instead of C text: parsing a million float literals makes the
compiler's front end the slow part of the build. ``FAST_C_FLAGS`` asks for 512-bit vectors.

The switch back to the plain path: ``jit(..., fast=False)``, or ``LAB_JIT_FAST=0`` in the
environment (the argument wins); ``generate_c(..., fast=False)`` for the code alone. The int8
kernels (VNNI) are ``reference_impl.quantize``'s, with their own switch (``compile_int8(simd=False)``).
"""
from __future__ import annotations

import hashlib
import os
import sys
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from .c_codegen import EMITTERS, NUMPY_TYPES, MatMul, _Emitter, c_array, csr_arrays, emit_dense

#: -march=native: the JIT compiles on the machine that runs the code (the host CPU is in the
#: cache key, see ``jit.host_cpu``); 512-bit vectors where the CPU has them (GCC and Clang default
#: to 256-bit ones), which read a packed weight panel in half as many loads.
FAST_C_FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512")
#: width of the packed panels of a dense weight matrix (outputs whose sums stay in registers)
PANEL = 64
#: independent sets of panel sums (rows of a panel dealt round-robin): a multiply-add takes
#: about 4 cycles to produce its result and a core starts 2 per cycle, so 8 independent chains
#: (2 sets × 64 floats = 2 × 4 AVX-512 registers) keep it busy; with one set each waits for the
#: previous one, and more sets only add broadcasts and additions
KSPLIT = 2
#: inputs per mask of the bitmask form (one AVX-512 register of float32)
RUN = 16
#: ``auto`` uses the bitmask form (with AVX-512) above this density: its work per run of 16
#: inputs is the same at any density, so CSR, whose work is per non-zero, wins on sparser
#: matrices (the deploy benchmark's sweep shows where the two cross at batch 1).
BITMASK_ABOVE = 0.15
#: arrays with more elements than this are embedded from a binary file (see ``embedded_array``)
INLINE_MAX = 65_536


def host_has_avx512() -> bool:
    """Whether this (Linux) machine's CPU reports AVX-512F, the instructions the fast path of the
    ``bitmask`` form is written with; False where it cannot tell."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


def prefers_bitmask(w: np.ndarray, nnz: int) -> bool:
    """``auto``'s choice between ``csr`` and ``bitmask`` for a matrix too big to unroll."""
    return nnz > BITMASK_ABOVE * w.size and host_has_avx512()


# ---------------------------------------------------------------- dense
def emit_dense_fast(c: _Emitter, mm: MatMul) -> None:
    """Packed panels (N a multiple of ``PANEL``), ``Wᵀ`` dot products (N < ``PANEL``), else plain."""
    if mm.value is not None and mm.n % PANEL == 0:
        c.array(mm.w, mm.value.reshape(mm.k, mm.n // PANEL, PANEL).transpose(1, 0, 2))
        return emit_dense_panels(c, mm)
    if mm.value is not None and mm.n < PANEL:
        c.array(mm.w, mm.value.T)
        return emit_dense_dots(c, mm)
    return emit_dense(c, mm)


def emit_dense_panels(c: _Emitter, mm: MatMul) -> None:
    """``y = x @ W`` with W pre-packed as ``n / PANEL`` panels of K×PANEL, each contiguous.

    For one panel the loop keeps running sums in registers and streams the panel once: one
    load and one multiply-add per weight, no reloading and storing of the output row for
    every k as the plain row-major loop does. ``KSPLIT`` sets of PANEL sums take turns over
    the rows of the panel (set u adds rows k ≡ u mod KSPLIT), so consecutive multiply-adds
    do not wait for each other's result; the sets are added at the end."""
    w, x, y, m, kdim, ncols = mm.w, mm.x, mm.y, mm.m, mm.k, mm.n
    body = kdim - kdim % KSPLIT
    total = " + ".join(f"acc[{u}][jj]" for u in range(KSPLIT))
    c.body += [
        f"    for (int64_t i = 0; i < {m}; i++) {{",
        f"        const float *restrict xr = {x} + i*{kdim};",
        f"        float *restrict yr = {y} + i*{ncols};",
        f"        for (int64_t jb = 0; jb < {ncols // PANEL}; jb++) {{",
        f"            float acc[{KSPLIT}][{PANEL}] = {{{{0.0f}}}};",
        f"            const float *restrict wp = {w} + jb*{kdim * PANEL};",
        f"            for (int64_t k = 0; k < {body}; k += {KSPLIT})",
        f"                for (int64_t u = 0; u < {KSPLIT}; u++)",
        f"                    for (int64_t jj = 0; jj < {PANEL}; jj++) acc[u][jj] += xr[k + u] * wp[(k + u)*{PANEL} + jj];",
    ] + ([f"            for (int64_t k = {body}; k < {kdim}; k++)",
          f"                for (int64_t jj = 0; jj < {PANEL}; jj++) acc[0][jj] += xr[k] * wp[k*{PANEL} + jj];"]
         if kdim % KSPLIT else []) + [
        f"            for (int64_t jj = 0; jj < {PANEL}; jj++) yr[jb*{PANEL} + jj] = {total};",
        "        }",
        "    }",
    ]


def emit_dense_dots(c: _Emitter, mm: MatMul) -> None:
    """``y = x @ W`` for a narrow W stored as ``Wᵀ``: output ``j`` is the dot product of the
    input row with row ``j`` of ``Wᵀ``, both contiguous. Sixteen partial sums (lane ``u`` adds
    the products at ``k ≡ u`` mod 16) are independent, so the compiler keeps them in one
    vector register without reordering any float addition."""
    w, x, y, m, kdim, ncols = mm.w, mm.x, mm.y, mm.m, mm.k, mm.n
    body = kdim - kdim % RUN
    c.body += [
        f"    for (int64_t i = 0; i < {m}; i++) {{",
        f"        const float *restrict xr = {x} + i*{kdim};",
        f"        for (int64_t j = 0; j < {ncols}; j++) {{",
        f"            const float *restrict wj = {w} + j*{kdim};",
        "            float s = 0.0f;",
    ] + ([
        f"            float acc[{RUN}] = {{0.0f}};",
        f"            for (int64_t k = 0; k < {body}; k += {RUN})",
        f"                for (int64_t u = 0; u < {RUN}; u++) acc[u] += xr[k + u] * wj[k + u];",
        f"            for (int64_t u = 0; u < {RUN}; u++) s += acc[u];",
    ] if body else []) + ([f"            for (int64_t k = {body}; k < {kdim}; k++) s += xr[k] * wj[k];"]
                          if kdim % RUN else []) + [
        f"            {y}[i*{ncols} + j] = s;",
        "        }",
        "    }",
    ]


# ---------------------------------------------------------------- csr
def emit_csr_fast(c: _Emitter, mm: MatMul) -> None:
    """CSR with four partial sums per output; for a batch (more than one row) the input is
    transposed once, then each weight is read once and applied to the whole batch."""
    w, x, y, m, kdim, ncols = mm.w, mm.x, mm.y, mm.m, mm.k, mm.n
    csr_arrays(c, mm)
    B = c.body
    if m != "1":
        xt, acc = f"{y}_xt", f"{y}_acc"
        c.buffers += [(xt, f"(int64_t){kdim}*{m}"), (acc, m)]
        B += [f"    if ({m} > 1) {{",
              f"    for (int64_t i = 0; i < {m}; i++)",
              f"        for (int64_t k = 0; k < {kdim}; k++) {xt}[k*{m} + i] = {x}[i*{kdim} + k];",
              f"    for (int64_t j = 0; j < {ncols}; j++) {{",
              f"        for (int64_t i = 0; i < {m}; i++) {acc}[i] = 0.0f;",
              f"        for (int32_t p = {w}_ptr[j]; p < {w}_ptr[j + 1]; p++) {{",
              f"            const float v = {w}_val[p];",
              f"            const float *restrict xk = {xt} + (int64_t){w}_idx[p]*{m};",
              f"            for (int64_t i = 0; i < {m}; i++) {acc}[i] += v * xk[i];",
              "        }",
              f"        for (int64_t i = 0; i < {m}; i++) {y}[i*{ncols} + j] = {acc}[i];",
              "    }",
              "    } else"]
    B += [f"    for (int64_t i = 0; i < {m}; i++) {{",
          f"        const float *restrict xr = {x} + i*{kdim};",
          f"        float *restrict yr = {y} + i*{ncols};",
          f"        for (int64_t j = 0; j < {ncols}; j++) {{",
          "            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;",
          f"            int32_t p = {w}_ptr[j];",
          f"            const int32_t end = {w}_ptr[j + 1];",
          "            for (; p + 4 <= end; p += 4) {"]
    B += [f"                a{u} += {w}_val[p + {u}] * xr[{w}_idx[p + {u}]];" for u in range(4)]
    B += ["            }",
          f"            for (; p < end; p++) a0 += {w}_val[p] * xr[{w}_idx[p]];",
          "            yr[j] = (a0 + a1) + (a2 + a3);",
          "        }",
          "    }"]


# ---------------------------------------------------------------- bitmask
def bitmask_pack(wt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(masks, values) of the ``bitmask`` form of ``wt`` (outputs × inputs): ``masks[j, c]`` has
    bit ``b`` set when ``wt[j, RUN*c + b]`` is non-zero, and ``values`` holds those weights in
    the order the kernel reads them (output by output, run by run, bit by bit)."""
    rows, k = wt.shape
    runs = -(-k // RUN)
    padded = np.zeros((rows, runs * RUN), np.float32)
    padded[:, :k] = wt
    bits = (padded != 0).reshape(rows, runs, RUN)
    masks = (bits.astype(np.uint32) << np.arange(RUN, dtype=np.uint32)).sum(axis=2).astype(np.uint16)
    return masks, padded[padded != 0]


def emit_bitmask(c: _Emitter, mm: MatMul) -> None:
    """``y = x @ W`` from the 16-bit masks and packed non-zeros of ``Wᵀ`` (``bitmask_pack``).

    AVX-512: per run, ``vexpandps`` loads the run's packed weights into the lanes its mask
    selects (zeros elsewhere), a masked load reads the 16 inputs (masked lanes are not read,
    so the last, partial run cannot overrun ``x``), one multiply-add; two accumulators
    alternate runs so that consecutive multiply-adds do not wait for each other."""
    w, x, y, m, kdim, ncols = mm.w, mm.x, mm.y, mm.m, mm.k, mm.n
    masks, vals = bitmask_pack(mm.value.T)
    c.array(f"{w}_val", vals)
    c.array(f"{w}_mask", masks, "uint16_t")
    c.preamble[:] = ["#if defined(__AVX512F__)", "#include <immintrin.h>", "#endif"]
    runs = masks.shape[1]
    pairs = runs - runs % 2
    run = (lambda q, a: f"{a} = _mm512_fmadd_ps(_mm512_maskz_expandloadu_ps(mk[{q}], v), "  # noqa: E731
           f"_mm512_maskz_loadu_ps(mk[{q}], xr + {RUN}*({q})), {a}); v += __builtin_popcount(mk[{q}]);")
    c.body += [
        f"    for (int64_t i = 0; i < {m}; i++) {{",
        f"        const float *restrict xr = {x} + i*{kdim};",
        f"        const float *restrict v = {w}_val;",
        f"        const uint16_t *restrict mk = {w}_mask;",
        "#if defined(__AVX512F__)",
        f"        for (int64_t j = 0; j < {ncols}; j++, mk += {runs}) {{",
        "            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();",
        f"            for (int64_t c = 0; c < {pairs}; c += 2) {{",
        f"                {run('c', 'a0')}",
        f"                {run('c + 1', 'a1')}",
        "            }",
    ] + ([f"            {run(runs - 1, 'a0')}"] if runs % 2 else []) + [
        f"            {y}[i*{ncols} + j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));",
        "        }",
        "#else  /* portable: visit the set bits of each mask */",
        f"        for (int64_t j = 0; j < {ncols}; j++, mk += {runs}) {{",
        "            float s = 0.0f;",
        f"            for (int64_t c = 0; c < {runs}; c++)",
        f"                for (unsigned b = mk[c]; b; b &= b - 1) s += *v++ * xr[{RUN}*c + __builtin_ctz(b)];",
        f"            {y}[i*{ncols} + j] = s;",
        "        }",
        "#endif",
        "    }",
    ]


#: ``c_codegen.EMITTERS`` with the fast kernels: what ``generate_c`` uses unless ``fast=False``
FAST_EMITTERS: dict[str, Callable[[_Emitter, MatMul], None]] = {
    **EMITTERS, "dense": emit_dense_fast, "csr": emit_csr_fast, "bitmask": emit_bitmask}


# ---------------------------------------------------------------- large arrays
def embedded_array(name: str, values: np.ndarray, ctype: str = "float", blob_dir: Path | None = None) -> str:
    """``c_array``, except that above ``INLINE_MAX`` elements (with ``blob_dir``) the values go into
    a binary file that the assembler embeds (``.incbin``) instead of C text."""
    flat = np.ascontiguousarray(values.ravel(), dtype=NUMPY_TYPES[ctype])
    if blob_dir is None or flat.size <= INLINE_MAX or not sys.platform.startswith("linux"):
        return c_array(name, flat, ctype)
    data = flat.astype(flat.dtype.newbyteorder("<")).tobytes()
    digest = hashlib.sha256(data).hexdigest()
    path = Path(blob_dir) / f"blob-{digest[:32]}.bin"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic: a concurrent build never sees half a file
    return (f"/* {name}: {flat.size} values, {len(data)} bytes (sha256 {digest}), embedded from a file */\n"
            f"extern const {ctype} {name}[{flat.size}] __attribute__((visibility(\"hidden\")));\n"
            f"__asm__(\".section .rodata\\n.balign 64\\n.globl {name}\\n.hidden {name}\\n{name}:\\n"
            f".incbin \\\"{path}\\\"\\n.previous\");")


def array_writer(blob_dir: Path | None) -> Callable[..., str]:
    """The array writer ``generate_c`` hands its emitter on the fast path."""
    return partial(embedded_array, blob_dir=blob_dir)
