"""C target: a frozen, optimised graph as one C function with the weights compiled in.

The generated library exports ``int graph_main(int64_t n, const float *x0, ..., float *y0, ...)``:
``n`` is the batch size (the one dimension allowed to be unknown, ``None``, at build time),
``x*`` the feeds and ``y*`` the fetches, all C-contiguous float32. It returns 0, or 1 if the
intermediates could not be allocated (they share one block: on the stack for a small batch, so
an inference calls no allocator, from ``malloc`` for a large one). What it supports: float32
tensors of rank ≤ 2 whose only unknown dimension is the leading one, and the ops Placeholder,
Const, Identity, MatMul, Softmax (last axis), every op in ``fusion.ELEMENTWISE`` and
``FusedElementwise``; anything else raises ``UnsupportedOpError`` naming the op (use ``target="numpy"`` for it).

A ``MatMul`` whose right operand is a constant weight matrix ``W`` (K×N) is emitted in one of
three forms (``matmul_format``; ``"auto"`` picks by density and size, see ``choose_format``):

* ``dense``: ``W`` as a ``static const float`` array in the layout the loop wants, packed once,
  here, not per call: when N is a multiple of ``PANEL``, as N/PANEL panels of K×PANEL, each
  contiguous, so that the loop keeps PANEL sums in registers while it streams one panel;
  otherwise row-major K×N, with the loop adding ``x[k] * W[k, :]`` to the output row;
* ``unrolled``: one C statement per output, each non-zero weight a literal (the C compiler
  keeps the literals in a read-only constant pool and loads them: x86-64 has no float immediates):
  ``y[3] = x[0]*0.25f + x[17]*-1.5f + ...``; no index arrays are read, the zeros cost nothing;
* ``csr``: the non-zeros of ``Wᵀ`` as inlined ``static const`` value/index arrays (compressed
  sparse rows, one row per output), for matrices whose unrolled code would be too big to
  compile quickly;
* ``bitmask``: ``Wᵀ`` cut into runs of 16 inputs, each run stored as a 16-bit mask of which
  weights are non-zero plus those weights packed: one 2-byte mask replaces up to 16 indices.
  With AVX-512 one instruction (``vexpandps``) spreads the packed weights of a run back into
  their 16 lanes and one multiply-add applies them to 16 contiguous inputs, so the work per
  run is the same at any density and no index gathers happen; without AVX-512 the same data
  drive a portable loop over the set bits. ``auto`` prefers it to ``csr`` above
  ``BITMASK_ABOVE`` density on a CPU with AVX-512 (the benchmark measures both). It reads the
  weights once per input row, so at large batches CSR's batch loop (or dense BLAS) is faster.

``dense`` with fewer than ``PANEL`` outputs (a classifier's last layer) stores ``Wᵀ`` so that
each output is one contiguous dot product, summed in 16 independent lanes.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from reference_impl.graph import Graph, GraphError, Tensor

from .fusion import ELEMENTWISE

#: ``auto`` uses a dense kernel above this density (fraction of non-zero weights) ...
DENSE_ABOVE = 0.5
#: ... and unrolled code for at most this many non-zeros (beyond it, compiling gets slow).
UNROLL_MAX_NNZ = 4_096
#: arrays with more elements than this are embedded from a binary file (see ``_array``): parsing
#: a million float literals makes the compiler's front end the slow part of the build.
INLINE_MAX = 65_536
#: width of the packed panels of a dense weight matrix (outputs whose sums stay in registers)
PANEL = 64
#: independent sets of panel sums (rows of a panel dealt round-robin): a multiply-add takes
#: about 4 cycles to produce its result and a core starts 2 per cycle, so 8 independent chains
#: (2 sets × 64 floats = 2 × 4 AVX-512 registers) keep it busy; with one set each waits for the
#: previous one, and more sets only add broadcasts and additions
KSPLIT = 2
#: intermediates of at most this many floats live on the stack, larger ones in one malloc'd block
STACK_FLOATS = 8_192
#: outputs per function in unrolled code (the compiler's time grows faster than linearly with
#: the size of one function).
UNROLL_CHUNK = 32
#: inputs per mask of the bitmask form (one AVX-512 register of float32)
RUN = 16
#: ``auto`` uses the bitmask form (with AVX-512) above this density: its work per run of 16
#: inputs is the same at any density, so CSR, whose work is per non-zero, wins on sparser
#: matrices (the deploy benchmark's sweep shows where the two cross at batch 1).
BITMASK_ABOVE = 0.15
FORMATS = ("auto", "dense", "unrolled", "csr", "bitmask")


def host_has_avx512() -> bool:
    """Whether this (Linux) machine's CPU reports AVX-512F, the instructions the fast path of the
    ``bitmask`` form is written with; False where it cannot tell."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


class UnsupportedOpError(GraphError):
    """The graph holds an op (or a shape/dtype) the C code generator cannot emit."""


def choose_format(w: np.ndarray, matmul_format: str = "auto") -> str:
    """The kernel form for constant weight matrix ``w``: ``dense``, ``unrolled`` or ``csr``."""
    if matmul_format not in FORMATS:
        raise ValueError(f"matmul_format must be one of {FORMATS}, got {matmul_format!r}")
    if matmul_format != "auto":
        return matmul_format
    nnz = int(np.count_nonzero(w))
    if nnz > DENSE_ABOVE * w.size:
        return "dense"
    if nnz <= UNROLL_MAX_NNZ:
        return "unrolled"
    return "bitmask" if nnz > BITMASK_ABOVE * w.size and host_has_avx512() else "csr"


def c_float(v: float) -> str:
    """A float32 as a C literal that parses back to exactly the same value."""
    v = np.float32(v)
    if not np.isfinite(v):
        raise UnsupportedOpError(f"constant {v} cannot be written as a C float literal")
    return np.format_float_scientific(v, unique=True, trim="0") + "f"


_NUMPY_TYPES = {"float": np.float32, "int32_t": np.int32, "uint16_t": np.uint16}


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


def _array(name: str, values: np.ndarray, ctype: str = "float", blob_dir: Path | None = None) -> str:
    """A ``static const`` array definition; above ``INLINE_MAX`` elements (with ``blob_dir``) the
    values go into a binary file that the assembler embeds (``.incbin``) instead of C text."""
    flat = np.ascontiguousarray(values.ravel(), dtype=_NUMPY_TYPES[ctype])
    if blob_dir is not None and flat.size > INLINE_MAX and sys.platform.startswith("linux"):
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
    fmt = c_float if ctype == "float" else str
    rows = [", ".join(fmt(v) for v in flat[i:i + 8]) for i in range(0, flat.size, 8)] or ["0"]
    items = ",\n    ".join(rows)
    return f"static const {ctype} {name}[{max(flat.size, 1)}] = {{\n    {items}\n}};"


def _balanced_sum(terms: list[str]) -> str:
    """``t0 + t1 + ...`` as a balanced tree: the additions form log2(n) dependent steps, not n."""
    if not terms:
        return "0.0f"
    while len(terms) > 1:
        terms = [f"({a} + {b})" for a, b in zip(terms[::2], terms[1::2])] + (terms[-1:] if len(terms) % 2 else [])
    t = terms[0]
    return t[1:-1] if t.startswith("(") and t.endswith(")") else t


class _Emitter:
    def __init__(self, graph: Graph, feeds: list[str], fetches: list[str], matmul_format: str,
                 blob_dir: Path | None) -> None:
        self.graph, self.feeds, self.fetches, self.fmt = graph, feeds, fetches, matmul_format
        self.blob_dir = blob_dir
        self.globals: list[str] = []
        self.helpers: list[str] = []  # functions of unrolled code
        self.body: list[str] = []
        self.buffers: list[tuple[str, str]] = []  # (name, element count expression)
        self.names: dict[Tensor, str] = {}
        self.formats: dict[str, str] = {}  # MatMul op name -> kernel form chosen
        self.intrinsics = False  # a bitmask kernel needs <immintrin.h>
        self.consts: dict[str, np.ndarray] = {}  # emitted only when read (a weight packed by a
        # MatMul is not also stored unpacked)

    def ref(self, t: Tensor) -> str:
        """The C name holding ``t``, emitting a constant's array on its first use."""
        name = self.names[t]
        if name in self.consts:
            self.globals.append(_array(name, self.consts.pop(name), blob_dir=self.blob_dir))
        return name

    # -- shapes as C expressions
    def _check(self, t: Tensor) -> None:
        if t.dtype != "float32":
            raise UnsupportedOpError(f"{t.op.type} op {t.op.name!r}: the C target handles float32 only, "
                                     f"this tensor is {t.dtype}; use target='numpy'")
        if t.shape is None or len(t.shape) > 2 or None in t.shape[1:]:
            raise UnsupportedOpError(f"{t.op.type} op {t.op.name!r}: the C target needs rank ≤ 2 with only "
                                     f"the leading dimension unknown, got shape {t.shape}; use target='numpy'")

    @staticmethod
    def dims(t: Tensor) -> list[str]:
        return ["n" if d is None else str(d) for d in t.shape]

    def numel(self, t: Tensor) -> str:
        return "*".join(["(int64_t)1"] + self.dims(t))

    def buffer(self, t: Tensor, k: int) -> str:
        name = f"t{k}"
        self.buffers.append((name, self.numel(t)))
        self.names[t] = name
        return name

    # -- ops
    def elementwise(self, out_t: Tensor, out: str, ins: list[Tensor], program: list) -> None:
        """One loop nest over the output; inputs broadcast by index arithmetic."""
        rank = len(out_t.shape)
        loops = [f"i{d}" for d in range(rank)]
        odims = self.dims(out_t)
        for t in ins:
            for a, b in zip(t.shape[::-1], out_t.shape[::-1]):
                if a is None and b is not None:
                    raise UnsupportedOpError(f"{out_t.op.type} op {out_t.op.name!r}: cannot broadcast an "
                                             f"unknown dimension of {t.name} to size {b}")

        def index(t: Tensor) -> str:
            terms, stride = [], "1"
            for d in range(len(t.shape) - 1, -1, -1):
                size = t.shape[d]
                if size != 1:
                    terms.append(f"i{rank - len(t.shape) + d}*{stride}")
                stride = f"{stride}*{'n' if size is None else size}"
            return " + ".join(terms) or "0"

        ind = "    "
        for d, v in enumerate(loops):
            self.body.append(f"{ind * (d + 1)}for (int64_t {v} = 0; {v} < {odims[d]}; {v}++) {{")
        inner = ind * (rank + 1)
        for j, t in enumerate(ins):
            self.body.append(f"{inner}const float a{j} = {self.ref(t)}[{index(t)}];")
        for s, (type, args) in enumerate(program):
            vals = [f"a{i}" if kind == "in" else f"s{i}" for kind, i in args]
            self.body.append(f"{inner}const float s{s} = {ELEMENTWISE[type][1].format(*vals)};")
        flat = " + ".join(f"i{d}*{'*'.join(odims[d + 1:]) or '1'}" for d in range(rank)) or "0"
        self.body.append(f"{inner}{out}[{flat}] = s{len(program) - 1};")
        for d in range(rank, 0, -1):
            self.body.append(f"{ind * d}}}")

    def matmul(self, op: Any, out: str) -> None:
        a, b = op.inputs
        if len(a.shape) != 2 or len(b.shape) != 2 or None in b.shape:
            raise UnsupportedOpError(f"MatMul op {op.name!r}: the C target needs a (rows×K) @ (K×N) product "
                                     f"with a known K×N, got {a.shape} @ {b.shape}")
        m, kdim, ncols = self.dims(a)[0], b.shape[0], b.shape[1]
        x, y = self.ref(a), out
        if b.op.type != "Const":  # both operands computed at run time: a plain loop nest
            w, form = self.ref(b), "dense"
        else:
            wv = np.asarray(b.op.attrs["value"], dtype=np.float32)
            form = choose_format(wv, self.fmt)
            w = f"W_{len(self.formats)}"
            if form == "dense" and ncols % PANEL == 0:  # packed panels, see ``_dense_panels``
                self.globals.append(_array(w, wv.reshape(kdim, ncols // PANEL, PANEL).transpose(1, 0, 2),
                                           blob_dir=self.blob_dir))
                self.formats[op.name] = "dense"
                self._dense_panels(w, x, y, m, kdim, ncols)
                return
            if form == "dense" and ncols < PANEL:  # Wᵀ: each output one contiguous dot product
                self.globals.append(_array(w, wv.T, blob_dir=self.blob_dir))
                self.formats[op.name] = "dense"
                self._dense_dots(w, x, y, m, kdim, ncols)
                return
            if form == "bitmask":
                masks, vals = bitmask_pack(wv.T)
                self.globals += [_array(f"{w}_val", vals, blob_dir=self.blob_dir),
                                 _array(f"{w}_mask", masks, "uint16_t", blob_dir=self.blob_dir)]
                self.formats[op.name] = "bitmask"
                self._bitmask(w, x, y, m, kdim, ncols, masks.shape[1])
                return
            if form == "dense":  # row-major K×N: the inner loop reads W[k, :] contiguously
                self.globals.append(_array(w, wv, blob_dir=self.blob_dir))
            elif form == "csr":
                wt = np.ascontiguousarray(wv.T)  # one CSR row per output column
                ptr = np.concatenate([[0], np.cumsum(np.count_nonzero(wt, axis=1))])
                idx = np.nonzero(wt)[1]
                itype = "uint16_t" if kdim < 65536 else "int32_t"
                self.globals += [_array(f"{w}_val", wt[wt != 0], blob_dir=self.blob_dir),
                                 _array(f"{w}_idx", idx, itype, blob_dir=self.blob_dir),
                                 _array(f"{w}_ptr", ptr, "int32_t", blob_dir=self.blob_dir)]
        self.formats[op.name] = form
        B = self.body
        if form == "csr" and m != "1":
            # a batch: transpose it once, then read each weight once and apply it to the whole
            # batch (a contiguous, vectorisable inner loop); one input row needs no transpose.
            xt, acc = f"{y}_xt", f"{y}_acc"
            self.buffers += [(xt, f"(int64_t){kdim}*{m}"), (acc, m)]
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
        B.append(f"    for (int64_t i = 0; i < {m}; i++) {{")
        B.append(f"        const float *restrict xr = {x} + i*{kdim};")
        B.append(f"        float *restrict yr = {y} + i*{ncols};")
        if form == "dense":
            B.append(f"        for (int64_t j = 0; j < {ncols}; j++) yr[j] = 0.0f;")
            B.append(f"        for (int64_t k = 0; k < {kdim}; k++) {{")
            B.append("            const float xk = xr[k];")
            B.append(f"            const float *restrict wk = {w} + k*{ncols};")
            B.append(f"            for (int64_t j = 0; j < {ncols}; j++) yr[j] += xk * wk[j];")
            B.append("        }")
        elif form == "csr":  # four partial sums: four independent chains of multiply-adds
            B.append(f"        for (int64_t j = 0; j < {ncols}; j++) {{")
            B.append("            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;")
            B.append(f"            int32_t p = {w}_ptr[j];")
            B.append(f"            const int32_t end = {w}_ptr[j + 1];")
            B.append("            for (; p + 4 <= end; p += 4) {")
            for u in range(4):
                B.append(f"                a{u} += {w}_val[p + {u}] * xr[{w}_idx[p + {u}]];")
            B.append("            }")
            B.append(f"            for (; p < end; p++) a0 += {w}_val[p] * xr[{w}_idx[p]];")
            B.append("            yr[j] = (a0 + a1) + (a2 + a3);")
            B.append("        }")
        else:  # unrolled: every non-zero weight is a literal in the code, no index array
            for c0 in range(0, ncols, UNROLL_CHUNK):
                fn = [f"static void {w}_{c0}(const float *restrict xr, float *restrict yr) {{"]
                for j in range(c0, min(ncols, c0 + UNROLL_CHUNK)):
                    col = wv[:, j]
                    terms = [f"xr[{k}]*{c_float(col[k])}" for k in np.flatnonzero(col)]
                    fn.append(f"    yr[{j}] = {_balanced_sum(terms)};")
                self.helpers.append("\n".join(fn + ["}"]))
                B.append(f"        {w}_{c0}(xr, yr);")
        B.append("    }")

    def _dense_panels(self, w: str, x: str, y: str, m: str, kdim: int, ncols: int) -> None:
        """``y = x @ W`` with W pre-packed as ``ncols / PANEL`` panels of K×PANEL, each contiguous.

        For one panel the loop keeps running sums in registers and streams the panel once: one
        load and one multiply-add per weight, no reloading and storing of the output row for
        every k as the plain row-major loop does. ``KSPLIT`` sets of PANEL sums take turns over
        the rows of the panel (set u adds rows k ≡ u mod KSPLIT), so consecutive multiply-adds
        do not wait for each other's result; the sets are added at the end."""
        body = kdim - kdim % KSPLIT
        total = " + ".join(f"acc[{u}][jj]" for u in range(KSPLIT))
        self.body += [
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

    def _dense_dots(self, w: str, x: str, y: str, m: str, kdim: int, ncols: int) -> None:
        """``y = x @ W`` for a narrow W stored as ``Wᵀ``: output ``j`` is the dot product of the
        input row with row ``j`` of ``Wᵀ``, both contiguous. Sixteen partial sums (lane ``u`` adds
        the products at ``k ≡ u`` mod 16) are independent, so the compiler keeps them in one
        vector register without reordering any float addition."""
        body = kdim - kdim % RUN
        self.body += [
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

    def _bitmask(self, w: str, x: str, y: str, m: str, kdim: int, ncols: int, runs: int) -> None:
        """``y = x @ W`` from the 16-bit masks and packed non-zeros of ``Wᵀ`` (``bitmask_pack``).

        AVX-512: per run, ``vexpandps`` loads the run's packed weights into the lanes its mask
        selects (zeros elsewhere), a masked load reads the 16 inputs (masked lanes are not read,
        so the last, partial run cannot overrun ``x``), one multiply-add; two accumulators
        alternate runs so that consecutive multiply-adds do not wait for each other."""
        self.intrinsics = True
        pairs = runs - runs % 2
        run = (lambda c, a: f"{a} = _mm512_fmadd_ps(_mm512_maskz_expandloadu_ps(mk[{c}], v), "
               f"_mm512_maskz_loadu_ps(mk[{c}], xr + {RUN}*({c})), {a}); v += __builtin_popcount(mk[{c}]);")
        self.body += [
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

    def softmax(self, op: Any, out: str) -> None:
        t = op.inputs[0]
        if len(t.shape) != 2 or op.attrs["axis"] not in (-1, 1):
            raise UnsupportedOpError(f"Softmax op {op.name!r}: the C target handles the last axis of a "
                                     f"rank-2 tensor only, got axis {op.attrs['axis']} of shape {t.shape}")
        m, c = self.dims(t)
        x = self.ref(t)
        self.body += [
            f"    for (int64_t i = 0; i < {m}; i++) {{",
            f"        const float *xr = {x} + i*{c}; float *yr = {out} + i*{c};",
            "        float mx = xr[0], s = 0.0f;",
            f"        for (int64_t j = 1; j < {c}; j++) mx = xr[j] > mx ? xr[j] : mx;",
            f"        for (int64_t j = 0; j < {c}; j++) {{ yr[j] = expf(xr[j] - mx); s += yr[j]; }}",
            f"        for (int64_t j = 0; j < {c}; j++) yr[j] /= s;",
            "    }",
        ]

    # -- the whole function
    def run(self) -> str:
        for k, op in enumerate(self.graph.operations):
            if not op.outputs:
                continue
            t = op.outputs[0]
            self._check(t)
            self.body.append(f"    /* {op.name} ({op.type}) */")
            if op.type == "Placeholder":
                if op.name not in self.feeds:
                    raise GraphError(f"placeholder {op.name!r} is needed by the fetches but is not among the feeds")
                self.names[t] = f"x{self.feeds.index(op.name)}"
            elif op.type == "Const":
                self.consts[f"c{k}"] = np.asarray(op.attrs["value"], dtype=np.float32)
                self.names[t] = f"c{k}"
            elif op.type == "Identity":
                self.names[t] = self.names[op.inputs[0]]
            elif op.type in ELEMENTWISE:
                args = [["in", i] for i in range(len(op.inputs))]
                self.elementwise(t, self.buffer(t, k), list(op.inputs), [[op.type, args]])
            elif op.type == "FusedElementwise":
                self.elementwise(t, self.buffer(t, k), list(op.inputs), op.attrs["program"])
            elif op.type == "MatMul":
                self.matmul(op, self.buffer(t, k))
            elif op.type == "Softmax":
                self.softmax(op, self.buffer(t, k))
            else:
                raise UnsupportedOpError(f"the C target has no code for {op.type} op {op.name!r}; "
                                         "use target='numpy' (which runs every registered op)")
        params = ["int64_t n"] + [f"const float *restrict x{i}" for i in range(len(self.feeds))] + \
                 [f"float *restrict y{i}" for i in range(len(self.fetches))]
        copies = [f"    memcpy(y{i}, {self.ref(self.graph.get_tensor_by_name(f))}, "
                  f"sizeof(float) * ({self.numel(self.graph.get_tensor_by_name(f))}));"
                  for i, f in enumerate(self.fetches)]
        lines = ["#include <math.h>", "#include <stdint.h>", "#include <stdlib.h>", "#include <string.h>", ""]
        if self.intrinsics:
            lines[-1:] = ["#if defined(__AVX512F__)", "#include <immintrin.h>", "#endif", ""]
        lines += self.globals + [""] + self.helpers + ["", f"int graph_main({', '.join(params)}) {{"]
        lines += self._scratch()
        lines += self.body
        lines += copies
        if self.buffers:
            lines.append("    if (scratch != on_stack) free(scratch);")
        lines += ["    return 0;", "}"]
        return "\n".join(lines) + "\n"

    def _scratch(self) -> list[str]:
        """The intermediates as slices of one block, each starting on a 64-byte boundary: on the
        stack when they fit in ``STACK_FLOATS`` (a small batch: no allocator call per
        inference), else from ``malloc`` (a large batch would overflow a thread's stack)."""
        if not self.buffers:
            return []
        lines = ["    /* intermediates: one block, on the stack for small batches, else malloc'd */",
                 f"    _Alignas(64) float on_stack[{STACK_FLOATS}];"]
        offset = "0"
        for name, size in self.buffers:
            lines.append(f"    const int64_t {name}_at = {offset};")
            offset = f"{name}_at + ((({size}) + 15) & ~(int64_t)15)"
        lines += [f"    const int64_t scratch_floats = {offset};",
                  (f"    float *scratch = scratch_floats <= {STACK_FLOATS} ? on_stack "
                   ": malloc(sizeof(float) * scratch_floats);"),
                  "    if (!scratch) return 1;"]
        lines += [f"    float *{name} = scratch + {name}_at;" for name, _ in self.buffers]
        return lines


def generate_c(graph: Graph, feeds: list[str], fetches: list[str], matmul_format: str = "auto",
               blob_dir: Path | None = None) -> tuple[str, dict[str, str]]:
    """(C source of ``graph_main``, the kernel form chosen for each constant-weight MatMul).

    With ``blob_dir``, arrays over ``INLINE_MAX`` elements are written there as binary files
    that the source embeds by absolute path (their hash is in the source, so a content hash of
    the source still covers every weight); without it every array is C text.
    """
    if matmul_format not in FORMATS:
        raise ValueError(f"matmul_format must be one of {FORMATS}, got {matmul_format!r}")
    e = _Emitter(graph, feeds, fetches, matmul_format, blob_dir)
    source = e.run()
    return source, e.formats
