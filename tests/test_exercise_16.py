"""Exercise 16 (a hashed crossed column): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a bucket taken with the *signed* modulo (``h % m`` on int64:
  in range, but not the lab's bucket) gets partial marks: only the exact bucket test fails,
  with the hint written for that mistake and a link to the concept paragraph;
* in process (no grader): more plausible wrong crosses and buckets lose exactly the tests they
  should, each with the hint written for its mistake (a symmetric XOR of hashed ids; a
  polynomial ``h * 31 + ids`` that does not mix; no salt; splitmix64's uint64 not viewed as
  int64; ``abs(h) % m``; ``np.fmod``); and the source notebook's functions equal the reference
  on random columns.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["16_crossed_column"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
TESTS = {"test_cross_example", "test_buckets_example", "hidden_cross", "hidden_buckets", "hidden_collisions"}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_signed_modulo_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["signed_mod"], MAX_SCORE, failing={"hidden_buckets"}, score=MAX_SCORE - 2)
    assert "ids differ" in tests["hidden_buckets"]["hint"]
    assert "reproduce: crossed_bucket_ids([np.array([0]), np.array([0])], 7)" in tests["hidden_buckets"]["hint"]
    HINTS.assert_advice(tests, {"hidden_buckets": "Your buckets are not the lab's"})


CHAIN, CROSS_FIRST, VIEW, SIGNED = ("The cross must be exactly the lab's", "already differs from the lab's",
                                    "splitmix64 returns uint64", "Your buckets are not the lab's")


@pytest.mark.parametrize("cell, edit, advice", [
    ("cross", replacing("h = splitmix64(h ^ ids).view(np.int64)", "h = h ^ splitmix64(ids).view(np.int64)"),
     {"test_cross_example": "symmetric or cancels", "hidden_cross": CHAIN, "hidden_buckets": CROSS_FIRST,
      "hidden_collisions": "more pairs share a bucket"}),
    ("cross", replacing("h = splitmix64(h ^ ids).view(np.int64)", "h = h * 31 + ids"),
     {"hidden_cross": CHAIN, "hidden_buckets": CROSS_FIRST, "hidden_collisions": "more pairs share a bucket"}),
    ("cross", replacing("h = np.full(len(columns[0]), CROSS_SALT, dtype=np.int64)",
                        "h = np.zeros(len(columns[0]), dtype=np.int64)"),
     {"hidden_cross": CHAIN, "hidden_buckets": CROSS_FIRST}),
    ("cross", replacing("h = splitmix64(h ^ ids).view(np.int64)", "h = splitmix64(h ^ ids)"),
     dict.fromkeys(TESTS, VIEW)),
    ("buckets", replacing("(h.view(np.uint64) % np.uint64(num_buckets)).astype(np.int64)", "np.abs(h) % num_buckets"),
     {"hidden_buckets": SIGNED}),
    ("buckets", replacing("(h.view(np.uint64) % np.uint64(num_buckets)).astype(np.int64)", "np.fmod(h, num_buckets)"),
     {"test_buckets_example": SIGNED, "hidden_buckets": SIGNED, "hidden_collisions": "Fewer pairs share a bucket"}),
], ids=["symmetric_xor", "no_mixing", "no_salt", "uint64_not_viewed", "abs_modulo", "fmod"])
def test_plausible_wrong_crosses_lose_the_right_tests_in_process(cell, edit, advice):
    tests = HINTS.graded_in_process(edit_cell(read_nb(SOURCE), cell, edit))
    assert set(tests) == TESTS
    HINTS.assert_advice(tests, advice)


def test_source_functions_match_the_reference_in_process():
    from reference_impl.models import feature_columns as fc

    ns = notebook_namespace(read_nb(SOURCE), upto="buckets")
    rng = np.random.default_rng(16)
    for _ in range(10):
        cols = [rng.integers(-2**63, 2**63 - 1, size=50, dtype=np.int64) for _ in range(3)]
        np.testing.assert_array_equal(ns["cross_hash"](cols), fc.cross_hash(cols))
        np.testing.assert_array_equal(ns["crossed_bucket_ids"](cols, 997), fc.hash_to_bucket(fc.cross_hash(cols), 997))
