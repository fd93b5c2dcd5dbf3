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
# so a new test is marked without anyone remembering to: ``mpi`` when it (or a helper or
# fixture it uses) runs ``mpiexec``; ``browser`` when it drives Chromium through Playwright;
# ``grader`` when it grades notebooks (``python -m grader``, the session's ``graded``);
# ``slow`` when it needs the strict site build (``built_site``, 20 s and more) or is one of
# SLOW_TESTS, measured at over about 5 s on 2 cores (pytest --durations). A test may also
# carry a marker written on it.
_WHAT_MARKS = {
    "mpi": ("mpiexec", "mpi_programs"),
    "browser": ("sync_playwright", "chromium_or_skip", "new_page("),
    "grader": ("GradedExercises", "grader_argv", "Started(", '"grader"', "check_notebook", "grader.check",
               "grader.steps"),
}
_FIXTURE_MARKS = {"site_url": "browser", "graded": "grader", "built_site": "slow"}
# The suite's shared helpers (tests/*.py that are not test modules) count as part of a test.
_HELPER_MODULES = ("notebook_tools", "learner_account", "browser_tools", "page_tools")
SLOW_MODULES = frozenset({
    "test_hostile",  # every test waits on a sandboxed kernel's limits
    "test_as_learner",  # the site build, a release and the benchmarks, run as the learner
    "test_site_visuals",  # its module fixture renders every plot of the site (10 s)
})
SLOW_TESTS = frozenset({
    "test_sharded_bench.py::test_small_sections_give_the_schema_the_plotter_reads",
    "test_exercise_03.py::test_a_partner_that_is_not_symmetric_deadlocks_and_gets_its_hint_in_process",
    "test_wide_deep_bench.py::test_quick_wide_deep_section_tunes_on_validation_only",
    "test_install.py::test_the_wheel_gives_the_console_scripts_outside_a_checkout",
})


def _source_of(function) -> str:
    import inspect

    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _sources(item) -> str:
    """The source of the test, of the fixtures it uses, and of the functions of its module
    (and of the shared helpers) that these name: one level, which is how the suite is written."""
    import ast
    import inspect
    import textwrap

    module = item.module
    fixtures = [d.func for defs in getattr(item, "_fixtureinfo").name2fixturedefs.values() for d in defs
                if getattr(d.func, "__module__", "") in (module.__name__, *_HELPER_MODULES)]
    parts = [_source_of(f) for f in [item.function, *fixtures]]
    names = set()
    for text in parts:
        try:
            names |= {n.id for n in ast.walk(ast.parse(textwrap.dedent(text))) if isinstance(n, ast.Name)}
        except SyntaxError:
            pass
    for name in names:
        helper = getattr(module, name, None)
        if inspect.isfunction(helper) and helper.__module__ in (module.__name__, *_HELPER_MODULES):
            parts.append(_source_of(helper))
    return "\n".join(parts)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if getattr(item, "function", None) is None:
            continue
        text = _sources(item)
        wanted = {mark for mark, needles in _WHAT_MARKS.items() if any(n in text for n in needles)}
        wanted |= {_FIXTURE_MARKS[f] for f in getattr(item, "fixturenames", ()) if f in _FIXTURE_MARKS}
        name = item.module.__name__.rpartition(".")[2]
        if name in SLOW_MODULES or f"{name}.py::{item.originalname}" in SLOW_TESTS:
            wanted.add("slow")
        for mark in sorted(wanted - {m.name for m in item.iter_markers()}):
            item.add_marker(mark)
