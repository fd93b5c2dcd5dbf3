"""``jit``: freeze a session's graph, optimise it for inference, generate code, return a callable.

NumPy-only: the compiler's targets are NumPy source and C compiled for host memory.

    f = jit(sess, [logits], [x], target="c")
    (y,) = f(batch)               # same values as sess.run([logits], {x: batch})
    print(f.source)               # the generated C (or NumPy) source
    print(f.report)               # (pass, ops before, ops after) for every pass

The idea, in the order this module reads:

1. **freeze**: variables → constants holding the session's current values (``freeze``);
2. **optimise**: constant folding, algebraic simplification, common-subexpression
   elimination, dead-code elimination and elementwise fusion (``optimize_for_inference``);
3. **generate**: straight-line NumPy source (``numpy_codegen``, run with ``exec``) or C with the
   weights compiled in (``c_codegen``, built into a shared library by ``reference_impl.toolchain``);
4. **call**: ``CompiledFunction`` checks each feed's dtype, rank and sizes, then calls the
   generated function, so a wrong input is a Python exception, never a crash inside C.

Compiled functions are cached by a content hash of the generated source, which contains
the whole optimised graph and (for C) every weight, plus (for NumPy) the weight arrays the
source refers to: the same graph with the same weights is generated and compiled once per
process (and once per machine for the ``.so``).

**The fast path** (the default for ``target="c"``) changes how steps 3 and 4 are done, not
what they compute: ``fast_kernels`` emits matmul kernels tuned for the CPU (packed panels,
batched CSR, the AVX-512 bitmask form) and ``fast_call`` makes the call cheap (the crossing
written in C, ``c_entry``, or pinned ``ctypes`` buffers and a check by identity). Switch back to
the plain kernels and the plain call with ``jit(..., fast=False)`` or ``LAB_JIT_FAST=0`` in the
environment (the argument wins over the variable); both paths give the same outputs to float
rounding, and the deploy benchmark times both.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from reference_impl.backend import require_numpy
from reference_impl.graph import (Graph, GraphError, Session, Tensor, common_subexpression_elimination,
                                  constant_folding, dead_node_removal, optimize)

from .c_codegen import generate_c
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
#: the plain path's compiler flags: -march=native, as the JIT compiles on the machine that runs
#: the code (the host CPU is in the cache key, see ``host_cpu``); ``fast_kernels.FAST_C_FLAGS``
#: adds a preference for 512-bit vectors
C_FLAGS = ("-O3", "-march=native")
#: unrolled sparse code is straight-line: -O3's loop optimisations have nothing to do in it and
#: the compile time of such long functions grows quickly with the optimisation level.
C_FLAGS_UNROLLED = ("-O1", "-march=native")
#: the environment variable that turns the fast path off (``0``, ``false``, ``no`` or ``off``)
FAST_ENV = "LAB_JIT_FAST"

_CACHE: dict[str, tuple[Any, Any, str]] = {}  # content hash + path -> (run function, fast call or None, path)


def jit(session: Session, fetches: Any, feeds: Sequence[Tensor], target: str = "c", *, matmul_format: str = "auto",
        fuse: bool = True, cache_dir: Any = None, fast: bool | None = None, c_entry: bool = True) -> CompiledFunction:
    """Compile ``fetches`` of ``session.graph`` with the variables' current values inlined.

    ``fetches`` is a tensor (the call returns one array) or a list of tensors (a list);
    ``feeds`` the placeholders, in the order the call takes their arrays. ``matmul_format``
    forces the C kernel form of constant-weight MatMuls (see ``c_codegen``). ``fast`` (C target):
    True, the default, uses ``fast_kernels`` and ``fast_call``; False the plain emitters and a
    plain checked ``ctypes`` call; None reads ``LAB_JIT_FAST`` (``0`` turns it off). ``c_entry``
    (fast path): call the C code through an entry point written in C where Python's headers are
    (``c_entry``); False, or no headers: through ``ctypes`` with pinned buffers. Raises
    ``UnsupportedOpError`` (C target, an op it cannot emit), ``ToolchainError`` (no compiler;
    the NumPy target needs none) or ``GraphError`` (a needed placeholder is not fed).
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    fast = fast_path_enabled(fast)
    single = isinstance(fetches, Tensor)
    fetch_list = [fetches] if single else list(fetches)
    for t in list(fetch_list) + list(feeds):
        if not isinstance(t, Tensor) or t.graph is not session.graph:
            raise GraphError(f"jit: {t!r} is not a tensor of this session's graph")
    for t in feeds:
        if t.op.type != "Placeholder":
            raise GraphError(f"jit: feeds must be placeholders, {t.name} is a {t.op.type}")
    # 1-2. freeze and optimise
    graph, report = optimize_for_inference(session, fetch_list, fuse=fuse)
    feed_names, fetch_names = [t.op.name for t in feeds], [t.name for t in fetch_list]
    # 3. generate (and, for C, build)
    if target == "numpy":
        source, namespace = generate_numpy(graph, feed_names, fetch_names)
        formats: dict[str, str] = {}
        key = content_hash(target, source, namespace)
        if key not in _CACHE:
            _CACHE[key] = (_numpy_runner(source, namespace), None, "numpy")
        run, fast_call, path = _CACHE[key]
    else:
        from reference_impl.toolchain import default_cache_dir, find_c_compiler

        find_c_compiler()  # no compiler: fail now, with the message that suggests target="numpy"
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        cache_dir.mkdir(parents=True, exist_ok=True)  # large weights are written there first
        source, formats = generate_c(graph, feed_names, fetch_names, matmul_format, blob_dir=cache_dir, fast=fast)
        key = content_hash(target, source, {})
        fetched = [graph.get_tensor_by_name(f) for f in fetch_names]
        run, fast_call, path = _c_function(source, key, formats, list(feeds), fetched, cache_dir, fast, c_entry)
    # 4. wrap it in the checked call
    return CompiledFunction(target, source, key, run, graph, list(feeds), fetch_list, report, formats, single,
                            fast_call, path)


def fast_path_enabled(fast: bool | None) -> bool:
    """``fast`` if given, else False only when ``LAB_JIT_FAST`` says 0/false/no/off."""
    if fast is not None:
        return bool(fast)
    return os.environ.get(FAST_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class CompiledFunction:
    """A generated function: call it with the feed arrays in order; it returns the fetched arrays.

    ``call_path`` says how a call reaches the code: ``"numpy"``, ``"plain"`` (``_check``, then
    ``ctypes``), or on the fast path ``"entry"`` (the C entry point) or ``"ctypes"`` (pinned slots)."""

    def __init__(self, target: str, source: str, key: str, run: Any, graph: Graph, feeds: list[Tensor],
                 fetches: list[Tensor], report: list, formats: dict[str, str], single: bool,
                 fast_call: Any = None, call_path: str = "plain") -> None:
        self.target, self.source, self.graph, self.report, self.formats = target, source, graph, report, formats
        self.key = key
        self._run, self._single, self.fast_call = run, single, fast_call
        self.call_path = call_path
        self.feed_specs = [(t.name, t.shape, np.dtype(t.dtype)) for t in feeds]
        self.fetch_specs = [(t.name, t.shape, t.dtype) for t in fetches]

    # --8<-- [start:call]
    def __call__(self, *arrays: Any) -> Any:
        if self.fast_call is not None:  # fast_call.py: the same checks, in C or by identity
            results = self.fast_call(*arrays)
            if results is not None:  # None: not sure, so take the checked path below
                return results[0] if self._single else results
        feeds, n = self._check(arrays)
        results = self._run(n, feeds)
        return results[0] if self._single else list(results)
    # --8<-- [end:call]

    def _check(self, arrays: Sequence[Any]) -> tuple[list[np.ndarray], int]:
        """The feeds as contiguous arrays, and the batch size ``n`` (the unknown dimension)."""
        if len(arrays) != len(self.feed_specs):
            raise TypeError(f"expected {len(self.feed_specs)} feed arrays "
                            f"({', '.join(n for n, _, _ in self.feed_specs)}), got {len(arrays)}")
        require_numpy("reference_impl.compiler (a compiled function: NumPy source or C)", *arrays)
        out, n = [], None
        for a, (name, shape, dtype) in zip(arrays, self.feed_specs):
            a = np.asarray(a)
            if a.dtype != dtype:
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

    def __repr__(self) -> str:
        return f"<CompiledFunction target={self.target} key={self.key[:12]} call={self.call_path}>"


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


# ---------------------------------------------------------------- the C library and its call
class CRunner:
    """``runner(n, feeds)`` calls ``graph_main`` with the (checked) feeds and new output arrays, so
    a later call never overwrites what an earlier one returned."""

    def __init__(self, lib: ctypes.CDLL, n_feeds: int, fetches: list[Tensor]) -> None:
        self.library = lib  # keeps the library loaded as long as the runner lives
        self.fn = lib.graph_main
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * (n_feeds + len(fetches))
        self.out_shapes = [t.shape for t in fetches]

    def shapes(self, n: int) -> list[tuple[int, ...]]:
        return [tuple(n if d is None else d for d in s) for s in self.out_shapes]

    def __call__(self, n: int, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in feeds]
        results = [np.empty(s, dtype=np.float32) for s in self.shapes(n)]
        args = [ctypes.c_void_p(a.ctypes.data) for a in feeds + results]
        if self.fn(ctypes.c_int64(n), *args) != 0:
            raise MemoryError("the compiled graph could not allocate its intermediate buffers")
        return results


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


def build_c(source: str, flags: tuple[str, ...], cache_dir: Any) -> Path:
    """The shared library of ``source`` for this CPU (built once, then found in the cache)."""
    from reference_impl import toolchain

    tag = f"/* built with {' '.join(flags)} for {hashlib.sha256(host_cpu().encode()).hexdigest()[:16]} */\n"
    return toolchain.build_shared_library(tag + source, name="jit", flags=flags, cache_dir=cache_dir)


def _c_function(source: str, key: str, formats: dict[str, str], feeds: list[Tensor], fetches: list[Tensor],
                cache_dir: Path, fast: bool, c_entry: bool) -> tuple[Any, Any, str]:
    """(runner, fast call or None, call path) for the C ``source``, built once per process and path."""
    from reference_impl import toolchain

    if not fast:
        flags = C_FLAGS_UNROLLED if "unrolled" in formats.values() else C_FLAGS
        if key + "+plain" not in _CACHE:
            _CACHE[key + "+plain"] = (CRunner(toolchain.load_library(build_c(source, flags, cache_dir)),
                                              len(feeds), fetches), None, "plain")
        return _CACHE[key + "+plain"]
    from . import fast_call  # fast_call builds on this module
    from .fast_kernels import FAST_C_FLAGS

    flags = C_FLAGS_UNROLLED if "unrolled" in formats.values() else FAST_C_FLAGS
    entry = c_entry and fast_call.entry_possible(feeds)
    runner_key = key + ("+entry" if entry else "+fast")
    if runner_key not in _CACHE:
        _CACHE[runner_key] = fast_call.build(source, flags, feeds, fetches, cache_dir,
                                             f"jit_entry_{key[:20]}" if entry else None)
    return _CACHE[runner_key]
