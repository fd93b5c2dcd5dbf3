"""Exercise 19 (tensor parallelism: f and g, column- and row-parallel linear layers): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solutions of tests/exercise_specs.py.

* graded with ``python -m grader``: an ``f`` that allreduces in its forward (the replicated
  input counted p times) gets partial marks, 8 of 19: exactly the tests of f and g and of the
  MLP fail, each with the hint written for that mistake, while both linear layers pass; a
  row-parallel layer that adds its bias before g's allreduce (the bias counted p times) gets
  9 of 19: exactly the row-parallel and MLP value tests fail, the traffic test passes;
* in process: more plausible wrong solutions (f's backward without its allreduce, g's backward
  with one, an identity that allreduces and divides by p, a row layer without g or without its
  bias, a bias gradient split over the ranks, a transposed weight gradient, an MLP that returns
  the partial input gradient) lose exactly the tests they should, each with its hint;
* on PyTorch tensors (``LAB_DEVICE=torch``, what ``--device torch`` sets; the CPU stand-in for
  ``gpu``) the source notebook passes every test, and an ``f`` that returns ``x.copy()`` (right
  on NumPy) loses exactly the tests that call f, each failure naming the device;
* the source notebook's layers are the reference's: its ``ParallelMLP``, built from
  ``reference_impl.parallel.tensor_parallel.shard_mlp``'s shards of the lab's GPT, gives the
  reference ``ParallelMLP``'s output, input gradient and shard gradients on 1 to 4 ranks.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["19_tensor_parallel"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score
TESTS = {"test_f_and_g_example", "test_column_example", "test_row_example", "test_mlp_example", "hidden_f_and_g",
         "hidden_column_parallel", "hidden_row_parallel", "hidden_mlp_matches_reference", "hidden_mlp_traffic"}
CONJ = {"test_f_and_g_example", "hidden_f_and_g"}
ROW = {"test_row_example", "hidden_row_parallel"}
MLP = {"test_mlp_example", "hidden_mlp_matches_reference"}

pytestmark = pytest.mark.timeout(300)

IDENTITY_SUMMED = "An identity allreduced"
F_FORWARD_SUMMED = "f's forward allreduced the input"
BIAS_P_TIMES = "The bias was added p times"
NOT_SUMMED = "A partial was never added up"
DX_PARTIAL = "Your dx is still each rank's partial"
TWICE = "A gradient was summed twice"
BIAS_SPLIT = "Your bias gradient is divided by p"
TRANSPOSED = "Your weight gradient is transposed"
MLP_GENERAL = "forward: x = f_forward(comm, x)"


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_f_allreducing_in_the_forward_gets_partial_marks(runs):
    failing = CONJ | MLP | {"hidden_mlp_traffic"}
    tests = assert_partial_marks(runs["f_allreduces_forward"], MAX_SCORE, failing=failing, score=8.0)
    assert "(exactly 2 x its input: f_forward summed 2 identical copies)" in tests["test_f_and_g_example"]["hint"]
    assert "f's forward summed 2 identical copies of x" in tests["hidden_mlp_matches_reference"]["hint"]
    assert "(2 allreduces in the forward)" in tests["hidden_mlp_traffic"]["hint"]
    HINTS.assert_advice(tests, {**dict.fromkeys(CONJ, IDENTITY_SUMMED), **dict.fromkeys(MLP, F_FORWARD_SUMMED),
                                "hidden_mlp_traffic": "The forward sent two allreduces"})


def test_bias_added_before_the_reduce_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["bias_before_reduce"], MAX_SCORE, failing=ROW | MLP, score=9.0)
    assert "(the bias added 2 times: it was added before g's allreduce)" in tests["test_row_example"]["hint"]
    assert "(c_proj's bias added 2 times" in tests["hidden_mlp_matches_reference"]["hint"]
    HINTS.assert_advice(tests, dict.fromkeys(ROW | MLP, BIAS_P_TIMES))


F_FORWARD = "return x  # nothing to send: x is replicated"
F_BACKWARD = "    return allreduce(comm, dx)"
G_BACKWARD = "return dy  # every rank's partial counted once in the sum"
ROW_FORWARD = "y = g_forward(self.comm, x_r @ self.weight.T)"


@pytest.mark.parametrize("cell, edit, advice", [
    ("f_and_g", replacing(F_BACKWARD, "    return dx"),
     {**dict.fromkeys(CONJ, NOT_SUMMED), **dict.fromkeys(MLP, DX_PARTIAL),
      "hidden_mlp_traffic": "The backward sent nothing"}),
    ("f_and_g", replacing(G_BACKWARD, "return allreduce(comm, dy)"),
     {**dict.fromkeys(CONJ, IDENTITY_SUMMED), **dict.fromkeys(ROW, "Your gradients are p times too large"),
      **dict.fromkeys(MLP, TWICE), "hidden_mlp_traffic": "The backward sent two allreduces"}),
    ("f_and_g", replacing(F_FORWARD, "return allreduce(comm, x) / comm.size"),
     {"hidden_f_and_g": "This operator must send nothing", "hidden_mlp_traffic": "The forward sent two allreduces"}),
    ("RowParallelLinear", replacing(ROW_FORWARD, "y = x_r @ self.weight.T"),
     {**dict.fromkeys(ROW, "this rank's partial sum only"), **dict.fromkeys(MLP, MLP_GENERAL),
      "hidden_mlp_traffic": "The forward sent nothing"}),
    ("RowParallelLinear", replacing("return y + self.bias  # once", "return y  # once"),
     {**dict.fromkeys(ROW, "Your output has no bias"), **dict.fromkeys(MLP, MLP_GENERAL)}),
    ("RowParallelLinear", replacing('"bias": dy_t.sum(axis=0)}', '"bias": dy_t.sum(axis=0) / self.comm.size}'),
     dict.fromkeys(ROW | MLP, BIAS_SPLIT)),
    ("ColumnParallelLinear", replacing('"weight": dy_t.T @ x.reshape(-1, x.shape[-1])',
                                       '"weight": x.reshape(-1, x.shape[-1]).T @ dy_t'),
     {"test_column_example": TRANSPOSED, "hidden_column_parallel": TRANSPOSED,
      "test_mlp_example": MLP_GENERAL, "hidden_mlp_matches_reference": TRANSPOSED}),
    ("ParallelMLP", replacing("return f_backward(self.comm, dx_partial), grads", "return dx_partial, grads"),
     {**dict.fromkeys(MLP, DX_PARTIAL), "hidden_mlp_traffic": "The backward sent nothing"}),
], ids=["f_backward_identity", "g_backward_allreduces", "f_forward_allreduce_over_p", "row_without_g",
        "row_without_bias", "bias_gradient_split", "weight_gradient_transposed", "mlp_without_f_backward"])
def test_plausible_wrong_solutions_lose_the_right_tests_in_process(cell, edit, advice):
    tests = HINTS.graded_in_process(edit_cell(read_nb(SOURCE), cell, edit))
    assert set(tests) == TESTS
    HINTS.assert_advice(tests, advice)
    for test_id, test in tests.items():  # every failure fits the grader's line, its note included
        if not test["passed"]:
            assert not test["hint"].endswith("..."), (test_id, test["hint"])


def test_the_tests_run_on_pytorch_tensors_in_process(monkeypatch):
    from notebook_tools import run_cells

    monkeypatch.setenv("LAB_DEVICE", "torch")
    assert all(error is None for error in run_cells(read_nb(SOURCE), skip=("demo",)).values())
    numpy_only = edit_cell(read_nb(SOURCE), "f_and_g", replacing(
        "return x  # nothing to send: x is replicated", "return x.copy()  # nothing to send: x is replicated"))
    outcome = run_cells(numpy_only, skip=("demo",))
    failed = {test_id: error for test_id, error in outcome.items() if error is not None}
    assert set(failed) == CONJ | MLP | {"hidden_mlp_traffic"}, outcome
    for test_id, error in failed.items():
        assert "(device torch): expected a result, found AttributeError" in error, (test_id, error)
        assert "has no attribute 'copy'" in error, (test_id, error)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_source_mlp_is_the_reference_parallel_mlp_in_process(ranks):
    from reference_impl.comm import run_threads
    from reference_impl.parallel import transformer as tf
    from reference_impl.parallel.tensor_parallel import ParallelMLP, shard_mlp

    ns = notebook_namespace(read_nb(SOURCE), upto="ParallelMLP")
    config = tf.GPTConfig(vocab_size=96, block_size=8, n_layer=2, n_head=2, n_embd=12)  # 4C = 48: 1-4 ranks divide it
    params = tf.init_params(config, seed=19, dtype=np.float64)
    rng = np.random.default_rng(1919)
    x, dout = rng.standard_normal((2, 5, 12)), rng.standard_normal((2, 5, 12))
    pre = "h.1.mlp."

    def both(comm):
        shards = shard_mlp(params, 1, comm.rank, comm.size)
        reference = ParallelMLP(comm, shards, 1)
        ref_out = reference.forward(x.copy())
        ref_dx, ref_grads = reference.backward(dout.copy())
        mine = ns["ParallelMLP"](comm, ns["ColumnParallelLinear"](shards[pre + "c_fc.weight"], shards[pre + "c_fc.bias"]),
                                 ns["RowParallelLinear"](comm, shards[pre + "c_proj.weight"], shards[pre + "c_proj.bias"]))
        out = mine.forward(x.copy())
        dx, grads = mine.backward(dout.copy())
        return (ref_out, ref_dx, {k[len(pre):]: v for k, v in ref_grads.items()}), (out, dx, grads)

    for r, ((ref_out, ref_dx, ref_grads), (out, dx, grads)) in enumerate(run_threads(ranks, both, timeout=30)):
        np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13, err_msg=f"output, rank {r} of {ranks}")
        np.testing.assert_allclose(dx, ref_dx, rtol=1e-12, atol=1e-13, err_msg=f"dx, rank {r} of {ranks}")
        assert set(grads) == set(ref_grads)
        for name, g in ref_grads.items():
            np.testing.assert_allclose(grads[name], g, rtol=1e-12, atol=1e-13, err_msg=f"{name}, rank {r} of {ranks}")
