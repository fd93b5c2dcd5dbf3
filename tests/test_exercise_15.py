"""Exercise 15 (an SSP clock that enforces the staleness bound): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a clock whose timeout names the waiting worker instead of
  the slow one gets partial marks: the rule and the threads pass, the two tests of the error
  message fail, each with the hint written for that mistake and a link to the concept paragraph;
* in process (no grader): an off-by-one bound (``<`` for ``<=``), a bound one too loose, a
  ``wait_to_read`` that returns the wrong clock and a constructor that accepts no workers lose
  exactly the tests they should, each with the hint written for its mistake; and the source
  notebook's clock agrees with ``reference_impl.ps.ssp_clock.SSPClock`` on a random schedule.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, by_id, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["15_ssp_clock"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
TESTS = {"test_example", "hidden_rule", "hidden_threads", "hidden_fail_fast"}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_naming_the_wrong_worker_gets_partial_marks(runs):
    result = runs["names_itself"]
    failing = set(by_id(result)) - {"hidden_rule", "hidden_threads"}  # only these two pass
    tests = assert_partial_marks(result, MAX_SCORE, failing=failing, score=5.0)
    assert "must name worker" in tests["hidden_fail_fast"]["hint"]
    assert "c = SSPClock(3, 1); c.tick(0); c.tick(0); c.tick(2); c.tick(2); c.wait_to_read(2, 0.1)" in (
        tests["hidden_fail_fast"]["hint"])
    HINTS.assert_advice(tests, {test: "must name the worker everyone is waiting for" for test in failing})


BOUND, LOOSE, RETURN = "AT MOST staleness", "beyond the bound and must wait", "must return the slowest clock"


@pytest.mark.parametrize("edit, advice", [
    (replacing("<= self.staleness  # noqa", "< self.staleness  # noqa"),
     {"test_example": BOUND, "hidden_rule": BOUND, "hidden_threads": BOUND,
      "hidden_fail_fast": "yet the read timed out"}),
    (replacing("<= self.staleness  # noqa", "<= self.staleness + 1  # noqa"),
     {"test_example": LOOSE, "hidden_rule": LOOSE, "hidden_threads": "A read ran further ahead",
      "hidden_fail_fast": LOOSE}),
    (replacing("            return min(self.clocks)\n", "            return 0\n"),
     {"test_example": RETURN, "hidden_rule": RETURN, "hidden_fail_fast": RETURN}),
    (replacing('raise ValueError(f"SSPClock: need at least one worker, got {n_workers}")', "pass"),
     {"hidden_rule": "Refuse impossible clocks"}),
], ids=["strict_bound", "loose_bound", "wrong_return", "no_workers_accepted"])
def test_plausible_wrong_clocks_lose_the_right_tests_in_process(edit, advice):
    tests = HINTS.graded_in_process(edit_cell(read_nb(SOURCE), "clock", edit))
    assert set(tests) == TESTS
    HINTS.assert_advice(tests, advice)


def test_source_clock_matches_the_reference_in_process():
    from reference_impl.ps.ssp_clock import SSPClock

    ns = notebook_namespace(read_nb(SOURCE), upto="clock")
    rng = np.random.default_rng(15)
    mine, ref = ns["SSPClock"](5, 2), SSPClock(5, 2)
    for worker in rng.integers(0, 5, 60):
        mine.tick(int(worker))
        ref.tick(int(worker))
        assert mine.clocks == ref.clocks and mine.slowest() == ref.slowest()
        for reader in range(5):
            if ref.can_read(reader):
                assert mine.wait_to_read(reader, 0.01) == ref.wait_to_read(reader, 0.01)
            else:
                with pytest.raises(TimeoutError, match=f"worker {ref.clocks.index(ref.slowest())}"):
                    mine.wait_to_read(reader, 0.002)
