"""``python -m grader release`` (the instructor's) and ``start`` (the learner's): learner versions.

nbgrader's ``generate_assignment`` runs in a scratch copy of the course; only the released
notebooks are copied out (``<out>/<assignment>/<notebook>.ipynb``), never the gradebook that
holds the hidden tests. Before anything is written, every released notebook is checked for
leaks: no solution or hidden-test delimiter, and no line that only appears inside a solution
or hidden-test region of the source. A leak is an error (``ReleaseLeak``), not a warning:
a released notebook with the answers in it cannot be taken back.

Neither command destroys a learner's work. ``start`` copies assignments into the
learner's own folder (``work/<assignment>/``) and never replaces a file there; ``release``
replaces a notebook only while it is exactly what was released before (``.released.json``).
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .course import Assignment, Course, InputProblem, cell_source, scratch_course
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


def _strip_written_hints(notebook: dict) -> int:
    """Take the instructor's hints (``lab.hint``, ``lab.hints``, ``lab.read``, grader.hints) out of
    a learner notebook's cells: the grader shows each one when its mistake happens, and reads
    them from the course, never from the learner's copy. Returns how many cells had some."""
    stripped = 0
    for cell in notebook.get("cells", []):
        lab = cell.get("metadata", {}).get("lab")
        if isinstance(lab, dict) and {"hint", "hints", "read"} & set(lab):
            for key in ("hint", "hints", "read"):
                lab.pop(key, None)
            if not lab:
                del cell["metadata"]["lab"]
            stripped += 1
    return stripped


MANIFEST = ".released.json"  # in the release folder: the hash of every notebook as it was released


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Released:
    """What a release did: the notebooks written, and those kept because someone edited them."""

    written: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)


def generate_release(course: Course, assignments: list[Assignment], root: Path, *,
                     timeout: float = DEFAULT_TIMEOUT) -> list[tuple[Path, str]]:
    """Run nbgrader's ``generate_assignment`` in the scratch course ``root``; the released
    notebooks, each with its path relative to a release folder, checked for leaks and with
    the written hints taken out."""
    if not assignments:
        raise ReleaseFailed(f"{course.root / 'source'} holds no assignment")
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
    staged = []
    for assignment in assignments:
        for source in assignment.notebooks:
            released = root / "release" / assignment.name / source.name
            if not released.is_file():
                raise ReleaseFailed(f"nbgrader produced no {released.relative_to(root)}")
            content = json.loads(released.read_text(encoding="utf-8"))
            check_no_leaks(json.loads(source.read_text(encoding="utf-8")), content,
                           f"{assignment.name}/{source.name}")
            _strip_written_hints(content)
            released.write_text(in_jupyter_form(content), encoding="utf-8")
            staged.append((released, f"{assignment.name}/{source.name}"))
    return staged


def python_language_info() -> dict:
    """The ``language_info`` the learner's kernel reports (ipykernel's ``kernel_info`` reply:
    name, version, lexers, file extension), for this interpreter, the one the kernel runs.

    JupyterLab writes the kernel's ``language_info`` into the notebook's metadata once the
    kernel has started; a notebook that holds less (``{"name": "python"}``, as the sources do)
    is then marked modified the moment it is opened, before the learner has typed anything
    (tests/test_jupyterlab_open.py)."""
    from ipykernel.ipkernel import IPythonKernel

    return json.loads(json.dumps(IPythonKernel.language_info))


def in_jupyter_form(content: dict) -> str:
    """``content`` as the text Jupyter itself saves, so that opening the notebook changes nothing.

    Jupyter's contents manager reads a notebook with ``nbformat.reads`` and saves it with
    ``nbformat.write(nb, version=nbformat.NO_CONVERT)`` (jupyter_server/services/contents/fileio.py,
    ``_read_notebook`` and ``_save_notebook``): sorted keys, one-space indent, a final newline
    (nbformat/__init__.py, ``write``). nbformat's ``validator.normalize`` first adds what a
    reader would add (cell ids of nbformat 4.5, for one), so the released file already holds it,
    and the metadata gets the kernel's full ``language_info`` (``python_language_info``).
    """
    import nbformat
    from nbformat.validator import normalize

    _, normalised = normalize(content)
    metadata = normalised.setdefault("metadata", {})
    if metadata.get("kernelspec", {}).get("language") == "python":
        metadata["language_info"] = python_language_info()
    text = nbformat.writes(nbformat.from_dict(normalised), version=nbformat.NO_CONVERT)
    return text if text.endswith("\n") else text + "\n"


def release_all(course: Course, out: Path, *, timeout: float = DEFAULT_TIMEOUT) -> Released:
    """Generate every assignment's learner version into ``out``, never over an edited notebook.

    ``out/.released.json`` holds the hash of each notebook as released. A notebook already in
    ``out`` is replaced only if it is still exactly what was released (or what would be
    released now); one that differs was edited, by a learner who worked in it, and is kept
    as it is and reported, whatever the cost of a stale release.
    """
    source_dir = (course.root / "source").resolve()
    if out.resolve() == source_dir or source_dir in out.resolve().parents:
        raise ReleaseFailed(f"refusing to write the release into the course sources ({out})")
    manifest_path = out / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        manifest = {}
    done = Released()
    with scratch_course(course) as root:
        for released, relative in generate_release(course, course.assignments, root, timeout=timeout):
            target = out / relative
            new_hash = _sha256(released)
            if target.exists():
                old_hash = _sha256(target)
                if old_hash != new_hash and manifest.get(relative) != old_hash:
                    done.kept.append(target)
                    continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(released, target)
            manifest[relative] = new_hash
            done.written.append(target)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return done


def find_assignment(course: Course, name: str) -> Assignment:
    """The assignment a learner means by ``name``: ``01``, ``1``, ``01_ring_allreduce`` or ``ring_allreduce``."""
    wanted = name.strip().rstrip("/").lower()
    for assignment in course.assignments:
        number, _, topic = assignment.name.partition("_")
        if wanted in (assignment.name.lower(), topic.lower()) or (wanted.isdigit() and number.isdigit()
                                                                  and int(wanted) == int(number)):
            return assignment
    known = ", ".join(a.name for a in course.assignments)
    raise InputProblem(f"no assignment {name!r} in the course; it has: {known}")


def start(course: Course, names: list[str], work: Path, *, timeout: float = DEFAULT_TIMEOUT) -> Released:
    """``python -m grader start NN ...``: the learner version of each assignment in ``work/<assignment>/``.

    A notebook already there is never touched, whatever it holds: it is the learner's work.
    """
    assignments = list(dict.fromkeys(find_assignment(course, name) for name in names))
    done = Released()
    missing = []
    for assignment in assignments:
        targets = [work / assignment.name / source.name for source in assignment.notebooks]
        done.kept += [t for t in targets if t.exists()]
        if not all(t.exists() for t in targets):
            missing.append(assignment)
    if not missing:
        return done
    with scratch_course(course, missing) as root:
        for released, relative in generate_release(course, missing, root, timeout=timeout):
            target = work / relative
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as f:  # exclusive: never replaces a file that appeared meanwhile
                f.write(released.read_bytes())
            done.written.append(target)
    return done
