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
