"""The guard around every test cell: a test counts only if it ran to its end, untampered.

nbgrader scores a test cell by looking for an error in its output. A learner's earlier cell
can defeat that from inside the kernel: hide errors (replace IPython's ``showtraceback``),
make checks always succeed (replace ``numpy.array_equal`` or a test helper, or swap a
``reference_impl`` function for their own so that the test compares their code with
itself), or make their function simply call the reference implementation. The guard closes
those holes, in two halves:

* grader side (``instrument``, ``read_verdicts``): before the course is generated, each
  test cell of the scratch copy gets one line before its code (``begin``) and one after it
  (``end``). ``end`` prints ``lab-guard <token> <test> ok``, where the token is a secret
  fresh for every grading run: the learner's cells run before the test cells and cannot
  know it. After autograding, a test counts as passed only if nbgrader scored it *and* its
  cell printed that line, so a test that did not run to its end, with or without a visible
  error, scores zero. The lines are then removed from the notebook the learner gets back.
* kernel side (``begin``, ``end``): ``begin`` refuses to run the test (raises
  ``TamperedError``, whose message becomes the test's hint) when the notebook has replaced
  the traceback display, a builtin, a NumPy checking function, a ``reference_impl``
  function, or a helper defined in a locked cell; it then watches calls into the
  reference while the test runs (``_CallWatch``). ``end`` refuses the credit when the learner's code called the very reference
  function the test compares it with.

This is a tripwire against the known tricks, not a proof: code in the kernel can in
principle find and rewrite the guard itself. The kernel's walls (``grader.jail``) keep the
secret token, the gradebook and the hidden tests out of its reach.
"""
from __future__ import annotations

import ast
import builtins
import functools
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

MARK = "lab-guard"
REFERENCE_DIR = str(Path(__file__).resolve().parent.parent / "reference_impl")
GRADER_DIR = str(Path(__file__).resolve().parent)
# Python's own folders, also as real paths: a venv reached through a symbolic link gives code
# file names under the link while ``numpy.__file__`` resolves to the target, and both are Python's.
INSTALLED = tuple(dict.fromkeys(p for prefix in (sys.prefix, sys.base_prefix)
                                for p in (prefix, os.path.realpath(prefix))))
_PROTECTED_BUILTINS = ("print", "open", "isinstance", "len", "sum", "sorted", "all", "any", "abs",
                       "min", "max", "range", "zip", "tuple", "list", "dict", "set", "exec",
                       "compile", "__import__", "repr", "str", "int", "float", "bool", "type", "globals")
_NUMPY_CHECKS = ("array_equal", "allclose", "isclose", "asarray", "array", "dtype")


class TamperedError(AssertionError):
    """The notebook changed something the tests rely on; the test is refused."""


# --------------------------------------------------------------------------- grader side


def solution_names(cells: list[dict[str, Any]]) -> tuple[str, ...]:
    """Names of the functions and classes the learner writes (top level of solution cells)."""
    names = []
    for cell in cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("solution"):
            names += _defined(_source(cell))
    return tuple(names)


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _defined(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def _helper_sources(cells: list[dict[str, Any]]) -> dict[str, str]:
    """The tests' own functions, which later cells must not redefine: name -> source.

    Functions defined in locked cells that are neither tests nor solutions, and functions a
    test cell defines for the tests after it (a hidden helper written once, in the first
    hidden test that needs it). A name that test cells define differently is each cell's own
    business and is left out, as are the learner's solution names."""
    helpers: dict[str, str] = {}
    conflicting: set[str] = set()
    for cell in cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or meta.get("solution"):
            continue
        if not (meta.get("grade") or meta.get("locked")):
            continue
        source = _source(cell)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                text = ast.get_source_segment(source, node) or ""
                if helpers.get(node.name, text) != text:
                    conflicting.add(node.name)
                helpers[node.name] = text
    return {name: text for name, text in helpers.items() if name not in conflicting}


def instrument(notebook: dict[str, Any], token: str) -> dict[str, Any]:
    """A copy of the source ``notebook`` whose test cells are wrapped by ``begin``/``end``."""
    cells = [dict(c) for c in notebook.get("cells", [])]
    learner = solution_names(cells)
    helpers = {name: text for name, text in _helper_sources(cells).items() if name not in learner}
    for cell in cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        test = meta["grade_id"]
        begin = (f"import grader.guard as _lab_guard; "
                 f"_lab_guard.begin({test!r}, {learner!r}, {helpers!r}, globals())\n")
        end = f"\n_lab_guard.end({test!r}, {token!r}, globals())"
        cell["source"] = begin + _source(cell).rstrip("\n") + end
    return {**notebook, "cells": cells}


def strip_guard_lines(source: str) -> str:
    """A test cell's text without the lines ``instrument`` added (to compare with the release)."""
    return "\n".join(line for line in source.splitlines()
                     if not line.startswith(("import grader.guard as _lab_guard", "_lab_guard.end(")))


def read_verdicts(notebook: dict[str, Any], token: str) -> tuple[dict[str, bool], dict[str, str], dict[str, str]]:
    """From an autograded notebook: which test cells printed the run's ``ok`` line, the reason
    the guard gave for any it refused, and the threads of the notebook's still running after
    a test (``end``). The guard's lines are removed from the outputs."""
    finished: dict[str, bool] = {}
    refused: dict[str, str] = {}
    threads: dict[str, str] = {}
    for cell in notebook.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        test = meta["grade_id"]
        finished[test] = False
        for output in cell.get("outputs", []):
            if output.get("output_type") != "stream":
                continue
            text = output.get("text", "")
            lines = text if isinstance(text, list) else text.splitlines(keepends=True)
            kept = []
            for line in lines:
                if line.strip() == f"{MARK} {token} {test} ok":
                    finished[test] = True
                elif line.startswith(f"{MARK} refused: "):
                    refused[test] = line[len(f"{MARK} refused: "):].strip()
                elif line.startswith(f"{MARK} threads: "):
                    threads[test] = line[len(f"{MARK} threads: "):].strip()
                elif line.startswith(f"{MARK} spinning: "):
                    threads[test] = threads.get(test, "") + ", keeping a CPU busy"
                else:
                    kept.append(line)
            output["text"] = "".join(kept)
        cell["outputs"] = [o for o in cell.get("outputs", [])
                           if o.get("output_type") != "stream" or o.get("text")]
    return finished, refused, threads


HIDDEN_TESTS = re.compile(r"^[ \t]*#+[ \t]*BEGIN HIDDEN TESTS.*?^[ \t]*#+[ \t]*END HIDDEN TESTS[^\n]*\n?",
                          re.MULTILINE | re.DOTALL)


def conceal_hidden_tests(notebook: dict[str, Any]) -> int:
    """Take the hidden tests out of an autograded notebook before it becomes feedback; how
    many cells had some.

    nbgrader puts the hidden tests back into the notebook it runs, so its feedback page
    would print them, and an IPython traceback quotes the failing lines. In every test cell
    with hidden tests, the hidden block becomes one comment line and error tracebacks shrink
    to ``Error: message`` (the message says what was expected and what was found).
    """
    concealed = 0
    for cell in notebook.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        source = _source(cell)
        if cell.get("cell_type") != "code" or not meta.get("grade") or not HIDDEN_TESTS.search(source):
            continue
        cell["source"] = HIDDEN_TESTS.sub("# (hidden tests: run by the grader, not shown)\n", source)
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        concealed += 1
    return concealed


OUTPUT_LIMIT = 20_000  # characters kept of one output (the feedback must stay readable)


def truncate_outputs(notebook: dict[str, Any], limit: int = OUTPUT_LIMIT) -> int:
    """Cut every stream, text or traceback output longer than ``limit`` characters; how many were cut.

    A cell that prints megabytes would otherwise be stored whole in the feedback HTML.
    """
    cut = 0
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            fields = [("text", output)] + [(k, output.get("data", {})) for k in ("text/plain", "text/html")]
            for key, holder in fields:
                value = holder.get(key)
                if value is None:
                    continue
                text = "".join(value) if isinstance(value, list) else str(value)
                if len(text) > limit:
                    holder[key] = (text[:limit] + f"\n[... {len(text) - limit} more characters "
                                   "not kept by the grader ...]\n")
                    cut += 1
    return cut


# --------------------------------------------------------------------------- kernel side


class _CallWatch:
    """Which reference functions the test calls, and which the learner's functions call.

    While a test runs, every module-level ``reference_impl`` function is replaced, in its
    modules and in the notebook's globals, by a thin wrapper that looks at its caller's
    frame and then calls the original. Only calls into the reference pay (one frame look-up
    each), unlike a ``sys.settrace``/``setprofile`` hook, which slows every line of every
    thread rank about twofold. Callers are told apart by their code: the test cell's own
    code, or a function the learner wrote (a solution cell's top-level name). A reference
    function that the learner's code reached another way (saved in a closure or an object
    before the test began) is not seen: the guard is a tripwire, not a proof.
    """

    def __init__(self, test_file: str, learner: tuple[str, ...]):
        self.test_file = test_file
        self.learner = set(learner)
        self.by_test: set[str] = set()
        self.by_learner: dict[str, str] = {}  # reference function -> the learner function calling it
        self.patched: list[tuple[dict[str, Any], str, Any, Any]] = []  # (namespace, key, original, wrapper)

    def saw(self, name: str, caller: types.FrameType | None) -> None:
        """Record a call of the reference function ``name`` made from ``caller``'s code."""
        while caller is not None and "site-packages" in caller.f_code.co_filename:
            caller = caller.f_back
        if caller is None:
            return
        code = caller.f_code
        if code.co_filename == self.test_file:
            self.by_test.add(name)
        elif not code.co_filename.startswith(REFERENCE_DIR) and code.co_qualname.split(".")[0] in self.learner:
            self.by_learner.setdefault(name, code.co_qualname)

    def install(self, namespaces: list[dict[str, Any]]) -> None:
        """Put a watching wrapper in place of every reference function bound in ``namespaces``."""
        wrappers: dict[int, Any] = {}
        for namespace in namespaces:
            for key, value in list(namespace.items()):
                if not _is_reference_function(value):
                    continue
                wrapper = wrappers.get(id(value))
                if wrapper is None:
                    wrapper = wrappers[id(value)] = self._wrap(value)
                namespace[key] = wrapper
                self.patched.append((namespace, key, value, wrapper))

    def _wrap(self, function: types.FunctionType) -> Any:
        name = f"{function.__module__}.{function.__name__}"
        frame_of_caller = sys._getframe

        @functools.wraps(function)
        def watched(*args: Any, **kwargs: Any) -> Any:
            self.saw(name, frame_of_caller(1))
            return function(*args, **kwargs)

        return watched

    def uninstall(self, notebook: dict[str, Any] | None = None) -> bool:
        """Put the originals back; whether every wrapper in a ``reference_impl`` module was still
        in place (the notebook's own globals may be rebound by the test cell itself)."""
        intact = True
        for namespace, key, original, wrapper in reversed(self.patched):
            current = namespace.get(key)
            if namespace is not notebook:
                intact = intact and current is wrapper
            if current is wrapper:
                namespace[key] = original
        self.patched.clear()
        return intact


def _is_reference_function(value: Any) -> bool:
    """A module-level Python function of ``reference_impl`` (methods and classes are not watched)."""
    code = getattr(value, "__code__", None)
    return (isinstance(value, types.FunctionType) and isinstance(code, types.CodeType)
            and code.co_filename.startswith(REFERENCE_DIR) and "." not in code.co_qualname)


def _reference_namespaces(namespace: dict[str, Any]) -> list[dict[str, Any]]:
    """The globals of every loaded ``reference_impl`` module, and the notebook's."""
    modules = [vars(m) for n, m in list(sys.modules.items()) if n.startswith("reference_impl") and m is not None]
    return modules + [namespace]


_watch: _CallWatch | None = None


def _refuse(test: str, reason: str) -> None:
    sys.__stdout__.flush()
    print(f"{MARK} refused: {reason}", flush=True)
    raise TamperedError(f"test {test} refused: {reason}")


@functools.lru_cache(maxsize=None)
def _real_path(name: str) -> str:
    return name if name.startswith("<") else os.path.realpath(name)


def _real_file(code: types.CodeType) -> str:
    """The file ``code`` was loaded from, with symbolic links resolved (``<frozen ...>`` as it is)."""
    return _real_path(code.co_filename)


def _foreign(obj: Any, home: str) -> bool:
    """Whether ``obj`` is a Python function whose code was not loaded from under ``home``."""
    code = getattr(obj, "__code__", None)
    return isinstance(code, types.CodeType) and not _real_file(code).startswith(home)


def _from_notebook(obj: Any) -> bool:
    """Whether ``obj`` is a Python function written outside the lab, Python and its packages."""
    code = getattr(obj, "__code__", None)
    return isinstance(code, types.CodeType) and not _real_file(code).startswith(
        (REFERENCE_DIR, GRADER_DIR, "<frozen ") + INSTALLED)


def _from_installed(obj: Any) -> bool:
    """Whether ``obj`` is a Python function installed with Python (IPython's own methods)."""
    code = getattr(obj, "__code__", None)
    return isinstance(code, types.CodeType) and _real_file(code).startswith(("<frozen ",) + INSTALLED)


def tampering(namespace: dict[str, Any], helpers: dict[str, str]) -> str | None:
    """What the notebook has replaced that the tests rely on, or None."""
    shell = namespace.get("get_ipython", lambda: None)()
    if shell is not None:
        for method in ("showtraceback", "_showtraceback", "showsyntaxerror"):
            bound = getattr(shell, method, None)
            if not _from_installed(getattr(bound, "__func__", bound)):
                return f"the notebook replaced IPython's {method} (error display)"
        extra = [t for t in list(shell.ast_transformers) + list(shell.input_transformers_post)
                 if "IPython" not in getattr(type(t), "__module__", "") + getattr(t, "__module__", "")]
        if extra:
            return "the notebook installed its own cell transformers"
    for name in ("setprofile", "getprofile", "settrace", "gettrace", "_getframe"):
        if not isinstance(getattr(sys, name, None), types.BuiltinFunctionType):
            return f"the notebook replaced sys.{name}"
    if sys.gettrace() is not None:
        return "the notebook installed a tracer (sys.settrace)"
    for name in _PROTECTED_BUILTINS:
        value = getattr(builtins, name, None)
        if isinstance(value, types.FunctionType):
            return f"the notebook replaced the builtin {name}"
    import numpy

    numpy_home = str(Path(numpy.__file__).resolve().parent)
    for module in (numpy, getattr(numpy, "testing", None)):
        if module is None or not str(Path(getattr(module, "__file__", "")).resolve()).startswith(numpy_home):
            return "the notebook replaced the numpy module"
    for name in _NUMPY_CHECKS + tuple(n for n in dir(numpy.testing) if n.startswith("assert")):
        owner = numpy.testing if name.startswith("assert") else numpy
        if _foreign(getattr(owner, name, None), numpy_home):
            return f"the notebook replaced numpy function {name}"
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("reference_impl") or module is None:
            continue
        if not _real_path(str(getattr(module, "__file__", "") or "")).startswith(REFERENCE_DIR):
            return f"the notebook replaced the module {module_name}"
        for attr, value in list(vars(module).items()):
            if not attr.startswith("__") and _from_notebook(value):
                return f"the notebook replaced {module_name}.{attr}"
    import inspect

    for name, source in helpers.items():
        value = namespace.get(name)
        if value is None:
            continue
        try:
            current = inspect.getsource(value).strip()
        except (OSError, TypeError):
            current = ""
        if current != source.strip():
            return f"the notebook redefined the test helper {name}"
    return None


def begin(test: str, learner: tuple[str, ...], helpers: dict[str, str], namespace: dict[str, Any]) -> None:
    """Before a test cell's code: refuse if tampered with, then watch calls to the reference."""
    global _watch
    if _watch is not None:  # left by an earlier test that failed before ``end``
        _watch.uninstall()
        _watch = None
    reason = tampering(namespace, helpers)
    if reason:
        _refuse(test, reason)
    if _report_threads():  # left by an earlier cell that failed before ``end`` could look
        _refuse(test, "threads your code left running keep a CPU busy; this test would only run slowly")
    _watch = _CallWatch(sys._getframe(1).f_code.co_filename, learner)
    _watch.install(_reference_namespaces(namespace))


def _reference_names(namespace: dict[str, Any]) -> set[str]:
    """The reference functions the tests bound to ``_ref...`` names (what they compare with)."""
    found = set()
    for name, value in list(namespace.items()):
        if name.startswith("_ref") and callable(value) and str(getattr(value, "__module__", "")).startswith(
                "reference_impl"):
            found.add(f"{value.__module__}.{getattr(value, '__name__', name)}")
    return found


def end(test: str, token: str, namespace: dict[str, Any] | None = None) -> None:
    """After a test cell's code ran to its end: stop watching, judge, print the ``ok`` line.

    The credit is refused when a learner function the test called calls a reference
    function that the test calls too, and that function is the learner function's
    namesake or one the tests bound to a ``_ref...`` name: the learner handed in the
    reference's answer. (Reference helpers both may use, like a training step's gradient
    order, are not counted.)"""
    global _watch
    watch, _watch = _watch, None
    if watch is None or not watch.uninstall(namespace):
        _refuse(test, "the grader's watch on the reference implementation was removed")
    compared = _reference_names(namespace or {})
    delegated = sorted(name for name in set(watch.by_learner) & watch.by_test
                       if name in compared or name.rsplit(".", 1)[-1] == watch.by_learner[name].split(".")[0])
    if delegated:
        name = delegated[0]
        _refuse(test, f"{watch.by_learner[name]} calls {name}, the reference implementation "
                      "this test compares it with: no credit")
    _report_threads()
    print(f"{MARK} {token} {test} ok", flush=True)


def _report_threads() -> bool:
    """Print the guard's line naming the notebook's threads still running, and a second line if
    they keep a CPU busy (``grader.steps`` then stops the run after this cell); whether they do."""
    left = running_threads()
    if not left:
        return False
    names = [t.name for t in left]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    print(f"{MARK} threads: {len(names)} ({shown})", flush=True)
    busy = busy_threads(left)
    if busy:
        print(f"{MARK} spinning: {shown}", flush=True)
    return busy


def running_threads() -> list[Any]:
    """The live threads running code of the notebook or of ``reference_impl`` (a rank the
    learner's code left blocked, a loop it started): after a test they can only compete with
    every later test for the CPU. Threads of Python, IPython and other packages are not counted."""
    import threading

    found = []
    for thread in threading.enumerate():
        if thread is threading.current_thread() or not thread.is_alive():
            continue
        run = getattr(thread, "_target", None) or type(thread).run
        code = getattr(getattr(run, "__func__", run), "__code__", None)
        if isinstance(code, types.CodeType) and not _real_file(code).startswith(
                ("<frozen ", GRADER_DIR) + INSTALLED):
            found.append(thread)
    return found


BUSY_SAMPLE_S = 0.1  # how long the guard watches left-over threads for CPU use


def busy_threads(threads: list[Any]) -> bool:
    """Whether any of ``threads`` keeps a CPU busy: over ``BUSY_SAMPLE_S`` they used at least half
    of it (Linux: the threads' own CPU times in /proc). An idle thread (blocked on a queue or a
    receive) is only reported; a spinning one would slow every later test, so the run stops."""
    import time

    def cpu_ticks() -> int:
        total = 0
        for thread in threads:
            try:
                fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
            except (OSError, IndexError, ValueError, TypeError):
                continue
        return total

    before = cpu_ticks()
    time.sleep(BUSY_SAMPLE_S)
    used_s = (cpu_ticks() - before) / os.sysconf("SC_CLK_TCK")
    return used_s >= BUSY_SAMPLE_S / 2
