"""The C toolchain: compiler discovery, cached atomic builds, compile errors with lines."""
import ctypes
import os
import threading

import pytest

from reference_impl import toolchain
from reference_impl.toolchain import (CompileError, ToolchainError, build_shared_library,
                                      find_c_compiler, load_library)

pytestmark = pytest.mark.timeout(120)

ADD = "int add(int a, int b) { return a + b + OFFSET; }\n"


def _has_compiler() -> bool:
    try:
        find_c_compiler()
        return True
    except ToolchainError:
        return False


needs_cc = pytest.mark.skipif(not _has_compiler(), reason="no C compiler on this machine")


def test_no_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ToolchainError) as e:
        find_c_compiler()
    msg = str(e.value)
    assert "no-such-compiler-xyz ($CC)" in msg and "gcc" in msg and "clang" in msg
    assert "apt install gcc" in msg and "NumPy" in msg
    with pytest.raises(ToolchainError):
        build_shared_library(ADD, name="add")


@needs_cc
def test_cc_env_wins_and_may_carry_arguments(monkeypatch, tmp_path):
    real = find_c_compiler().split()[0]
    monkeypatch.setenv("CC", f"{real} -DOFFSET=100")
    assert find_c_compiler() == f"{real} -DOFFSET=100"
    lib = load_library(build_shared_library(ADD, name="add", cache_dir=tmp_path))
    assert lib.add(1, 2) == 103


@needs_cc
def test_build_is_cached_by_content_hash(tmp_path):
    a = build_shared_library(ADD, name="add", flags=("-O2", "-DOFFSET=1"), cache_dir=tmp_path)
    mtime = a.stat().st_mtime_ns
    assert build_shared_library(ADD, name="add", flags=("-O2", "-DOFFSET=1"), cache_dir=tmp_path) == a
    assert a.stat().st_mtime_ns == mtime  # not rebuilt
    b = build_shared_library(ADD, name="add", flags=("-O2", "-DOFFSET=2"), cache_dir=tmp_path)
    c = build_shared_library(ADD.replace("a + b", "a - b"), name="add", flags=("-O2", "-DOFFSET=1"),
                             cache_dir=tmp_path)
    assert len({a, b, c}) == 3
    assert load_library(a).add(5, 3) == 9 and load_library(b).add(5, 3) == 10
    assert load_library(c).add(5, 3) == 3
    assert a.with_suffix(".c").read_text() == ADD
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary leftovers


@needs_cc
def test_concurrent_builders_all_load_a_complete_library(tmp_path):
    src = "double twice(double x) { return 2 * x; }\n"
    src += "".join(f"int pad_{i}(void) {{ return {i}; }}\n" for i in range(120))
    results, errors = [], []

    def build():
        try:
            lib = load_library(build_shared_library(src, name="twice", cache_dir=tmp_path))
            lib.twice.restype, lib.twice.argtypes = ctypes.c_double, [ctypes.c_double]
            results.append((lib.twice(21.0), lib.pad_119()))
        except Exception as e:  # noqa: BLE001 - collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and results == [(42.0, 119)] * 4
    assert len(list(tmp_path.glob("twice-*.so"))) == 1


@needs_cc
def test_compile_error_shows_message_and_failing_line(tmp_path):
    src = "int ok(void) { return 1; }\n\nint broken(int x) {\n    return x +* ;\n}\n"
    with pytest.raises(CompileError) as e:
        build_shared_library(src, name="broken", cache_dir=tmp_path)
    err = e.value
    assert 4 in err.failing_lines()
    assert "error" in err.stderr
    assert ">    4 |     return x +* ;" in str(err)
    assert isinstance(err, ToolchainError)
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_bad_library_name_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="library name"):
        build_shared_library(ADD, name="../evil")
    with pytest.raises(ToolchainError, match="cannot load shared library"):
        load_library(tmp_path / "missing.so")


def test_default_cache_dir_env_and_fallback(monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    assert toolchain.default_cache_dir() == tmp_path / "cache"
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("LAB_CACHE_DIR", str(blocked / "sub"))
    fallback = toolchain.default_cache_dir()
    assert fallback != blocked / "sub" and os.access(fallback, os.W_OK)
    monkeypatch.delenv("LAB_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert toolchain.default_cache_dir() == tmp_path / "home" / ".cache" / "lab" / "c"
