"""Shared test settings: the repository root, one BLAS thread in this process, and seeds for
reproducible random inputs."""
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
