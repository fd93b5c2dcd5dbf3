"""Declaring a custom op: its interface in Python, its kernel in C, one registry entry.

NumPy-only: C kernels read host memory through NumPy buffers.

This is TensorFlow's split in small.  ``REGISTER_OP`` declares the *op* (inputs, output,
attributes, shape function) and ``REGISTER_KERNEL_BUILDER`` attaches a *kernel* per device
and type; ``tf.load_op_library`` loads the compiled ``.so``.  Here ``CustomOp(...)`` is the
declaration, the C source is the kernel (built once per element type ``T``), and
``register()`` compiles, loads and adds the op to the graph registry, after which graph mode,
eager mode, the passes and the gradient builder use it like any built-in op.

The kernel runs on the caller's buffers (``abi.py`` checks them first), and its output is
allocated here from the shape function, so C never writes past the end of an array.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import reference_impl.graph as graph
from reference_impl.backend import require_numpy
from reference_impl.graph import ShapeError, apply_op  # apply_op: the graph-or-eager dispatch
from reference_impl.toolchain import CompileError, ToolchainError, build_shared_library, load_library

from . import abi

KERNELS_DIR = Path(__file__).with_name("kernels")


@dataclass(frozen=True)
class Input:
    """One input: a NumPy dtype name or ``"T"`` (the op's element type), a rank, a layout."""
    name: str
    dtype: str = "T"
    ndim: int | None = None
    layout: str = "contiguous"  # or "strided": the kernel honours in[k].strides


@dataclass(frozen=True)
class Attr:
    """One attribute, passed to C as ``attr[k].i`` (``kind="int"``) or ``attr[k].f`` (``"float"``)."""
    name: str
    kind: str = "int"


# --8<-- [start:declare]
class CustomOp:
    """An op whose kernel is C source: declare it, ``register()`` it, call it like a built-in.

    ``shape_fn(shapes, attrs)`` gets the input shapes (static ones may hold ``None``) and returns
    the output shape; it raises ``ShapeError`` for inputs that do not fit together.  ``symbol``
    is the C function's name.  ``grad(op, grad_output)`` is a registry gradient function; it may
    call other custom ops (a gradient kernel in C) or built-in ops.
    """

    def __init__(self, name: str, inputs: Sequence[Input], shape_fn: Callable[[list, dict], Any], *,
                 symbol: str, source: str | None = None, source_file: str | Path | None = None,
                 output_dtype: str = "T", attrs: Sequence[Attr] = (),
                 T: Sequence[str] = ("float32", "float64"), grad: Callable | None = None,
                 flags: Sequence[str] = ("-O2",)) -> None:
        if (source is None) == (source_file is None):
            raise ValueError(f"custom op {name!r}: give exactly one of source= and source_file=")
        if source_file is not None:
            path = Path(source_file)
            source = (path if path.is_absolute() else KERNELS_DIR / path).read_text()
        for spec in inputs:
            if spec.layout not in abi.LAYOUTS:
                raise ValueError(f"custom op {name!r} input {spec.name!r}: layout must be one of {abi.LAYOUTS}")
            if spec.dtype != "T" and spec.dtype not in abi.C_TYPES:
                raise ValueError(f"custom op {name!r} input {spec.name!r}: dtype {spec.dtype!r} has no "
                                 f"C type (known: {', '.join(abi.C_TYPES)})")
        for t in T:
            if t not in ("float32", "float64"):
                raise ValueError(f"custom op {name!r}: element type T={t!r} must be float32 or float64")
        for attr in attrs:
            if attr.kind not in ("int", "float"):
                raise ValueError(f"custom op {name!r} attribute {attr.name!r}: kind must be 'int' or 'float'")
        self.name, self.inputs, self.shape_fn = name, tuple(inputs), shape_fn
        self.symbol, self.source, self.output_dtype = symbol, source, output_dtype
        self.attrs, self.grad, self.flags = tuple(attrs), grad, tuple(flags)
        generic = output_dtype == "T" or any(s.dtype == "T" for s in self.inputs)
        self.type_params: tuple[str | None, ...] = tuple(T) if generic else (None,)
        self.kernels: dict[str | None, Any] = {}
        self._where = [f"custom op {name!r} input {spec.name!r}" for spec in self.inputs]  # for errors

    # ------------------------------------------------------------ build + register
    def build(self) -> None:
        """Compile and load one kernel per element type (cached on disk by content hash)."""
        header = (Path(__file__).with_name(abi.HEADER)).read_text()
        for t in self.type_params:
            flags = self.flags + ((f"-DT={abi.C_TYPES[t]}",) if t else ())
            # '#line' makes the compiler count lines (and name the file) as in the kernel source.
            text = f'{header}\n#line 1 "{self.name}.c"\n{self.source}'
            try:
                path = build_shared_library(text, name=f"{self.name}_{t or 'any'}", flags=flags)
            except CompileError as e:
                raise CompileError(e.name, e.command, e.stderr, self.source, f"{self.name}.c") from None
            lib = load_library(path)
            try:
                fn = getattr(lib, self.symbol)
            except AttributeError:
                raise ToolchainError(f"custom op {self.name!r}: the compiled kernel has no function "
                                     f"{self.symbol!r}; is the C function named differently?") from None
            fn.argtypes, fn.restype = abi.KERNEL_ARGTYPES, ctypes.c_int
            self.kernels[t] = fn

    def register(self, replace: bool = False) -> "CustomOp":
        """Build the kernels, then add the op to the registry (``replace`` re-registers a name)."""
        self.build()
        if replace:
            graph.REGISTRY.pop(self.name, None)
        graph.register(self.name, infer=self._infer, kernel=self._kernel, grad=self.grad)
        return self
# --8<-- [end:declare]

    def __call__(self, *inputs: Any, name: str | None = None, **attrs: Any) -> Any:
        """The front-end function: a graph node, or the result now in eager mode."""
        if len(inputs) != len(self.inputs):
            raise TypeError(f"{self.name} takes {len(self.inputs)} inputs "
                            f"({', '.join(s.name for s in self.inputs)}), got {len(inputs)}")
        return apply_op(self.name, list(inputs), self._attrs(attrs), name=name)

    # ------------------------------------------------------------ what the registry calls
    def _attrs(self, attrs: dict) -> dict:
        declared = {a.name for a in self.attrs}
        if set(attrs) != declared:
            raise TypeError(f"{self.name} takes attributes {sorted(declared)}, got {sorted(attrs)}")
        return {a.name: int(attrs[a.name]) if a.kind == "int" else float(attrs[a.name]) for a in self.attrs}

    def _element_type(self, dtypes: Sequence[str]) -> str | None:
        """Check input dtypes against the declaration; return the element type ``T``."""
        t = None
        for spec, dt in zip(self.inputs, dtypes):
            want = spec.dtype if spec.dtype != "T" else (t or dt)
            if spec.dtype == "T" and dt not in self.type_params:
                raise ShapeError(f"input {spec.name!r} has dtype {dt}; kernels exist for "
                                 f"{', '.join(self.type_params)}")
            if dt != want:
                raise ShapeError(f"input {spec.name!r} has dtype {dt}, expected {want}")
            if spec.dtype == "T":
                t = dt
        return t if t is not None else self.type_params[0]

    def _infer(self, shapes: list, dtypes: list, attrs: dict) -> tuple:
        if len(shapes) != len(self.inputs):
            raise ShapeError(f"expected {len(self.inputs)} inputs, got {len(shapes)}")
        t = self._element_type(dtypes)
        for spec, shape in zip(self.inputs, shapes):
            if spec.ndim is not None and shape is not None and len(shape) != spec.ndim:
                raise ShapeError(f"input {spec.name!r} must have rank {spec.ndim}, got shape {tuple(shape)}")
        out = self.shape_fn([None if s is None else tuple(s) for s in shapes], attrs)
        return (None if out is None else tuple(out)), (t if self.output_dtype == "T" else self.output_dtype)

    def _kernel(self, xs: list, attrs: dict, state: dict) -> np.ndarray:
        require_numpy(f"reference_impl.custom_ops (custom op {self.name!r}: a C kernel on host memory)", *xs)
        t = self._element_type([abi.dtype_name(x) for x in xs])
        for spec, where, x in zip(self.inputs, self._where, xs):
            abi.check_array(where, x, t if spec.dtype == "T" else spec.dtype, spec.ndim, spec.layout)
        shape = self.shape_fn([x.shape for x in xs], attrs)
        if shape is None or any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise ShapeError(f"custom op {self.name!r}: shape function returned {shape} for concrete "
                             f"inputs {[x.shape for x in xs]}; it must be a tuple of sizes >= 0")
        out = np.empty(tuple(int(d) for d in shape), dtype=t if self.output_dtype == "T" else self.output_dtype)
        if t not in self.kernels:
            raise ToolchainError(f"custom op {self.name!r} has no {t} kernel loaded; call register() first")
        values = [attrs[a.name] for a in self.attrs]
        c_attrs = abi.attr_values(values, [a.kind for a in self.attrs])
        return abi.call_kernel(self.kernels[t], self.name, xs, out, c_attrs, len(values))
