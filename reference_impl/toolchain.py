"""The C toolchain: find a compiler, turn C source into a shared library, load it with ctypes.

Custom ops (``reference_impl.custom_ops``) and the C code generator both go through here, so
there is one answer to "which compiler, which flags, where does the ``.so`` live":

* ``find_c_compiler()`` tries ``$CC``, then ``cc``, ``gcc`` and ``clang`` on ``PATH``;
* ``build_shared_library(source, name=...)`` compiles with ``-shared -fPIC`` into a cache
  directory.  The file name holds a hash of (source, flags, compiler identity), so an
  unchanged kernel is never rebuilt and a changed one never loads a stale library.  The
  compiler writes to a private temporary file that is renamed into place (``os.replace`` is
  atomic), so two processes building the same kernel at once never load half a file;
* ``load_library(path)`` is ``ctypes.CDLL`` with an error that says which file failed.

Errors are ``ToolchainError`` (no compiler; the message says what was tried and what to do)
and its subclass ``CompileError`` (the compiler's stderr plus the failing source lines).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

CANDIDATES = ("cc", "gcc", "clang")
COMPILE_TIMEOUT_S = 120


class ToolchainError(RuntimeError):
    """No usable C compiler (or a library that cannot be loaded)."""


class CompileError(ToolchainError):
    """The C compiler rejected the source; ``stderr`` is its message, ``str()`` adds the lines."""

    def __init__(self, name: str, command: Sequence[str], stderr: str, source: str, source_path: str):
        self.name, self.command, self.stderr = name, list(command), stderr
        self.source, self.source_path = source, source_path
        super().__init__(self._format())

    def failing_lines(self) -> list[int]:
        """Line numbers (1-based) of ``source`` that the compiler's messages point at."""
        pattern = re.compile(re.escape(os.path.basename(self.source_path)) + r":(\d+)(?::\d+)?:")
        return sorted({int(m.group(1)) for m in pattern.finditer(self.stderr)})

    def _format(self) -> str:
        lines = self.source.splitlines()
        parts = [f"compiling C library {self.name!r} failed: {shlex.join(self.command)}",
                 self.stderr.rstrip()]
        for n in self.failing_lines():
            if 1 <= n <= len(lines):
                parts.append(f"source line {n}:")
                for i in range(max(1, n - 1), min(len(lines), n + 1) + 1):
                    parts.append(f"{'>' if i == n else ' '} {i:4d} | {lines[i - 1]}")
        return "\n".join(parts)


def find_c_compiler() -> str:
    """The C compiler command: ``$CC`` if set and found, else the first of cc, gcc, clang.

    ``$CC`` may carry arguments (``CC="ccache gcc"``); the program is resolved on ``PATH`` and
    the result is returned as one shell-quoted command string.
    """
    tried = []
    env_cc = os.environ.get("CC", "").strip()
    choices = ([shlex.split(env_cc)] if env_cc else []) + [[c] for c in CANDIDATES]
    for words in choices:
        tried.append(shlex.join(words) + (" ($CC)" if env_cc and words == choices[0] else ""))
        found = shutil.which(words[0])
        if found:
            return shlex.join([found, *words[1:]])
    raise ToolchainError(
        f"no C compiler found: tried {', '.join(tried)} on PATH={os.environ.get('PATH', '')!r}. "
        "Install one (for example `apt install gcc`) or set $CC to a compiler; "
        "without a compiler, use the NumPy target instead of the C one.")


@functools.lru_cache(maxsize=None)
def _compiler_identity(compiler: str) -> str:
    """The compiler's path and ``--version`` banner: part of the cache key, so an upgrade rebuilds."""
    try:
        out = subprocess.run([*shlex.split(compiler), "--version"], capture_output=True, text=True,
                             timeout=30)
        banner = out.stdout.strip().splitlines()[:1]
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"C compiler {compiler!r} does not run: {e}") from None
    return f"{compiler}\n{banner[0] if banner else ''}"


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(d, os.W_OK | os.X_OK)


def default_cache_dir() -> Path:
    """``$LAB_CACHE_DIR``, else ``~/.cache/lab/c``; a temporary folder if neither is writable."""
    if os.environ.get("LAB_CACHE_DIR"):
        choices = [Path(os.environ["LAB_CACHE_DIR"])]
    else:
        choices = []
        try:
            choices.append(Path.home() / ".cache" / "lab" / "c")
        except RuntimeError:  # no HOME and no password-database entry (sandboxes)
            pass
    choices.append(Path(tempfile.gettempdir()) / f"lab-c-{os.getuid()}")
    for d in choices:
        if _writable(d):
            return d
    return Path(tempfile.mkdtemp(prefix="lab-c-"))


def build_shared_library(source: str, *, name: str, flags: Sequence[str] = ("-O2",),
                         cache_dir: Path | None = None) -> Path:
    """Compile C ``source`` into ``<cache>/<name>-<hash>.so`` and return its path.

    The hash covers the source, the flags and the compiler identity; a library already in the
    cache is returned without running the compiler.  Raises ``CompileError`` with the
    compiler's message if the source does not compile.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"library name {name!r} must use only letters, digits, '_', '.' and '-'")
    compiler = find_c_compiler()
    flags = [str(f) for f in flags]
    key = hashlib.sha256("\0".join([source, *flags, _compiler_identity(compiler)]).encode()).hexdigest()[:20]
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}-{key}.so"
    if target.exists():
        return target
    # Private temporary names in the same directory, so the final rename is atomic.
    fd, tmp_src = tempfile.mkstemp(dir=directory, prefix=f".{name}-", suffix=".c")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp_lib = tmp_src[:-2] + ".so.tmp"
    command = [*shlex.split(compiler), *flags, "-shared", "-fPIC", "-o", tmp_lib, tmp_src]
    try:
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ToolchainError(f"compiling {name!r} took over {COMPILE_TIMEOUT_S} s: "
                                 f"{shlex.join(command)}") from None
        if proc.returncode != 0 or not os.path.exists(tmp_lib):
            raise CompileError(name, command, proc.stderr or proc.stdout, source, tmp_src)
        os.replace(tmp_src, target.with_suffix(".c"))  # kept beside the library, for reading
        os.replace(tmp_lib, target)
    finally:
        for leftover in (tmp_src, tmp_lib):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return target


def load_library(path: Path) -> ctypes.CDLL:
    """Load a shared library with ``ctypes``; a failure names the file and the loader's reason."""
    try:
        return ctypes.CDLL(str(Path(path).resolve()))
    except OSError as e:
        raise ToolchainError(f"cannot load shared library {path}: {e}") from None
