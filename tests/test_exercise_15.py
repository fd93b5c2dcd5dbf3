"""Exercise 15 (an SSP clock that enforces the staleness bound), graded end to end with
``python -m grader``.

What is checked, with the grader runs started together once:

* the released notebook scores 0, and grading it completes;
* the released notebook with the solution cells filled in from the source scores full marks;
* a clock whose timeout names the waiting worker instead of the slow one gets partial marks:
  the rule and the threads pass, the two tests of the error message fail, each with the hint
  written for that mistake and a link to the concept paragraph;
* in process (no grader): an off-by-one bound (``<`` for ``<=``), a bound one too loose, a
  ``wait_to_read`` that returns the wrong clock and a constructor that accepts no workers lose
  exactly the tests they should, each with the hint written for its mistake; every test cell
  has a hint and a link; and the source notebook's clock agrees with
  ``reference_impl.ps.ssp_clock.SSPClock`` on a random schedule.
"""
from __future__ import annotations

import numpy as np
import pytest

from notebook_tools import (
    Hints, ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero,
    by_id, edit_cell, grade_assignment, notebook_namespace, read_nb, replacing,
)

ASSIGNMENT = "15_ssp_clock"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "ssp_clock.ipynb"
HINTS = Hints(SOURCE)
MAX_SCORE = 8.0
SOLUTION_CELLS = ("clock",)
TESTS = {"test_example", "hidden_rule", "hidden_threads", "hidden_fail_fast"}

pytestmark = pytest.mark.timeout(300)


NAMES_ITSELF = replacing("slow = min(range(len(self.clocks)), key=self.clocks.__getitem__)", "slow = worker")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    source = read_nb(SOURCE)
    wrong = {"names_itself": edit_cell(source, "clock", NAMES_ITSELF)}
    results = grade_assignment(tmp_path_factory.mktemp("grader15"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)
    return results


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=4, hidden=3)


def test_released_notebook_scores_zero_without_crashing(runs):
    assert_unimplemented_scores_zero(runs["released"], MAX_SCORE)
    assert_nothing_leaked(runs["released_text"], "notify_all()", "_RefClock")


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
