"""Exercise 13 (a code generator for a dense layer with inlined weights): what is specific to it.

The checks every exercise shares (full marks with the solutions, zero for the stubs with the
general hints, nothing secret in the release, every source cell passing in process) are
tests/test_exercises.py's; the grading below is the session's one grading of this exercise
(``graded``), with the wrong solution of tests/exercise_specs.py. The hidden tests compile the
learner's C with the system compiler inside the grader's sandbox, so these gradings also check
that the toolchain works there.

* graded with ``python -m grader``: a generator that writes every weight, zeros included, gets
  partial marks: its layers compute the right values, the sparsity test fails, with the hint
  written for that mistake and a link to the concept paragraph;
* in process (no grader): more plausible mistakes (no bias, W read transposed, the name argument
  ignored, a dangling '+' for an all-zero column) fail exactly their tests with their hints
  (every test cell having a hint and a link is tests/test_hints.py's);
* in process: the source's generated layer, compiled, equals ``x @ W + b``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, assert_partial_marks, edit_cell, notebook_namespace, read_nb, replacing

SPEC = EXERCISES["13_codegen"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
MAX_SCORE = SPEC.max_score

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(graded) -> dict[str, Any]:
    return graded(SPEC.assignment)


def test_writing_zero_weights_gets_partial_marks(runs):
    tests = assert_partial_marks(runs["with_zeros"], MAX_SCORE, failing={"hidden_sparsity"})
    assert "expected one x[...] term per non-zero weight" in tests["hidden_sparsity"]["hint"]
    assert "smallest failing input: generate_layer(np.array([[0.0]], np.float32)" in tests["hidden_sparsity"]["hint"]
    HINTS.assert_advice(tests, {"hidden_sparsity": "more x[...] terms than W has non-zero weights"})


@pytest.mark.parametrize("old, new, advice", [
    ("terms = [c_float(b[j])] + [", "terms = [",
     {"test_layer_example": "computes the wrong values", "hidden_layers": "computes the wrong values",
      "hidden_sparsity": "all zeros must be exactly"}),
    ('f"x[{k}]*{c_float(w[k, j])}" for k in np.flatnonzero(w[:, j])',
     'f"x[{k}]*{c_float(w[j, k])}" for k in np.flatnonzero(w[j, :])',
     {"test_layer_example": "computes the wrong values", "hidden_layers": "indexed W out of range",
      "hidden_sparsity": "indexed W out of range"}),
    ('lines = [f"void {name}(const float *x, float *y) {{"]', 'lines = ["void layer(const float *x, float *y) {"]',
     {"hidden_layers": "called by the name argument"}),
    ("lines.append(f\"    y[{j}] = {' + '.join(terms)};\")",
     "lines.append(f\"    y[{j}] = {terms[0]} + {' + '.join(terms[1:])};\")",
     {"hidden_layers": "does not compile", "hidden_sparsity": "all zeros must be exactly"}),
], ids=["no_bias", "w_transposed", "name_ignored", "dangling_plus"])
def test_plausible_wrong_generators_fail_their_tests_with_their_hints_in_process(old, new, advice):
    tests = HINTS.graded_in_process(edit_cell(read_nb(SOURCE), "generate_layer", replacing(old, new)))
    HINTS.assert_advice(tests, advice)
    if "does not compile" in advice.get("hidden_layers", ""):  # the compiler's error, not its command line
        assert "the C compiler rejected the source: expected expression" in tests["hidden_layers"]["hint"]


def test_source_generator_compiles_and_matches_numpy_in_process():
    ns = notebook_namespace(read_nb(SOURCE), upto="generate_layer")
    rng = np.random.default_rng(13)
    w = (rng.normal(size=(7, 5)) * (rng.random((7, 5)) < 0.4)).astype(np.float32)
    b = rng.normal(size=5).astype(np.float32)
    f = ns["compile_layer"](ns["generate_layer"](w, b, "inproc"), "inproc")
    x = rng.normal(size=7).astype(np.float32)
    np.testing.assert_allclose(f(x, 5), x @ w + b, rtol=1e-5, atol=1e-6)
