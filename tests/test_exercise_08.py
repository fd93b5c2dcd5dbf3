"""Exercise 08 (magnitude pruning and CSR), graded end to end with ``python -m grader``.

* the released notebook scores 0, and grading it completes;
* the released notebook with the solution cells filled in from the source scores full marks;
* pruning by signed value instead of magnitude gets partial marks: the CSR tests pass, the
  pruning tests fail with a hint naming the case;
* in process: the source's functions agree with ``reference_impl.sparsity`` on random inputs.
"""
from __future__ import annotations

import numpy as np
import pytest

from notebook_tools import (
    ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero, edit_cell,
    grade_assignment, notebook_namespace, read_nb, replacing,
)

ASSIGNMENT = "08_sparsity"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "sparsity.ipynb"
MAX_SCORE = 10.0
SOLUTION_CELLS = ("magnitude_prune", "csr_from_dense", "csr_matvec")
PRUNE_TESTS = {"test_prune_example", "hidden_prune"}

pytestmark = pytest.mark.timeout(300)

SIGNED = replacing("np.argsort(np.abs(flat), kind=\"stable\")", "np.argsort(flat, kind=\"stable\")")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    source = read_nb(SOURCE)
    wrong = {"signed": edit_cell(source, "magnitude_prune", SIGNED)}
    results = grade_assignment(tmp_path_factory.mktemp("grader08"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)
    return results


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=6, hidden=3)


def test_released_notebook_scores_zero_without_crashing(runs):
    assert_unimplemented_scores_zero(runs["released"], MAX_SCORE)
    assert_nothing_leaked(runs["released_text"], "_ref_magnitude_mask", "np.bincount(row_of")


def test_pruning_by_signed_value_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["signed"], MAX_SCORE, failing=PRUNE_TESTS)
    assert "magnitude_prune(w, 0.7)" in tests["test_prune_example"]["hint"]


def test_source_functions_match_reference_in_process():
    from reference_impl.sparsity import CSR, magnitude_mask

    ns = notebook_namespace(read_nb(SOURCE), upto="csr_matvec")
    rng = np.random.default_rng(12)
    for _ in range(10):
        a = rng.normal(size=(int(rng.integers(1, 20)), int(rng.integers(1, 20))))
        s = float(rng.random())
        pruned = ns["magnitude_prune"](a, s)
        np.testing.assert_array_equal(pruned, a * magnitude_mask(a, s))
        data, indices, indptr = ns["csr_from_dense"](pruned)
        ref = CSR.from_dense(pruned)
        np.testing.assert_array_equal(indptr, ref.indptr)
        x = rng.normal(size=a.shape[1])
        np.testing.assert_allclose(ns["csr_matvec"](data, indices, indptr, x), ref.matmul(x), rtol=1e-12)
