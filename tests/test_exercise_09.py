"""Exercise 09 (sparse_table_pull / push and the temporary embedding matrix): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a gradient that assigns instead of scatter-adding
  (``d[local] += d_out`` keeps one of the repeated rows) gets partial marks: the pull tests
  pass, every test of the gradient fails, each with the hint written for that mistake and a
  link to the concept paragraph;
* in process (no grader): five more plausible mistakes (no dedupe, a flat local index, pulling
  the whole batch, pushing row by row, a gradient sized by the batch) fail exactly their tests,
  each advised with the hint written for it;
* in process: the source notebook's functions equal the reference on random batches.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["09_sparse_table"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
GRADIENT_TESTS = {"test_grad_example", "hidden_grad", "hidden_push", "hidden_traffic"}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_assigning_instead_of_scatter_adding_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["no_add_at"], MAX_SCORE, failing=GRADIENT_TESTS, score=3.0)
    assert "row 0 is used twice" in tests["test_grad_example"]["hint"]
    assert "smallest failing input: embedding_grad(np.array([0, 0]), np.array([[1.0], [2.0]]), 1)" in (
        tests["hidden_grad"]["hint"])
    HINTS.assert_advice(tests, {"test_grad_example": "The backward of a gather is a scatter-add",
                          "hidden_grad": "The backward of a gather is a scatter-add",
                          "hidden_push": "After pull, gradient and push with Adagrad",
                          "hidden_traffic": "Each id travelled once"})


@pytest.mark.parametrize("cell, old, new, advice", [
    ("pull", "unique_ids, local_index = np.unique(ids.ravel(), return_inverse=True)",
     "unique_ids, local_index = ids.ravel(), np.arange(ids.size)",
     {"test_pull_example": "unique_ids repeats an id", "hidden_pull": "unique_ids repeats an id",
      "hidden_push": "table.push refuses an id named twice", "hidden_traffic": "table.push refuses an id named twice"}),
    ("pull", "local_index = local_index.reshape(ids.shape)", "pass",
     {"test_pull_example": "must have the shape of ids", "hidden_pull": "must have the shape of ids"}),
    ("pull", "matrix = table.pull(unique_ids)",
     "matrix = table.pull(ids.ravel())[np.unique(ids.ravel(), return_index=True)[1]]",
     {"hidden_traffic": "More ids travelled to the servers"}),
    ("grad_push", "table.push(np.asarray(unique_ids), np.asarray(d_matrix))",
     "for i, g in zip(unique_ids, d_matrix):\n        table.push(np.array([i]), np.asarray(g)[None])",
     {"hidden_traffic": "accepts a push only for ids pulled"}),
    ("grad_push", "d_matrix = np.zeros((n_unique, dim))", "d_matrix = np.zeros((local_index.max() + 1, dim))",
     {"hidden_grad": "one row per unique id: shape (n_unique, dim)"}),
], ids=["no_dedupe", "flat_local_index", "pull_whole_batch", "push_row_by_row", "gradient_sized_by_batch"])
def test_plausible_wrong_solutions_fail_their_tests_with_their_hints_in_process(cell, old, new, advice):
    tests = HINTS.graded_in_process(edit_cell(read_nb(SOURCE), cell, replacing(old, new)))
    HINTS.assert_advice(tests, advice)
    if advice.get("hidden_traffic") == "accepts a push only for ids pulled":  # the PSError says what to do
        assert "must have been pulled first in the same step" in tests["hidden_traffic"]["hint"]


def test_source_functions_match_the_reference_in_process():
    from reference_impl.ps import ShardedSparseTable, embedding_lookup_grad, sparse_table_pull

    ns = notebook_namespace(read_nb(SOURCE), upto="grad_push")
    rng = np.random.default_rng(12)
    for _ in range(10):
        ids = rng.integers(0, 15, size=(20, 3))
        u, local, m = ns["sparse_table_pull"](ShardedSparseTable(2, 3, seed=1), ids)
        ref = sparse_table_pull(ShardedSparseTable(2, 3, seed=1), ids)
        np.testing.assert_array_equal(u, ref.unique_ids)
        np.testing.assert_array_equal(m[local], ref.matrix[ref.local_index])
        d_out = rng.normal(size=(20, 3, 3))
        np.testing.assert_allclose(ns["embedding_grad"](local, d_out, len(u)), embedding_lookup_grad(ref, d_out))
