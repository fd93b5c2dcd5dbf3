"""The crossing from Python into the generated C, written in C: a tiny CPython extension.

NumPy-only: the compiler's targets are NumPy source and C compiled for host memory.

For a small model at batch 1 the compiled graph runs for a few microseconds, and calling it
through ``ctypes`` costs about as much again: Python code has to check the feeds, find their
addresses (or copy them into buffers whose addresses it knows), convert the arguments, and
copy the results out. ``entry_source`` writes that work in C instead, appended to the graph's
own source so that one shared library is both the ``ctypes`` library (``graph_main``) and an
extension module with one function, ``run(x0, x1, ...)``:

* each feed is taken through the buffer protocol and accepted only if it is a C-contiguous
  buffer of native float32 (format ``"f"``) with the rank and sizes of its placeholder, one
  batch size shared by all; anything else (a strided view, float64, a list, a wrong shape)
  makes ``run`` return ``None``, and ``CompiledFunction`` then takes its Python path, which
  converts what it can and raises an error naming the feed. No wrong input reaches
  ``graph_main``;
* the outputs are new NumPy arrays (``numpy.empty``, called from C), so an array a call
  returned is never written by a later call;
* ``graph_main`` runs with the GIL released, so other Python threads run meanwhile.

It needs the CPython headers (``Python.h``, the ``python3-dev`` package on Debian); without
them ``python_include_dir`` returns None and the JIT calls ``graph_main`` through ``ctypes``.
Any generated C that defines ``graph_main`` with this signature can use it: the int8 MLP of
``reference_impl.quantize.compile_int8`` does.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import numpy as np


def python_include_dir() -> Path | None:
    """The folder holding this interpreter's ``Python.h``, or None (no headers, or a platform
    where the extension is not built: it is linked like a Linux shared library)."""
    if not sys.platform.startswith("linux"):
        return None
    include = sysconfig.get_paths().get("include")
    return Path(include) if include and (Path(include) / "Python.h").is_file() else None


def _dims(shape: tuple) -> str:
    """A C initialiser of a shape's sizes, -1 for the batch dimension (``None``)."""
    return "{" + ", ".join("-1" if d is None else str(d) for d in shape) + "}" if shape else "{0}"


def entry_source(module: str, feeds: list[tuple], fetches: list[tuple]) -> str:
    """C source of the extension module ``module`` for a graph with feeds and fetches of these
    shapes (rank ≤ 2, only the leading size unknown, as ``c_codegen`` requires; at least one
    of each). Appended to the output of ``generate_c``, which defines ``graph_main``."""
    nf, ny = len(feeds), len(fetches)
    if not nf or not ny or any(len(s) > 2 or None in s[1:] for s in feeds + fetches):
        raise ValueError(f"entry_source: needs ≥ 1 feed and fetch of rank ≤ 2, got {feeds} -> {fetches}")
    call_args = ", ".join(["n"] + [f"(const float *)x[{i}].buf" for i in range(nf)]
                          + [f"(float *)y[{j}].buf" for j in range(ny)])
    signature = f"{module}.run({', '.join(f'x{i}' for i in range(nf))}) -> [{', '.join(f'y{j}' for j in range(ny))}]"
    return f"""
/* ---- the Python entry point: {signature} ---- */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *np_empty, *np_float32;  /* numpy.empty and numpy.float32, given by setup() */
static const int feed_rank[{nf}] = {{{", ".join(str(len(s)) for s in feeds)}}};
static const Py_ssize_t feed_dims[{nf}][2] = {{{", ".join(_dims(s) for s in feeds)}}};
static const int fetch_rank[{ny}] = {{{", ".join(str(len(s)) for s in fetches)}}};
static const Py_ssize_t fetch_dims[{ny}][2] = {{{", ".join(_dims(s) for s in fetches)}}};

/* Hold o's buffer in b if it is C-contiguous native float32 of the feed's rank and sizes (-1:
   the batch size *n, the same for every feed); else hold nothing and return 0. */
static int take_feed(PyObject *o, Py_buffer *b, int rank, const Py_ssize_t *dims, Py_ssize_t *n) {{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {{
        PyErr_Clear();
        return 0;
    }}
    int ok = b->ndim == rank && b->itemsize == 4 && b->format != NULL && strcmp(b->format, "f") == 0;
    for (int d = 0; ok && d < rank; d++) {{
        if (dims[d] >= 0) ok = b->shape[d] == dims[d];
        else if (*n < 0) *n = b->shape[d];
        else ok = b->shape[d] == *n;
    }}
    if (!ok) PyBuffer_Release(b);
    return ok;
}}

/* A new float32 array of the fetch's shape for batch size n, its buffer held in b. */
static PyObject *new_output(int rank, const Py_ssize_t *dims, Py_ssize_t n, Py_buffer *b) {{
    PyObject *shape = PyTuple_New(rank);
    for (int d = 0; shape != NULL && d < rank; d++) {{
        PyObject *size = PyLong_FromSsize_t(dims[d] < 0 ? n : dims[d]);
        if (size == NULL) Py_CLEAR(shape);
        else PyTuple_SET_ITEM(shape, d, size);
    }}
    PyObject *a = shape == NULL ? NULL : PyObject_CallFunctionObjArgs(np_empty, shape, np_float32, NULL);
    Py_XDECREF(shape);
    if (a != NULL && PyObject_GetBuffer(a, b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) Py_CLEAR(a);
    return a;
}}

static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {{
    Py_buffer x[{nf}], y[{ny}];
    PyObject *out = NULL;
    Py_ssize_t n = -1;
    int held = 0, made = 0;
    if (nargs != {nf}) Py_RETURN_NONE;
    while (held < {nf} && take_feed(args[held], &x[held], feed_rank[held], feed_dims[held], &n)) held++;
    if (held < {nf}) {{  /* not the exact feeds: the Python side checks, converts or explains */
        for (int i = 0; i < held; i++) PyBuffer_Release(&x[i]);
        Py_RETURN_NONE;
    }}
    if (n < 0) n = 1;
    out = PyList_New({ny});
    for (; out != NULL && made < {ny}; made++) {{
        PyObject *a = new_output(fetch_rank[made], fetch_dims[made], n, &y[made]);
        if (a == NULL) break;
        PyList_SET_ITEM(out, made, a);
    }}
    if (out != NULL && made == {ny}) {{
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = graph_main({call_args});
        Py_END_ALLOW_THREADS
        if (status != 0) {{
            PyErr_SetString(PyExc_MemoryError, "the compiled graph could not allocate its intermediates");
            Py_CLEAR(out);
        }}
    }} else {{
        Py_CLEAR(out);
    }}
    for (int i = 0; i < {nf}; i++) PyBuffer_Release(&x[i]);
    for (int j = 0; j < made; j++) PyBuffer_Release(&y[j]);
    return out;
}}

static PyObject *setup(PyObject *self, PyObject *args) {{
    if (!PyArg_ParseTuple(args, "OO", &np_empty, &np_float32)) return NULL;
    Py_INCREF(np_empty);
    Py_INCREF(np_float32);
    Py_RETURN_NONE;
}}

static PyMethodDef methods[] = {{
    {{"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, "run(*feeds): the fetched arrays, or None"}},
    {{"setup", setup, METH_VARARGS, "setup(numpy.empty, numpy.float32)"}},
    {{NULL, NULL, 0, NULL}},
}};
static struct PyModuleDef module_def = {{PyModuleDef_HEAD_INIT, "{module}", NULL, -1, methods}};
PyMODINIT_FUNC PyInit_{module}(void) {{ return PyModule_Create(&module_def); }}
"""


def load_entry(path: Path, module: str) -> ModuleType:
    """Import the extension module ``module`` from the shared library at ``path``, set up."""
    loader = importlib.machinery.ExtensionFileLoader(module, str(path))
    spec = importlib.util.spec_from_file_location(module, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    mod.setup(np.empty, np.dtype(np.float32))
    return mod
