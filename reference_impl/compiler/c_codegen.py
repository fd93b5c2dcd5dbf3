"""C target: a frozen, optimised graph as one C function with the weights compiled in.

NumPy-only: the compiler's targets are NumPy source and C compiled for host memory.

The generated library exports ``int graph_main(int64_t n, const float *x0, ..., float *y0, ...)``:
``n`` is the batch size (the one dimension allowed to be unknown, ``None``, at build time),
``x*`` the feeds and ``y*`` the fetches, all C-contiguous float32. It returns 0, or 1 if the
intermediates could not be allocated (they share one block: on the stack for a small batch, so
an inference calls no allocator, from ``malloc`` for a large one). What it supports: float32
tensors of rank ≤ 2 whose only unknown dimension is the leading one, and the ops Placeholder,
Const, Identity, MatMul, Softmax (last axis), every op in ``fusion.ELEMENTWISE`` and
``FusedElementwise``; anything else raises ``UnsupportedOpError`` naming the op (use ``target="numpy"`` for it).

A ``MatMul`` whose right operand is a constant weight matrix ``W`` (K×N) is written by one of
three small emitters, looked up by name in ``EMITTERS`` (``matmul_format``; ``"auto"`` picks by
density and size, see ``choose_format``):

* ``dense``: ``W`` as a row-major ``static const float`` array; for each input row the loop adds
  ``x[k] * W[k, :]`` to the output row;
* ``csr``: the non-zeros of ``Wᵀ`` as inlined ``static const`` value/index arrays (compressed
  sparse rows, one row per output): the work is one multiply-add per non-zero;
* ``unrolled``: one C statement per output, each non-zero weight a literal (the C compiler
  keeps the literals in a read-only constant pool and loads them: x86-64 has no float immediates):
  ``y[3] = x[0]*0.25f + x[17]*-1.5f + ...``; no index arrays are read, the zeros cost nothing.

That is the whole idea. ``fast_kernels`` (used by default, ``generate_c(..., fast=False)`` or
``LAB_JIT_FAST=0`` turns it off) replaces two entries of the table with kernels tuned for the
CPU (pre-packed dense panels, CSR over a whole batch) and adds a fourth form, ``bitmask``, for
AVX-512; it also embeds large arrays from binary files instead of C text.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from reference_impl.graph import Graph, GraphError, Tensor

from .fusion import ELEMENTWISE

#: ``auto`` uses a dense kernel above this density (fraction of non-zero weights) ...
DENSE_ABOVE = 0.5
#: ... and unrolled code for at most this many non-zeros (beyond it, compiling gets slow).
UNROLL_MAX_NNZ = 4_096
#: outputs per function in unrolled code (the compiler's time grows faster than linearly with
#: the size of one function).
UNROLL_CHUNK = 32
#: intermediates of at most this many floats live on the stack, larger ones in one malloc'd block
STACK_FLOATS = 8_192
#: every name ``matmul_format`` accepts; ``bitmask`` exists only on the fast path
FORMATS = ("auto", "dense", "unrolled", "csr", "bitmask")


class UnsupportedOpError(GraphError):
    """The graph holds an op (or a shape/dtype) the C code generator cannot emit."""


class MatMul(NamedTuple):
    """One ``y = x @ W`` to emit: C names and sizes. ``value`` is the constant ``W`` (None when ``W``
    is computed at run time; then ``w`` names its buffer), ``m`` the rows (``"n"`` or a number)."""
    w: str
    x: str
    y: str
    m: str
    k: int
    n: int
    value: np.ndarray | None


# --8<-- [start:emitters]
def emit_dense(c: "_Emitter", mm: MatMul) -> None:
    """Row-major K×N: each output row starts at zero and gains ``x[i, k] * W[k, :]`` for every k
    (the inner loop reads a row of W contiguously and vectorises)."""
    if mm.value is not None:
        c.array(mm.w, mm.value)
    c.body += [
        f"    for (int64_t i = 0; i < {mm.m}; i++) {{",
        f"        const float *restrict xr = {mm.x} + i*{mm.k};",
        f"        float *restrict yr = {mm.y} + i*{mm.n};",
        f"        for (int64_t j = 0; j < {mm.n}; j++) yr[j] = 0.0f;",
        f"        for (int64_t k = 0; k < {mm.k}; k++) {{",
        "            const float xk = xr[k];",
        f"            const float *restrict wk = {mm.w} + k*{mm.n};",
        f"            for (int64_t j = 0; j < {mm.n}; j++) yr[j] += xk * wk[j];",
        "        }",
        "    }",
    ]


def csr_arrays(c: "_Emitter", mm: MatMul) -> None:
    """The CSR arrays of ``Wᵀ`` (one row per output): ``{w}_val``, ``{w}_idx`` and ``{w}_ptr``."""
    wt = np.ascontiguousarray(mm.value.T)
    ptr = np.concatenate([[0], np.cumsum(np.count_nonzero(wt, axis=1))])
    c.array(f"{mm.w}_val", wt[wt != 0])
    c.array(f"{mm.w}_idx", np.nonzero(wt)[1], "uint16_t" if mm.k < 65536 else "int32_t")
    c.array(f"{mm.w}_ptr", ptr, "int32_t")


def emit_csr(c: "_Emitter", mm: MatMul) -> None:
    """Output j of row i sums ``val[p] * x[i, idx[p]]`` over the non-zeros p of column j of W."""
    csr_arrays(c, mm)
    c.body += [
        f"    for (int64_t i = 0; i < {mm.m}; i++) {{",
        f"        const float *restrict xr = {mm.x} + i*{mm.k};",
        f"        for (int64_t j = 0; j < {mm.n}; j++) {{",
        "            float s = 0.0f;",
        f"            for (int32_t p = {mm.w}_ptr[j]; p < {mm.w}_ptr[j + 1]; p++) s += {mm.w}_val[p] * xr[{mm.w}_idx[p]];",
        f"            {mm.y}[i*{mm.n} + j] = s;",
        "        }",
        "    }",
    ]


def emit_unrolled(c: "_Emitter", mm: MatMul) -> None:
    """Every non-zero weight a literal in the code, no array: one statement per output, in
    functions of ``UNROLL_CHUNK`` outputs (``balanced_sum`` keeps the additions' chain short)."""
    c.body += [f"    for (int64_t i = 0; i < {mm.m}; i++) {{",
               f"        const float *restrict xr = {mm.x} + i*{mm.k};",
               f"        float *restrict yr = {mm.y} + i*{mm.n};"]
    for c0 in range(0, mm.n, UNROLL_CHUNK):
        fn = [f"static void {mm.w}_{c0}(const float *restrict xr, float *restrict yr) {{"]
        for j in range(c0, min(mm.n, c0 + UNROLL_CHUNK)):
            col = mm.value[:, j]
            fn.append(f"    yr[{j}] = {balanced_sum([f'xr[{k}]*{c_float(col[k])}' for k in np.flatnonzero(col)])};")
        c.helpers.append("\n".join(fn + ["}"]))
        c.body.append(f"        {mm.w}_{c0}(xr, yr);")
    c.body.append("    }")


#: matmul form -> the function that writes its C (``fast_kernels.FAST_EMITTERS`` extends it)
EMITTERS: dict[str, Callable[["_Emitter", MatMul], None]] = {
    "dense": emit_dense, "csr": emit_csr, "unrolled": emit_unrolled}
# --8<-- [end:emitters]


def choose_format(w: np.ndarray, matmul_format: str = "auto", fast: bool = True) -> str:
    """The kernel form for constant weight matrix ``w``: ``dense``, ``unrolled`` or ``csr`` (and,
    with ``fast`` on a CPU with AVX-512, ``bitmask`` where ``fast_kernels.prefers_bitmask`` says)."""
    if matmul_format not in FORMATS:
        raise ValueError(f"matmul_format must be one of {FORMATS}, got {matmul_format!r}")
    if matmul_format != "auto":
        return matmul_format
    nnz = int(np.count_nonzero(w))
    if nnz > DENSE_ABOVE * w.size:
        return "dense"
    if nnz <= UNROLL_MAX_NNZ:
        return "unrolled"
    if fast:
        from .fast_kernels import prefers_bitmask  # fast_kernels imports this module
        if prefers_bitmask(w, nnz):
            return "bitmask"
    return "csr"


def c_float(v: float) -> str:
    """A float32 as a C literal that parses back to exactly the same value."""
    v = np.float32(v)
    if not np.isfinite(v):
        raise UnsupportedOpError(f"constant {v} cannot be written as a C float literal")
    return np.format_float_scientific(v, unique=True, trim="0") + "f"


NUMPY_TYPES = {"float": np.float32, "int32_t": np.int32, "uint16_t": np.uint16}


def c_array(name: str, values: np.ndarray, ctype: str = "float") -> str:
    """A ``static const`` array definition with the values as C text."""
    flat = np.ascontiguousarray(values.ravel(), dtype=NUMPY_TYPES[ctype])
    fmt = c_float if ctype == "float" else str
    rows = [", ".join(fmt(v) for v in flat[i:i + 8]) for i in range(0, flat.size, 8)] or ["0"]
    items = ",\n    ".join(rows)
    return f"static const {ctype} {name}[{max(flat.size, 1)}] = {{\n    {items}\n}};"


def balanced_sum(terms: list[str]) -> str:
    """``t0 + t1 + ...`` as a balanced tree: the additions form log2(n) dependent steps, not n."""
    if not terms:
        return "0.0f"
    while len(terms) > 1:
        terms = [f"({a} + {b})" for a, b in zip(terms[::2], terms[1::2])] + (terms[-1:] if len(terms) % 2 else [])
    t = terms[0]
    return t[1:-1] if t.startswith("(") and t.endswith(")") else t


class _Emitter:
    """The C source of ``graph_main`` being written: ``globals`` (weight arrays), ``helpers``
    (functions), ``body`` (the statements of ``graph_main``) and its intermediate buffers."""

    def __init__(self, graph: Graph, feeds: list[str], fetches: list[str], matmul_format: str,
                 emitters: dict[str, Callable], write_array: Callable[..., str], fast: bool) -> None:
        self.graph, self.feeds, self.fetches, self.fmt = graph, feeds, fetches, matmul_format
        self.emitters, self.write_array, self.fast = emitters, write_array, fast
        self.globals: list[str] = []
        self.helpers: list[str] = []  # functions of unrolled code
        self.body: list[str] = []
        self.preamble: list[str] = []  # lines after the standard #includes (a kernel's own headers)
        self.buffers: list[tuple[str, str]] = []  # (name, element count expression)
        self.names: dict[Tensor, str] = {}
        self.formats: dict[str, str] = {}  # MatMul op name -> kernel form chosen
        self.consts: dict[str, np.ndarray] = {}  # emitted only when read (a weight packed by a
        # MatMul is not also stored unpacked)

    def array(self, name: str, values: np.ndarray, ctype: str = "float") -> None:
        self.globals.append(self.write_array(name, values, ctype))

    def ref(self, t: Tensor) -> str:
        """The C name holding ``t``, emitting a constant's array on its first use."""
        name = self.names[t]
        if name in self.consts:
            self.array(name, self.consts.pop(name))
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
        """Pick the form of ``op`` (``choose_format``) and let its emitter write it."""
        a, b = op.inputs
        if len(a.shape) != 2 or len(b.shape) != 2 or None in b.shape:
            raise UnsupportedOpError(f"MatMul op {op.name!r}: the C target needs a (rows×K) @ (K×N) product "
                                     f"with a known K×N, got {a.shape} @ {b.shape}")
        x, m = self.ref(a), self.dims(a)[0]
        if b.op.type != "Const":  # both operands computed at run time: the plain dense loop
            self.formats[op.name] = "dense"
            return emit_dense(self, MatMul(self.ref(b), x, out, m, b.shape[0], b.shape[1], None))
        value = np.asarray(b.op.attrs["value"], dtype=np.float32)
        form = choose_format(value, self.fmt, self.fast)
        mm = MatMul(f"W_{len(self.formats)}", x, out, m, b.shape[0], b.shape[1], value)
        self.formats[op.name] = form
        self.emitters[form](self, mm)

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
        lines = ["#include <math.h>", "#include <stdint.h>", "#include <stdlib.h>", "#include <string.h>"]
        lines += self.preamble + [""]
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
               blob_dir: Path | None = None, fast: bool = True) -> tuple[str, dict[str, str]]:
    """(C source of ``graph_main``, the kernel form chosen for each constant-weight MatMul).

    ``fast`` (the default): the emitters of ``fast_kernels.FAST_EMITTERS``, and with ``blob_dir``
    arrays over ``fast_kernels.INLINE_MAX`` elements are written there as binary files that the
    source embeds by absolute path (their hash is in the source, so a content hash of the
    source still covers every weight). ``fast=False``: ``EMITTERS`` and every array as C text.
    """
    if matmul_format not in FORMATS:
        raise ValueError(f"matmul_format must be one of {FORMATS}, got {matmul_format!r}")
    if fast:
        from .fast_kernels import FAST_EMITTERS, array_writer  # it imports this module
        emitters, write_array = FAST_EMITTERS, array_writer(blob_dir)
    elif matmul_format not in EMITTERS and matmul_format != "auto":
        raise ValueError(f"matmul_format={matmul_format!r} is a fast kernel (fast_kernels); the plain path "
                         f"has {sorted(EMITTERS)}")
    else:
        emitters, write_array = EMITTERS, c_array
    e = _Emitter(graph, feeds, fetches, matmul_format, emitters, write_array, fast)
    source = e.run()
    return source, e.formats


#: names that moved to ``fast_kernels``, still importable from here
_MOVED = ("BITMASK_ABOVE", "INLINE_MAX", "KSPLIT", "PANEL", "RUN", "bitmask_pack", "host_has_avx512")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from . import fast_kernels
        return getattr(fast_kernels, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
