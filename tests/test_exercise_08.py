"""Exercise 08 (magnitude pruning and CSR): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: pruning by signed value instead of magnitude gets partial
  marks: the CSR tests pass, the pruning tests fail with the hint written for that mistake
  (the test cell's ``lab`` metadata, chosen by the failure message) and a link to its paragraph;
* in process: the same for a ``k`` truncated instead of rounded, an ``indptr`` without its
  leading 0, and a ``csr_matvec`` that drops trailing empty rows; the source's functions agree
  with ``reference_impl.sparsity`` on random inputs.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import (
    Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing, run_cells,
)

SPEC = EXERCISES["08_sparsity"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
PRUNE_TESTS = {"test_prune_example", "hidden_prune"}

pytestmark = pytest.mark.timeout(300)

TRUNCATED_K = replacing("k = int(round(sparsity * w.size))", "k = int(sparsity * w.size)")
NO_LEADING_ZERO = replacing('''    indptr = np.zeros(a.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=a.shape[0]), out=indptr[1:])''',
                            "    indptr = np.cumsum(np.bincount(rows, minlength=a.shape[0]))")
NO_MINLENGTH = replacing("weights=data * x[indices], minlength=rows)", "weights=data * x[indices])")


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_pruning_by_signed_value_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["signed"], MAX_SCORE, failing=PRUNE_TESTS)
    assert "magnitude_prune(w, 0.7)" in tests["test_prune_example"]["hint"]
    assert "reproduce: magnitude_prune(np.array([" in tests["hidden_prune"]["hint"]
    HINTS.assert_advised(tests, {gid: HINTS.case(gid, r"but kept one of magnitude") for gid in PRUNE_TESTS},
                         whole=True)


@pytest.mark.parametrize("cell, edit, expected", [
    ("magnitude_prune", TRUNCATED_K, {"hidden_prune": r"entries zeroed, \d+ expected"}),
    ("csr_from_dense", NO_LEADING_ZERO, {"test_csr_example": r"indptr: expected shape",
                                        "hidden_csr": r"indptr: expected shape"}),
    ("csr_matvec", NO_MINLENGTH, {"hidden_matvec": r"expected shape .*of them empty"}),
], ids=["k_truncated", "indptr_without_leading_zero", "trailing_empty_rows_dropped"])
def test_other_plausible_mistakes_get_their_hints_in_process(cell, edit, expected):
    outcome = run_cells(edit_cell(read_nb(SOURCE), cell, edit), skip=("demo",))
    assert HINTS.advice_in_process(outcome, whole=True) == {gid: HINTS.case(gid, pattern) for gid, pattern in expected.items()}, outcome


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
