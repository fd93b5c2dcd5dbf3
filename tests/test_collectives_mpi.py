"""Every collective on real MPI processes: against the MPI library's own, and when ranks misbehave.

Each test launches ``mpiexec -n 2..4`` as a subprocess (programs in tests/mpi_programs/)
with a timeout, so a hang fails the test instead of the suite.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from reference_impl.comm.mpi import TIMEOUT_ENV, mpiexec_command, timeout_from_env

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "mpi_programs"

pytestmark = pytest.mark.timeout(180)


def _mpiexec(n: int, program: str, *args: str, timeout: float = 120, env: dict | None = None):
    return subprocess.run(
        mpiexec_command(n, str(PROGRAMS / program), *args),
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env,
    )


@pytest.mark.parametrize("n_ranks", [2, 3, 4])
def test_every_collective_equals_the_mpi_library(n_ranks):
    run = _mpiexec(n_ranks, "collectives_vs_mpi.py")
    assert run.returncode == 0, run.stdout + run.stderr
    # Per length (6) and dtype (4): 5 ops for floats, 4 for integers = 18 (op, dtype) pairs a
    # length. Each rank checks 5 allreduce variants + reduce_scatter per pair, plus allgather and
    # broadcast per dtype; reduce is checked on its root only.
    per_length = n_ranks * (18 * 6 + 4 * 2) + 18
    assert f"OK {6 * per_length} comparisons on {n_ranks} ranks" in run.stdout, run.stdout


MISMATCHES = [
    ("length", "allreduce:ring"), ("length", "allreduce:recursive_doubling"),
    ("length", "allreduce:rabenseifner"), ("length", "allreduce:tree"), ("length", "allreduce:auto"),
    ("length", "reduce_scatter"), ("length", "broadcast"), ("length", "reduce"),
    ("dtype", "allreduce:ring"), ("dtype", "allreduce:recursive_doubling"),
    ("dtype", "allreduce:rabenseifner"), ("dtype", "allreduce:tree"),
    ("dtype", "allgather"), ("dtype", "broadcast"),
]


@pytest.mark.parametrize("case, collective", MISMATCHES)
def test_mismatch_fails_fast_naming_rank_and_sizes(case, collective):
    """Lengths differ (float32: 8 vs 9 elements), or dtypes of the same size differ (float32 vs int32)."""
    start = time.monotonic()
    run = _mpiexec(3, "collective_failures.py", case, collective, timeout=60)
    assert run.returncode != 0 and "UNREACHABLE" not in run.stdout, run.stdout + run.stderr
    assert time.monotonic() - start < 30, "a mismatch must not wait for the communication timeout"
    name = collective.split(":")[0]
    assert f"CommError: {name} on rank" in run.stderr, run.stderr
    if case == "length":
        assert "input of 8 elements" in run.stderr or "input of 9 elements" in run.stderr, run.stderr
        assert "bytes" in run.stderr and "receive buffer" in run.stderr, run.stderr
    else:
        assert "holds int32 data" in run.stderr or "holds float32 data" in run.stderr, run.stderr


@pytest.mark.parametrize("collective", ["allreduce:ring", "allreduce:tree"])
def test_a_rank_that_never_joins_aborts_the_job_after_the_timeout(collective):
    """The last of 3 ranks sleeps instead of joining: the others give up after LAB_COMM_TIMEOUT."""
    env = dict(os.environ, **{TIMEOUT_ENV: "1.5"})
    start = time.monotonic()
    run = _mpiexec(3, "collective_failures.py", "skip", collective, timeout=60, env=env)
    elapsed = time.monotonic() - start
    assert run.returncode != 0 and "UNREACHABLE" not in run.stdout, run.stdout + run.stderr
    assert 1.5 <= elapsed < 30, elapsed  # the sleeping rank was aborted, not waited for
    assert "still waiting for a message from rank" in run.stderr and "after 1.5 s" in run.stderr, run.stderr
    assert "CommError: allreduce on rank" in run.stderr, run.stderr


def test_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert timeout_from_env() == 60.0
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert timeout_from_env() == 2.5
    for bad in ("soon", "0", "-1", "nan"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"{TIMEOUT_ENV}='{bad}': expected a positive number"):
            timeout_from_env()
