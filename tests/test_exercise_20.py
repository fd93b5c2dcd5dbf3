"""Exercise 20 (MoE dispatch and combine with capacity): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solutions of tests/exercise_specs.py.

* graded with ``python -m grader``: capacity applied token by token (each token's k choices in
  turn, instead of GShard's every first choice, then every second choice) gets partial marks,
  10 of 20: exactly the capacity tests and the layer's value tests fail, each with the hint
  written for that mistake, while dispatch, combine and the traffic test pass (the same number
  of assignments is kept per expert, so the same bytes move); a combine that adds the expert
  outputs without their gates gets 10 of 20: exactly the combine and layer value tests fail;
* in process: more plausible wrong solutions (an expert keeping capacity + 1, the latest
  assignments kept, the drop count in tokens, dropped assignments dispatched, rows left source
  by source or in another order, an alltoallv that exchanges its counts again, outputs
  overwritten instead of summed, the capacity of all the ranks' tokens, no capacity) lose
  exactly the tests they should, each with its hint, and no failure is cut short;
* the source notebook is the reference: its ``keep_within_capacity`` and the tests' loop
  (``direct_keep``) give ``moe.keep_within_capacity``'s position policy; its ``dispatch`` lays the
  rows out as ``expert_parallel.ExpertParallelMoE`` does (the same ``t``, ``j`` and receive
  counts); its ``ExpertParallelMoE`` gives the reference layer's output, drop count and bytes
  on 1, 2 and 4 ranks, a rank without tokens and a rank whose experts get nothing included.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["20_moe_dispatch"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
TESTS = {"test_keep_example", "test_dispatch_example", "test_combine_example", "test_layer_example",
         "hidden_keep_within_capacity", "hidden_dispatch", "hidden_combine", "hidden_layer_matches_reference",
         "hidden_layer_traffic"}
KEEP = {"test_keep_example", "hidden_keep_within_capacity"}
DISPATCH = {"test_dispatch_example", "hidden_dispatch"}
COMBINE = {"test_combine_example", "hidden_combine"}
LAYER = {"test_layer_example", "hidden_layer_matches_reference"}
TRAFFIC = "hidden_layer_traffic"

pytestmark = pytest.mark.timeout(300)

TOKEN_ORDER = "You ranked the assignments token by token"
NO_GATES = "The expert outputs were added without their gates"
OVER_CAPACITY = "Some expert kept more assignments than the capacity"
LAYER_GENERAL = "forward(x): experts, gates = top_k_router"
TRAFFIC_GENERAL = "One forward sends, per rank, the counts"
TRAFFIC_MESSAGES = "The forward must send exactly 3 (p - 1) messages"
TRAFFIC_ROUTED = "Your traffic is that of every routed assignment"
TOKENS_COUNTED = "You counted the tokens that lost all k of their experts"


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_token_by_token_capacity_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["token_by_token"], MAX_SCORE, failing=KEEP | LAYER, score=10.0)
    assert "(token by token: a token's second choice went before the next token's first choice)" in (
        tests["test_keep_example"]["hint"])
    assert "token by token" in tests["hidden_layer_matches_reference"]["hint"]
    HINTS.assert_advice(tests, dict.fromkeys(KEEP | LAYER, TOKEN_ORDER))


def test_combine_without_gates_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["no_gates"], MAX_SCORE, failing=COMBINE | LAYER, score=10.0)
    for test_id in COMBINE | LAYER:
        assert "(the expert outputs added without their gates)" in tests[test_id]["hint"], tests[test_id]["hint"]
    HINTS.assert_advice(tests, dict.fromkeys(COMBINE | LAYER, NO_GATES))


LATEST_FIRST = '''
def keep_within_capacity(experts, capacity, n_experts):
    T, k = experts.shape
    if capacity is None:
        return np.ones((T, k), dtype=bool), 0
    kept = np.zeros((T, k), dtype=bool)
    load = np.zeros(n_experts, dtype=np.int64)
    for j in reversed(range(k)):  # the latest assignments first
        for t in reversed(range(T)):
            e = experts[t, j]
            if load[e] < capacity:
                kept[t, j] = True
                load[e] += 1
    return kept, int(T * k - kept.sum())
'''
KEEP_SOLUTION = "kept[:, j] = place[np.arange(T), experts[:, j]] < capacity"
ROWS_ADDED = "np.add.at(y, t, gates[t, j][:, None] * rows)"
REGROUP = ("    inputs = [np.concatenate([blocks[s][starts[s, i]:starts[s, i + 1]] for s in range(ep)]) "
           "for i in range(n_local)]")
DISPATCH_ALLTOALLV = "recv_counts=[int(n) * C for n in recv_counts.sum(axis=1)])"
COMBINE_ALLTOALLV = "got = alltoallv(comm, blocks, recv_counts=[int(n) * C for n in send_counts.sum(axis=1)])"


@pytest.mark.parametrize("cell, edit, advice", [
    ("keep_within_capacity", replacing(KEEP_SOLUTION, KEEP_SOLUTION.replace("<", "<=")),
     {**dict.fromkeys(KEEP, "An expert kept capacity + 1 assignments"), **dict.fromkeys(LAYER, OVER_CAPACITY),
      TRAFFIC: TRAFFIC_GENERAL}),
    ("keep_within_capacity", LATEST_FIRST,
     {**dict.fromkeys(KEEP, "You kept the latest assignments"), **dict.fromkeys(LAYER, LAYER_GENERAL)}),
    ("keep_within_capacity", replacing("return kept, int(T * k - kept.sum())", "return kept, int((~kept.any(axis=1)).sum())"),
     dict.fromkeys(KEEP | LAYER, TOKENS_COUNTED)),
    ("dispatch", replacing("np.nonzero((experts == e) & kept)", "np.nonzero(experts == e)"),
     {**dict.fromkeys(DISPATCH, "You sent the dropped assignments too"), **dict.fromkeys(LAYER, OVER_CAPACITY),
      TRAFFIC: TRAFFIC_ROUTED}),
    ("dispatch", replacing(REGROUP, "    inputs = np.split(np.concatenate(blocks), np.cumsum(recv_counts.sum(axis=0))[:-1])"),
     {**dict.fromkeys(DISPATCH, "What arrives is source by source"), **dict.fromkeys(LAYER, LAYER_GENERAL)}),
    ("dispatch", replacing(REGROUP, REGROUP.replace("for s in range(ep)", "for s in reversed(range(ep))")),
     {**dict.fromkeys(DISPATCH, "The right rows in another order"), **dict.fromkeys(LAYER, LAYER_GENERAL)}),
    ("dispatch", replacing(DISPATCH_ALLTOALLV, ")"),
     {"hidden_dispatch": "dispatch sends one alltoall of the counts", TRAFFIC: TRAFFIC_MESSAGES}),
    ("combine", replacing(COMBINE_ALLTOALLV, "got = alltoallv(comm, blocks)"),
     {"hidden_combine": "combine sends one alltoallv", TRAFFIC: TRAFFIC_MESSAGES}),
    ("combine", replacing(ROWS_ADDED, "y[t] = gates[t, j][:, None] * rows"),
     {**dict.fromkeys(COMBINE, "overwritten, not summed"), **dict.fromkeys(LAYER, LAYER_GENERAL)}),
    ("ExpertParallelMoE", replacing("expert_capacity(len(x), cfg)", "expert_capacity(len(x) * self.comm.size, cfg)"),
     {**dict.fromkeys(LAYER, OVER_CAPACITY), TRAFFIC: TRAFFIC_GENERAL}),
    ("ExpertParallelMoE", replacing("capacity = expert_capacity(len(x), cfg)", "capacity = None"),
     {**dict.fromkeys(LAYER, OVER_CAPACITY), TRAFFIC: TRAFFIC_ROUTED}),
], ids=["keeps_capacity_plus_one", "keeps_the_latest", "drop_count_in_tokens", "dispatches_dropped",
        "not_regrouped", "sources_reversed", "dispatch_counts_exchanged_twice", "combine_counts_exchanged",
        "combine_overwrites", "capacity_of_all_ranks", "no_capacity"])
def test_plausible_wrong_solutions_lose_the_right_tests_in_process(cell, edit, advice):
    tests = HINTS.graded_in_process(edit_cell(read_nb(SOURCE), cell, edit))
    assert set(tests) == TESTS
    HINTS.assert_advice(tests, advice)
    for test_id, test in tests.items():  # every failure fits the grader's line, its note included
        if not test["passed"]:
            assert not test["hint"].endswith("..."), (test_id, test["hint"])


@pytest.fixture(scope="module")
def ns() -> dict[str, Any]:
    return notebook_namespace(read_nb(SOURCE), upto="ExpertParallelMoE")


def test_source_capacity_and_the_tests_loop_are_the_references_position_policy(ns):
    import reference_impl.parallel.moe as moe

    rng = np.random.default_rng(2020)
    for _ in range(200):
        E = int(rng.integers(1, 9))
        k, T = int(rng.integers(1, min(E, 4) + 1)), int(rng.integers(0, 30))
        experts = ns["random_experts"](rng, T, k, E)
        capacity = [None, 0, int(rng.integers(1, 6)), T * k][int(rng.integers(0, 4))]
        want = moe.keep_within_capacity(experts, rng.random((T, k)), capacity, E, "position")
        kept, dropped = ns["keep_within_capacity"](experts.copy(), capacity, E)
        assert kept.dtype == bool and np.array_equal(kept, want) and dropped == int((~want).sum())
        loop_kept, loop_dropped = ns["direct_keep"](experts, capacity, E)
        assert np.array_equal(loop_kept, want) and loop_dropped == dropped
        if capacity is not None and capacity < T:
            assert np.bincount(experts[kept], minlength=E).max() <= capacity


@pytest.mark.parametrize("ep, E, k, factor, sizes", [
    (1, 4, 2, 1.0, [11]), (2, 4, 2, 1.0, [9, 6]), (2, 8, 1, 0.5, [12, 0]), (4, 4, 1, 0.75, [9, 4, 0, 13]),
    (4, 8, 2, 1.0, [10, 3, 6, 8]), (4, 8, 2, None, [10, 0, 6, 8])])
def test_source_layer_is_the_reference_expert_parallel_layer(ns, ep, E, k, factor, sizes):
    """Output, drop count, dispatch layout and bytes of the notebook's layer = the reference's, rank by rank;
    with ep = 4 and E = 8, rank 1's experts are never chosen (it receives nothing)."""
    import reference_impl.parallel.expert_parallel as xp
    import reference_impl.parallel.moe as moe
    from reference_impl.comm import CountingCommunicator, run_threads

    C = 5
    cfg = moe.MoEConfig(n_embd=C, n_experts=E, top_k=k, capacity_factor=factor)
    params = moe.init_params(cfg, seed=ep * 10 + E + k, std=0.3, router_std=1.0)
    rng = np.random.default_rng(sum(sizes))
    xs = [rng.standard_normal((n, C)) for n in sizes]
    if ep == 4 and E == 8:
        params["wg"][2:4, 0] = -50.0
        for x in xs:
            x[:, 0] = 1.0

    def both(comm):
        shard = xp.shard_experts(params, comm.rank, comm.size)
        x = xs[comm.rank]
        before = comm.bytes_sent
        reference = xp.ExpertParallelMoE(comm, shard, cfg)
        ref_y = reference.forward(x.copy())
        ref_bytes = comm.bytes_sent - before
        mine = ns["ExpertParallelMoE"](comm, shard, cfg)
        y = mine.forward(x.copy())
        my_bytes = comm.bytes_sent - before - ref_bytes
        experts, _ = ns["top_k_router"](params["wg"], x, k)
        kept, _ = ns["keep_within_capacity"](experts, moe.expert_capacity(len(x), cfg), E)
        _, plan = ns["dispatch"](comm, x, experts, kept, E)
        return (ref_y, reference.stats.dropped, reference.t, reference.j, reference.recv_counts, ref_bytes), (
            y, mine.dropped, plan["t"], plan["j"], plan["recv_counts"], my_bytes)

    results = run_threads(ep, both, timeout=30, wrap=CountingCommunicator)
    for r, ((ref_y, ref_dropped, ref_t, ref_j, ref_recv, ref_bytes), (y, dropped, t, j, recv, sent)) in enumerate(results):
        np.testing.assert_allclose(y, ref_y, rtol=1e-12, atol=1e-14, err_msg=f"y, rank {r} of {ep}")
        assert dropped == ref_dropped, (r, dropped, ref_dropped)
        assert np.array_equal(t, ref_t) and np.array_equal(j, ref_j) and np.array_equal(recv, ref_recv), r
        assert sent == ref_bytes, (r, sent, ref_bytes)  # on one rank both send nothing
    if factor is not None:
        assert sum(r[0][1] for r in results) > 0, "the case must drop something"
    if ep == 4 and E == 8:
        assert results[1][0][4].sum() == 0, "rank 1's experts must receive nothing"
