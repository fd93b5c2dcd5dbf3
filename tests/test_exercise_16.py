"""Exercise 16 (a hashed crossed column), graded end to end with ``python -m grader``.

What is checked, with the grader runs started together once:

* the released notebook scores 0, and grading it completes;
* the released notebook with the solution cells filled in from the source scores full marks;
* a bucket taken with the *signed* modulo (``h % m`` on int64: in range, but not the lab's
  bucket) gets partial marks: only the exact bucket test fails;
* in process (no grader): two more plausible wrong crosses lose exactly the tests they should
  (a symmetric XOR of hashed ids; a polynomial ``h * 31 + ids`` that does not mix), and the
  source notebook's functions equal the reference on random columns.
"""
from __future__ import annotations

import numpy as np
import pytest

from notebook_tools import (
    ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero, edit_cell,
    grade_assignment, notebook_namespace, read_nb, replacing, run_cells,
)

ASSIGNMENT = "16_crossed_column"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "crossed_column.ipynb"
MAX_SCORE = 8.0
SOLUTION_CELLS = ("cross", "buckets")
TESTS = {"test_cross_example", "test_buckets_example", "hidden_cross", "hidden_buckets", "hidden_collisions"}

pytestmark = pytest.mark.timeout(300)

SIGNED_MOD = replacing("(h.view(np.uint64) % np.uint64(num_buckets)).astype(np.int64)", "h % num_buckets")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    source = read_nb(SOURCE)
    wrong = {"signed_mod": edit_cell(source, "buckets", SIGNED_MOD)}
    results = grade_assignment(tmp_path_factory.mktemp("grader16"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)
    return results


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=5, hidden=3)


def test_released_notebook_scores_zero_without_crashing(runs):
    assert_unimplemented_scores_zero(runs["released"], MAX_SCORE)
    assert_nothing_leaked(runs["released_text"], "splitmix64(h ^ ids)", "_ref_cross_hash")


def test_signed_modulo_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["signed_mod"], MAX_SCORE, failing={"hidden_buckets"}, score=MAX_SCORE - 2)
    assert "ids differ" in tests["hidden_buckets"]["hint"]


@pytest.mark.parametrize("edit, failing", [
    (replacing("h = splitmix64(h ^ ids).view(np.int64)", "h = h ^ splitmix64(ids).view(np.int64)"),
     {"test_cross_example", "hidden_cross", "hidden_buckets", "hidden_collisions"}),
    (replacing("h = splitmix64(h ^ ids).view(np.int64)", "h = h * 31 + ids"),
     {"hidden_cross", "hidden_buckets", "hidden_collisions"}),
], ids=["symmetric_xor", "no_mixing"])
def test_plausible_wrong_crosses_lose_the_right_tests_in_process(edit, failing):
    outcome = run_cells(edit_cell(read_nb(SOURCE), "cross", edit))
    assert set(outcome) == TESTS
    assert {t for t, error in outcome.items() if error} == failing, outcome


def test_source_functions_match_the_reference_in_process():
    from reference_impl.models import feature_columns as fc

    ns = notebook_namespace(read_nb(SOURCE), upto="buckets")
    rng = np.random.default_rng(16)
    for _ in range(10):
        cols = [rng.integers(-2**63, 2**63 - 1, size=50, dtype=np.int64) for _ in range(3)]
        np.testing.assert_array_equal(ns["cross_hash"](cols), fc.cross_hash(cols))
        np.testing.assert_array_equal(ns["crossed_bucket_ids"](cols, 997), fc.hash_to_bucket(fc.cross_hash(cols), 997))
