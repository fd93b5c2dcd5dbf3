"""Reading heterogeneous records one by one: typed fields, conversion, and a reject file for bad lines.

Real input files mix integers, floats, booleans, strings and lists, with empty cells,
stray quotes, text where a number belongs, truncated lines and bytes that are not UTF-8.
A parser has three honest options for a line it cannot convert: stop the job, fill in a
guess, or set the line aside. Training jobs take the third, and it must never be silent:

* every line ends in exactly one counter: ``parsed``, ``rejected`` or ``blank``, so
  ``parsed + rejected + blank == lines`` can be checked at the end of a run;
* a rejected line is appended to the *reject file* (JSON lines: file, line number, the
  reason, the raw text) so it can be inspected, fixed and re-fed; nothing is lost;
* ``by_reason`` counts the rejections per kind of failure, and ``max_reject_fraction``
  turns a file that is mostly garbage (a wrong schema, a wrong delimiter) into an error
  instead of a job that trains on 3 % of its data.

The schema is a list of ``Field(name, type)``; ``type`` is ``"int"``, ``"float"``,
``"bool"``, ``"str"`` or ``"floats"`` (a list of floats: ``1.5;2;3`` in CSV, a JSON array
in JSON lines). Optional fields take their ``default`` when empty or absent.
"""
from __future__ import annotations

import csv
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

TYPES = ("int", "float", "bool", "str", "floats")
_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}


class BadRecord(ValueError):
    """One line could not be converted; the message is the reason written to the reject file."""


@dataclass(frozen=True)
class Field:
    """One column of the schema."""

    name: str
    type: str
    required: bool = True
    default: Any = None

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"Field {self.name!r}: unknown type {self.type!r}; expected one of {TYPES}")


@dataclass
class ParseStats:
    """Where every line went: ``lines == parsed + rejected + blank``."""

    lines: int = 0
    parsed: int = 0
    rejected: int = 0
    blank: int = 0
    by_reason: Counter = field(default_factory=Counter)

    def balanced(self) -> bool:
        return self.lines == self.parsed + self.rejected + self.blank


def _number(value: Any, name: str, kind: str, allow_nan: bool) -> float | int:
    """``value`` (a CSV string or a JSON value) as an int or a float, or ``BadRecord``."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadRecord(f"field {name!r}: expected {kind}, got {type(value).__name__} {value!r}")
    if kind == "int":
        if isinstance(value, float):
            if not value.is_integer():
                raise BadRecord(f"field {name!r}: {value!r} is not an integer")
            return int(value)
        try:
            return int(value)
        except ValueError:
            raise BadRecord(f"field {name!r}: cannot convert {value!r} to int") from None
    try:
        number = float(value)
    except ValueError:
        raise BadRecord(f"field {name!r}: cannot convert {value!r} to float") from None
    if not allow_nan and not math.isfinite(number):
        raise BadRecord(f"field {name!r}: {value!r} is not a finite number")
    return number


def convert(value: Any, f: Field, allow_nan: bool = False, list_separator: str = ";") -> Any:
    """One field's value from a CSV cell (str) or a JSON value, converted to ``f.type``."""
    if f.type in ("int", "float"):
        return _number(value, f.name, f.type, allow_nan)
    if f.type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise BadRecord(f"field {f.name!r}: cannot convert {value!r} to bool")
    if f.type == "str":
        if not isinstance(value, str):
            raise BadRecord(f"field {f.name!r}: expected a string, got {type(value).__name__} {value!r}")
        return value
    items = value.split(list_separator) if isinstance(value, str) else value
    if not isinstance(items, list):
        raise BadRecord(f"field {f.name!r}: expected a list of floats, got {type(value).__name__} {value!r}")
    return [_number(v, f.name, "float", allow_nan) for v in items]


class RecordParser:
    """Parses CSV or JSON-lines files against a schema; bad lines go to ``reject_path`` with the reason."""

    def __init__(self, fields: Sequence[Field], reject_path: str | Path, allow_nan: bool = False,
                 list_separator: str = ";", max_reject_fraction: float = 1.0):
        names = [f.name for f in fields]
        if not fields or len(set(names)) != len(names):
            raise ValueError(f"RecordParser: need fields with unique names, got {names}")
        self.fields = list(fields)
        self.by_name = {f.name: f for f in fields}
        self.reject_path = Path(reject_path)
        self.allow_nan, self.list_separator = allow_nan, list_separator
        self.max_reject_fraction = max_reject_fraction
        self.stats = ParseStats()

    def _record(self, values: dict[str, Any]) -> dict[str, Any]:
        """Convert a name -> raw value mapping into a typed record."""
        unexpected = sorted(set(values) - set(self.by_name))
        if unexpected:
            raise BadRecord(f"unexpected field(s) {unexpected}")
        out = {}
        for f in self.fields:
            raw = values.get(f.name)
            if raw is None or raw == "":
                if f.required:
                    raise BadRecord(f"missing required field {f.name!r}")
                out[f.name] = f.default
                continue
            out[f.name] = convert(raw, f, self.allow_nan, self.list_separator)
        return out

    def parse_line(self, text: str, kind: str, header: list[str] | None = None) -> dict[str, Any]:
        """One typed record from one line of a ``"csv"`` (with its ``header``) or ``"jsonl"`` file."""
        if kind == "jsonl":
            try:
                values = json.loads(text)
            except ValueError as exc:
                raise BadRecord(f"not valid JSON: {exc.args[0] if exc.args else exc}") from None
            if not isinstance(values, dict):
                raise BadRecord(f"expected a JSON object, got {type(values).__name__}")
            return self._record(values)
        if kind != "csv" or header is None:
            raise ValueError(f"RecordParser.parse_line: kind must be 'jsonl', or 'csv' with a header, got {kind!r}")
        try:
            cells = next(csv.reader([text], strict=True))
        except csv.Error as exc:
            raise BadRecord(f"malformed CSV: {exc}") from None
        if len(cells) != len(header):
            raise BadRecord(f"expected {len(header)} columns, got {len(cells)}")
        return self._record(dict(zip(header, cells)))

    def _reject(self, path: Path, line_no: int, reason: str, raw: str) -> None:
        self.stats.rejected += 1
        self.stats.by_reason[reason.split(":")[0]] += 1
        with open(self.reject_path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"file": str(path), "line": line_no, "reason": reason, "raw": raw}) + "\n")

    # --8<-- [start:parse_file]
    def parse_file(self, path: str | Path, kind: str) -> Iterator[dict[str, Any]]:
        """Typed records of one file, in order; every other line is counted as blank or rejected."""
        path = Path(path)
        header = None
        file_lines = file_rejects = 0
        with open(path, "rb") as f:
            for line_no, raw_bytes in enumerate(f, start=1):
                text_raw = raw_bytes.rstrip(b"\r\n")
                if kind == "csv" and header is None:
                    header = next(csv.reader([text_raw.decode("utf-8", "replace")]))
                    missing = [x.name for x in self.fields if x.required and x.name not in header]
                    extra = [h for h in header if h not in self.by_name]
                    if missing or extra:
                        raise ValueError(f"{path}: CSV header {header} does not match the schema: "
                                         f"missing {missing}, unknown {extra}")
                    continue
                self.stats.lines += 1
                file_lines += 1
                try:
                    text = text_raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    self._reject(path, line_no, f"not UTF-8: {exc.reason} at byte {exc.start}",
                                 text_raw.decode("utf-8", "backslashreplace"))
                    file_rejects += 1
                    continue
                if not text.strip():
                    self.stats.blank += 1
                    continue
                try:
                    record = self.parse_line(text, kind, header)
                except BadRecord as exc:
                    self._reject(path, line_no, str(exc), text)
                    file_rejects += 1
                    continue
                self.stats.parsed += 1
                yield record
    # --8<-- [end:parse_file]
        if file_lines and file_rejects / file_lines > self.max_reject_fraction:
            raise ValueError(f"{path}: {file_rejects} of {file_lines} lines rejected, more than the allowed "
                             f"{self.max_reject_fraction:.0%} (wrong schema or delimiter?); see {self.reject_path}")
