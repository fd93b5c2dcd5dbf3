"""``jit``: freeze a session's graph, optimise it for inference, generate code, return a callable.

    f = jit(sess, [logits], [x], target="c")
    (y,) = f(batch)               # same values as sess.run([logits], {x: batch})
    print(f.source)               # the generated C (or NumPy) source
    print(f.report)               # (pass, ops before, ops after) for every pass

The pipeline: ``freeze`` (variables → constants holding the session's current values),
then constant folding, algebraic simplification, common-subexpression elimination,
dead-code elimination and elementwise fusion, then code generation for ``target``:

* ``"numpy"``: straight-line NumPy source (``numpy_codegen``), run with ``exec``;
* ``"c"``: C source with the weights compiled in (``c_codegen``), built into a shared library
  by ``reference_impl.toolchain``, and called through an entry point written in C (``c_entry``,
  where Python's headers are) or else through ``ctypes`` with pinned buffers (``_CRunner``).

Compiled functions are cached by a content hash of the generated source, which contains
the whole optimised graph and (for C) every weight, plus (for NumPy) the weight arrays the
source refers to: the same graph with the same weights
is generated and compiled once per process (and once per machine for the ``.so``). Every call
checks each feed's dtype, rank and sizes *before* the graph's compiled code runs (in the C
entry point, which passes anything unexpected back to the Python check), so a wrong input
is a Python exception, never a crash inside C.
"""
from __future__ import annotations

import ctypes
import hashlib
import platform
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from reference_impl.graph import (Graph, GraphError, Session, Tensor, common_subexpression_elimination,
                                  constant_folding, dead_node_removal, optimize)

from .c_codegen import generate_c
from .c_entry import entry_source, load_entry, python_include_dir
from .freeze import freeze
from .fusion import elementwise_fusion
from .numpy_codegen import generate_numpy
from .simplify import algebraic_simplification

# --8<-- [start:pipeline]
INFERENCE_PASSES = [
    ("constant_folding", constant_folding),
    ("algebraic_simplification", algebraic_simplification),
    ("common_subexpression_elimination", common_subexpression_elimination),
    ("dead_code_elimination", dead_node_removal),
    ("elementwise_fusion", elementwise_fusion),
]


def optimize_for_inference(session: Session, fetches: Sequence[Tensor],
                           fuse: bool = True) -> tuple[Graph, list[tuple[str, int, int]]]:
    """The frozen, optimised graph for ``fetches`` and (pass, ops before, ops after) per pass."""
    keep = sorted({t.op.name for t in fetches})
    frozen = freeze(session, keep)
    passes = INFERENCE_PASSES if fuse else INFERENCE_PASSES[:-1]
    graph, report = optimize(frozen, keep, passes)
    return graph, [("freeze", len(session.graph), len(frozen))] + report
# --8<-- [end:pipeline]


TARGETS = ("c", "numpy")
#: -march=native: the JIT compiles on the machine that runs the code (the host CPU is in the
#: cache key, see ``host_cpu``); 512-bit vectors where the CPU has them (GCC and Clang default
#: to 256-bit ones), which read a packed weight panel in half as many loads.
C_FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512")
#: unrolled sparse code is straight-line: -O3's loop optimisations have nothing to do in it and
#: the compile time of such long functions grows quickly with the optimisation level.
C_FLAGS_UNROLLED = ("-O1", "-march=native")

_CACHE: dict[str, Any] = {}  # content hash -> the loaded run function


class CompiledFunction:
    """A generated function: call it with the feed arrays in order; it returns the fetched arrays."""

    def __init__(self, target: str, source: str, key: str, run: Any, graph: Graph, feeds: list[Tensor],
                 fetches: list[Tensor], report: list, formats: dict[str, str], single: bool) -> None:
        self.target, self.source, self.graph, self.report, self.formats = target, source, graph, report, formats
        self.key = key
        self._run, self._single = run, single
        self.feed_specs = [(t.name, t.shape, np.dtype(t.dtype)) for t in feeds]
        self.fetch_specs = [(t.name, t.shape, t.dtype) for t in fetches]
        # the fast check (``_quick_check``) handles feeds whose only unknown dimension is the
        # leading one: (dtype, leading size or None, the other sizes as a tuple) per feed
        quick = [(dtype, shape[0], tuple(shape[1:])) for _, shape, dtype in self.feed_specs
                 if shape is not None and len(shape) >= 1 and None not in shape[1:]]
        self._quick = quick if len(quick) == len(self.feed_specs) else None
        # the C runner's pinned calls by the feeds' shapes (``pinned_key``): a key is added only
        # after feeds of those shapes passed ``_check``, so a hit leaves only the dtype to check
        self._pinned: dict = getattr(run, "pinned", {})
        self._entry = getattr(run, "entry", None)  # the C entry point's run(*feeds), if built

    def _check(self, arrays: Sequence[Any]) -> tuple[list[np.ndarray], int]:
        """The feeds as contiguous arrays, and the batch size ``n`` (the unknown dimension)."""
        if len(arrays) != len(self.feed_specs):
            raise TypeError(f"expected {len(self.feed_specs)} feed arrays "
                            f"({', '.join(n for n, _, _ in self.feed_specs)}), got {len(arrays)}")
        out, n = [], None
        for a, (name, shape, dtype) in zip(arrays, self.feed_specs):
            if not isinstance(a, np.ndarray):
                a = np.asarray(a)
            if a.dtype != dtype:  # a dtype object: comparing names costs microseconds per call
                raise TypeError(f"feed {name} must be {dtype}, got {a.dtype}")
            if shape is not None:
                if a.ndim != len(shape):
                    raise ValueError(f"feed {name} must have rank {len(shape)} (shape {shape}), got shape {a.shape}")
                for want, got in zip(shape, a.shape):
                    if want is None:
                        if n is not None and got != n:
                            raise ValueError(f"feed {name} has batch size {got}, another feed has {n}")
                        n = got
                    elif want != got:
                        raise ValueError(f"feed {name} must have shape {shape}, got {a.shape}")
            out.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
        return out, 1 if n is None else n

    def _quick_check(self, arrays: Sequence[Any]) -> int | None:
        """The batch size if every feed is an ndarray of exactly the expected dtype and shape,
        else None (then ``_check`` converts what it can and names what is wrong). Comparing a
        dtype by identity and a shape as one tuple costs a fraction of a microsecond, which
        matters when the compiled code itself runs for a few microseconds."""
        if self._quick is None or len(arrays) != len(self._quick):
            return None
        n = None
        for a, (dtype, lead, rest) in zip(arrays, self._quick):
            if type(a) is not np.ndarray or a.dtype is not dtype or a.shape[1:] != rest or a.ndim == 0:
                return None
            if lead is None:
                if n is not None and a.shape[0] != n:
                    return None
                n = a.shape[0]
            elif a.shape[0] != lead:
                return None
        return 1 if n is None else n

    # --8<-- [start:call]
    def __call__(self, *arrays: Any) -> Any:
        if self._entry is not None:  # C target with its entry point in C (``c_entry``)
            results = self._entry(*arrays)
            if results is not None:
                return results[0] if self._single else results
        pinned = self._pinned
        if pinned:  # C target through ctypes: feeds of the same shapes as an earlier checked call?
            try:
                slot = pinned.get(arrays[0].shape if len(arrays) == 1 else pinned_key(arrays))
            except (AttributeError, IndexError):  # not arrays, or none: the full check names it
                slot = None
            if slot is not None:
                results = slot(arrays)
                if results is not None:
                    return results[0] if self._single else results
        n = self._quick_check(arrays)
        if n is not None:  # checked; contiguity is the runner's business (it copies or asks)
            feeds: Any = arrays
        else:
            feeds, n = self._check(arrays)
        results = self._run(n, feeds)
        return results[0] if self._single else list(results)
    # --8<-- [end:call]

    def __repr__(self) -> str:
        return f"<CompiledFunction target={self.target} key={self.key[:12]}>"


def content_hash(target: str, source: str, constants: dict[str, Any]) -> str:
    """The cache key: the generated source (C inlines the weights) plus any arrays kept beside it."""
    h = hashlib.sha256(f"{target}\0{source}".encode())
    for name in sorted(constants):
        value = constants[name]
        if isinstance(value, np.ndarray):
            h.update(f"\0{name}\0{value.dtype.str}\0{value.shape}\0".encode())
            h.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, dict):
            h.update(f"\0{name}\0{sorted(value.items())!r}".encode())
    return h.hexdigest()


def _numpy_runner(source: str, namespace: dict) -> Any:
    exec(compile(source, "<jit numpy>", "exec"), namespace)
    fn = namespace["run"]
    return lambda n, feeds: fn(*feeds)


#: the C runner keeps pinned input/output buffers for a batch size when its feeds and fetches
#: hold at most this many floats together (so small calls skip NumPy's slow pointer lookups) ...
PINNED_MAX_FLOATS = 1 << 16
#: ... for at most this many distinct feed shapes
PINNED_MAX_BATCHES = 8
_F32 = np.dtype(np.float32)


def host_cpu() -> str:
    """This machine's architecture and CPU model: ``-march=native`` code is built for it, so it is
    part of the cache key of a C library (a cache directory shared between machines must not
    hand a library built for one CPU to another)."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))]
        model = "; ".join(sorted(set(lines)))
    except OSError:
        pass
    return f"{platform.machine()} {model}"


# --8<-- [start:runner]
def _pinned_call(fn: Any, ins: list[np.ndarray], outs: list[np.ndarray], args: tuple, lock: threading.Lock) -> Any:
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


def pinned_key(arrays: Sequence[Any]) -> Any:
    """The key of a pinned slot: the one feed's shape, or the tuple of the feeds' shapes."""
    return arrays[0].shape if len(arrays) == 1 else tuple([a.shape for a in arrays])


class _CRunner:
    """The Python side of a compiled graph: ``runner(n, feeds)`` calls ``graph_main`` and returns
    the fetched arrays, always freshly allocated (a later call never overwrites them).

    Crossing from Python into C costs a good part of the C code's time for a small model, so
    the common case is made cheap: for feeds of at most ``PINNED_MAX_FLOATS`` the first checked
    call creates a pinned slot (``_pinned_call``) keyed by the feeds' shapes, whose ctypes
    arguments are made once and which ``CompiledFunction.__call__`` looks up before any other
    work. Larger batches pass the callers' arrays (made contiguous) and new outputs directly."""

    def __init__(self, lib: ctypes.CDLL, n_feeds: int, fetches: list[Tensor]) -> None:
        self.library = lib  # keeps the library loaded as long as the runner lives
        self._fn = lib.graph_main
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * (n_feeds + len(fetches))
        self._out_shapes = [t.shape for t in fetches]
        self.pinned: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def shapes(self, n: int) -> list[tuple[int, ...]]:
        return [tuple(n if d is None else d for d in s) for s in self._out_shapes]

    def _pin(self, n: int, feeds: Sequence[np.ndarray]) -> Any:
        """The pinned slot for these (checked) feeds, made on first use; None if too big."""
        key = pinned_key(feeds)
        slot = self.pinned.get(key)
        floats = sum(a.size for a in feeds) + sum(int(np.prod(s)) for s in self.shapes(n))
        if slot is None and floats <= PINNED_MAX_FLOATS and len(self.pinned) < PINNED_MAX_BATCHES:
            ins = [np.empty(a.shape, np.float32) for a in feeds]
            outs = [np.empty(s, np.float32) for s in self.shapes(n)]
            args = (ctypes.c_int64(n),) + tuple(ctypes.c_void_p(a.ctypes.data) for a in ins + outs)
            slot = self.pinned.setdefault(key, _pinned_call(self._fn, ins, outs, args, self._lock))
        return slot

    def __call__(self, n: int, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        slot = self._pin(n, feeds)
        results = slot(feeds) if slot is not None else None
        if results is None:  # too big to pin, or another thread is using the pinned buffers
            feeds = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in feeds]
            results = [np.empty(s, dtype=np.float32) for s in self.shapes(n)]
            args = [ctypes.c_void_p(a.ctypes.data) for a in list(feeds) + results]
            if self._fn(ctypes.c_int64(n), *args) != 0:
                raise MemoryError("the compiled graph could not allocate its intermediate buffers")
        return results


def _c_runner(source: str, flags: tuple[str, ...], feeds: list[Tensor], fetches: list[Tensor], cache_dir: Any,
              entry_module: str | None) -> _CRunner:
    """Build (or find in the cache) the library for ``source`` and wrap it in a ``_CRunner``.

    With ``entry_module`` (where this Python has its headers, see ``c_entry``) the library is
    also that extension module, and ``runner.entry`` its ``run``: the whole call in C. If that
    library does not build or import (headers that do not match this interpreter), the graph
    is built again without it and called through ``ctypes``."""
    from reference_impl import toolchain  # noqa: PLC0415

    def build(code: str, options: tuple[str, ...]) -> Path:
        tag = f"/* built with {' '.join(options)} for {hashlib.sha256(host_cpu().encode()).hexdigest()[:16]} */\n"
        return toolchain.build_shared_library(tag + code, name="jit", flags=options, cache_dir=cache_dir)

    if entry_module is not None:
        try:
            path = build(source + entry_source(entry_module, [t.shape for t in feeds], [t.shape for t in fetches]),
                         flags + (f"-I{python_include_dir()}",))
            runner = _CRunner(toolchain.load_library(path), len(feeds), fetches)
            runner.entry = load_entry(path, entry_module).run
            return runner
        except (toolchain.CompileError, ImportError):
            pass
    runner = _CRunner(toolchain.load_library(build(source, flags)), len(feeds), fetches)
    runner.entry = None
    return runner


def jit(session: Session, fetches: Any, feeds: Sequence[Tensor], target: str = "c", *, matmul_format: str = "auto",
        fuse: bool = True, cache_dir: Any = None, c_entry: bool = True) -> CompiledFunction:
    """Compile ``fetches`` of ``session.graph`` with the variables' current values inlined.

    ``fetches`` is a tensor (the call returns one array) or a list of tensors (a list);
    ``feeds`` the placeholders, in the order the call takes their arrays. ``matmul_format``
    forces the C kernel form of constant-weight MatMuls (see ``c_codegen``). ``c_entry``: call
    the C code through an entry point written in C where Python's headers are (``c_entry``);
    False, or no headers: through ``ctypes`` (``_CRunner``). Raises
    ``UnsupportedOpError`` (C target, an op it cannot emit), ``ToolchainError`` (no compiler;
    the NumPy target needs none) or ``GraphError`` (a needed placeholder is not fed).
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    single = isinstance(fetches, Tensor)
    fetch_list = [fetches] if single else list(fetches)
    for t in list(fetch_list) + list(feeds):
        if not isinstance(t, Tensor) or t.graph is not session.graph:
            raise GraphError(f"jit: {t!r} is not a tensor of this session's graph")
    for t in feeds:
        if t.op.type != "Placeholder":
            raise GraphError(f"jit: feeds must be placeholders, {t.name} is a {t.op.type}")
    graph, report = optimize_for_inference(session, fetch_list, fuse=fuse)
    feed_names = [t.op.name for t in feeds]
    fetch_names = [t.name for t in fetch_list]
    if target == "numpy":
        source, namespace = generate_numpy(graph, feed_names, fetch_names)
        formats: dict[str, str] = {}
    else:
        from reference_impl.toolchain import default_cache_dir, find_c_compiler  # noqa: PLC0415

        find_c_compiler()  # no compiler: fail now, with the message that suggests target="numpy"
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        cache_dir.mkdir(parents=True, exist_ok=True)  # large weights are written there first
        source, formats = generate_c(graph, feed_names, fetch_names, matmul_format, blob_dir=cache_dir)
    key = content_hash(target, source, namespace if target == "numpy" else {})
    entry = target == "c" and c_entry and python_include_dir() is not None and all(  # feeds it can check
        t.dtype == "float32" and t.shape is not None and len(t.shape) <= 2 and None not in t.shape[1:] for t in feeds)
    runner_key = key + ("+entry" if entry else "")
    if runner_key not in _CACHE:
        if target == "numpy":
            _CACHE[runner_key] = _numpy_runner(source, namespace)
        else:
            flags = C_FLAGS_UNROLLED if "unrolled" in formats.values() else C_FLAGS
            fetched = [graph.get_tensor_by_name(f) for f in fetch_names]
            _CACHE[runner_key] = _c_runner(source, flags, list(feeds), fetched, cache_dir,
                                           f"jit_entry_{key[:20]}" if entry else None)
    return CompiledFunction(target, source, key, _CACHE[runner_key], graph, list(feeds), fetch_list, report, formats,
                            single)
