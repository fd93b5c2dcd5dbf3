"""The install: the parts of nbgrader, nbclient and nbconvert the grader patches or subclasses
are still there as it expects them, the versions are bounded and pinned, and the package
installed from a wheel (not a checkout) gives working console scripts.

grader/steps.py replaces ``Execute.preprocess_cell`` and ``nbgrader.api.get_alembic_version``,
imports nbgrader without running its ``__init__``, stands in for ``setuptools.archive_util``,
drives nbgrader's converters through ``temp_attrs`` and ``capture_log``, and grader/generated.py
recomputes cell checksums with ``compute_checksum``. None of that is public API: a new
release may rename or reshape it, and grading would then break in ways far from the cause.
Each check below names the internal it is about, so an upgrade that breaks one says which.
"""
from __future__ import annotations

import ast
import inspect
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import ROOT
from learner_account import learner

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
LOCK = ROOT / "requirements" / "constraints.txt"
PATCHED = ("nbgrader", "nbclient", "nbconvert")


def _site(package: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
    return Path(list(spec.submodule_search_locations)[0])


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def _library_function(cls: type, name: str):
    """``cls.name`` as the libraries define it, skipping a replacement grader.steps may have
    installed in this process (its functions live in grader.steps)."""
    for klass in cls.__mro__:
        function = vars(klass).get(name)
        if function is not None and not getattr(function, "__module__", "").startswith("grader"):
            return function
    raise AssertionError(f"{cls.__module__}.{cls.__name__}.{name} no longer exists")


# --------------------------------------------------------------------- the patched internals

def check_execute_preprocess_cell():
    """grader.steps._stop_at_first_timeout replaces it and calls the original as (self, cell, resources, index)."""
    from nbgrader.preprocessors.execute import Execute

    original = _library_function(Execute, "preprocess_cell")
    assert callable(original)
    assert _parameters(original) == ["self", "cell", "resources", "index"], _parameters(original)


def check_execute_get_timeout():
    """The override asks the cell's time limit with self._get_timeout(cell) (nbclient's NotebookClient)."""
    from nbgrader.preprocessors.execute import Execute

    assert _parameters(_library_function(Execute, "_get_timeout")) == ["self", "cell"]


def check_execute_shutdown_kernel_immediate():
    """grader.steps.Steps sets Execute.shutdown_kernel = "immediate" (an nbclient trait)."""
    from nbgrader.preprocessors.execute import Execute

    trait = Execute.class_traits().get("shutdown_kernel")
    assert trait is not None and "immediate" in trait.values, trait


def check_execute_kernel_pid():
    """The override kills a hung kernel through self.km.provisioner.pid (jupyter_client's LocalProvisioner)."""
    from jupyter_client.provisioning import LocalProvisioner
    from nbgrader.preprocessors.execute import Execute

    create = _library_function(Execute, "create_kernel_manager")  # nbclient's NotebookClient: sets self.km
    assert "self.km =" in inspect.getsource(create)
    assert hasattr(LocalProvisioner, "pid")


def check_nbclient_exceptions():
    """The override catches nbclient.exceptions.CellTimeoutError and DeadKernelError."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    assert issubclass(CellTimeoutError, Exception) and issubclass(DeadKernelError, Exception)


def check_get_alembic_version():
    """grader.steps._read_schema_version_in_process replaces nbgrader.api.get_alembic_version (no
    arguments, returns the head revision); the in-process answer must equal nbgrader's own."""
    import nbgrader.api
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    original = nbgrader.api.get_alembic_version
    if getattr(original, "__module__", "").startswith("grader"):  # replaced in this process: the closure holds it
        original = next(c.cell_contents for c in original.__closure__ if callable(c.cell_contents))
    assert not [p for p in inspect.signature(original).parameters.values() if p.default is p.empty]
    assert Path(ALEMBIC_DIR, "env.py").is_file(), ALEMBIC_DIR
    heads = ScriptDirectory(ALEMBIC_DIR).get_heads()
    assert len(heads) == 1, heads
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # nbgrader runs `alembic`
    old = os.environ.get("PATH")
    os.environ["PATH"] = path
    try:
        assert original() == heads[0]
    finally:
        os.environ["PATH"] = old or ""


def check_nbgrader_utils():
    """grader.steps and grader.generated call temp_attrs(app, **newvals), capture_log(app, ...) and
    compute_checksum(cell) from nbgrader.utils."""
    from nbgrader.utils import capture_log, compute_checksum, temp_attrs

    assert _parameters(temp_attrs) == ["app", "newvals"]
    assert _parameters(capture_log)[0] == "app"
    assert _parameters(compute_checksum) == ["cell"]


def check_setuptools_archive_util_stand_in():
    """grader.steps._lean_nbgrader stands in for setuptools.archive_util with unpack_archive,
    unpack_tarfile and unpack_zipfile: nbgrader.utils must import no other name from it."""
    tree = ast.parse((_site("nbgrader") / "utils.py").read_text(encoding="utf-8"))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "setuptools.archive_util" for alias in node.names}
    assert names <= {"unpack_archive", "unpack_tarfile", "unpack_zipfile"}, names


def check_lean_nbgrader_auth():
    """grader.steps._lean_nbgrader skips nbgrader.auth's __init__ and provides only Authenticator
    (from nbgrader.auth.base) and nbgrader.__version__ (from nbgrader._version)."""
    from nbgrader._version import __version__
    from nbgrader.auth.base import Authenticator

    assert __version__ and inspect.isclass(Authenticator)
    root = _site("nbgrader")
    used = set()
    for path in [root / "api.py", root / "coursedir.py", *root.glob("converters/*.py"),
                 *root.glob("preprocessors/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "auth":
                used |= {alias.name for alias in node.names}
    assert used <= {"Authenticator"}, used


def check_converter_traits():
    """grader.steps.Steps sets these traits on nbgrader's converters and course directory."""
    from nbgrader.converters.autograde import Autograde
    from nbgrader.converters.base import BaseConverter
    from nbgrader.converters.generate_assignment import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.preprocessors.execute import Execute

    wanted = {GenerateAssignment: {"force", "create_assignment"}, Autograde: {"force", "create_student"},
              BaseConverter: {"permissions"}, Execute: {"timeout"},
              CourseDirectory: {"root", "assignment_id", "student_id", "db_url", "course_id"}}
    for cls, traits in wanted.items():
        assert traits <= set(cls.class_traits()), f"{cls.__name__}: missing {traits - set(cls.class_traits())}"
    assert hasattr(BaseConverter, "start")  # capture_log calls app.start()


def check_gradebook_model():
    """grader.steps and grader.generated read and correct the gradebook through these."""
    from nbgrader import api

    assert _parameters(api.Gradebook.find_assignment) == ["self", "name"]
    assert _parameters(api.Gradebook.find_submission_notebook) == ["self", "notebook", "assignment", "student"]
    wanted = {api.SubmittedNotebook: {"grades"}, api.Grade: {"name", "score", "auto_score", "max_score"},
              api.Notebook: {"grade_cells", "solution_cells", "source_cells"},
              api.SourceCell: {"name", "source", "checksum", "locked", "cell_type"}, api.GradeCell: {"max_score"}}
    for cls, names in wanted.items():
        missing = {n for n in names if not hasattr(cls, n)}
        assert not missing, f"nbgrader.api.{cls.__name__}: missing {missing}"


CHECKS = [value for name, value in sorted(globals().items()) if name.startswith("check_")]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__.removeprefix("check_") for c in CHECKS])
def test_a_patched_internal_is_as_the_grader_expects(check):
    try:
        check()
    except (AssertionError, ImportError, AttributeError, TypeError, ValueError) as exc:
        pytest.fail(f"{check.__doc__.strip()}\n  -> no longer holds with nbgrader/nbclient/nbconvert "
                    f"{_versions()}: {type(exc).__name__}: {exc}\n  Fix grader/ for the new release, "
                    "then raise the bound in pyproject.toml and run `make lock`.")


def test_the_lean_import_still_grades():
    """In a fresh interpreter, as the grading child starts: nbgrader's converters import without
    its package __init__ and with the in-process schema version."""
    code = ("import sys\nfrom grader import steps\nsteps._lean_nbgrader()\nsteps._read_schema_version_in_process()\n"
            "steps._stop_at_first_timeout()\n"
            "import nbgrader.api, nbgrader.converters.autograde, nbgrader.converters.generate_assignment\n"
            "assert nbgrader.api.get_alembic_version.__module__ == 'grader.steps'\n"
            "assert 'nbgrader.server_extensions' not in ' '.join(sys.modules), 'nbgrader.__init__ ran'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in PATCHED}


# --------------------------------------------------------------------- bounds and the lock

def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    extras = {k: v for k, v in project["optional-dependencies"].items() if k not in ("gpu", "all")}
    return [Requirement(r) for r in [*project["dependencies"], *(r for rs in extras.values() for r in rs)]]


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"{LOCK.name}: not a name==version pin: {line!r}"
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_the_patched_libraries_are_bounded_and_the_installed_ones_are_the_pinned_ones():
    bounded = {r.name: r for r in _requirements() if r.name in PATCHED}
    assert set(bounded) == set(PATCHED)
    pins = _pins()
    for name, requirement in bounded.items():
        assert any(spec.operator == "<" for spec in requirement.specifier), f"{name}: no upper bound"
        assert requirement.specifier.contains(pins[name]), f"{name}: the lock's {pins[name]} is outside {requirement}"
        assert _versions()[name] == pins[name], f"{name}: installed {_versions()[name]}, locked {pins[name]} " \
                                               "(run make venv)"


def test_the_lock_pins_every_dependency_within_its_range():
    pins = _pins()
    for requirement in _requirements():
        name = requirement.name.lower().replace("_", "-")
        if name == "dl-systems-lab":
            continue
        assert name in pins, f"{name} is not pinned in {LOCK.relative_to(ROOT)}: run make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), \
            f"{name}: locked {pins[name]} is outside {requirement}"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"pip install .*-c \$\(LOCK\)", makefile) and "LOCK   := requirements/constraints.txt" in makefile


# --------------------------------------------------------------------- the wheel

SCRIPTS = ("dl-lab-grader", "dl-lab-bench", "dl-lab-train")


@pytest.fixture(scope="module")
def installed() -> Path:
    """The lab built as a wheel and installed (not editable) into a venv of its own; the
    dependencies come from this venv's site-packages through a .pth line, so nothing is
    downloaded. Returns the venv's bin/."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="dl-lab-wheel-"))  # not under pytest's 0700 folder: the learner runs it
    try:
        yield from _build_and_install(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _build_and_install(work: Path):
    source = work / "src"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"),
                            str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, f"pip wheel failed (make venv installs setuptools>=77):\n{built.stderr[-3000:]}"
    wheel = next((work / "dist").glob("dl_systems_lab-*.whl"))
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    site = next(venv.glob("lib/python3*/site-packages"))
    here = next(p for p in map(Path, sys.path) if p.name == "site-packages" and p.is_relative_to(sys.prefix))
    (site / "lab-dependencies.pth").write_text(f"{here}\n")
    work.chmod(0o755)
    yield venv / "bin"


@pytest.mark.slow
def test_the_wheel_gives_the_console_scripts_outside_a_checkout(installed, tmp_path):
    who = learner()
    away, scores = Path(tempfile_dir(who)), Path(tempfile_dir(who))
    try:
        where = who.run([str(installed / "python"), "-c", "import grader, benchmarks, reference_impl\n"
                        "print(grader.__file__, benchmarks.__file__, reference_impl.__file__)"], cwd=away)
        assert where.returncode == 0, where.stderr
        assert all(Path(p).is_relative_to(installed.parent) for p in where.stdout.split()), where.stdout
        for script in SCRIPTS:
            proc = who.run([str(installed / script), "--help"], cwd=away, timeout=120)
            assert proc.returncode == 0 and "usage:" in proc.stdout, f"{script} --help:\n{proc.stdout}{proc.stderr}"
        assert who.run([str(installed / "dl-lab-grader"), "--help"], cwd=away).stdout.startswith("usage: dl-lab-grader")
        assert "--strategy" in who.run([str(installed / "dl-lab-train"), "--help"], cwd=away).stdout
        listed = who.run([str(installed / "dl-lab-bench"), "--list"], cwd=away).stdout.split()
        assert "allreduce" in listed and "cluster" not in listed
        # what needs the checkout says so, in one line, and changes nothing
        for argv in (["list"], ["start", "01"]):
            proc = who.run([str(installed / "dl-lab-grader"), *argv], cwd=away, timeout=120)
            assert proc.returncode != 0
            assert "needs a checkout of the lab" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
                proc.stderr
        assert list(away.iterdir()) == []
        # inside a checkout the installed command finds its course from the current directory
        # (its scores from a folder of the learner's: this checkout's grader-feedback/ is not theirs)
        proc = who.run([str(installed / "dl-lab-grader"), "list", "--feedback-dir", str(scores)], cwd=ROOT,
                       timeout=120)
        assert proc.returncode == 0 and "01_ring_allreduce" in proc.stdout, proc.stderr
    finally:
        shutil.rmtree(away, ignore_errors=True)
        shutil.rmtree(scores, ignore_errors=True)


def tempfile_dir(who) -> str:
    """An empty folder the learner owns, outside any checkout."""
    import tempfile

    path = tempfile.mkdtemp(prefix="dl-lab-away-")
    if who.switch:
        os.chown(path, who.uid, who.gid)
    return path


def test_the_wheel_carries_the_c_sources_and_no_tests(installed):
    site = next(installed.parent.glob("lib/python3*/site-packages"))
    assert (site / "reference_impl" / "custom_ops" / "lab_op.h").is_file()
    assert list((site / "reference_impl" / "custom_ops" / "kernels").glob("*.c"))
    assert not (site / "tests").exists() and not (site / "docs").exists() and not (site / "exercises").exists()
    licences = {p.name for p in site.glob("dl_systems_lab-*.dist-info/licenses/*")}
    assert licences == {"LICENSE", "LICENSE-docs"}
