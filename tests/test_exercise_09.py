"""Exercise 09 (sparse_table_pull / push and the temporary embedding matrix), graded end to
end with ``python -m grader``.

What is checked, with the grader runs started together once:

* the released notebook scores 0, and grading it completes;
* the released notebook with the solution cells filled in from the source scores full marks;
* a gradient that assigns instead of scatter-adding (``d[local] += d_out`` keeps one of the
  repeated rows) gets partial marks: the pull tests pass, every test of the gradient fails;
* in process: the source notebook's functions equal the reference on random batches.
"""
from __future__ import annotations

import numpy as np
import pytest

from notebook_tools import (
    ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero, edit_cell,
    grade_assignment, notebook_namespace, read_nb, replacing,
)

ASSIGNMENT = "09_sparse_table"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "sparse_table.ipynb"
MAX_SCORE = 11.0
SOLUTION_CELLS = ("pull", "grad_push")
GRADIENT_TESTS = {"test_grad_example", "hidden_grad", "hidden_push", "hidden_traffic"}

pytestmark = pytest.mark.timeout(300)

NO_ADD_AT = replacing("np.add.at(d_matrix, local_index.ravel(), d_out.reshape(-1, dim))",
                      "d_matrix[local_index.ravel()] += d_out.reshape(-1, dim)")
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    source = read_nb(SOURCE)
    wrong = {"no_add_at": edit_cell(source, "grad_push", NO_ADD_AT)}
    results = grade_assignment(tmp_path_factory.mktemp("grader09"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)
    return results


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=6, hidden=4)


def test_released_notebook_scores_zero_without_crashing(runs):
    assert_unimplemented_scores_zero(runs["released"], MAX_SCORE)
    assert_nothing_leaked(runs["released_text"], "np.add.at(d_matrix", "_reference_worker")


def test_assigning_instead_of_scatter_adding_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["no_add_at"], MAX_SCORE, failing=GRADIENT_TESTS, score=3.0)
    assert "row 0 is used twice" in tests["test_grad_example"]["hint"]


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
