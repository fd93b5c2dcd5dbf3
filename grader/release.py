"""``python -m grader release``: the learner versions of every assignment.

nbgrader's ``generate_assignment`` runs in a scratch copy of the course; only the released
notebooks are copied out (``<out>/<assignment>/<notebook>.ipynb``), never the gradebook that
holds the hidden tests. Before anything is written, every released notebook is checked for
leaks: no solution or hidden-test delimiter, and no line that only appears inside a solution
or hidden-test region of the source. A leak is an error (``ReleaseLeak``), not a warning:
a released notebook with the answers in it cannot be taken back.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

from .course import Course, cell_source, scratch_course
from .sandbox import child_environment, run_limited

DEFAULT_TIMEOUT = 300.0
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
_REGION = re.compile(
    r"^[ \t]*#+[ \t]*BEGIN (SOLUTION|HIDDEN TESTS)[^\n]*\n(.*?)^[ \t]*#+[ \t]*END \1",
    re.MULTILINE | re.DOTALL,
)


class ReleaseLeak(RuntimeError):
    """A released notebook contains solution code or hidden tests."""


class ReleaseFailed(RuntimeError):
    """nbgrader could not generate the learner version of an assignment."""


def secret_lines(source_notebook: dict) -> set[str]:
    """Lines that occur only inside solution / hidden-test regions of the source notebook.

    Lines that also appear in public text (a given cell, a docstring, a visible test) are not
    secrets, so ``return bounds`` counts only if nothing public says it too.
    """
    secret: set[str] = set()
    public: set[str] = set()
    for cell in source_notebook.get("cells", []):
        text = cell_source(cell)
        for match in _REGION.finditer(text):
            secret.update(line.strip() for line in match.group(2).splitlines())
        public.update(line.strip() for line in _REGION.sub("", text).splitlines())
    return {line for line in secret - public if line and not line.startswith("###")}


def check_no_leaks(source_notebook: dict, released_notebook: dict, name: str) -> None:
    """Raise ``ReleaseLeak`` if ``released_notebook`` shows any solution or hidden test."""
    secrets = secret_lines(source_notebook)
    for index, cell in enumerate(released_notebook.get("cells", [])):
        text = cell_source(cell)
        for marker in MARKERS:
            if marker in text:
                raise ReleaseLeak(f"{name}: cell {index} of the release still contains '{marker}'")
        leaked = sorted(secrets & {line.strip() for line in text.splitlines()})
        if leaked:
            raise ReleaseLeak(
                f"{name}: cell {index} of the release contains solution or hidden-test code: "
                f"{leaked[0]!r}" + (f" (and {len(leaked) - 1} more lines)" if len(leaked) > 1 else "")
            )


def release_all(course: Course, out: Path, *, timeout: float = DEFAULT_TIMEOUT) -> list[Path]:
    """Generate every assignment's learner version into ``out``; return the notebooks written."""
    assignments = course.assignments
    source_dir = (course.root / "source").resolve()
    if out.resolve() == source_dir or source_dir in out.resolve().parents:
        raise ReleaseFailed(f"refusing to write the release into the course sources ({out})")
    if not assignments:
        raise ReleaseFailed(f"{course.root / 'source'} holds no assignment")
    with scratch_course(course) as root:
        scratch = root.parent
        record_file = scratch / "steps.json"
        argv = [sys.executable, "-m", "grader.steps", str(root), "--steps", "generate",
                "--result", str(record_file)]
        for assignment in assignments:
            argv += ["--assignment", assignment.name]
        child = run_limited(argv, cwd=root, env=child_environment(scratch), timeout=timeout)
        if child.timed_out:
            raise ReleaseFailed(f"nbgrader generate_assignment ran past {timeout:g} s")
        try:
            record = json.loads(record_file.read_text())
        except (OSError, json.JSONDecodeError):
            record = {}
        if child.returncode != 0 or record.get("failed"):
            failed = record.get("failed") or {}
            tail = [line for line in child.stderr.splitlines() if line.strip()]
            message = failed.get("message") or (tail[-1] if tail else f"exit status {child.returncode}")
            raise ReleaseFailed(
                f"nbgrader generate_assignment failed for {failed.get('assignment', '?')}: {message}"
            )

        staged: list[tuple[Path, Path]] = []
        for assignment in assignments:
            for source in assignment.notebooks:
                released = root / "release" / assignment.name / source.name
                if not released.is_file():
                    raise ReleaseFailed(f"nbgrader produced no {released.relative_to(root)}")
                check_no_leaks(
                    json.loads(source.read_text(encoding="utf-8")),
                    json.loads(released.read_text(encoding="utf-8")),
                    f"{assignment.name}/{source.name}",
                )
                staged.append((released, out / assignment.name / source.name))

        written = []
        for released, target in staged:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(released, target)
            written.append(target)
    return written
