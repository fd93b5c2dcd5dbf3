"""Custom ops: C kernels registered into the graph runtime, checked against NumPy.

Forward results are compared with the NumPy composition, gradients with central finite
differences (float64); the ABI checks are exercised with arrays C must not see.
"""
from __future__ import annotations

import numpy as np
import pytest

import reference_impl.graph as G
from reference_impl.toolchain import CompileError, ToolchainError, find_c_compiler

try:
    find_c_compiler()
except ToolchainError:
    pytest.skip("no C compiler on this machine", allow_module_level=True)

from reference_impl.custom_ops import Attr, CustomOp, Input, InvalidArgumentError, KernelError
from reference_impl.custom_ops.bias_relu import bias_add_relu
from reference_impl.custom_ops.segment_sum import sparse_segment_sum

pytestmark = pytest.mark.timeout(120)


def np_segment_sum(data, ids, k):
    out = np.zeros((k, data.shape[1]), dtype=data.dtype)
    np.add.at(out, ids, data)
    return out


def np_bias_add_relu(x, b):
    return np.maximum(x + b, 0)


def finite_difference(f, x, eps=1e-6):
    """d f(x) / dx for scalar f, by central differences."""
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        hi = f(x)
        x[idx] = old - eps
        lo = f(x)
        x[idx] = old
        grad[idx] = (hi - lo) / (2 * eps)
    return grad


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n,d,k", [(0, 3, 2), (1, 1, 1), (7, 5, 3), (64, 16, 40)])
def test_sparse_segment_sum_matches_numpy_graph_and_eager(rng, dtype, n, d, k):
    data = rng.standard_normal((n, d)).astype(dtype)
    ids = rng.integers(0, k, size=n)  # unsorted, with repeats and empty segments
    want = np_segment_sum(data, ids, k)
    g = G.Graph()
    with g.as_default():
        xp, ip = G.placeholder(dtype, [None, d]), G.placeholder("int64", [None])
        out = sparse_segment_sum(xp, ip, k)
        assert out.shape == (k, d) and out.dtype == dtype
        got = G.Session(g).run(out, {xp: data, ip: ids})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with G.eager_mode():
        np.testing.assert_allclose(sparse_segment_sum(data, ids, k).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n,d", [(0, 4), (1, 1), (9, 7), (33, 130)])
def test_bias_add_relu_matches_numpy_graph_and_eager(rng, dtype, n, d):
    x, b = rng.standard_normal((n, d)).astype(dtype), rng.standard_normal(d).astype(dtype)
    g = G.Graph()
    with g.as_default():
        got = G.Session(g).run(bias_add_relu(G.constant(x), G.constant(b)))
    np.testing.assert_array_equal(got, np_bias_add_relu(x, b))
    with G.eager_mode():
        np.testing.assert_array_equal(bias_add_relu(x, b).numpy(), np_bias_add_relu(x, b))


def test_sparse_segment_sum_gradient_matches_finite_differences(rng):
    data, ids, k = rng.standard_normal((6, 3)), np.array([2, 0, 2, 2, 1, 0]), 4
    w = rng.standard_normal((k, 3))  # loss = sum(w * segment_sum(data)): a non-trivial upstream grad
    g = G.Graph()
    with g.as_default():
        xp = G.placeholder("float64", [6, 3])
        loss = G.reduce_sum(sparse_segment_sum(xp, G.constant(ids), k) * G.constant(w))
        (grad,) = G.gradients(loss, [xp])
        got = G.Session(g).run(grad, {xp: data})
    fd = finite_difference(lambda x: float(np.sum(np_segment_sum(x, ids, k) * w)), data.copy())
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got, w[ids])  # the closed form: a gather of the upstream gradient


def test_bias_add_relu_gradients_match_finite_differences(rng):
    x, b = rng.standard_normal((5, 4)), rng.standard_normal(4)
    x[np.abs(x + b) < 1e-3] += 0.01  # keep away from the kink of relu, where FD is undefined
    w = rng.standard_normal((5, 4))

    def loss_np(x_, b_):
        return float(np.sum(np_bias_add_relu(x_, b_) * w))

    fd_x = finite_difference(lambda v: loss_np(v, b), x.copy())
    fd_b = finite_difference(lambda v: loss_np(x, v), b.copy())
    g = G.Graph()
    with g.as_default():
        xp, bp = G.placeholder("float64", [None, 4]), G.placeholder("float64", [4])
        loss = G.reduce_sum(bias_add_relu(xp, bp) * G.constant(w))
        gx, gb = G.Session(g).run(G.gradients(loss, [xp, bp]), {xp: x, bp: b})
    np.testing.assert_allclose(gx, fd_x, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, fd_b, rtol=1e-6, atol=1e-8)
    with G.eager_mode():  # the tape uses the same registered gradient (and the C grad kernel)
        xv, bv = G.EagerVariable(x), G.EagerVariable(b)
        with G.GradientTape() as tape:
            loss = G.reduce_sum(bias_add_relu(xv, bv) * w)
        ex, eb = tape.gradient(loss, [xv, bv])
    np.testing.assert_allclose(ex.numpy(), fd_x, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(eb.numpy(), fd_b, rtol=1e-6, atol=1e-8)


def test_strided_inputs_are_honoured_without_a_copy(rng):
    base = rng.standard_normal((12, 12)).astype("float32")
    ids = rng.integers(0, 3, size=6)
    views = [base.T[:6, :5], base[::2, 1::3][:6], base[::-1][:6]]  # transposed, stepped, reversed
    with G.eager_mode():
        for v in views:
            assert not v.flags.c_contiguous
            np.testing.assert_allclose(sparse_segment_sum(v, ids, 3).numpy(), np_segment_sum(v, ids, 3),
                                       rtol=1e-5, atol=1e-6)
            b = rng.standard_normal(v.shape[1]).astype("float32")
            np.testing.assert_array_equal(bias_add_relu(v, b).numpy(), np_bias_add_relu(v, b))


def test_non_contiguous_input_declared_contiguous_is_rejected(rng):
    data, ids = rng.standard_normal((4, 3)), np.array([0, 9, 1, 9, 2, 9, 1, 9])
    with G.eager_mode(), pytest.raises(InvalidArgumentError) as e:
        sparse_segment_sum(data, ids[::2], 3)  # ids[::2] == [0, 1, 2, 1], but not contiguous
    msg = str(e.value)
    assert "'SparseSegmentSum'" in msg and "'segment_ids'" in msg and "not C-contiguous" in msg
    with G.eager_mode():  # the fix the message suggests works
        np.testing.assert_allclose(sparse_segment_sum(data, np.ascontiguousarray(ids[::2]), 3).numpy(),
                                   np_segment_sum(data, ids[::2], 3))


def test_wrong_dtype_rank_and_alignment_are_rejected_before_the_call(rng):
    data = rng.standard_normal((4, 3)).astype("float32")
    with G.eager_mode():
        with pytest.raises(G.ShapeError, match=r"SparseSegmentSum.*'segment_ids' has dtype int32, expected int64"):
            sparse_segment_sum(data, np.zeros(4, dtype="int32"), 2)
        with pytest.raises(G.ShapeError, match="kernels exist for float32, float64"):
            sparse_segment_sum(data.astype("float16"), np.zeros(4, dtype="int64"), 2)
        with pytest.raises(G.ShapeError, match="BiasAddRelu.*dtypes? .*float64, expected float32"):
            bias_add_relu(data, np.zeros(3))
        with pytest.raises(G.ShapeError, match="'x' must have rank 2"):
            bias_add_relu(data.ravel(), np.zeros(3, dtype="float32"))
        with pytest.raises(G.ShapeError, match="x has 3 columns but bias has 2 entries"):
            bias_add_relu(data, np.zeros(2, dtype="float32"))
        raw = np.frombuffer(bytes(4 * 12 + 1), dtype="uint8")[1:].view("float32").reshape(4, 3)
        assert not raw.flags.aligned
        with pytest.raises(InvalidArgumentError, match="'x': buffer at address .* not aligned"):
            bias_add_relu(raw, np.zeros(3, dtype="float32"))
    g = G.Graph()
    with g.as_default(), pytest.raises(G.ShapeError, match="data has 4 rows but segment_ids has 5"):
        sparse_segment_sum(G.constant(data), G.constant(np.zeros(5, dtype="int64")), 2)


def test_status_from_c_raises_naming_the_op_and_writes_nothing(rng):
    data = rng.standard_normal((5, 2))
    g = G.Graph()
    with g.as_default():
        ip = G.placeholder("int64", [5])
        out = sparse_segment_sum(G.constant(data), ip, 4)
        sess = G.Session(g)
        np.testing.assert_allclose(sess.run(out, {ip: [0, 1, 2, 3, 0]}), np_segment_sum(data, [0, 1, 2, 3, 0], 4))
        for bad, pos in (([0, 1, 7, 3, 0], "segment_ids[2] = 7"), ([0, -1, 2, 3, 0], "segment_ids[1] = -1")):
            with pytest.raises(KernelError) as e:
                sess.run(out, {ip: bad})
            assert "'SparseSegmentSum'" in str(e.value) and f"{pos} is out of range [0, 4)" in str(e.value)


SCALE_SOURCE = """
int scale(const lab_tensor *in, int64_t n_in, lab_tensor *out,
          const lab_attr *attr, int64_t n_attr, char *msg, int64_t msg_len)
{
    const T *x = in[0].data;
    T *y = out->data;
    int64_t n = in[0].shape[0];
    if (attr[0].f == 0)
        return LAB_FAIL("alpha must be non-zero");
    for (int64_t i = 0; i < n; i++)
        y[i] = (T)(attr[0].f * x[i]);
    return LAB_OK;
}
"""


def test_op_from_a_string_with_a_float_attribute_and_a_python_gradient(rng):
    op = CustomOp("TestScale", [Input("x", ndim=1)], lambda shapes, attrs: shapes[0],
                  attrs=[Attr("alpha", "float")], symbol="scale", source=SCALE_SOURCE, T=["float64"],
                  grad=lambda op_, g: [op_.inputs[0] * 0 + g * op_.attrs["alpha"]]).register(replace=True)
    x = rng.standard_normal(7)
    g = G.Graph()
    with g.as_default():
        xp = G.placeholder("float64", [7])
        y = op(xp, alpha=2.5)
        (gx,) = G.gradients(G.reduce_sum(y), [xp])
        got, grad = G.Session(g).run([y, gx], {xp: x})
    np.testing.assert_allclose(got, 2.5 * x)
    np.testing.assert_allclose(grad, np.full(7, 2.5))
    with G.eager_mode(), pytest.raises(KernelError, match="'TestScale'.*alpha must be non-zero"):
        op(x, alpha=0.0)
    with pytest.raises(TypeError, match=r"attributes \['alpha'\]"):
        op(x)
    op.register(replace=True)  # re-running a notebook cell re-registers instead of failing


def test_compile_error_names_the_kernel_file_and_line(tmp_path):
    bad = SCALE_SOURCE.replace("y[i] = (T)", "y[i] = (T))")
    op = CustomOp("TestBroken", [Input("x", ndim=1)], lambda s, a: s[0], attrs=[Attr("alpha", "float")],
                  symbol="scale", source=bad)
    with pytest.raises(CompileError) as e:
        op.register()
    line = bad.splitlines().index("        y[i] = (T))(attr[0].f * x[i]);") + 1
    assert line in e.value.failing_lines()
    assert "TestBroken.c:%d" % line in str(e.value) and f">{line:5d} |" in str(e.value)
    assert "TestBroken" not in G.REGISTRY


def test_bad_declarations_are_rejected_when_declared():
    with pytest.raises(ValueError, match="give exactly one of source= and source_file="):
        CustomOp("TestBad", [Input("x")], lambda s, a: s[0], symbol="f")
    with pytest.raises(ValueError, match="layout must be one of"):
        CustomOp("TestBad", [Input("x", layout="fortran")], lambda s, a: s[0], symbol="f", source="")
    with pytest.raises(ValueError, match="dtype 'complex64' has no C type"):
        CustomOp("TestBad", [Input("x", "complex64")], lambda s, a: s[0], symbol="f", source="")
    with pytest.raises(ValueError, match="T='int8' must be float32 or float64"):
        CustomOp("TestBad", [Input("x")], lambda s, a: s[0], symbol="f", source="", T=["int8"])
    with pytest.raises(ValueError, match="kind must be 'int' or 'float'"):
        CustomOp("TestBad", [Input("x")], lambda s, a: s[0], symbol="f", source="", attrs=[Attr("a", "str")])


def test_missing_symbol_and_missing_compiler_are_clear(monkeypatch):
    op = CustomOp("TestNoSymbol", [Input("x", ndim=1)], lambda s, a: s[0], attrs=[Attr("alpha", "float")],
                  symbol="scael", source=SCALE_SOURCE, T=["float64"])
    with pytest.raises(ToolchainError, match="no function 'scael'"):
        op.register()
    monkeypatch.setenv("CC", "definitely-not-a-compiler")
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ToolchainError, match="no C compiler found.*apt install gcc"):
        op.register()


def test_rank_above_the_abi_limit_is_rejected():
    from reference_impl.custom_ops import abi

    with pytest.raises(InvalidArgumentError, match="rank 9 is over the ABI's limit of 8"):
        abi.check_array("custom op 'X' input 'x'", np.zeros((1,) * 9), "float64", None, "strided")
    assert abi.check_array("x", np.zeros((1,) * 8), "float64", None, "strided").ndim == 8


def test_graphdef_round_trip_and_constant_folding_treat_it_like_a_built_in(rng):
    data, ids = rng.standard_normal((5, 3)), np.array([1, 1, 0, 3, 1])
    g = G.Graph()
    with g.as_default():
        xp = G.placeholder("float64", [None, 3], name="x")
        sparse_segment_sum(xp, G.constant(ids), 4, name="y")
        bias_add_relu(G.constant(data), G.constant(np.ones(3)), name="folded")
    g2 = G.from_json(G.to_json(g))  # the op must be registered before import, as with load_op_library
    with G.Session(g2) as sess:
        np.testing.assert_allclose(sess.run("y:0", {"x:0": data}), np_segment_sum(data, ids, 4))
    folded_graph = G.constant_folding(g2)  # runs the C kernel at optimisation time
    assert "BiasAddRelu" not in {op.type for op in folded_graph.operations}
    assert "SparseSegmentSum" in {op.type for op in folded_graph.operations}  # has a placeholder input
    with G.Session(g2) as sess:
        np.testing.assert_array_equal(sess.run("folded:0"), np_bias_add_relu(data, np.ones(3)))


def test_importing_the_package_needs_no_compiler():
    import subprocess
    import sys

    from conftest import ROOT

    env = {"PATH": "", "CC": "definitely-not-a-compiler", "PYTHONPATH": str(ROOT)}
    code = ("import reference_impl.custom_ops as c, reference_impl.toolchain as t\n"
            "try:\n    t.find_c_compiler()\nexcept t.ToolchainError:\n    print('declared ops:', c.CustomOp.__name__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "declared ops: CustomOp" in out.stdout, out.stderr


def test_kernel_calls_from_threads_keep_their_own_status_and_message(rng):
    import threading

    data = rng.standard_normal((64, 8))
    good, bad = rng.integers(0, 5, size=64), np.full(64, 5)
    kernel = G.REGISTRY["SparseSegmentSum"].kernel
    failures, wrong = [], []

    def worker(ids, expect_error):
        for _ in range(200):
            try:
                out = kernel([data, ids], {"num_segments": 5}, {})
                if expect_error or not np.allclose(out, np_segment_sum(data, ids, 5)):
                    wrong.append("unexpected result")
            except KernelError as e:
                (failures if expect_error and "segment_ids[0] = 5" in str(e) else wrong).append(str(e))

    threads = [threading.Thread(target=worker, args=(ids, ids is bad)) for ids in (good, bad, good, bad)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert wrong == [] and len(failures) == 400


def test_custom_ops_run_in_a_distributed_session_like_built_ins(rng):
    """The graph travels to the workers as a GraphDef naming the op types; each worker finds
    the C kernels in its own registry (one process here, so it imported them already)."""
    from reference_impl.runtime import ClusterSpec, DistributedSession, run_cluster

    x = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    ids = np.array([0, 2, 2, 1, 0, 2], dtype=np.int64)
    g = G.Graph()
    with g.as_default():
        with g.device("/job:worker/task:0"):
            xp = G.placeholder("float32", [6, 4], name="x")
            y = bias_add_relu(xp, G.constant(b))
        with g.device("/job:worker/task:1"):
            s = sparse_segment_sum(y, G.constant(ids), 3)
    with G.Session(g) as local:
        expected = local.run(s, {xp: x})
    np.testing.assert_allclose(expected, np.stack([np.maximum(x + b, 0)[ids == k].sum(0) for k in range(3)]),
                               rtol=1e-6)

    def client(master):
        with DistributedSession(master, g) as sess:
            return sess.run(s, {xp: x})

    got = run_cluster(client, ClusterSpec.workers(2), timeout=20)
    assert np.array_equal(got, expected)
