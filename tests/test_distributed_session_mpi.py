"""The distributed session on real MPI processes: ``mpiexec -n 3`` (a master and two workers)
runs random DAGs in ONE subprocess and checks them bit for bit against ``Session``, then
checks that a worker failing mid-step is reported to the client without hanging the job."""
import os
import subprocess
from pathlib import Path

import pytest

from reference_impl.comm.mpi import mpiexec_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(150)
def test_random_dags_on_three_mpi_ranks_match_the_session_and_failures_are_reported():
    run = subprocess.run(
        mpiexec_command(3, str(ROOT / "tests" / "mpi_programs" / "distributed_dags.py")),
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "LAB_COMM_TIMEOUT": "30"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK 10 random DAGs bit-identical on 2 MPI workers" in run.stdout
    assert "OK a failing worker was reported and the next step ran" in run.stdout
