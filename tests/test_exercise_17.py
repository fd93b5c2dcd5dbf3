"""Exercise 17 (ZeRO stage 2: sharded gradients and optimiser state): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a ``reduce_scatter_mean`` that never divides the sum by the
  number of ranks gets partial marks: exactly the four tests that compare values with more than
  one rank fail (the shard layout and every traffic count still pass), each with the hint written
  for that mistake; the training test says the parameters are Adam's on the *sum* (Adam nearly
  hides the mistake, only eps sees the gradient's scale);
* in process: more plausible wrong solutions (no padding before the reduce-scatter, an allreduce
  instead of a reduce-scatter, an all-gather without ``sizes``, parameters rebound instead of
  written in place, Adam state for the whole vector, a shard size rounded down, exercise 1's
  uneven chunks) lose exactly the tests they should, each with its hint;
* the source notebook's shards are the reference's (``reference_impl.parallel.zero.flat_units``)
  for every layer of the lab's GPT at 1 to 8 ranks.
"""
from __future__ import annotations

from typing import Any

import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["17_zero_stage2"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
MEAN_TESTS = {"test_reduce_scatter_mean_example", "hidden_reduce_scatter_mean"}
STEP_TESTS = {"test_zero2_step_example", "hidden_zero2_matches_reference"}

pytestmark = pytest.mark.timeout(300)

SUM = "comm.size times the mean"
ADAM_ON_SUM = "Adam ran on the sum"
LENGTHS = "Shards of different lengths met"
WRONG_LENGTH = "Your shard has the wrong length"


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_summing_without_averaging_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["no_average"], MAX_SCORE, failing=MEAN_TESTS | STEP_TESTS, score=8.0)
    assert "(exactly 2 x the mean: the sum over ranks)" in tests["test_reduce_scatter_mean_example"]["hint"]
    assert "what Adam gives on the sum over ranks instead of the mean" in tests["hidden_zero2_matches_reference"]["hint"]
    assert "ZeroTrainer(stage=2)" in tests["hidden_zero2_matches_reference"]["hint"]
    HINTS.assert_advice(tests, {**dict.fromkeys(MEAN_TESTS, SUM), **dict.fromkeys(STEP_TESTS, ADAM_ON_SUM)})


@pytest.mark.parametrize("cell, edit, advice", [
    ("reduce_scatter_mean",
     replacing("padded = pad_to_shards(grad.reshape(-1), comm.size)", "padded = grad.reshape(-1).copy()"),
     {**dict.fromkeys(MEAN_TESTS, WRONG_LENGTH), "hidden_reduce_scatter_traffic": "A ring reduce-scatter sends",
      **dict.fromkeys(STEP_TESTS | {"hidden_optimizer_state_sharded", "hidden_step_traffic"}, LENGTHS)}),
    ("reduce_scatter_mean",
     replacing("mine = reduce_scatter(comm, padded)",
               "lo, hi = shard_bounds(grad.size, comm.size)[comm.rank]\n"
               "    from reference_impl.comm import allreduce\n"
               "    mine = allreduce(comm, padded)[lo:hi].copy()"),
     {"hidden_reduce_scatter_traffic": "twice what a reduce-scatter sends",
      "hidden_step_traffic": "an extra all-gather's worth"}),
    ("Zero2Adam", replacing("sizes=[self.shard.size] * self.comm.size", ""),
     {"hidden_step_traffic": "allgather without sizes"}),
    ("Zero2Adam", replacing("self.params[...] = full[:self.params.size]", "self.params = full[:self.params.size]"),
     dict.fromkeys(STEP_TESTS, "never changed")),
    ("Zero2Adam", replacing('self.adam.init_state({"shard": self.shard})',
                            'self.adam.init_state({"shard": self.shard, "all": np.zeros(params.size)})'),
     {"hidden_optimizer_state_sharded": "plain data parallelism's memory"}),
    ("shard_bounds", replacing("shard = -(-numel // n_ranks)", "shard = numel // n_ranks"),
     {"test_shard_bounds_examples": "rounds down", "hidden_shard_bounds": "rounds down",
      "test_reduce_scatter_mean_example": "Pad the gradient", "hidden_reduce_scatter_mean": WRONG_LENGTH,
      "hidden_reduce_scatter_traffic": LENGTHS,
      **dict.fromkeys(STEP_TESTS | {"hidden_optimizer_state_sharded", "hidden_step_traffic"}, LENGTHS)}),
    ("shard_bounds", replacing("    shard = -(-numel // n_ranks)\n"
                               "    return [(r * shard, (r + 1) * shard) for r in range(n_ranks)]",
                               "    from reference_impl.comm import chunk_bounds\n"
                               "    return chunk_bounds(numel, n_ranks)"),
     {"test_shard_bounds_examples": "exercise 1's chunk_bounds", "hidden_shard_bounds": "exercise 1's chunk_bounds",
      **dict.fromkeys(MEAN_TESTS, WRONG_LENGTH), "hidden_reduce_scatter_traffic": "A ring reduce-scatter sends",
      **dict.fromkeys(STEP_TESTS | {"hidden_optimizer_state_sharded", "hidden_step_traffic"}, LENGTHS)}),
], ids=["no_padding", "allreduce", "allgather_without_sizes", "params_rebound", "adam_on_everything",
        "shard_rounded_down", "uneven_chunks"])
def test_plausible_wrong_solutions_lose_the_right_tests_in_process(cell, edit, advice):
    tests = HINTS.graded_in_process(edit_cell(read_nb(SOURCE), cell, edit))
    HINTS.assert_advice(tests, advice)
    for test_id, test in tests.items():  # every failure fits the grader's line, its note included
        if not test["passed"]:
            assert not test["hint"].endswith("..."), (test_id, test["hint"])


def test_source_shards_are_the_reference_layout_in_process():
    from reference_impl.parallel import transformer as tf
    from reference_impl.parallel.zero import flat_units

    ns = notebook_namespace(read_nb(SOURCE), upto="shard_bounds")
    config = tf.GPTConfig(vocab_size=96, block_size=8, n_layer=2, n_head=2, n_embd=12)
    for ranks in range(1, 9):
        for unit in flat_units(config, ranks):
            bounds = [tuple(b) for b in ns["shard_bounds"](unit.numel, ranks)]
            assert bounds == [(r * unit.shard, (r + 1) * unit.shard) for r in range(ranks)], (unit.name, ranks)
            assert bounds[-1][1] == unit.padded
