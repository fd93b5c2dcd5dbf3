"""Exercise 07 (a custom op with a C kernel): what is specific to it, all in process (cheaper
than another sandboxed grading). The checks every exercise shares (full marks with the
solutions, zero for the stubs with the general hints, nothing secret in the release, every
source cell passing in process) are tests/test_exercises.py's.

* a kernel that indexes ``x`` as dense row-major (``i * d + j``) instead of through its
  strides, while declaring it ``layout="strided"``, fails only the non-contiguous test, with a
  hint about strides;
* a kernel that never checks for NaN, a shape function that accepts mismatched sizes, and a
  gradient for ``s`` that forgets to weight by ``x`` get the hint written for that mistake (the
  test cell's ``lab`` metadata, chosen by the failure message);
* the source's kernel equals ``x * s[:, None]`` on random shapes and views.
"""
from __future__ import annotations

import numpy as np
import pytest

from exercise_specs import EXERCISES
from notebook_tools import Hints, edit_cell, notebook_namespace, read_nb, replacing, run_cells
from reference_impl.toolchain import ToolchainError, find_c_compiler

try:
    find_c_compiler()
except ToolchainError:
    pytest.skip("no C compiler on this machine", allow_module_level=True)

SPEC = EXERCISES["07_custom_op"]
SOURCE = SPEC.source
HINTS = Hints(SOURCE)
STRIDE_TESTS = {"hidden_non_contiguous"}

pytestmark = pytest.mark.timeout(300)

NO_STRIDES = replacing("y[i * d + j] = xd[LAB_AT2(x, i, j)] * s[i];", "y[i * d + j] = xd[i * d + j] * s[i];")
NO_NAN_CHECK = replacing('''        if (s[i] != s[i])
            return LAB_FAIL("s[%lld] is NaN", (long long)i);
''', "")
NO_SHAPE_CHECK = replacing('''    if x is not None and s is not None and None not in (x[0], s[0]) and x[0] != s[0]:
        raise ShapeError(f"x has {x[0]} rows but s has {s[0]} entries")
''', "")
GRAD_S_WITHOUT_X = replacing("G.reduce_sum(g * x, axis=1)", "G.reduce_sum(g, axis=1)")


def test_kernel_ignoring_strides_fails_only_the_non_contiguous_test():
    outcome = run_cells(edit_cell(read_nb(SOURCE), "kernel_source", NO_STRIDES))
    assert set(outcome) == {"test_example", "hidden_random_shapes", "hidden_non_contiguous",
                            "hidden_shapes", "hidden_status", "hidden_gradient"}
    for test_id, error in outcome.items():
        assert (error is not None) == (test_id in STRIDE_TESTS), (test_id, error)
    assert "does the kernel use in[0].strides?" in outcome["hidden_non_contiguous"]
    assert "reproduce: x = np.arange(" in outcome["hidden_non_contiguous"]
    assert HINTS.advice_in_process(outcome, whole=True) == {"hidden_non_contiguous": HINTS.written("hidden_non_contiguous").hint}


@pytest.mark.parametrize("cell, edit, failing, pattern", [
    ("kernel_source", NO_NAN_CHECK, "hidden_status", None),
    ("op", NO_SHAPE_CHECK, "hidden_shapes", None),
    ("op", GRAD_S_WITHOUT_X, "hidden_gradient", r"row sums of the upstream gradient w alone"),
], ids=["no_nan_check", "no_shape_check", "grad_s_without_x"])
def test_other_plausible_mistakes_get_their_hints_in_process(cell, edit, failing, pattern):
    outcome = run_cells(edit_cell(read_nb(SOURCE), cell, edit), skip=("demo",))
    hint = HINTS.written(failing)
    assert HINTS.advice_in_process(outcome, whole=True) == {failing: dict(hint.cases)[pattern] if pattern else hint.hint}, outcome


def test_source_kernel_matches_numpy_in_process():
    import reference_impl.graph as G

    ns = notebook_namespace(read_nb(SOURCE), upto="op")
    op = ns["register_row_scale"]()
    rng = np.random.default_rng(17)
    with G.eager_mode():
        for _ in range(10):
            base = rng.normal(size=tuple(int(v) for v in rng.integers(1, 30, size=2))).astype("float32")
            for x in (base, base.T, base[::-1, ::2]):
                s = rng.normal(size=x.shape[0]).astype("float32")
                np.testing.assert_allclose(op(x, s).numpy(), x * s[:, None], rtol=1e-6)
