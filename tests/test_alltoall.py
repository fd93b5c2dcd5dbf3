"""alltoall (pairwise exchange, Bruck) and alltoallv: on thread ranks against NumPy, and under MPI.

* results equal the NumPy transposition of the stacked inputs exactly, for p = 1..8,
  float32 and int64, several block shapes (including empty blocks);
* alltoallv handles uneven and zero-length counts, and ``recv_counts`` given by the caller;
* they run on the array_api_strict namespace (nothing outside the array API);
* the bytes each rank sends (CountingCommunicator) are the closed forms' byte terms:
  (p - 1) / p of the buffer for pairwise, ``sum_k b_k`` blocks for Bruck (half the buffer a
  step when p is a power of two);
* under ``mpiexec -n 2, 3, 4`` both equal mpi4py's ``Alltoall`` / ``Alltoallv`` bit for bit.
"""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import (
    ALLTOALL_ALGORITHMS, CommError, CountingCommunicator, alltoall, alltoallv, run_threads,
)
from reference_impl.comm.alltoall import bruck_blocks_per_step
from reference_impl.comm.cost_model import LinkParams, bruck_alltoall_time, pairwise_alltoall_time
from reference_impl.comm.mpi import mpiexec_command

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "mpi_programs"

pytestmark = pytest.mark.timeout(180)

RANKS = range(1, 9)
DTYPES = (np.float32, np.int64)


def inputs(p: int, block: tuple[int, ...], dtype, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + p)
    return [rng.integers(-1000, 1000, size=(p, *block)).astype(dtype) for _ in range(p)]


@pytest.mark.parametrize("algorithm", ALLTOALL_ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", RANKS)
def test_alltoall_is_the_transpose_of_the_blocks(p, dtype, algorithm):
    for block in [(1,), (5,), (3, 2), (0,)]:
        xs = inputs(p, block, dtype)
        expected = np.stack(xs).swapaxes(0, 1)  # expected[r][i] = xs[i][r]
        got = run_threads(p, lambda comm: alltoall(comm, xs[comm.rank], algorithm=algorithm))
        for r in range(p):
            assert got[r].dtype == dtype and got[r].shape == xs[r].shape
            np.testing.assert_array_equal(got[r], expected[r])


def test_alltoall_random_floats_bit_exact():
    p = 5
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((p, 7)).astype(np.float32) for _ in range(p)]
    for algorithm in ALLTOALL_ALGORITHMS:
        got = run_threads(p, lambda comm: alltoall(comm, xs[comm.rank], algorithm=algorithm))
        for r in range(p):
            for i in range(p):
                assert got[r][i].tobytes() == xs[i][r].tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", RANKS)
def test_alltoallv_uneven_and_empty_counts(p, dtype):
    rng = np.random.default_rng(p)
    counts = rng.integers(0, 6, size=(p, p))  # counts[src, dst]; about 1 in 6 is empty
    counts[0, :] = 0  # rank 0 sends nothing at all
    if p > 1:
        counts[:, 1] = 0  # and rank 1 receives nothing
    blocks = [[rng.integers(-99, 99, size=int(counts[s, d])).astype(dtype) for d in range(p)] for s in range(p)]
    got = run_threads(p, lambda comm: alltoallv(comm, blocks[comm.rank]))
    given = run_threads(p, lambda comm: alltoallv(comm, blocks[comm.rank], recv_counts=counts[:, comm.rank]))
    for result in (got, given):
        for r in range(p):
            assert len(result[r]) == p
            for i in range(p):
                assert result[r][i].dtype == dtype
                np.testing.assert_array_equal(result[r][i], blocks[i][r])


def _count(p, fn):
    counters = []

    def wrap(comm):
        counters.append(CountingCommunicator(comm))
        return counters[-1]

    run_threads(p, fn, wrap=wrap)
    return sorted(counters, key=lambda c: c.rank)


def test_runs_on_the_array_api_strict_namespace():
    from reference_impl.backend import get_namespace, to_numpy

    xp = get_namespace("strict")
    p = 5
    xs = inputs(p, (3,), np.float32)
    expected = np.stack(xs).swapaxes(0, 1)
    for algorithm in ALLTOALL_ALGORITHMS:
        got = run_threads(p, lambda comm: alltoall(comm, xp.asarray(xs[comm.rank]), algorithm=algorithm))
        for r in range(p):
            assert type(got[r]).__module__.startswith("array_api_strict")
            np.testing.assert_array_equal(to_numpy(got[r]), expected[r])
    blocks = [[xp.asarray(np.full(s + d, s, np.int64)) for d in range(p)] for s in range(p)]
    got = run_threads(p, lambda comm: alltoallv(comm, blocks[comm.rank]))
    for r in range(p):
        for i in range(p):
            np.testing.assert_array_equal(to_numpy(got[r][i]), np.full(i + r, i))


@pytest.mark.parametrize("p", RANKS)
def test_bytes_sent_match_the_closed_forms(p):
    m = 6  # float32 elements per block
    n_bytes = p * m * 4  # a rank's whole send buffer
    xs = inputs(p, (m,), np.float32)
    beta_only = LinkParams(alpha=0.0, beta=1.0)  # time == bytes on the critical path
    alpha_only = LinkParams(alpha=1.0, beta=0.0)  # time == messages

    pairwise = _count(p, lambda comm: alltoall(comm, xs[comm.rank], algorithm="pairwise"))
    for c in pairwise:
        assert c.bytes_sent == (p - 1) * n_bytes // p == pairwise_alltoall_time(n_bytes, p, beta_only)
        assert c.messages_sent == p - 1 == pairwise_alltoall_time(n_bytes, p, alpha_only)

    bruck = _count(p, lambda comm: alltoall(comm, xs[comm.rank], algorithm="bruck"))
    steps = math.ceil(math.log2(p)) if p > 1 else 0
    exact_blocks = {1: 0, 2: 1, 3: 2, 4: 4, 5: 5, 6: 7, 7: 9, 8: 12}[p]  # sum_k b_k
    assert sum(bruck_blocks_per_step(p)) == exact_blocks
    for c in bruck:
        assert c.messages_sent == steps == bruck_alltoall_time(n_bytes, p, alpha_only)
        assert c.bytes_sent == exact_blocks * m * 4
        assert c.bytes_sent == pytest.approx(bruck_alltoall_time(n_bytes, p, beta_only))
        if p & (p - 1) == 0:  # a power of two: half the buffer every step
            assert c.bytes_sent == steps * n_bytes // 2


def test_closed_forms():
    c = LinkParams(alpha=2e-6, beta=1e-9)
    n = 1 << 20
    assert pairwise_alltoall_time(n, 8, c) == pytest.approx(7 * (2e-6 + n / 8 * 1e-9))
    assert bruck_alltoall_time(n, 8, c) == pytest.approx(3 * (2e-6 + n / 2 * 1e-9))
    assert bruck_alltoall_time(n, 5, c) == pytest.approx(3 * 2e-6 + 5 * n / 5 * 1e-9)
    assert pairwise_alltoall_time(n, 1, c) == bruck_alltoall_time(n, 1, c) == 0.0
    # Short messages: Bruck's fewer latencies win; long ones: pairwise's fewer bytes win.
    assert bruck_alltoall_time(64, 64, c) < pairwise_alltoall_time(64, 64, c)
    assert pairwise_alltoall_time(64 << 20, 64, c) < bruck_alltoall_time(64 << 20, 64, c)


def test_bad_arguments():
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="one block per rank"):
        run_threads(2, lambda comm: alltoall(comm, x))
    with pytest.raises(ValueError, match="unknown algorithm"):
        run_threads(3, lambda comm: alltoall(comm, x, algorithm="ring"))
    with pytest.raises(ValueError, match="need 2 blocks"):
        run_threads(2, lambda comm: alltoallv(comm, [np.zeros(1)]))
    with pytest.raises(ValueError, match="block 1 has"):
        run_threads(2, lambda comm: alltoallv(comm, [np.zeros(1), np.zeros(1, np.int64)]))


def test_shape_mismatch_between_ranks_fails_fast():
    xs = [np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)]
    with pytest.raises(CommError):
        run_threads(2, lambda comm: alltoall(comm, xs[comm.rank]), timeout=5)


@pytest.mark.parametrize("n_ranks", [2, 3, 4])
def test_alltoall_equals_the_mpi_library(n_ranks):
    run = subprocess.run(
        mpiexec_command(n_ranks, str(PROGRAMS / "alltoall_check.py")),
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # Per rank: 2 dtypes x 3 block sizes x 2 algorithms (Alltoall) + 2 dtypes x 2 (Alltoallv).
    assert f"OK {n_ranks * (2 * 3 * 2 + 2 * 2)} comparisons on {n_ranks} ranks" in run.stdout, run.stdout
