"""The learner's own line in a failure: which line of which of their cells an error went through.

A test that fails inside the learner's function shows, in IPython's traceback, a frame per
cell it passed through (``Cell In[7], line 12``), where ``7`` is the execution count of the
cell. The hidden tests' frames must not reach the learner, but the frame in their own
solution cell is the most useful line of the report: it is where to look. ``learner_lines``
reads it from an executed notebook before the tracebacks are concealed, and ``syntax_errors``
finds the cells that cannot even be parsed before any of them runs.
"""
from __future__ import annotations

import ast
import re
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FRAME = re.compile(r"Cell In\[(\d+)\], line (\d+)")
_MAGIC = re.compile(r"^\s*[%!]", re.MULTILINE)


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _meta(cell: dict[str, Any]) -> dict[str, Any]:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def cell_key(cell: dict[str, Any], index: int) -> str:
    """A cell's name in reports: its grade id, else ``#index``."""
    return str(_meta(cell).get("grade_id") or f"#{index}")


def quote(cell_name: str, source: str, line: int) -> str | None:
    """``cell NAME, line L: <code>`` for line ``line`` (1-based) of ``source``, or None if out of range."""
    lines = source.splitlines()
    if not 1 <= line <= len(lines):
        return None
    return f"cell {cell_name}, line {line}: {lines[line - 1].strip()}"


def learner_lines(notebook: dict[str, Any]) -> dict[str, str]:
    """``{cell: "cell NAME, line L: code"}`` for every cell whose error went through a solution cell.

    The last (innermost) frame in a solution cell is chosen: the learner's line closest to
    where the error was raised.
    """
    cells = notebook.get("cells", [])
    by_count = {c.get("execution_count"): (i, c) for i, c in enumerate(cells)
                if c.get("cell_type") == "code" and c.get("execution_count") is not None}
    found = {}
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            text = _ANSI.sub("", "\n".join(output.get("traceback", [])))
            for count, line in reversed(_FRAME.findall(text)):
                where = by_count.get(int(count))
                if where is None or not _meta(where[1]).get("solution"):
                    continue
                quoted = quote(cell_key(where[1], where[0]), _source(where[1]), int(line))
                if quoted:
                    found[cell_key(cell, index)] = quoted
                    break
    return found


def syntax_errors(notebook: dict[str, Any]) -> dict[str, str]:
    """``{cell: message}`` for every solution cell that Python cannot parse, with the learner's line."""
    found = {}
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code" or not _meta(cell).get("solution"):
            continue
        source = _source(cell)
        if _MAGIC.search(source):  # IPython syntax (%magic, !shell): only the kernel can judge it
            continue
        try:
            ast.parse(source)
        except SyntaxError as exc:
            name = cell_key(cell, index)
            where = quote(name, source, exc.lineno or 0) or f"cell {name}"
            found[name] = f"{type(exc).__name__}: {exc.msg} ({where})"
    return found


def defined_names(notebook: dict[str, Any]) -> dict[str, str]:
    """``{name: cell}``: the top-level functions and classes each solution cell defines.

    A cell that does not parse is read line by line, so that a name it meant to define is
    still traced back to it.
    """
    found = {}
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code" or not _meta(cell).get("solution"):
            continue
        name = cell_key(cell, index)
        source = _source(cell)
        try:
            names = [n.name for n in ast.parse(source).body
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        except SyntaxError:
            names = re.findall(r"^(?:async\s+)?(?:def|class)\s+(\w+)", source, re.MULTILINE)
        for defined in names:
            found[defined] = name
    return found
