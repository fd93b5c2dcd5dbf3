"""Every collective and every allreduce algorithm on thread ranks, checked against NumPy.

What is checked, for the four allreduce algorithms (and "auto") and for reduce_scatter,
allgather, broadcast and reduce:

* results equal NumPy's exactly on integer-valued data, for every op, four dtypes, rank
  counts 1 to 8 and lengths 0, below the rank count, uneven and even; every rank gets the
  same bits on random floats;
* they run on the array_api_strict namespace (nothing outside the array API);
* the traffic each rank sends, counted by CountingCommunicator, is the derivation's:
  log2(p) N for recursive doubling, 2(p-1)/p N for Rabenseifner, ceil(log2 p) N from the
  tree's root, plus the fold for rank counts that are not powers of two;
* bad input (lengths or dtypes that differ between ranks, a rank that never joins, bad
  arguments) raises a clear error within bounded time, never a wrong answer.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from reference_impl.backend import get_namespace, to_numpy
from reference_impl.comm import (
    ALGORITHMS,
    AUTO_LINK,
    OPS,
    CommError,
    CountingCommunicator,
    allgather,
    allreduce,
    broadcast,
    choose_algorithm,
    chunk_bounds,
    reduce,
    reduce_scatter,
    run_threads,
)
from reference_impl.comm.cost_model import LinkParams, allreduce_time

pytestmark = pytest.mark.timeout(120)

EXPLICIT = tuple(a for a in ALGORITHMS if a != "auto")
DTYPES = (np.float32, np.float64, np.int32, np.int64)
RANKS = range(1, 9)


def numpy_reduce(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """The reference result, computed by NumPy on the stacked inputs, in the inputs' dtype."""
    stack = np.stack(arrays)
    if op == "mean":
        return (np.sum(stack, axis=0) / len(arrays)).astype(stack.dtype)
    return {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op](stack, axis=0).astype(stack.dtype)


def cases(n_ranks: int, seed: int):
    """(op, dtype, length, per-rank inputs) for one rank count: integer values, so sums are exact."""
    rng = np.random.default_rng(seed)
    for op in OPS:
        for dtype in DTYPES:
            if op == "mean" and not np.issubdtype(dtype, np.floating):
                continue
            for length in sorted({0, 1, n_ranks - 1, n_ranks, n_ranks + 1, 2 * n_ranks + 3, 100,
                                  int(rng.integers(0, 300))}):
                high = 3 if op == "prod" else 1000
                yield op, dtype, length, [rng.integers(-high, high + 1, size=length).astype(dtype)
                                          for _ in range(n_ranks)]


def sent(fn, n_ranks: int) -> list[CountingCommunicator]:
    """Run ``fn(comm)`` on counting thread ranks; return each rank's counter."""
    return run_threads(n_ranks, lambda comm: (fn(comm), comm)[1], wrap=CountingCommunicator, timeout=20)


# --------------------------------------------------------------------------- allreduce results


@pytest.mark.parametrize("n_ranks", RANKS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce_equals_numpy_for_every_op_dtype_and_length(algorithm, n_ranks):
    all_cases = list(cases(n_ranks, seed=100 * n_ranks + len(algorithm)))

    def body(comm):  # every rank runs all cases in the same order: one thread start per test
        return [allreduce(comm, inputs[comm.rank], algorithm=algorithm, op=op)
                for op, _, _, inputs in all_cases]

    results = run_threads(n_ranks, body, timeout=60)
    for i, (op, dtype, length, inputs) in enumerate(all_cases):
        expected = numpy_reduce(op, inputs)
        for rank in range(n_ranks):
            got = results[rank][i]
            assert got.dtype == dtype and got.shape == (length,)
            np.testing.assert_array_equal(got, expected, err_msg=f"{op} {dtype.__name__} N={length} rank {rank}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n_ranks", [3, 6, 8])
def test_every_rank_gets_the_same_bits_on_random_floats(rng, algorithm, n_ranks):
    inputs = [rng.standard_normal(1003).astype(np.float32) for _ in range(n_ranks)]
    results = run_threads(n_ranks, lambda comm: allreduce(comm, inputs[comm.rank], algorithm=algorithm))
    np.testing.assert_allclose(results[0], np.sum(np.stack(inputs, dtype=np.float64), axis=0), rtol=1e-4, atol=1e-5)
    for got in results[1:]:
        assert got.tobytes() == results[0].tobytes()


@pytest.mark.parametrize("algorithm", EXPLICIT)
def test_shape_kept_input_untouched_and_out_reused(rng, algorithm):
    inputs = [rng.integers(0, 5, size=(3, 4, 5)).astype(np.float64) for _ in range(5)]
    copies = [x.copy() for x in inputs]
    outs = [np.empty(60) for _ in range(5)]
    results = run_threads(5, lambda comm: allreduce(comm, inputs[comm.rank], algorithm=algorithm,
                                                     op="mean", out=outs[comm.rank]))
    for rank, got in enumerate(results):
        assert got.shape == (3, 4, 5) and np.shares_memory(got, outs[rank])
        np.testing.assert_array_equal(got, sum(copies) / 5)
    for x, c in zip(inputs, copies):
        np.testing.assert_array_equal(x, c)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n_ranks", [1, 3, 4])
def test_strict_array_api_namespace(rng, algorithm, n_ranks):
    """The algorithms use nothing outside the array API standard."""
    xp = get_namespace("strict")
    inputs = [rng.integers(-9, 10, size=37).astype(np.float32) for _ in range(n_ranks)]
    for op in ("sum", "max", "mean"):
        results = run_threads(n_ranks, lambda comm: allreduce(
            comm, xp.asarray(inputs[comm.rank]), algorithm=algorithm, op=op))
        for got in results:
            assert type(got).__module__.startswith("array_api_strict")
            np.testing.assert_array_equal(to_numpy(got), numpy_reduce(op, inputs))


# --------------------------------------------------------------------------- auto


def test_auto_choice_follows_the_cost_model():
    for n_ranks in RANKS:
        for n_bytes in (0, 8, 4096, 1 << 16, 1 << 20, 1 << 26):
            chosen = choose_algorithm(n_bytes, n_ranks)
            best = min(allreduce_time(a, n_bytes, n_ranks, AUTO_LINK) for a in EXPLICIT)
            assert allreduce_time(chosen, n_bytes, n_ranks, AUTO_LINK) == best
    # On this link short messages need the fewest steps and long ones the fewest bytes.
    assert choose_algorithm(8, 8) == "recursive_doubling"
    assert choose_algorithm(64 << 20, 8) in ("ring", "rabenseifner")


@pytest.mark.parametrize(
    "link, n_elements, algorithm",
    [
        (None, 4, "recursive_doubling"),  # default link, tiny message
        (LinkParams(alpha=1.0, beta=0.0), 4096, "recursive_doubling"),  # latency only
        (LinkParams(alpha=0.0, beta=1e-9), 4096, "ring"),  # bandwidth only: ring ties Rabenseifner, listed first
    ],
)
def test_auto_runs_the_chosen_algorithm(rng, link, n_elements, algorithm):
    """Counted traffic tells which algorithm ran; the result is right either way."""
    inputs = [rng.integers(-9, 10, size=n_elements).astype(np.float32) for _ in range(4)]
    results = run_threads(4, lambda comm: allreduce(comm, inputs[comm.rank], algorithm="auto", link=link))
    np.testing.assert_array_equal(results[0], numpy_reduce("sum", inputs))
    auto = sent(lambda comm: allreduce(comm, inputs[comm.rank], algorithm="auto", link=link), 4)
    explicit = sent(lambda comm: allreduce(comm, inputs[comm.rank], algorithm=algorithm), 4)
    assert [c.messages_sent for c in auto] == [c.messages_sent for c in explicit]
    assert [c.elements_sent for c in auto] == [c.elements_sent for c in explicit]


# --------------------------------------------------------------------------- traffic


def _fold_shape(n_ranks: int) -> tuple[int, int]:
    p2 = 1 << (n_ranks.bit_length() - 1)
    return p2, n_ranks - p2


@pytest.mark.parametrize("n_ranks", RANKS)
def test_recursive_doubling_sends_log2_p_arrays_per_rank(n_ranks):
    N = 840  # divisible by every rank count up to 8
    counters = sent(lambda comm: allreduce(comm, np.ones(N, np.float32), algorithm="recursive_doubling"), n_ranks)
    p2, extra = _fold_shape(n_ranks)
    k = int(math.log2(p2))
    for rank, c in enumerate(counters):
        if rank >= p2:  # folded in: hands its array over once, gets the result back
            expected = (1, N)
        elif rank < extra:  # partner of an extra rank: one more message, the result going back
            expected = (k + 1, (k + 1) * N)
        else:
            expected = (k, k * N)
        assert (c.messages_sent, c.elements_sent) == expected, f"rank {rank} of {n_ranks}"
        assert c.bytes_sent == 4 * c.elements_sent


@pytest.mark.parametrize("n_ranks", RANKS)
def test_rabenseifner_sends_like_the_ring_in_2_log2_p_steps(n_ranks):
    N = 840
    counters = sent(lambda comm: allreduce(comm, np.ones(N, np.float32), algorithm="rabenseifner"), n_ranks)
    p2, extra = _fold_shape(n_ranks)
    k = int(math.log2(p2))
    core = 2 * (p2 - 1) * N // p2  # the ring's 2 (p2 - 1) / p2 * N, in 2 log2(p2) messages
    for rank, c in enumerate(counters):
        if rank >= p2:
            expected = (1, N)
        elif rank < extra:
            expected = (2 * k + 1, core + N)
        else:
            expected = (2 * k, core)
        assert (c.messages_sent, c.elements_sent) == expected, f"rank {rank} of {n_ranks}"


@pytest.mark.parametrize("n_ranks", [2, 3, 4, 5, 7, 8])
@pytest.mark.parametrize("N", [1, 6, 13])
def test_rabenseifner_total_traffic_for_uneven_chunks(n_ranks, N):
    counters = sent(lambda comm: allreduce(comm, np.ones(N, np.float64), algorithm="rabenseifner"), n_ranks)
    p2, extra = _fold_shape(n_ranks)
    # Halving and doubling each move every element across every one of the log2(p2) bits
    # except its owner's: (p2 - 1) * N in all per phase, whatever the chunk sizes; plus the fold.
    assert sum(c.elements_sent for c in counters) == 2 * (p2 - 1) * N + 2 * extra * N


@pytest.mark.parametrize("n_ranks", RANKS)
def test_tree_root_sends_ceil_log2_p_arrays(n_ranks):
    N = 100
    counters = sent(lambda comm: allreduce(comm, np.ones(N, np.float32), algorithm="tree"), n_ranks)
    assert counters[0].elements_sent == math.ceil(math.log2(n_ranks)) * N
    # Every rank but the root sends once up the tree and receives once down it.
    assert sum(c.elements_sent for c in counters) == 2 * (n_ranks - 1) * N
    assert sum(c.messages_sent for c in counters) == 2 * (n_ranks - 1)


@pytest.mark.parametrize("n_ranks", [2, 3, 4, 5, 8])
def test_ring_sends_2_n_minus_1_over_n(n_ranks):
    N = 840
    counters = sent(lambda comm: allreduce(comm, np.ones(N, np.float32), algorithm="ring"), n_ranks)
    assert all(c.elements_sent == 2 * (n_ranks - 1) * N // n_ranks for c in counters)


@pytest.mark.parametrize("n_ranks", [1, 2, 3, 5, 8])
def test_traffic_of_the_other_collectives(n_ranks):
    N = 840
    x = np.ones(N, np.float32)
    rs = sent(lambda comm: reduce_scatter(comm, x), n_ranks)
    assert all(c.elements_sent == (n_ranks - 1) * N // n_ranks for c in rs)
    ag = sent(lambda comm: allgather(comm, x[: 10 * comm.rank], sizes=[10 * r for r in range(n_ranks)]), n_ranks)
    assert sum(c.elements_sent for c in ag) == (n_ranks - 1) * 10 * sum(range(n_ranks))
    ag_sizes = sent(lambda comm: allgather(comm, x[: 10 * comm.rank]), n_ranks)
    assert [c.messages_sent for c in ag_sizes] == [2 * (n_ranks - 1)] * n_ranks  # sizes first, then data
    bc = sent(lambda comm: broadcast(comm, x.copy(), root=n_ranks - 1), n_ranks)
    assert bc[n_ranks - 1].elements_sent == math.ceil(math.log2(n_ranks)) * N
    assert sum(c.elements_sent for c in bc) == (n_ranks - 1) * N
    rd = sent(lambda comm: reduce(comm, x, root=n_ranks // 2), n_ranks)
    assert [c.elements_sent for c in rd] == [0 if r == n_ranks // 2 else N for r in range(n_ranks)]


# --------------------------------------------------------------------------- the other collectives


@pytest.mark.parametrize("n_ranks", RANKS)
def test_reduce_scatter_allgather_broadcast_reduce_equal_numpy(n_ranks):
    all_cases = list(cases(n_ranks, seed=7 * n_ranks))
    roots = [i % n_ranks for i in range(len(all_cases))]
    rng = np.random.default_rng(n_ranks)
    sizes = [[int(s) for s in rng.integers(0, 12, size=n_ranks)] for _ in all_cases]

    def body(comm):
        out = []
        for (op, _, _, inputs), root, piece in zip(all_cases, roots, sizes):
            x = inputs[comm.rank]
            bcast_buf = x.copy() if comm.rank == root else np.zeros_like(x)
            out.append((
                reduce_scatter(comm, x, op=op),
                allgather(comm, np.full(piece[comm.rank], comm.rank, x.dtype)),
                broadcast(comm, bcast_buf, root=root),
                reduce(comm, x, root=root, op=op),
            ))
        return out

    results = run_threads(n_ranks, body, timeout=60)
    for i, ((op, dtype, length, inputs), root, piece) in enumerate(zip(all_cases, roots, sizes)):
        expected = numpy_reduce(op, inputs)
        gathered = np.concatenate([np.full(piece[r], r, dtype) for r in range(n_ranks)])
        what = f"{op} {dtype.__name__} N={length} root {root}"
        for rank in range(n_ranks):
            rs, ag, bc, rd = results[rank][i]
            lo, hi = chunk_bounds(length, n_ranks)[rank]
            assert rs.dtype == dtype, what
            np.testing.assert_array_equal(rs, expected[lo:hi], err_msg=f"reduce_scatter {what} rank {rank}")
            np.testing.assert_array_equal(ag, gathered, err_msg=f"allgather {what} rank {rank}")
            np.testing.assert_array_equal(bc, inputs[root], err_msg=f"broadcast {what} rank {rank}")
            if rank == root:
                np.testing.assert_array_equal(rd, expected, err_msg=f"reduce {what}")
            else:
                assert rd is None


@pytest.mark.parametrize("n_ranks", [1, 3, 4])
def test_other_collectives_on_the_strict_namespace(rng, n_ranks):
    xp = get_namespace("strict")
    inputs = [rng.integers(-9, 10, size=(2, 5)).astype(np.float64) for _ in range(n_ranks)]

    def body(comm):
        x = xp.asarray(inputs[comm.rank])
        return (reduce_scatter(comm, x, op="max"), allgather(comm, x),
                broadcast(comm, xp.asarray(inputs[comm.rank], copy=True), root=0), reduce(comm, x, op="mean"))

    expected_max = numpy_reduce("max", inputs).reshape(-1)
    for rank, (rs, ag, bc, rd) in enumerate(run_threads(n_ranks, body)):
        for arr in (rs, ag, bc):
            assert type(arr).__module__.startswith("array_api_strict")
        lo, hi = chunk_bounds(10, n_ranks)[rank]
        np.testing.assert_array_equal(to_numpy(rs), expected_max[lo:hi])
        np.testing.assert_array_equal(to_numpy(ag), np.concatenate([x.reshape(-1) for x in inputs]))
        np.testing.assert_array_equal(to_numpy(bc), inputs[0])
        if rank == 0:
            assert rd.shape == (2, 5)
            np.testing.assert_allclose(to_numpy(rd), np.mean(inputs, axis=0), rtol=1e-15)


# --------------------------------------------------------------------------- bad input, failures


COLLECTIVES = {
    **{f"allreduce:{a}": (lambda a: lambda comm, x: allreduce(comm, x, algorithm=a))(a) for a in ALGORITHMS},
    "reduce_scatter": lambda comm, x: reduce_scatter(comm, x),
    "broadcast": lambda comm, x: broadcast(comm, x, root=comm.size - 1),
    "reduce": lambda comm, x: reduce(comm, x, root=1),
}


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_any_length_mismatch_raises_naming_rank_and_sizes(collective):
    """Random per-rank lengths, not all equal: some rank must raise, so the job never answers."""
    rng = np.random.default_rng(len(collective))
    for trial in range(40):
        n_ranks = int(rng.integers(2, 9))
        lengths = [int(v) for v in rng.integers(0, 3 * n_ranks, size=n_ranks)]
        if len(set(lengths)) == 1:
            lengths[int(rng.integers(0, n_ranks))] += 1

        def body(comm):
            return COLLECTIVES[collective](comm, np.ones(lengths[comm.rank], np.float32))

        with pytest.raises(CommError) as info:
            run_threads(n_ranks, body, timeout=5)
        message = str(info.value)
        assert f"{collective.split(':')[0]} on rank" in message and "input of" in message, message
        assert "Every rank must call" in message, message
        assert "shape" in message, message  # the low-level error states both sizes


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("other", [np.float64, np.int32])
def test_dtype_mismatch_is_reported(algorithm, other):
    def body(comm):
        return allreduce(comm, np.ones(8, other if comm.rank == 1 else np.float32), algorithm=algorithm)

    with pytest.raises(CommError, match=r"dtype (float32|float64|int32).*dtype (float32|float64|int32)"):
        run_threads(3, body, timeout=5)


def test_mismatches_in_the_other_collectives_are_reported():
    with pytest.raises(CommError, match=r"reduce_scatter on rank \d \(input of (6|7) elements"):
        run_threads(3, lambda comm: reduce_scatter(comm, np.ones(6 + (comm.rank == 2))), timeout=5)
    with pytest.raises(CommError, match=r"allgather on rank \d .*same dtype"):
        run_threads(3, lambda comm: allgather(comm, np.ones(2, np.float32 if comm.rank else np.int32)), timeout=5)
    with pytest.raises(CommError, match=r"broadcast on rank \d .*root 0's size and dtype"):
        run_threads(3, lambda comm: broadcast(comm, np.ones(4 + (comm.rank == 1))), timeout=5)
    with pytest.raises(CommError, match=r"reduce on rank \d \(input of (4|5) elements"):
        run_threads(4, lambda comm: reduce(comm, np.ones(4 + (comm.rank == 3))), timeout=5)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_rank_that_never_joins_gives_an_error_in_bounded_time(algorithm):
    def body(comm):
        if comm.rank == 2:
            return None  # skips the collective
        return allreduce(comm, np.ones(16), algorithm=algorithm)

    start = time.monotonic()
    with pytest.raises(CommError, match=r"allreduce on rank \d .*no message from rank \d"):
        run_threads(4, body, timeout=0.5)
    assert time.monotonic() - start < 5


def test_bad_arguments_are_named():
    one = lambda fn: run_threads(2, fn, timeout=5)  # noqa: E731
    with pytest.raises(ValueError, match="unknown algorithm 'star'"):
        one(lambda comm: allreduce(comm, np.ones(2), algorithm="star"))
    with pytest.raises(ValueError, match="unknown op 'avg'"):
        one(lambda comm: reduce_scatter(comm, np.ones(2), op="avg"))
    with pytest.raises(TypeError, match=r"rank \d: op='mean' needs a floating dtype, got int64"):
        one(lambda comm: allreduce(comm, np.ones(2, np.int64), algorithm="tree", op="mean"))
    with pytest.raises(TypeError, match=r"reduce on rank \d: expected an array.*got list"):
        one(lambda comm: reduce(comm, [1.0, 2.0]))
    with pytest.raises(ValueError, match=r"broadcast on rank \d: root 2 is outside 0..1"):
        one(lambda comm: broadcast(comm, np.ones(2), root=2))
    with pytest.raises(ValueError, match=r"allgather on rank 1: sizes=\[2, 3\] must list 2 counts with this rank's 2"):
        one(lambda comm: allgather(comm, np.ones(2), sizes=[2, 3]))
    with pytest.raises(ValueError, match="out must be a separate 1-D array of 4 float32"):
        one(lambda comm: allreduce(comm, np.ones(4, np.float32), algorithm="rabenseifner",
                                   out=np.empty(3, np.float32)))


# --------------------------------------------------------------------------- the concept page


LINKS = [LinkParams(5e-6, 0.08e-9), LinkParams(30e-6, 0.8e-9), AUTO_LINK]


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("p", [4, 8, 64, 1024])
def test_the_pages_crossover_formulas_agree_with_the_cost_model(link, p):
    """docs/concepts/allreduce-algorithms.md derives N* in closed form; at N* the times must tie."""
    k = math.log2(p)
    denominator = (k - 2 * (p - 1) / p) * link.beta + (k - (p - 1) / p) * link.gamma
    for algorithm, numerator in (("rabenseifner", k * link.alpha), ("ring", (2 * (p - 1) - k) * link.alpha)):
        n_star = numerator / denominator
        rd = allreduce_time("recursive_doubling", n_star, p, link)
        assert rd == pytest.approx(allreduce_time(algorithm, n_star, p, link), rel=1e-9)
        assert allreduce_time("recursive_doubling", 0.9 * n_star, p, link) < allreduce_time(algorithm, 0.9 * n_star, p, link)
        assert allreduce_time("recursive_doubling", 1.1 * n_star, p, link) > allreduce_time(algorithm, 1.1 * n_star, p, link)


def test_the_page_renders_every_algorithm_module_and_its_diagrams():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "concepts" / "allreduce-algorithms.md").read_text(encoding="utf-8")
    for module in ("recursive_doubling", "rabenseifner", "tree", "allreduce"):
        assert f'--8<-- "reference_impl/comm/{module}.py"' in page, module
    for diagram in ("recursive-doubling.svg", "rabenseifner.svg"):
        assert f"../assets/diagrams/{diagram}" in page and (root / "docs/assets/diagrams" / diagram).is_file()
    assert "../exercises/index.md#exercise-03-recursive-doubling" in page
