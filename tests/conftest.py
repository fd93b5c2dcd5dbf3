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
