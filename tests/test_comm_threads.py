"""Ring allreduce and the thread communicator, checked against NumPy on thread ranks."""
import time

import numpy as np
import pytest

from reference_impl.backend import get_namespace, to_numpy
from reference_impl.comm import (
    CommError,
    CountingCommunicator,
    allreduce,
    chunk_bounds,
    run_threads,
)

NP_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def _inputs(rng, n_ranks, length, dtype):
    return [rng.integers(-9, 10, size=length).astype(dtype) for _ in range(n_ranks)]


@pytest.mark.parametrize("n_elements", [0, 1, 2, 5, 7, 64, 1001])
@pytest.mark.parametrize("n_ranks", [1, 2, 3, 4, 5, 8])
def test_chunk_bounds_cover_range_evenly(n_elements, n_ranks):
    bounds = chunk_bounds(n_elements, n_ranks)
    assert len(bounds) == n_ranks
    assert bounds[0][0] == 0 and bounds[-1][1] == n_elements
    assert all(hi == lo2 for (_, hi), (lo2, _) in zip(bounds, bounds[1:]))  # contiguous
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("n_ranks", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("length", [0, 1, 3, 7, 100, 4097])
def test_allreduce_sum_equals_numpy_exactly(rng, n_ranks, length):
    data = _inputs(rng, n_ranks, length, np.float32)
    results = run_threads(n_ranks, lambda comm: allreduce(comm, data[comm.rank]))
    expected = np.sum(data, axis=0)
    for rank, got in enumerate(results):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, expected, err_msg=f"rank {rank}")


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_every_op_and_dtype(rng, op, dtype):
    n_ranks, length = 3, 29
    data = [rng.integers(-3, 4, size=length).astype(dtype) for _ in range(n_ranks)]
    results = run_threads(n_ranks, lambda comm: allreduce(comm, data[comm.rank], op=op))
    for got in results:
        np.testing.assert_array_equal(got, NP_REDUCE[op](np.stack(data), axis=0))


def test_mean_divides_by_rank_count(rng):
    data = [rng.standard_normal(10) for _ in range(4)]
    results = run_threads(4, lambda comm: allreduce(comm, data[comm.rank], op="mean"))
    np.testing.assert_allclose(results[0], np.mean(data, axis=0), rtol=1e-12)


def test_shape_is_kept_and_input_untouched(rng):
    data = [rng.integers(0, 5, size=(3, 4, 5)).astype(np.float64) for _ in range(3)]
    copies = [d.copy() for d in data]
    results = run_threads(3, lambda comm: allreduce(comm, data[comm.rank]))
    assert results[1].shape == (3, 4, 5)
    np.testing.assert_array_equal(results[1], sum(copies))
    for d, c in zip(data, copies):
        np.testing.assert_array_equal(d, c)


def test_out_buffer_is_reused(rng):
    data = _inputs(rng, 2, 10, np.float32)
    outs = [np.empty(10, np.float32) for _ in range(2)]
    results = run_threads(2, lambda comm: allreduce(comm, data[comm.rank], out=outs[comm.rank]))
    np.testing.assert_array_equal(outs[0], data[0] + data[1])
    assert np.shares_memory(results[0], outs[0])


def test_out_buffer_of_wrong_size_is_refused():
    with pytest.raises(ValueError, match="rank 0: out must be a separate 1-D array of 4 float32"):
        run_threads(1, lambda comm: allreduce(comm, np.ones(4, np.float32), out=np.empty(3, np.float32)))


@pytest.mark.parametrize("n_ranks", [1, 2, 3, 5])
def test_strict_array_api_namespace(rng, n_ranks):
    """The collective runs on array_api_strict, so it uses nothing outside the standard."""
    xp = get_namespace("strict")
    data = _inputs(rng, n_ranks, 37, np.float32)
    results = run_threads(n_ranks, lambda comm: allreduce(comm, xp.asarray(data[comm.rank])))
    for got in results:
        assert type(got).__module__.startswith("array_api_strict")
        np.testing.assert_array_equal(to_numpy(got), np.sum(data, axis=0))


@pytest.mark.parametrize("n_ranks, length", [(2, 64), (3, 300), (4, 4096), (5, 50)])
def test_each_rank_sends_2_n_minus_1_over_n_of_the_data(n_ranks, length):
    data = np.ones(length, np.float32)
    counters = run_threads(
        n_ranks,
        lambda comm: (allreduce(comm, data), comm)[1],
        wrap=CountingCommunicator,
    )
    for c in counters:
        assert c.elements_sent == 2 * (n_ranks - 1) * length // n_ranks
        assert c.bytes_sent == 4 * c.elements_sent
        assert c.messages_sent == 2 * (n_ranks - 1)


@pytest.mark.parametrize("n_ranks, length", [(3, 7), (4, 2), (5, 13)])
def test_total_traffic_is_exact_for_uneven_lengths(n_ranks, length):
    data = np.ones(length, np.float32)
    counters = run_threads(n_ranks, lambda comm: (allreduce(comm, data), comm)[1], wrap=CountingCommunicator)
    assert sum(c.elements_sent for c in counters) == 2 * (n_ranks - 1) * length


# ------------------------------------------------------------------ bad input, failures


def test_non_array_input_names_the_rank():
    with pytest.raises(TypeError, match=r"allreduce on rank \d: expected an array.*got list"):
        run_threads(2, lambda comm: allreduce(comm, [1.0, 2.0]))


@pytest.mark.parametrize("n_ranks", [2, 3, 4])
def test_mismatched_lengths_name_rank_and_lengths(n_ranks):
    def body(comm):
        return allreduce(comm, np.ones(6 + (comm.rank == n_ranks - 1), np.float32))

    with pytest.raises(CommError, match=r"allreduce on rank \d \(input of [67] elements.*same number of elements"):
        run_threads(n_ranks, body, timeout=10)


def test_mismatched_dtypes_are_reported():
    def body(comm):
        return allreduce(comm, np.ones(6, np.float32 if comm.rank else np.float64))

    with pytest.raises(CommError, match="dtype"):
        run_threads(2, body, timeout=10)


def test_unknown_algorithm_and_op():
    with pytest.raises(ValueError, match="unknown algorithm 'star'"):
        run_threads(1, lambda comm: allreduce(comm, np.ones(2), algorithm="star"))
    with pytest.raises(ValueError, match="unknown op 'avg'"):
        run_threads(1, lambda comm: allreduce(comm, np.ones(2), op="avg"))


def test_exception_on_one_rank_reaches_caller_without_hang():
    def body(comm):
        if comm.rank == 2:
            raise KeyError("boom on purpose")
        buf = np.empty(1)
        comm.recv(buf, source=2)  # would wait forever for the failed rank
        return buf

    start = time.monotonic()
    with pytest.raises(KeyError, match="boom on purpose") as info:
        run_threads(4, body, timeout=30)
    assert time.monotonic() - start < 5
    assert "(raised on rank 2 of 4)" in info.value.__notes__


def test_deadlock_becomes_an_error():
    def body(comm):
        buf = np.empty(1)
        comm.recv(buf, source=(comm.rank + 1) % comm.size)  # everyone receives, nobody sends

    with pytest.raises(CommError, match="no message from rank .* after 0.5 s"):
        run_threads(2, body, timeout=0.5)


def test_peer_out_of_range():
    with pytest.raises(ValueError, match="rank 0: destination rank 5 is outside 0..1"):
        run_threads(2, lambda comm: comm.send(np.ones(1), dest=5))


def test_messages_with_tags_do_not_overtake():
    def body(comm):
        if comm.rank == 0:
            comm.send(np.array([1.0]), 1, tag=7)
            comm.send(np.array([2.0]), 1, tag=3)
            comm.send(np.array([3.0]), 1, tag=7)
            return None
        a, b, c = np.empty(1), np.empty(1), np.empty(1)
        comm.recv(b, 0, tag=3)
        comm.recv(a, 0, tag=7)
        comm.recv(c, 0, tag=7)
        return float(a[0]), float(b[0]), float(c[0])

    assert run_threads(2, body)[1] == (1.0, 2.0, 3.0)


def test_barrier_waits_for_everyone():
    arrived = []

    def body(comm):
        time.sleep(0.05 * comm.rank)
        arrived.append(comm.rank)
        comm.barrier()
        return len(arrived)

    assert run_threads(4, body) == [4, 4, 4, 4]
