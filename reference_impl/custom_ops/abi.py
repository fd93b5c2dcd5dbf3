"""The Python side of the C ABI in ``lab_op.h``: check arrays, describe them to C, call, raise.

NumPy-only: C kernels read host memory through NumPy buffers.

A kernel receives raw pointers, so everything that makes a pointer safe to follow is checked
here, before the call: the dtype (C reads bytes, it cannot tell float32 from float64), the
rank, the alignment, and the layout.  An input declared ``layout="contiguous"`` must be
C-contiguous: a transposed view passed as if it were row-major is the classic custom-op bug
(wrong numbers, no crash), so it is rejected with an error instead.  An input declared
``layout="strided"`` may be any view; its strides are passed (in elements) and the kernel
must use them.  Nothing is copied: C reads the very buffer NumPy owns.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Sequence

import numpy as np

from reference_impl.graph import GraphError

HEADER = "lab_op.h"
C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t"}
LAYOUTS = ("contiguous", "strided")
MESSAGE_BYTES = 512
MAX_DIMS = 8  # LAB_MAX_DIMS in lab_op.h
_DTYPES = {name: np.dtype(name) for name in C_TYPES}
_message = threading.local()  # one message buffer per thread, reused across calls


class InvalidArgumentError(GraphError):
    """An array that the kernel must not see: wrong dtype, rank, alignment or layout."""


class KernelError(GraphError):
    """A kernel returned a non-zero status; the message is the one it wrote."""


class LabTensor(ctypes.Structure):
    """``lab_tensor`` in lab_op.h: data pointer, rank, shape and strides (in elements)."""
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int64),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("strides", ctypes.c_int64 * MAX_DIMS)]


class LabAttr(ctypes.Structure):
    """``lab_attr`` in lab_op.h: an attribute value, in ``i`` (integers) or ``f`` (floats)."""
    _fields_ = [("i", ctypes.c_int64), ("f", ctypes.c_double)]


KERNEL_ARGTYPES = [ctypes.POINTER(LabTensor), ctypes.c_int64, ctypes.POINTER(LabTensor),
                   ctypes.POINTER(LabAttr), ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]


# --8<-- [start:check_array]
def check_array(where: str, x: object, dtype: str, ndim: int | None, layout: str) -> np.ndarray:
    """Raise ``InvalidArgumentError`` (naming ``where``) unless ``x`` is safe to hand to C."""
    if not isinstance(x, np.ndarray):
        raise InvalidArgumentError(f"{where}: expected a NumPy array, got {type(x).__name__}")
    if x.dtype != _DTYPES[dtype]:
        raise InvalidArgumentError(
            f"{where}: dtype {x.dtype} but the kernel reads {dtype} ({C_TYPES[dtype]}); "
            f"C would reinterpret the bytes, so cast first (x.astype({dtype!r}))")
    if ndim is not None and x.ndim != ndim:
        raise InvalidArgumentError(f"{where}: expected rank {ndim}, got shape {x.shape}")
    if x.ndim > MAX_DIMS:
        raise InvalidArgumentError(f"{where}: rank {x.ndim} is over the ABI's limit of {MAX_DIMS} dimensions")
    if not x.flags.aligned:  # NumPy's flag: the address and every stride are multiples of the alignment
        raise InvalidArgumentError(
            f"{where}: buffer at address {x.ctypes.data:#x} (strides {x.strides}) is not aligned to "
            f"its {x.itemsize}-byte elements; copy it (np.array(x)) before the call")
    if any(s % x.itemsize for s in x.strides):
        raise InvalidArgumentError(f"{where}: strides {x.strides} bytes are not whole elements "
                                   f"of {x.itemsize} bytes")
    if layout == "contiguous" and not x.flags.c_contiguous and x.size > 1:
        raise InvalidArgumentError(
            f"{where}: not C-contiguous (shape {x.shape}, strides {x.strides} bytes) and this "
            "kernel indexes it as dense row-major, so it would read the wrong elements; pass "
            "np.ascontiguousarray(x), or declare the input layout='strided' and use its strides in C")
    return x
# --8<-- [end:check_array]


def dtype_name(x: np.ndarray) -> str:
    """``x.dtype.name``, cached (NumPy builds the name string on every access)."""
    name = _NAMES.get(x.dtype)
    if name is None:
        name = _NAMES[x.dtype] = x.dtype.name
    return name


_NAMES: dict[np.dtype, str] = {}


def describe(x: np.ndarray) -> LabTensor:
    """A ``LabTensor`` viewing ``x``'s buffer (no copy): address, rank, shape, strides in elements."""
    t = LabTensor()  # filling the fields one by one is faster than LabTensor(...) with tuples
    t.data, t.ndim, n, size = x.ctypes.data, x.ndim, x.ndim, x.itemsize
    t.shape[:n] = x.shape
    t.strides[:n] = [s // size for s in x.strides]
    return t


def attr_values(values: Sequence[int | float], kinds: Sequence[str]) -> ctypes.Array:
    """The attributes in declaration order, as a C array of ``lab_attr``."""
    out = (LabAttr * max(1, len(values)))()
    for slot, value, kind in zip(out, values, kinds):
        if kind == "int":
            slot.i = int(value)
        else:
            slot.f = float(value)
    return out


# --8<-- [start:call_kernel]
def call_kernel(fn: ctypes._CFuncPtr, op: str, inputs: Sequence[np.ndarray], output: np.ndarray,
                attrs: ctypes.Array, n_attrs: int) -> np.ndarray:
    """Call a checked kernel; a non-zero status becomes ``KernelError`` naming ``op``."""
    c_inputs = (LabTensor * max(1, len(inputs)))(*[describe(x) for x in inputs])
    c_output = describe(output)
    message = getattr(_message, "buffer", None)
    if message is None:
        message = _message.buffer = ctypes.create_string_buffer(MESSAGE_BYTES)
    message[0] = b"\0"
    status = fn(c_inputs, len(inputs), ctypes.byref(c_output), attrs, n_attrs, message, MESSAGE_BYTES)
    if status != 0:
        text = message.value.decode(errors="replace") or "(the kernel wrote no message)"
        raise KernelError(f"custom op {op!r}: kernel returned status {status}: {text}")
    return output
# --8<-- [end:call_kernel]
