"""Exercise 04 (gradient bucketing with overlap), graded end to end with ``python -m grader``.

What is checked, with the grader runs started together once (as in tests/test_grader.py):

* the released notebook scores 0, and grading it completes;
* the released notebook with the solution cells filled in from the source scores full marks
  (so the hidden tests come from the gradebook, not from the learner's file);
* a solution that reduces every bucket only in ``wait()`` (right numbers, right messages,
  no overlap) gets partial marks: exactly the overlap tests fail;
* in process: every cell of the source notebook passes, and its bucket plan equals the
  reference's;
* every failing test of a wrong solution shows the hint written for that mistake (the test
  cell's ``lab`` metadata, chosen by the failure message) and a link to its paragraph; in
  process too for a plan that keeps a full bucket open (``>`` for ``>=``) and a bucketer that
  sums without dividing by the number of ranks.
"""
from __future__ import annotations

import numpy as np
import pytest


from notebook_tools import (
    Hints, ROOT, assert_nothing_leaked, assert_partial_marks, assert_solved, assert_unimplemented_scores_zero,
    edit_cell, grade_assignment, notebook_namespace, read_nb, replacing, run_cells,
)

ASSIGNMENT = "04_gradient_bucketing"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "gradient_bucketing.ipynb"
HINTS = Hints(SOURCE)
MAX_SCORE = 16.0
SOLUTION_CELLS = ("plan_buckets", "GradientBucketer")
OVERLAP_TESTS = {"test_overlap_example", "hidden_bucket_ships_when_full"}

pytestmark = pytest.mark.timeout(300)

FULL_BUCKET_STAYS_OPEN = replacing("if filled >= bucket_bytes:", "if filled > bucket_bytes:")
NO_AVERAGE = replacing('''                bucket["avg"] /= self.comm.size
''', "")
TIMING_TESTS = ("test_overlap", "hidden_bucket_ships")  # timed on a shared machine: not run in process


# A learner's bucketer that gets the numbers right but reduces every bucket in wait().
REDUCE_AT_THE_END = '''
class GradientBucketer:
    def __init__(self, comm, params, bucket_bytes):
        self.comm, self.params = comm, params
        order = backward_order(len(params))
        self.buckets, self.where = [], {}
        for positions in plan_buckets([params[i].nbytes for i in order], bucket_bytes):
            offset = 0
            for p in positions:
                self.where[order[p]] = (len(self.buckets), offset)
                offset += params[order[p]].size
            self.buckets.append(np.empty(offset, dtype=params[0].dtype))

    def add(self, index, grad):
        b, offset = self.where[index]
        self.buckets[b][offset:offset + grad.size] = grad.reshape(-1)

    def wait(self):
        averaged = [allreduce(self.comm, flat, op="sum") / self.comm.size for flat in self.buckets]
        return [averaged[b][o:o + p.size].reshape(p.shape)
                for p, (b, o) in ((p, self.where[i]) for i, p in enumerate(self.params))]

    def close(self):
        pass
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    wrong = {"at_end": edit_cell(read_nb(SOURCE), "GradientBucketer", REDUCE_AT_THE_END)}
    results = grade_assignment(tmp_path_factory.mktemp("grader04"), SOURCE, ASSIGNMENT, SOLUTION_CELLS, wrong)
    return results


def test_released_notebook_with_solutions_scores_full_marks(runs):
    """The learner's path: the released notebook (no hidden tests in it) with the solution
    cells filled in scores full marks, so every hidden test came back from the gradebook."""
    assert_solved(runs["released_solved"], ASSIGNMENT, MAX_SCORE, tests=7, hidden=4)


def test_released_notebook_scores_zero_without_crashing(runs):
    result = runs["released"]
    assert_unimplemented_scores_zero(result, MAX_SCORE)
    HINTS.assert_general_hints(result)  # nothing is a known mistake yet: every test gets its general hint
    assert_nothing_leaked(runs["released_text"], "_ref_plan", "_RefTrainer", "self.jobs.put(b)")


def test_reducing_everything_at_the_end_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["at_end"], MAX_SCORE, failing=OVERLAP_TESTS)
    assert "as soon as that bucket was full" in tests["hidden_bucket_ships_when_full"]["hint"]
    assert "expected communication to start before backward ended" in tests["test_overlap_example"]["hint"]
    HINTS.assert_advised(tests, {gid: HINTS.written(gid).hint for gid in OVERLAP_TESTS})


def test_a_full_bucket_left_open_gets_its_hint_in_process():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "plan_buckets", FULL_BUCKET_STAYS_OPEN), skip=TIMING_TESTS)
    assert "(bucket 0 stayed open after holding 8 bytes, bucket_bytes = 8)" in outcome["test_plan_buckets_examples"]
    assert HINTS.advice_in_process(outcome, whole=True) == {
        "test_plan_buckets_examples": HINTS.case("test_plan_buckets_examples", r"stayed open after holding")}


def test_summing_without_averaging_gets_its_hint_in_process():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "GradientBucketer", NO_AVERAGE), skip=TIMING_TESTS)
    assert "(exactly 2 x the average, with 2 ranks)" in outcome["hidden_averaged_gradients"], outcome
    assert "reproduce: w = (7, 9, 4); p = init_mlp(w, seed=2)" in outcome["hidden_averaged_gradients"]
    assert HINTS.advice_in_process(outcome, whole=True) == {
        gid: HINTS.case(gid, r"exactly \d+ x the average")
        for gid in ("test_averaged_gradients_example", "hidden_averaged_gradients")}


def test_every_cell_of_the_source_notebook_passes_in_process():
    from reference_impl.comm.bucketing import plan_buckets

    namespace = notebook_namespace(read_nb(SOURCE))
    rng = np.random.default_rng(3)
    for _ in range(100):
        sizes = [int(s) for s in rng.integers(0, 900, size=int(rng.integers(0, 12)))]
        cap = int(rng.integers(0, 3000))
        assert namespace["plan_buckets"](sizes, cap) == plan_buckets(sizes, cap)
