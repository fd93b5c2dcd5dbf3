"""A cache of nbgrader's generated assignment: built once per source, personalised per run.

Every ``check`` needs the assignment nbgrader generates from the instructor's source: the
gradebook (hidden tests included, from which ``autograde`` restores the test cells) and the
release notebook (which the tamper report compares with). Generating them costs a gradebook
built row by row, about a second per check, yet for a given source the result is always the
same but for one thing: the guard's secret token (``grader.guard``), which is in the test
cells' source and must be new on every run.

So the grader instruments the source with a fixed slot, ``TOKEN_SLOT``, instead of the
token; the first run generates the assignment and stores a copy under a key that hashes
everything generation depends on (``source_key``); later runs copy it back (``restore``).
Either way, before any learner code runs, ``personalise`` writes this run's token into the
scratch gradebook's copy of the test cells and recomputes their nbgrader checksums, so what
``autograde`` sees is exactly what generating with the token would have given (the tests
compare the two). The cache holds no token, never a learner's file, and nothing of a run.

Where: ``$LAB_GRADER_CACHE`` if set (``off`` turns the cache off), else
``$XDG_CACHE_HOME/dl-lab-grader/generated`` (``~/.cache/...``), created private (mode 0700).
``check`` uses it only when the kernel runs as a user of its own (as root; ``grader.jail``),
which can neither read nor rewrite it; a kernel running as the grader's own user could
rewrite a cached gradebook and so every later grade, so then nothing is cached.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

CACHE_FORMAT = 1  # bump when what is stored, or how it is keyed, changes
TOKEN_SLOT = "lab-guard-token-slot"  # what ``guard.instrument`` writes where the token goes
KEEP_ENTRIES = 64  # the newest entries kept; older ones (sources since changed) are removed
GRADEBOOK = "gradebook.db"
CONFIG_FILE = "nbgrader_config.py"


def cache_dir() -> Path | None:
    """Where generated assignments are kept, or None when ``LAB_GRADER_CACHE=off``."""
    chosen = os.environ.get("LAB_GRADER_CACHE")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dl-lab-grader" / "generated"


def source_key(root: Path, assignment: str) -> str:
    """A hash of everything the generated assignment depends on.

    The course configuration, every file of ``source/<assignment>/`` (already instrumented,
    so a change to the guard changes the key), nbgrader's version, Python's, and
    ``CACHE_FORMAT``. Any change to any of them gives a new key, so a stale entry is never used.
    """
    from importlib import metadata

    digest = hashlib.sha256()
    for part in (f"format {CACHE_FORMAT}", f"nbgrader {metadata.version('nbgrader')}",
                 f"python {sys.version}", f"assignment {assignment}"):
        digest.update(part.encode() + b"\0")
    digest.update((root / CONFIG_FILE).read_bytes() + b"\0")
    folder = root / "source" / assignment
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def restore(cache: Path, key: str, root: Path, assignment: str) -> bool:
    """Copy the cached gradebook and release of ``key`` into the course at ``root``; whether found."""
    entry = cache / key
    if not (entry / GRADEBOOK).is_file() or not (entry / "release").is_dir():
        return False
    try:
        shutil.copyfile(entry / GRADEBOOK, root / GRADEBOOK)
        shutil.copytree(entry / "release", root / "release" / assignment)
    except OSError:  # removed while we copied (pruned by another run): generate instead
        (root / GRADEBOOK).unlink(missing_ok=True)
        shutil.rmtree(root / "release" / assignment, ignore_errors=True)
        return False
    return True


def store(cache: Path, key: str, root: Path, assignment: str) -> None:
    """Keep the just-generated gradebook and release of the course at ``root`` under ``key``.

    Written to a temporary folder in the cache and renamed into place, so a run never sees
    half an entry; when two runs store the same key at once, the first rename wins and the
    other copy is dropped. Must be called before any learner code runs (the gradebook then
    holds only the instructor's source).
    """
    cache.mkdir(parents=True, exist_ok=True)
    os.chmod(cache, 0o700)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
    try:
        shutil.copyfile(root / GRADEBOOK, staging / GRADEBOOK)
        shutil.copytree(root / "release" / assignment, staging / "release")
        try:
            os.rename(staging, cache / key)
        except OSError:  # another run stored it first
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _prune(cache)


def _prune(cache: Path) -> None:
    """Remove all but the ``KEEP_ENTRIES`` newest entries."""
    entries = sorted((p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP_ENTRIES:]:
        shutil.rmtree(old, ignore_errors=True)


class PersonaliseError(RuntimeError):
    """The gradebook's test cells are not what the slot-instrumented source would give."""


def personalise(db_url: str, course_id: str, assignment: str, token: str) -> int:
    """Put ``token`` where ``TOKEN_SLOT`` stands in the gradebook's cells; how many cells changed.

    nbgrader keeps, per source cell, its text and a checksum of it (``compute_checksum``: the
    text, type, grade/solution/locked flags, id and points). Each cell's checksum is first
    recomputed from the gradebook's own rows and must match the stored one (otherwise the
    rows are not understood and ``PersonaliseError`` is raised); then the text gets the
    token and the checksum is computed again.
    """
    from nbgrader.api import Gradebook

    slot, mine = repr(TOKEN_SLOT), repr(token)
    changed = 0
    with Gradebook(db_url, course_id) as gb:
        for notebook in gb.find_assignment(assignment).notebooks:
            points = {c.name: c.max_score for c in notebook.grade_cells}
            solutions = {c.name for c in notebook.solution_cells}
            for cell in notebook.source_cells:
                if slot not in cell.source:
                    continue
                if _checksum(cell, cell.source, points, solutions) != cell.checksum:
                    raise PersonaliseError(f"gradebook cell {cell.name} of {notebook.name}: its checksum "
                                           "does not match its text; cannot put this run's token in it")
                cell.source = cell.source.replace(slot, mine)
                cell.checksum = _checksum(cell, cell.source, points, solutions)
                changed += 1
        gb.db.commit()
    return changed


def _checksum(cell: Any, source: str, points: dict[str, float], solutions: set[str]) -> str:
    """nbgrader's checksum of gradebook source cell ``cell`` with the text ``source``."""
    from nbformat.notebooknode import from_dict
    from nbgrader.utils import compute_checksum

    flags: dict[str, Any] = {"grade": cell.name in points, "solution": cell.name in solutions,
                             "locked": bool(cell.locked), "grade_id": cell.name}
    if cell.name in points:
        flags["points"] = points[cell.name]
    return compute_checksum(from_dict({"cell_type": cell.cell_type, "source": source,
                                       "metadata": {"nbgrader": flags}}))
