"""A character-level corpus from text every Python installation ships: standard-library docstrings.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

A language model needs text, and nothing may be downloaded, so the corpus is the docstrings
of a fixed, sorted list of standard-library modules (the module's own docstring, then its
public classes' and functions' docstrings in name order), read with ``inspect.getdoc``. The
same Python version gives the same bytes on every machine (another version documents its
modules a little differently: the corpus is deterministic per installation, and
``corpus_digest`` says which one you have).

The vocabulary is fixed, not learned from the text: newline plus the 95 printable ASCII
characters, 96 tokens (``VOCAB``), so a model's ``vocab_size`` does not depend on the
corpus. The few characters outside it (tabs, non-ASCII) are written as ``?`` when the text is
built, so every character of ``text()`` is in the vocabulary.

Training windows are nanoGPT's ``get_batch``: ``batch`` random offsets into the encoded text,
``tokens = data[o : o + seq]`` and ``targets = data[o + 1 : o + seq + 1]`` (the next
character at every position), drawn from a seeded generator.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import warnings

import numpy as np

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
STOI = {ch: i for i, ch in enumerate(VOCAB)}
UNKNOWN = "?"

MODULES = (
    "abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions",
    "functools", "gzip", "hashlib", "heapq", "http.client", "inspect", "io", "ipaddress", "itertools", "json",
    "logging", "math", "operator", "os", "pathlib", "pickle", "queue", "random", "re", "shutil", "socket",
    "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "typing",
    "unittest", "urllib.parse", "uuid", "zipfile",
)


def _docs_of(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    docs = [inspect.getdoc(module) or ""]
    with warnings.catch_warnings():  # typing.io and typing.re warn that they are deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in sorted(dir(module)):
            obj = None if name.startswith("_") else getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) == module.__name__:  # defined here, not re-exported
                docs.append(f"{name}: {inspect.getdoc(obj) or ''}")
            elif name in _replaced(module):  # defined here, then replaced by another library at run time
                docs.append(f"{name}: {_replaced(module)[name]}")
    return [d for d in docs if d.strip()]


def _replaced(module) -> dict[str, str]:
    """The docstrings of the functions ``module``'s own source defines at top level but that are
    no longer its own at run time: another library replaced them (importing PyTorch replaces
    ``inspect.getfile``). Read from the source, so the corpus does not depend on what else the
    process has imported."""
    if module.__name__ not in _REPLACED:
        import ast

        found = {}
        source = inspect.getsourcefile(module)
        if source:
            with open(source, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    obj = getattr(module, node.name, None)
                    if inspect.isfunction(obj) and obj.__module__ != module.__name__:
                        found[node.name] = ast.get_docstring(node) or ""
        _REPLACED[module.__name__] = found
    return _REPLACED[module.__name__]


_REPLACED: dict[str, dict[str, str]] = {}


@functools.lru_cache(maxsize=1)
def text() -> str:
    """The corpus: every docstring of ``MODULES``, separated by blank lines, mapped into ``VOCAB``."""
    raw = "\n\n".join(doc for m in MODULES for doc in _docs_of(m))
    return "".join(ch if ch in STOI else UNKNOWN for ch in raw.expandtabs(4))


def corpus_digest() -> str:
    """SHA-256 of ``text()``: equal on two machines when their corpora are equal."""
    return hashlib.sha256(text().encode()).hexdigest()


def encode(s: str) -> np.ndarray:
    """Token ids (``int64``) of ``s``; raises ``KeyError`` on a character outside ``VOCAB``."""
    return np.fromiter((STOI[ch] for ch in s), dtype=np.int64, count=len(s))


def decode(ids) -> str:
    """The string of token ids ``ids``."""
    return "".join(VOCAB[int(i)] for i in ids)


@functools.lru_cache(maxsize=1)
def data() -> np.ndarray:
    """The whole corpus encoded (read-only)."""
    out = encode(text())
    out.setflags(write=False)
    return out


def split(val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)``: the first ``1 - val_fraction`` of the encoded corpus, and the rest."""
    d = data()
    cut = int(len(d) * (1 - val_fraction))
    return d[:cut], d[cut:]


def get_batch(tokens: np.ndarray, batch: int, seq: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``, each ``(batch, seq)``: random windows of ``tokens`` and the same windows shifted by one."""
    if len(tokens) <= seq:
        raise ValueError(f"get_batch: need more than seq={seq} tokens, got {len(tokens)}")
    offsets = rng.integers(0, len(tokens) - seq, size=batch)
    window = offsets[:, None] + np.arange(seq)
    return tokens[window], tokens[window + 1]
