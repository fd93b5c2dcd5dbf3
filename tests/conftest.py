"""Shared test settings: the repository root, one BLAS thread in this process, seeds for
reproducible random inputs, and the exercises graded once a session (``graded``)."""
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

# Thread ranks share this process: with BLAS free to start a thread per core for each rank's
# matmul, two ranks on two cores oversubscribe the machine and a rank's communication thread
# may not run until backward has ended, which the overlap tests read as no overlap (they
# failed about one run in two here). One BLAS thread per rank is what a real job has, a
# process per rank on its own cores. The limit holds in this process only: MPI ranks and
# grading kernels, started as processes, keep their libraries' defaults.
_ONE_BLAS_THREAD = threadpool_limits(limits=1, user_api="blas")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)


@pytest.fixture(scope="session")
def graded(tmp_path_factory):
    """``graded(assignment)``: an assignment of tests/exercise_specs.py graded through ``python -m
    grader`` (release, release with solutions, wrong solutions: at once), once a session, shared by
    tests/test_exercises.py and tests/test_exercise_NN.py (``notebook_tools.GradedExercises``)."""
    from notebook_tools import GradedExercises

    return GradedExercises(tmp_path_factory)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    """The site, built once a session with ``mkdocs build --strict`` (as ``make site`` does),
    shared by every test that reads or browses the built HTML."""
    import os
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.fixture(scope="session")
def site_url(built_site):
    """The session's built site served over HTTP on 127.0.0.1 (a free port); its base URL."""
    from browser_tools import serve_directory

    with serve_directory(built_site) as url:
        yield url


# --- markers: `make test-fast` deselects what starts processes, a browser or a grading run ---
# Registered in pyproject.toml (with --strict-markers). Applied here from what a test does,
# so a new test is marked without anyone remembering to: ``mpi`` when it (or a helper of its
# module that it calls) runs ``mpiexec``; ``browser`` when it drives Chromium through
# Playwright; ``grader`` when it grades notebooks (the session's ``graded`` fixture, or
# ``python -m grader``); ``slow`` for the tests in SLOW_MODULES (> ~5 s each on 2 cores).
# A test may also carry a marker written on it.
_WHAT_MARKS = {
    "mpi": ("mpiexec", "mpi_programs"),
    "browser": ("sync_playwright", "chromium", "new_page(", "browser_tools"),
    "grader": ("GradedExercises", "grader_argv", "Started(", '"grader"', "check_notebook", "grader.check", "grader.steps"),
}
_FIXTURE_MARKS = {"site_url": "browser", "browser": "browser", "graded": "grader", "learner": "grader"}
# The suite's shared helpers (tests/*.py that are not test modules) count as part of a test.
_HELPER_MODULES = ("notebook_tools", "learner_account", "browser_tools", "page_tools")
SLOW_MODULES = frozenset({
    "test_as_learner", "test_hostile", "test_grader_device", "test_accessibility", "test_site_visuals",
    "test_practice", "test_virtual_cluster", "test_hybrid", "test_moe_page", "test_layout_calculator",
})


def _sources(function, module) -> str:
    """The source of ``function`` and of the functions of its module that it names (one level)."""
    import ast
    import inspect

    try:
        text = inspect.getsource(function)
    except (OSError, TypeError):
        return ""
    parts = [text]
    try:
        names = {n.id for n in ast.walk(ast.parse(inspect.cleandoc(text) if text[:1].isspace() else text))
                 if isinstance(n, ast.Name)}
    except SyntaxError:
        names = set()
    for name in names:
        helper = getattr(module, name, None)
        if inspect.isfunction(helper) and helper.__module__ in (module.__name__, *_HELPER_MODULES) \
                and helper is not function:
            try:
                parts.append(inspect.getsource(helper))
            except (OSError, TypeError):
                pass
    return "\n".join(parts)


def pytest_collection_modifyitems(config, items):
    for item in items:
        function = getattr(item, "function", None)
        if function is None:
            continue
        text = _sources(function, item.module)
        wanted = {mark for mark, needles in _WHAT_MARKS.items() if any(n in text for n in needles)}
        wanted |= {_FIXTURE_MARKS[f] for f in getattr(item, "fixturenames", ()) if f in _FIXTURE_MARKS}
        if item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
            wanted.add("slow")
        for mark in sorted(wanted - {m.name for m in item.iter_markers()}):
            item.add_marker(mark)
