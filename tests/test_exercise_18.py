"""Exercise 18 (the FSDP schedule: gather, compute, free, prefetch): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py.

* graded with ``python -m grader``: a schedule that never re-gathers (each layer kept gathered from
  its forward to its backward) gets partial marks: its gradients and trained parameters are right,
  so exactly the schedule, peak and traffic tests fail, each with the hint written for that
  mistake (too many layers gathered at once; a layer must be gathered again for its backward;
  one all-gather per layer instead of two);
* in process: more plausible wrong schedules and steps (freed after the forward and never
  gathered again, the prefetch issued after the computation, the reduce-scatter before the free,
  a gather two computations ahead, gathered arrays kept after their free) lose exactly the tests
  they should, each with its hint;
* the source schedule issues the collectives in the reference's order: a stage-3 ``ZeroTrainer``
  (``reference_impl.parallel.fsdp``) on the lab's GPT, instrumented, gathers and reduce-scatters
  its layers in exactly the order of ``fsdp_schedule``, with and without prefetch.
"""
from __future__ import annotations

from typing import Any

import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["18_fsdp_schedule"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
TESTS = {"test_schedule_example", "test_fsdp_step_example", "test_peak_example", "hidden_schedule",
         "hidden_fsdp_gradients", "hidden_peak_live", "hidden_traffic"}

pytestmark = pytest.mark.timeout(300)

TOO_MANY = "Too many layers are gathered at once"
REGATHER = "must be gathered again for its backward"
NOT_GATHERED = "A computation ran on a layer that was not gathered"

NO_REGATHER = '''
def fsdp_schedule(n_layers, prefetch=True):
    ops = []
    for i in range(n_layers):
        ops += [("gather", i), ("forward", i), ("free", i)]
    for i in reversed(range(n_layers)):
        ops += [("backward", i), ("reduce_scatter", i)]  # the layer was freed after its forward
    return ops
'''
PREFETCH = '''    if prefetch and computations:
        ops.append(("gather", computations[0][1]))
    for k, (phase, i) in enumerate(computations):
        if not prefetch:
            ops.append(("gather", i))
        elif k + 1 < len(computations):
            ops.append(("gather", computations[k + 1][1]))  # runs while computation k computes
        ops += [(phase, i), ("free", i)]'''


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_keeping_layers_gathered_gets_partial_marks(runs):
    failing = {"test_schedule_example", "test_peak_example", "hidden_schedule", "hidden_peak_live", "hidden_traffic"}
    tests = assert_partial_marks(runs["keep_gathered"], MAX_SCORE, failing=failing, score=6.0)
    assert "it holds up to 3 layers gathered at once" in tests["test_peak_example"]["hint"]
    assert "not 2L" in tests["hidden_schedule"]["hint"]
    assert "one all-gather per layer, not two" in tests["hidden_traffic"]["hint"]
    HINTS.assert_advice(tests, {"test_schedule_example": TOO_MANY, "test_peak_example": TOO_MANY,
                                "hidden_schedule": REGATHER, "hidden_peak_live": REGATHER,
                                "hidden_traffic": "all-gathered only once"})


@pytest.mark.parametrize("cell, edit, advice", [
    ("fsdp_schedule", NO_REGATHER,
     {**dict.fromkeys(("test_schedule_example", "hidden_schedule", "test_peak_example", "hidden_peak_live",
                       "hidden_traffic"), REGATHER),
      **dict.fromkeys(("test_fsdp_step_example", "hidden_fsdp_gradients"), NOT_GATHERED)}),
    ("fsdp_schedule", replacing(PREFETCH, '''    for k, (phase, i) in enumerate(computations):
        ops.append(("gather", i))
        ops += [(phase, i), ("free", i)]'''),
     dict.fromkeys(("test_schedule_example", "hidden_schedule", "hidden_peak_live"), "so the all-gather can overlap it")),
    ("fsdp_schedule", replacing('''        ops += [(phase, i), ("free", i)]
        if phase == "backward":
            ops.append(("reduce_scatter", i))''', '''        ops.append((phase, i))
        if phase == "backward":
            ops.append(("reduce_scatter", i))
        ops.append(("free", i))'''),
     dict.fromkeys(("test_schedule_example", "hidden_schedule"), "Build the 2L computations first")),
    ("fsdp_schedule", replacing('''            ops.append(("gather", computations[k + 1][1]))  # runs while computation k computes''',
                                '''            ops.append(("gather", computations[k + 1][1]))  # runs while computation k computes
            if k == 0 and len(computations) > 2:
                ops.append(("gather", computations[2][1]))  # two ahead'''),
     {**dict.fromkeys(("test_schedule_example", "hidden_schedule", "test_fsdp_step_example", "test_peak_example",
                       "hidden_peak_live"), "Every gather needs its free"),
      "hidden_traffic": "Stage 3 sends 1.5 times"}),
    ("fsdp_step", replacing('''            copies.setdefault(i, []).append(stack.gather(i))''',
                            '''            copies.setdefault(i, []).append(stack.gather(i))
            stack.kept = getattr(stack, "kept", []) + [copies[i][-1]]  # a list that outlives the step'''),
     {"hidden_peak_live": "still holds the gathered array"}),
], ids=["freed_never_regathered", "prefetch_after_compute", "reduce_scatter_before_free", "two_ahead",
        "keeps_gathered_arrays"])
def test_plausible_wrong_solutions_lose_the_right_tests_in_process(cell, edit, advice):
    tests = HINTS.graded_in_process(edit_cell(read_nb(SOURCE), cell, edit))
    assert set(tests) == TESTS
    HINTS.assert_advice(tests, advice)
    for test_id, test in tests.items():  # every failure fits the grader's line, its note included
        if not test["passed"]:
            assert not test["hint"].endswith("..."), (test_id, test["hint"])


@pytest.mark.parametrize("prefetch", [False, True])
def test_source_schedule_is_the_reference_trainers_collective_order_in_process(prefetch):
    from reference_impl.comm import run_threads
    from reference_impl.parallel import transformer as tf
    from reference_impl.parallel.zero import ZeroTrainer

    ns = notebook_namespace(read_nb(SOURCE), upto="fsdp_schedule")

    class Recording(ZeroTrainer):
        def __init__(self, *args, **kwargs):
            self.calls = []
            super().__init__(*args, **kwargs)

        def gather_unit(self, name, phase):
            self.calls.append(("gather", name))
            return super().gather_unit(name, phase)

        def reduce_scatter_unit(self, name, packed):
            self.calls.append(("reduce_scatter", name))
            return super().reduce_scatter_unit(name, packed)

    for n_layer in (1, 2, 4):
        config = tf.GPTConfig(vocab_size=96, block_size=8, n_layer=n_layer, n_head=2, n_embd=8)
        names = [layer.name for layer in tf.layers(config)]
        tokens = (tf.np.arange(16) % 96).reshape(2, 8)

        def step(comm):
            with Recording(comm, config, tf.init_params(config, dtype=tf.np.float64), stage=3,
                           prefetch=prefetch) as t:
                t.step(tokens, tokens)
                return t.calls

        reference = run_threads(2, step, timeout=30)[0]
        ops = ns["fsdp_schedule"](len(names), prefetch)
        mine = [(op, names[i]) for op, i in ops if op in ("gather", "reduce_scatter")]
        assert mine == reference, (n_layer, prefetch)
