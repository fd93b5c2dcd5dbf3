"""The fast path of a call into the generated C: what ``CompiledFunction.fast_call`` is.

NumPy-only: the compiler's targets are NumPy source and C compiled for host memory.

``CompiledFunction.__call__`` checks the feeds in Python and calls ``graph_main`` through
``ctypes`` (``jit.CRunner``). For a small model at batch 1 the compiled code runs for a few
microseconds and that crossing costs about as much again, so ``jit`` (unless ``fast=False`` or
``LAB_JIT_FAST=0``) hands ``CompiledFunction`` a faster callable made here, which returns the
outputs, or ``None`` when it is not sure the feeds are right (then the checked path runs and
names what is wrong). Two kinds, tried in this order:

* ``"entry"``: the library is also a CPython extension (``c_entry``, where Python's headers are)
  whose ``run(*feeds)`` checks the feeds through the buffer protocol and allocates the outputs
  in C;
* ``"ctypes"`` (no headers, or ``jit(..., c_entry=False)``): ``pinned_call``, which looks up a
  *pinned slot* by the feeds' shapes (input and output buffers the runner owns, whose ``ctypes``
  arguments were made once: a call copies the feeds in, calls, returns copies of the outputs),
  and otherwise ``quick_check``s the feeds (a dtype by identity, a shape as one tuple) and makes
  the slot. Feeds larger than ``PINNED_MAX_FLOATS`` skip the slot and go straight to the runner.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Sequence

import numpy as np

from reference_impl.graph import Tensor

from .c_entry import entry_source, load_entry, python_include_dir
from .jit import CRunner, build_c

#: the C runner keeps pinned input/output buffers for a batch size when its feeds and fetches
#: hold at most this many floats together (so small calls skip NumPy's slow pointer lookups) ...
PINNED_MAX_FLOATS = 1 << 16
#: ... for at most this many distinct feed shapes
PINNED_MAX_BATCHES = 8
_F32 = np.dtype(np.float32)


def entry_possible(feeds: list[Tensor]) -> bool:
    """Whether the C entry point can check these feeds (and Python's headers are here)."""
    return python_include_dir() is not None and all(
        t.dtype == "float32" and t.shape is not None and len(t.shape) <= 2 and None not in t.shape[1:] for t in feeds)


def build(source: str, flags: tuple[str, ...], feeds: list[Tensor], fetches: list[Tensor], cache_dir: Any,
          entry_module: str | None) -> tuple[CRunner, Callable, str]:
    """(runner, fast call, its kind: ``"entry"`` or ``"ctypes"``) for ``source``. With ``entry_module`` the library is also that extension
    module and the fast call its ``run``: the whole call in C. If that library does not build or
    import (headers that do not match this interpreter), the graph is built again without it and
    the fast call is ``pinned_call``'s."""
    from reference_impl import toolchain

    if entry_module is not None:
        try:
            path = build_c(source + entry_source(entry_module, [t.shape for t in feeds], [t.shape for t in fetches]),
                           flags + (f"-I{python_include_dir()}",), cache_dir)
            runner = CRunner(toolchain.load_library(path), len(feeds), fetches)
            return runner, load_entry(path, entry_module).run, "entry"
        except (toolchain.CompileError, ImportError):
            pass
    runner = CRunner(toolchain.load_library(build_c(source, flags, cache_dir)), len(feeds), fetches)
    return runner, pinned_call(runner, feeds), "ctypes"


def quick_check(quick: list[tuple[np.dtype, int | None, tuple]], arrays: Sequence[Any]) -> int | None:
    """The batch size if every feed is an ndarray of exactly the expected dtype and shape (``quick``:
    dtype, leading size or None, the other sizes), else None. Comparing a dtype by identity and a
    shape as one tuple costs a fraction of a microsecond, which matters when the compiled code
    itself runs for a few microseconds."""
    if len(arrays) != len(quick):
        return None
    n = None
    for a, (dtype, lead, rest) in zip(arrays, quick):
        if type(a) is not np.ndarray or a.dtype is not dtype or a.shape[1:] != rest or a.ndim == 0:
            return None
        if lead is None:
            if n is not None and a.shape[0] != n:
                return None
            n = a.shape[0]
        elif a.shape[0] != lead:
            return None
    return 1 if n is None else n


def pinned_key(arrays: Sequence[Any]) -> Any:
    """The key of a pinned slot: the one feed's shape, or the tuple of the feeds' shapes."""
    return arrays[0].shape if len(arrays) == 1 else tuple([a.shape for a in arrays])


def pinned_call(runner: CRunner, feeds: list[Tensor]) -> Callable:
    """The ``"ctypes"`` fast call of ``runner``: a pinned slot by the feeds' shapes, else the quick
    check (which makes the slot, or calls the runner directly for feeds too big to pin), else None."""
    specs = [(np.dtype(t.dtype), t.shape) for t in feeds]
    quick = [(dtype, shape[0], tuple(shape[1:])) for dtype, shape in specs
             if shape is not None and len(shape) >= 1 and None not in shape[1:]]
    if len(quick) != len(specs):
        quick = None
    pinned: dict[Any, Callable] = {}  # a key is added only after feeds of those shapes passed quick_check
    lock = threading.Lock()

    def call(*arrays: Any) -> list[np.ndarray] | None:
        try:
            slot = pinned.get(arrays[0].shape if len(arrays) == 1 else pinned_key(arrays))
        except (AttributeError, IndexError):  # not arrays, or none: the checked path names it
            return None
        if slot is not None:
            results = slot(arrays)
            if results is not None:
                return results
        n = None if quick is None else quick_check(quick, arrays)
        if n is None:
            return None
        slot = _pin(runner, pinned, lock, n, arrays)
        results = slot(arrays) if slot is not None else None
        return results if results is not None else runner(n, arrays)  # too big, or another thread

    call.pinned = pinned
    return call


def _pin(runner: CRunner, pinned: dict, lock: threading.Lock, n: int, feeds: Sequence[np.ndarray]) -> Any:
    """The pinned slot for these (checked) feeds, made on first use; None if too big or too many."""
    key = pinned_key(feeds)
    slot = pinned.get(key)
    floats = sum(a.size for a in feeds) + sum(int(np.prod(s)) for s in runner.shapes(n))
    if slot is None and floats <= PINNED_MAX_FLOATS and len(pinned) < PINNED_MAX_BATCHES:
        ins = [np.empty(a.shape, np.float32) for a in feeds]
        outs = [np.empty(s, np.float32) for s in runner.shapes(n)]
        args = (ctypes.c_int64(n),) + tuple(ctypes.c_void_p(a.ctypes.data) for a in ins + outs)
        slot = pinned.setdefault(key, _pinned_slot(runner.fn, ins, outs, args, lock))
    return slot


# --8<-- [start:runner]
def _pinned_slot(fn: Any, ins: list[np.ndarray], outs: list[np.ndarray], args: tuple, lock: threading.Lock) -> Any:
    """A call through buffers owned by the runner: copy the feeds in, call, return copies of the
    outputs (so an array a call returned never changes when a later call runs). ``args`` are the
    ctypes arguments (batch size and buffer addresses), made once. The caller has matched the
    feeds' shapes; the dtype must be float32 itself (``buf[...] = a`` would convert any other).
    ``lock`` guards the buffers; if another thread holds it, or a dtype differs, this returns
    None and the caller takes the checked, unpinned path instead of waiting."""
    if len(ins) == 1 and len(outs) == 1:  # the common case, without loops
        (x,), (y,) = ins, outs

        def call(arrays: Sequence[Any]) -> list[np.ndarray] | None:
            a = arrays[0]
            if getattr(a, "dtype", None) is not _F32 or not lock.acquire(False):
                return None
            try:
                x[...] = a  # any strides: the C code reads the contiguous copy
                if fn(*args) != 0:
                    raise MemoryError("the compiled graph could not allocate its intermediate buffers")
                return [y.copy()]
            finally:
                lock.release()
        return call

    def call_many(arrays: Sequence[Any]) -> list[np.ndarray] | None:
        if any(getattr(a, "dtype", None) is not _F32 for a in arrays) or not lock.acquire(False):
            return None
        try:
            for buf, a in zip(ins, arrays):
                buf[...] = a
            if fn(*args) != 0:
                raise MemoryError("the compiled graph could not allocate its intermediate buffers")
            return [o.copy() for o in outs]
        finally:
            lock.release()
    return call_many
# --8<-- [end:runner]

