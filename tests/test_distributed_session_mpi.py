"""The distributed session on real MPI processes: ``mpiexec -n 3`` (a master and two workers)
runs random DAGs in ONE subprocess and checks them bit for bit against ``Session``, then
checks that a worker failing mid-step is reported to the client without hanging the job; a
second job kills a worker process mid-step and checks that the client hears of it in time."""
import os
import subprocess
import time
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


@pytest.mark.timeout(30)
def test_a_worker_process_that_dies_mid_step_is_reported_to_the_client_within_the_timeout():
    """Rank 2 ends its process inside a kernel; the client's StepError names it after ~3 s."""
    command = mpiexec_command(3, str(ROOT / "tests" / "mpi_programs" / "distributed_die.py"))
    command.insert(1, "-disable-auto-cleanup")  # MPICH would otherwise kill the survivors at once
    start = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, timeout=15, cwd=ROOT,
                         env={**os.environ, "LAB_COMM_TIMEOUT": "3"})
    assert time.monotonic() - start < 15
    out = run.stdout + run.stderr
    assert run.returncode == 3, out  # the dead rank's exit code; the survivors exited with 0
    report = run.stdout.split("REPORT ", 1)[1].splitlines()
    seconds, second = map(float, report[0].split())
    assert 2.9 < seconds < 4.5, out  # the communicator's timeout (3 s) bounds the wait
    assert second < 0.5, out  # the dead worker is marked unavailable: no second wait
    dead = "/job:worker/replica:0/task:1/device:CPU:0"
    assert f"worker {dead} (rank 2) did not answer RunGraph" in report[1], out
    # the survivor that waited for the dead worker's tensor names it and the rendezvous key
    assert f"for '{dead};/job:worker/replica:0/task:0/device:CPU:0;dead:0;2' from peer {dead} (rank 2)" \
        in report[1], out
    assert f"worker {dead} is unavailable" in report[2], out
