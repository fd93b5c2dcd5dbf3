"""Ring allreduce on real MPI processes: mpiexec -n 2..4 as a subprocess, with a timeout."""
import subprocess
from pathlib import Path

import pytest

from reference_impl.comm.mpi import mpiexec_command

ROOT = Path(__file__).resolve().parent.parent

PROGRAMS = ROOT / "tests" / "mpi_programs"


def _mpiexec(n, program, timeout=120):
    return subprocess.run(
        mpiexec_command(n, str(PROGRAMS / program)),
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )


@pytest.mark.parametrize("n_ranks", [2, 3, 4])
def test_ring_allreduce_equals_mpi_allreduce(n_ranks):
    run = _mpiexec(n_ranks, "allreduce_vs_mpi.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"OK {n_ranks * 6 * 4 * 4} comparisons on {n_ranks} ranks" in run.stdout


def test_mismatched_lengths_fail_fast_with_a_clear_error():
    run = _mpiexec(2, "mismatched_lengths.py", timeout=60)
    assert run.returncode != 0
    assert "UNREACHABLE" not in run.stdout
    assert "allreduce on rank" in run.stderr and "same number of elements" in run.stderr, run.stderr
