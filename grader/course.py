"""The nbgrader course: where it lives, which assignments it has, and whose notebook is whose.

The course root is ``exercises/`` (``nbgrader_config.py`` plus ``source/<assignment>/``).
The grader never works in it directly: every command runs in a throwaway copy
(``scratch_course``), so grading or releasing leaves no gradebook, no submission and no
generated file in the repository.

Learner input is checked here, before any child process starts, so that a wrong path or a
file that is not a notebook gives one clear line (``InputProblem``) instead of a traceback.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "nbgrader_config.py"
SOURCE_DIR = "source"


class InputProblem(Exception):
    """The learner's input cannot be graded: missing file, not a notebook, unknown assignment."""


def repo_root() -> Path:
    """The checkout this package belongs to (the folder holding ``grader/``)."""
    return Path(__file__).resolve().parent.parent


def default_course_root() -> Path:
    """``exercises/`` of this checkout, else of the current directory."""
    for candidate in (repo_root() / "exercises", Path.cwd() / "exercises"):
        if (candidate / CONFIG_FILE).is_file():
            return candidate
    return repo_root() / "exercises"


@dataclass(frozen=True)
class Assignment:
    """One assignment of the course: ``source/<name>/`` and the notebooks in it."""

    name: str
    source_dir: Path

    @property
    def notebooks(self) -> list[Path]:
        """The source notebooks of this assignment, sorted by name."""
        return sorted(self.source_dir.glob("*.ipynb"))


@dataclass(frozen=True)
class Course:
    """An nbgrader course root on disk (normally ``exercises/``)."""

    root: Path

    @classmethod
    def at(cls, root: Path | None = None) -> Course:
        """The course at ``root`` (default: this checkout's ``exercises/``), checked to exist."""
        if root is None and not (default_course_root() / CONFIG_FILE).is_file():
            # An installed copy (pip install, not a checkout) run outside a checkout: the
            # course is not part of the package.
            raise InputProblem(
                "no course here: the grader needs a checkout of the lab (its exercises/ folder); "
                "run it inside the checkout, or pass --course DIR"
            )
        root = (root or default_course_root()).resolve()
        if not (root / CONFIG_FILE).is_file() or not (root / SOURCE_DIR).is_dir():
            raise InputProblem(
                f"{root} is not a course root: expected {CONFIG_FILE} and {SOURCE_DIR}/ in it"
            )
        return cls(root)

    def cell_timeout(self) -> int | None:
        """The per-cell time limit the course's ``nbgrader_config.py`` sets, in seconds (None if unset)."""
        import re

        text = (self.root / CONFIG_FILE).read_text(encoding="utf-8")
        match = re.search(r"^c\.ExecutePreprocessor\.timeout\s*=\s*(\d+)", text, re.MULTILINE)
        return int(match.group(1)) if match else None

    @property
    def assignments(self) -> list[Assignment]:
        """Every ``source/<name>/`` folder holding at least one notebook, sorted by name."""
        found = []
        for folder in sorted((self.root / SOURCE_DIR).iterdir()):
            if folder.is_dir() and any(folder.glob("*.ipynb")):
                found.append(Assignment(folder.name, folder))
        return found

    def assignment(self, name: str) -> Assignment | None:
        """The assignment called ``name``, or None."""
        for assignment in self.assignments:
            if assignment.name == name:
                return assignment
        return None

    def identify(self, notebook: Path, content: dict[str, Any],
                 claimed: str | None = None) -> tuple[Assignment, str]:
        """Which assignment, and which of its notebooks, ``notebook`` is an attempt at.

        The notebook's own metadata (``lab.assignment``) says what it is; ``claimed`` (the
        learner's ``--assignment``) names it when it has none. When the metadata, the claim
        and the file name disagree, the learner gets one line saying which is which, instead
        of a grade for the wrong assignment. Returns the assignment and the source notebook's
        file name (the name nbgrader expects the submission to have).
        """
        lab = content.get("metadata", {}).get("lab", {})
        declared = lab.get("assignment") if isinstance(lab, dict) else None
        known = ", ".join(a.name for a in self.assignments) or "none"
        by_name = [a for a in self.assignments if notebook.name in {p.name for p in a.notebooks}]
        if claimed is not None:
            wanted = self.assignment(claimed)
            if wanted is None:
                raise InputProblem(f"--assignment {claimed}: no such assignment; this course has: {known}")
            if declared is not None and str(declared) != wanted.name:
                raise InputProblem(f"{notebook}: this notebook is {declared} (its metadata), not {wanted.name}")
        elif declared is not None:
            wanted = self.assignment(str(declared))
            if wanted is None:
                raise InputProblem(
                    f"{notebook}: unknown assignment {declared!r} in its metadata "
                    f"(lab.assignment); this course has: {known}"
                )
            if by_name and wanted not in by_name:
                raise InputProblem(
                    f"{notebook}: this notebook is {wanted.name}, not {by_name[0].name} as its file name "
                    f"says; grade it with --assignment {wanted.name}, or check the notebook of {by_name[0].name}"
                )
        elif len(by_name) == 1:
            return by_name[0], notebook.name
        else:
            raise InputProblem(
                f"{notebook}: which assignment is this? The notebook has no lab.assignment metadata and "
                f"its name matches no source/*/{notebook.name}; name it with --assignment (one of: {known})"
            )
        names = [p.name for p in wanted.notebooks]
        if notebook.name in names:
            return wanted, notebook.name
        if len(names) == 1:
            return wanted, names[0]
        raise InputProblem(
            f"{notebook}: assignment {wanted.name} has several notebooks "
            f"({', '.join(names)}); rename the file to the one it answers"
        )


def load_notebook(path: Path) -> dict[str, Any]:
    """Read ``path`` as an nbformat-4 notebook (plain JSON, structure checked).

    Raises ``InputProblem`` naming the file when it is missing, unreadable, not JSON, or
    JSON that is not a notebook. Deeper validation is left to nbgrader in the child process.
    """
    if not path.exists():
        raise InputProblem(f"{path}: no such file")
    if not path.is_file():
        raise InputProblem(f"{path}: not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputProblem(f"{path}: cannot be read as a notebook ({exc.__class__.__name__}: {exc})") from None
    try:
        content = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputProblem(
            f"{path}: not a Jupyter notebook (invalid JSON at line {exc.lineno}: {exc.msg})"
        ) from None
    if not isinstance(content, dict) or "nbformat" not in content:
        raise InputProblem(f"{path}: not a Jupyter notebook (JSON without an 'nbformat' version)")
    version = content.get("nbformat")
    if not isinstance(version, int) or version < 4:
        raise InputProblem(
            f"{path}: not a Jupyter notebook of a supported version (nbformat {version!r}; need 4)"
        )
    cells = content.get("cells")
    if not isinstance(cells, list) or not all(
        isinstance(c, dict) and "cell_type" in c and "source" in c for c in cells
    ):
        raise InputProblem(f"{path}: not a valid Jupyter notebook (its 'cells' are malformed)")
    if not isinstance(content.get("metadata", {}), dict):
        raise InputProblem(f"{path}: not a valid Jupyter notebook (its 'metadata' is not an object)")
    return content


def cell_source(cell: dict[str, Any]) -> str:
    """A cell's source as one string (nbformat allows a string or a list of lines)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


@contextlib.contextmanager
def scratch_course(course: Course, assignments: list[Assignment] | None = None) -> Iterator[Path]:
    """A temporary copy of the course (config and ``source/`` only), deleted afterwards.

    nbgrader writes its gradebook, ``release/``, ``submitted/``, ``autograded/`` and
    ``feedback/`` under the copy, so nothing of a run ever lands in the repository. With
    ``assignments``, only their sources are copied (grading one notebook needs only its own).
    """
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
    with tempfile.TemporaryDirectory(prefix="dl-lab-grader-") as tmp:
        root = Path(tmp) / "course"
        root.mkdir()
        shutil.copy2(course.root / CONFIG_FILE, root / CONFIG_FILE)
        if assignments is None:
            shutil.copytree(course.root / SOURCE_DIR, root / SOURCE_DIR, ignore=ignore)
        else:
            for assignment in assignments:
                shutil.copytree(assignment.source_dir, root / SOURCE_DIR / assignment.name, ignore=ignore)
        yield root
