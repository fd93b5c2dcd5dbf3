"""The inference compiler: freezing, each pass on its own, and jit on both targets vs Session."""
from __future__ import annotations

import numpy as np
import pytest

import reference_impl.graph as G
from reference_impl.compiler import (UnsupportedOpError, algebraic_simplification, choose_format,
                                     elementwise_fusion, freeze, jit)
from reference_impl.toolchain import ToolchainError

pytestmark = pytest.mark.timeout(120)


def _types(graph: G.Graph) -> list[str]:
    return [op.type for op in graph.operations]


def _mlp(widths=(16, 32, 32, 10), seed=0):
    rng = np.random.default_rng(seed)
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, widths[0]), name="x")
        h = x
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            w = G.Variable((rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32), name=f"w{i}")
            bias = G.Variable(rng.normal(size=b).astype(np.float32) * 0.1, name=f"b{i}")
            h = G.matmul(h, w) + bias
            if i < len(widths) - 2:
                h = G.relu(h)
        sess = G.Session(g)
        sess.run(G.global_variables_initializer())
    return g, sess, x, h


@pytest.fixture(params=["entry", "ctypes"])
def crossing(request, monkeypatch):
    """Run a test through both ways into the compiled code: the C entry point (``c_entry``, built
    where Python's headers are) and ctypes with pinned buffers (the fallback without them)."""
    from reference_impl.compiler import fast_call

    if request.param == "ctypes":
        monkeypatch.setattr(fast_call, "python_include_dir", lambda: None)
    elif fast_call.python_include_dir() is None:
        pytest.skip("no Python headers here: the C entry point is not built")
    return request.param


def _check_crossing(f, crossing: str) -> None:
    assert f.call_path == crossing


# ---------------------------------------------------------------- freezing
def test_freeze_turns_variables_into_constants_with_current_values():
    g, sess, x, y = _mlp()
    with g.as_default():
        w0 = g.get_tensor_by_name("w0:0")
        sess.run(G.assign_sub(g.variables[0], 0.5 * np.ones(w0.shape, np.float32)))  # training moved it
    frozen = freeze(sess, [y.op.name])
    assert "VariableV2" not in _types(frozen) and "Assign" not in _types(frozen)
    np.testing.assert_array_equal(frozen.get_operation_by_name("w0").attrs["value"], sess.run(w0))
    xs = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32)
    np.testing.assert_allclose(G.Session(frozen).run(frozen.get_tensor_by_name(y.name), {"x:0": xs}),
                               sess.run(y, {x: xs}), rtol=1e-6)


def test_freeze_refuses_a_training_step():
    g, sess, x, y = _mlp()
    with g.as_default():
        step = G.assign_sub(g.variables[0], g.variables[0])
    with pytest.raises(G.GraphError, match="AssignSub"):
        freeze(sess, [step.op.name])


# ---------------------------------------------------------------- algebraic simplification
def test_algebraic_simplification_removes_identities_and_keeps_values():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (4, 3), name="x")
        one, zero = G.constant(np.ones((4, 3), np.float32)), G.constant(np.float32(0))
        y = G.identity(G.identity(x * one + zero)) - zero
        t = G.transpose(G.transpose(-(-y)))               # cancels
        z = G.transpose(G.transpose(G.reshape(t, (2, 3, 2)), [1, 0, 2]), [0, 2, 1])  # merges into one
        grow = G.placeholder("float32", (3,), name="v") * one  # broadcasts: must stay
    out = algebraic_simplification(g, keep=[z.op.name, grow.op.name])
    # every op on x's path is bypassed; the inner Neg/Transpose stay until dead-code removal
    zt = out.get_operation_by_name(z.op.name)
    assert zt.type == "Transpose" and zt.attrs["perm"] == [1, 2, 0]
    assert zt.inputs[0].op.type == "Reshape" and zt.inputs[0].op.inputs[0].op.name == "x"
    assert out.get_operation_by_name(grow.op.name).type == "Mul"
    pruned = G.dead_node_removal(out, [z.op.name])
    assert _types(pruned) == ["Placeholder", "Reshape", "Transpose"]
    xs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_array_equal(G.Session(pruned).run(pruned.get_tensor_by_name(z.name), {"x:0": xs}),
                                  G.Session(g).run(z, {x: xs}))


def test_simplified_fetch_stays_fetchable():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (2,), name="x")
        G.mul(x, 1.0, name="y")
    out = algebraic_simplification(g, keep=["y"])
    assert out.get_operation_by_name("y").type == "Identity"


# ---------------------------------------------------------------- fusion
def test_elementwise_fusion_makes_one_op_and_matches():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 5), name="x")
        b = G.constant(np.arange(5, dtype=np.float32))
        y = G.sigmoid(G.relu(x + b) * 2.0 - G.exp(x))  # Add, Relu, Mul, Exp, Sub, Sigmoid
    fused = elementwise_fusion(g, keep=[y.op.name])
    assert _types(fused).count("FusedElementwise") == 1
    assert not set(_types(fused)) & {"Add", "Relu", "Mul", "Exp", "Sub", "Sigmoid"}
    op = fused.get_operation_by_name(y.op.name)
    assert len(op.attrs["program"]) == 6 and op.outputs[0].shape == (None, 5)
    xs = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    np.testing.assert_allclose(G.Session(fused).run(op.outputs[0], {"x:0": xs}), G.Session(g).run(y, {x: xs}),
                               rtol=1e-6)


def test_fusion_stops_at_a_fetched_or_shared_intermediate():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (3,), name="x")
        a = G.exp(x)            # two consumers: stays
        b = G.relu(a + 1.0)     # fetched: stays a separate op
        y = G.tanh(b) * a
    fused = elementwise_fusion(g, keep=[y.op.name, b.op.name])
    assert fused.get_operation_by_name(a.op.name).type == "Exp"
    assert fused.get_operation_by_name(b.op.name).type == "FusedElementwise"  # Add + Relu
    assert fused.get_operation_by_name(y.op.name).type == "FusedElementwise"  # Tanh + Mul


def test_fused_kernel_equals_the_unfused_graph_bit_for_bit_and_leaves_its_inputs_alone():
    """The values are those of the unfused graph exactly, and neither the feed nor a constant
    is written (steps free their results as they go, they never reuse an input's array)."""
    rng = np.random.default_rng(3)
    mean, scale = rng.normal(size=256).astype(np.float32), rng.random(256).astype(np.float32) + 0.5
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 256), name="x")
        m, s = G.constant(mean), G.constant(scale)
        h = G.relu((x - m) * s + m * 2.0)       # m * 2.0: a small step result, broadcast
        y = G.sqrt(G.square(G.sigmoid(h)) + 1.0) - G.tanh(x)
    fused = elementwise_fusion(g, keep=[y.op.name])
    op = fused.get_operation_by_name(y.op.name)
    assert op.type == "FusedElementwise" and len(op.attrs["program"]) >= 9
    for batch in (1, 64):
        xs = rng.normal(size=(batch, 256)).astype(np.float32)
        before = xs.copy()
        np.testing.assert_array_equal(G.Session(fused).run(op.outputs[0], {"x:0": xs}), G.Session(g).run(y, {x: xs}))
        np.testing.assert_array_equal(xs, before)
    np.testing.assert_array_equal(m.op.attrs["value"], mean)


def test_fused_kernel_frees_each_step_after_its_last_reader():
    """A chain of 8 steps on a 4 MB array: the unfused interpreter holds about two such arrays
    at a time, and so must the fused kernel (keeping every step's result would hold eight)."""
    import tracemalloc

    from reference_impl.compiler.fusion import _run_program, last_reads

    program = [["Exp", [["in", 0]]], ["Add", [["step", 0], ["in", 1]]], ["Mul", [["step", 1], ["in", 0]]],
               ["Tanh", [["step", 2]]], ["Sub", [["in", 0], ["step", 3]]], ["Sigmoid", [["step", 4]]],
               ["Square", [["step", 5]]], ["Relu", [["step", 6]]]]
    assert last_reads(program) == [[], [0], [1], [2], [3], [4], [5], [6]]
    x = np.random.default_rng(5).normal(size=(1024, 1024)).astype(np.float32)
    c = np.float32(0.5) * np.ones(1024, np.float32)
    before = x.copy()
    ref = np.maximum(np.square(0.5 * (np.tanh(0.5 * (x - np.tanh((np.exp(x) + c) * x))) + 1)), 0)
    tracemalloc.start()
    try:
        out = _run_program([x, c], {"program": program, "frees": last_reads(program)}, {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, ref.astype(np.float32))
    np.testing.assert_array_equal(x, before)
    assert peak < 3.5 * x.nbytes, f"the fused kernel held {peak / x.nbytes:.1f} arrays of the batch's size at once"


# ---------------------------------------------------------------- jit
@pytest.mark.parametrize("target", ["numpy", "c"])
def test_jit_mlp_matches_session(target):
    g, sess, x, y = _mlp()
    f = jit(sess, y, [x], target=target)
    rng = np.random.default_rng(2)
    for batch in (1, 5):
        xs = rng.normal(size=(batch, 16)).astype(np.float32)
        np.testing.assert_allclose(f(xs), sess.run(y, {x: xs}), rtol=1e-4, atol=1e-5)
    assert "def run" in f.source if target == "numpy" else "static const float" in f.source
    assert f.report[0][0] == "freeze" and f.report[-1][0] == "elementwise_fusion"
    assert f.report[-1][2] < f.report[0][1]  # fewer ops than the training graph


def test_jit_reports_op_counts_and_fuses_bias_relu():
    g, sess, x, y = _mlp()
    f = jit(sess, y, [x], target="numpy")
    counts = {name: (before, after) for name, before, after in f.report}
    assert counts["elementwise_fusion"][1] == counts["elementwise_fusion"][0] - 2  # 2 × (Add+Relu → 1 op)
    assert _types(f.graph).count("FusedElementwise") == 2 and "VariableV2" not in _types(f.graph)


def _random_graph(seed: int):
    """A random DAG of elementwise ops, matmuls with constant weights and broadcasts."""
    rng = np.random.default_rng(seed)
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 6), name="x")
        pool = [x]
        for _ in range(12):
            a = pool[rng.integers(len(pool))]
            kind = rng.integers(5)
            if kind == 0:
                w = G.Variable(rng.normal(size=(6, 6)).astype(np.float32) * (rng.random((6, 6)) < 0.5))
                pool.append(G.matmul(a, w))
            elif kind == 1:
                pool.append(a + pool[rng.integers(len(pool))])
            elif kind == 2:
                pool.append(a * G.constant(rng.normal(size=6).astype(np.float32)))
            elif kind == 3:
                pool.append([G.tanh, G.relu, G.sigmoid, G.neg][rng.integers(4)](a))
            else:
                pool.append(G.maximum(a, 0.1) - a * 1.0)
        outs = [pool[-1], pool[len(pool) // 2]]
        sess = G.Session(g)
        sess.run(G.global_variables_initializer())
    return sess, x, outs


@pytest.mark.parametrize("seed", range(4))
def test_jit_random_graphs_match_session(seed):
    sess, x, outs = _random_graph(seed)
    xs = np.random.default_rng(seed + 10).normal(size=(3, 6)).astype(np.float32)
    want = sess.run(outs, {x: xs})
    for target in ("numpy", "c"):
        got = jit(sess, outs, [x], target=target)(xs)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_c_matmul_forms_agree():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(40, 30)).astype(np.float32) * (rng.random((40, 30)) < 0.1)
    w[:, 4] = 0  # an output with no weights at all
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 40), name="x")
        y = G.matmul(x, G.constant(w))
    sess = G.Session(g)
    xs = rng.normal(size=(4, 40)).astype(np.float32)
    assert choose_format(w) == "unrolled" and choose_format(np.ones((4, 4))) == "dense"
    assert choose_format(np.eye(300, dtype=np.float32)) == "unrolled"
    from reference_impl.compiler.fast_kernels import host_has_avx512
    mask = np.random.default_rng(4).random((300, 300))
    assert choose_format(np.where(mask < 0.1, 1.0, 0.0)) == "csr"  # sparse: work per non-zero wins
    assert choose_format(np.where(mask < 0.3, 1.0, 0.0)) == ("bitmask" if host_has_avx512() else "csr")
    for form in ("dense", "unrolled", "csr", "bitmask"):
        f = jit(sess, y, [x], target="c", matmul_format=form)
        assert list(f.formats.values()) == [form]
        for batch in (xs, xs[:1]):  # a batch and one row take different loops
            np.testing.assert_allclose(f(batch), batch @ w, rtol=1e-5, atol=1e-5)
    unrolled = jit(sess, y, [x], target="c", matmul_format="unrolled").source
    k = int(np.flatnonzero(w[:, 0])[0])
    assert f"xr[{k}]*" in unrolled and "const float W_0" not in unrolled  # immediates, no array


def test_dense_weights_packed_in_panels():
    rng = np.random.default_rng(10)
    w = rng.normal(size=(70, 128)).astype(np.float32)
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 70), name="x")
        y = G.matmul(x, G.constant(w))
    f = jit(G.Session(g), y, [x], target="c")
    assert f.formats == {y.op.name: "dense"} and "float acc[2][64]" in f.source
    for batch in (1, 3):
        xs = rng.normal(size=(batch, 70)).astype(np.float32)
        np.testing.assert_allclose(f(xs), xs @ w, rtol=1e-5, atol=1e-4)


def test_large_arrays_are_embedded_from_a_file(monkeypatch, tmp_path):
    from reference_impl.compiler import fast_kernels
    monkeypatch.setattr(fast_kernels, "INLINE_MAX", 100)
    rng = np.random.default_rng(9)
    w = rng.normal(size=(40, 30)).astype(np.float32)
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 40), name="x")
        y = G.matmul(x, G.constant(w))
    f = jit(G.Session(g), y, [x], target="c", cache_dir=tmp_path)
    assert ".incbin" in f.source and list(tmp_path.glob("blob-*.bin"))
    xs = rng.normal(size=(3, 40)).astype(np.float32)
    np.testing.assert_allclose(f(xs), xs @ w, rtol=1e-5, atol=1e-5)


def test_jit_cache_by_content():
    g, sess, x, y = _mlp(seed=5)
    f1, f2 = jit(sess, y, [x], target="c"), jit(sess, y, [x], target="c")
    assert f1.key == f2.key and f1._run is f2._run
    with g.as_default():
        sess.run(G.assign_add(g.variables[1], np.ones(32, np.float32)))
    f3 = jit(sess, y, [x], target="c")
    assert f3.key != f1.key
    _, other, x2, y2 = _mlp(seed=8)  # same structure, other weights: NumPy source is equal, key is not
    assert jit(other, y2, [x2], target="numpy").key != jit(sess, y, [x], target="numpy").key
    xs = np.ones((1, 16), np.float32)
    np.testing.assert_allclose(f3(xs), sess.run(y, {x: xs}), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["numpy", "c"])
def test_bad_feeds_raise_before_running(target):
    g, sess, x, y = _mlp(seed=6)
    f = jit(sess, y, [x], target=target)
    with pytest.raises(ValueError, match=r"feed x:0 must have shape \(None, 16\)"):
        f(np.ones((2, 15), np.float32))
    with pytest.raises(ValueError, match="rank 2"):
        f(np.ones(16, np.float32))
    with pytest.raises(TypeError, match="must be float32, got float64"):
        f(np.ones((2, 16)))
    with pytest.raises(TypeError, match="expected 1 feed arrays"):
        f()
    np.testing.assert_allclose(f(np.ones((2, 32), np.float32)[:, ::2]), sess.run(y, {x: np.ones((2, 16))}),
                               rtol=1e-5, atol=1e-5)  # a strided view is copied, not misread


def test_unsupported_op_names_the_op_and_numpy_target_runs_it():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 4), name="x")
        y = G.reduce_sum(G.exp(x), axis=1, name="total")
    sess = G.Session(g)
    with pytest.raises(UnsupportedOpError, match=r"Sum op 'total'.*target='numpy'"):
        jit(sess, y, [x], target="c")
    xs = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(jit(sess, y, [x], target="numpy")(xs), sess.run(y, {x: xs}))


def test_unfed_placeholder_is_an_error():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 4), name="x")
        z = G.placeholder("float32", (None, 4), name="z")
        y = x + z
    with pytest.raises(G.GraphError, match="'z'"):
        jit(G.Session(g), y, [x], target="c")


def test_missing_compiler_suggests_numpy(monkeypatch, tmp_path):
    g, sess, x, y = _mlp(widths=(3, 2), seed=7)
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainError, match="NumPy target"):
        jit(sess, y, [x], target="c", cache_dir=tmp_path)
    assert jit(sess, y, [x], target="numpy")(np.ones((1, 3), np.float32)).shape == (1, 2)


def test_committed_example_matches_the_generator():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "generators"))
    from jit_example import OUT, example_source
    assert OUT.read_text(encoding="utf-8") == example_source(), \
        "regenerate it: python docs/generators/jit_example.py"


def test_bitmask_pack_round_trips_and_the_portable_kernel_agrees(tmp_path):
    """The masks + packed values rebuild Wᵀ exactly; the C kernel agrees with x @ W both with
    AVX-512 (if this CPU has it) and in the portable loop compiled without it."""
    import ctypes

    from reference_impl.compiler.c_codegen import generate_c
    from reference_impl.compiler.fast_kernels import RUN, bitmask_pack
    from reference_impl.toolchain import build_shared_library, load_library

    rng = np.random.default_rng(21)
    w = (rng.normal(size=(37, 50)) * (rng.random((37, 50)) < 0.3)).astype(np.float32)  # 37: a partial run
    masks, vals = bitmask_pack(w.T)
    rebuilt, pos = np.zeros((50, masks.shape[1] * RUN), np.float32), 0
    for j in range(50):
        for c in range(masks.shape[1]):
            for b in range(RUN):
                if masks[j, c] >> b & 1:
                    rebuilt[j, c * RUN + b], pos = vals[pos], pos + 1
    assert pos == len(vals) == np.count_nonzero(w)
    np.testing.assert_array_equal(rebuilt[:, :37], w.T)
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 37), name="x")
        y = G.matmul(x, G.constant(w))
    xs = rng.normal(size=(3, 37)).astype(np.float32)
    np.testing.assert_allclose(jit(G.Session(g), y, [x], "c", matmul_format="bitmask")(xs), xs @ w,
                               rtol=1e-5, atol=1e-5)
    source, formats = generate_c(g, ["x"], [y.name], "bitmask")
    assert formats == {y.op.name: "bitmask"} and "#else  /* portable" in source
    lib = load_library(build_shared_library(source, name="bitmask_portable", flags=("-O2",), cache_dir=tmp_path))
    out = np.zeros((3, 50), np.float32)
    fn = lib.graph_main
    fn.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    assert fn(3, xs.ctypes.data, out.ctypes.data) == 0
    np.testing.assert_allclose(out, xs @ w, rtol=1e-5, atol=1e-5)


def test_c_results_are_fresh_arrays_and_calls_are_thread_safe(crossing):
    """Small batches go through buffers the runner owns: what a call returns must not change when
    a later call (or another thread) runs, and a batch too big to pin takes the direct path."""
    from concurrent.futures import ThreadPoolExecutor

    from reference_impl.compiler.fast_call import PINNED_MAX_FLOATS

    _, sess, x, y = _mlp(seed=11)
    f = jit(sess, y, [x], target="c")
    _check_crossing(f, crossing)
    rng = np.random.default_rng(12)
    a, b = rng.normal(size=(1, 16)).astype(np.float32), rng.normal(size=(1, 16)).astype(np.float32)
    ra = f(a)
    rb = f(b)
    np.testing.assert_allclose(ra, sess.run(y, {x: a}), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rb, sess.run(y, {x: b}), rtol=1e-5, atol=1e-5)
    big = rng.normal(size=(PINNED_MAX_FLOATS // 16 + 1, 16)).astype(np.float32)
    np.testing.assert_allclose(f(np.asfortranarray(big)), sess.run(y, {x: big}), rtol=1e-4, atol=1e-4)
    inputs = [rng.normal(size=(1 + i % 3, 16)).astype(np.float32) for i in range(64)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda v: [f(v) for _ in range(20)], inputs))
    for v, rs in zip(inputs, results):
        want = sess.run(y, {x: v})
        for r in rs:
            np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)


def test_pinned_fast_path_still_names_a_wrong_feed(crossing):
    """After a call has made the pinned slot for a shape, inputs that differ only in dtype, byte
    order or shape must still get the checked path's error, never reach the C code."""
    _, sess, x, y = _mlp(seed=13)
    f = jit(sess, y, [x], target="c")
    _check_crossing(f, crossing)
    good = np.ones((2, 16), np.float32)
    f(good)
    assert f(good).shape == (2, 10)  # the second call takes the pinned slot
    with pytest.raises(TypeError, match="feed x:0 must be float32, got float64"):
        f(np.ones((2, 16)))
    with pytest.raises(TypeError, match="feed x:0 must be float32"):
        f(np.ones((2, 16), ">f4"))  # float32 in the other byte order: the C code would misread it
    with pytest.raises(ValueError, match=r"feed x:0 must have shape \(None, 16\), got \(2, 17\)"):
        f(np.ones((2, 17), np.float32))
    with pytest.raises(TypeError, match="expected 1 feed arrays"):
        f(good, good)
    rng = np.random.default_rng(14)
    wide = rng.normal(size=(2, 32)).astype(np.float32)
    np.testing.assert_allclose(f(wide[:, ::2]), sess.run(y, {x: wide[:, ::2]}), rtol=1e-5, atol=1e-5)
    fortran = np.asfortranarray(wide[:, :16])  # same shape and dtype, other memory order
    np.testing.assert_allclose(f(fortran), sess.run(y, {x: fortran}), rtol=1e-5, atol=1e-5)


def test_c_outputs_never_share_memory_between_calls(crossing):
    _, sess, x, y = _mlp(seed=15)
    f = jit(sess, [y, x * 2.0], [x], target="c")  # two fetches: the general pinned slot
    _check_crossing(f, crossing)
    rng = np.random.default_rng(16)
    a, b = rng.normal(size=(1, 16)).astype(np.float32), rng.normal(size=(1, 16)).astype(np.float32)
    ra = f(a)
    ra_copy = [r.copy() for r in ra]
    rb = f(b)
    for r_a, r_b, kept in zip(ra, rb, ra_copy):
        assert not np.shares_memory(r_a, r_b)
        np.testing.assert_array_equal(r_a, kept)  # the later call did not write into it
    np.testing.assert_allclose(rb[0], sess.run(y, {x: b}), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rb[1], 2 * b, rtol=1e-6)


def test_two_feeds_through_the_pinned_slot(crossing):
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 8), name="x")
        z = G.placeholder("float32", (None, 8), name="z")
        y = G.relu(x * z + x)
    sess = G.Session(g)
    f = jit(sess, y, [x, z], target="c")
    _check_crossing(f, crossing)
    rng = np.random.default_rng(17)
    for _ in range(3):  # the first call makes the slot, the others use it
        a, b = rng.normal(size=(3, 8)).astype(np.float32), rng.normal(size=(3, 8)).astype(np.float32)
        np.testing.assert_allclose(f(a, b), sess.run(y, {x: a, z: b}), rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="feed z:0 must be float32, got float64"):
        f(a, b.astype(np.float64))
    with pytest.raises(ValueError, match="batch size 2, another feed has 3"):
        f(a, b[:2])


def test_intermediates_on_the_stack_or_the_heap_give_the_same_results():
    """Small batches keep the intermediates in a stack block, large ones in one malloc'd block."""
    from reference_impl.compiler.c_codegen import STACK_FLOATS

    _, sess, x, y = _mlp(seed=18)
    f = jit(sess, y, [x], target="c")
    assert "on_stack" in f.source and "malloc(" in f.source
    rng = np.random.default_rng(19)
    for n in (1, 7, STACK_FLOATS // 32 + 1):  # the last needs more than STACK_FLOATS floats
        xs = rng.normal(size=(n, 16)).astype(np.float32)
        np.testing.assert_allclose(f(xs), sess.run(y, {x: xs}), rtol=1e-5, atol=1e-5)


def test_a_buffer_that_is_not_an_ndarray_still_works_after_the_slot_exists(crossing):
    """A memoryview has a shape but no dtype; a read-only array and an empty batch are fine too."""
    _, sess, x, y = _mlp(seed=20)
    f = jit(sess, y, [x], target="c")
    _check_crossing(f, crossing)
    xs = np.random.default_rng(21).normal(size=(1, 16)).astype(np.float32)
    f(xs)  # the slot for shape (1, 16)
    np.testing.assert_allclose(f(memoryview(xs)), sess.run(y, {x: xs}), rtol=1e-5, atol=1e-5)
    xs.flags.writeable = False
    np.testing.assert_allclose(f(xs), sess.run(y, {x: xs}), rtol=1e-5, atol=1e-5)
    assert f(np.ones((0, 16), np.float32)).shape == (0, 10)


def test_an_entry_point_that_does_not_build_falls_back_to_ctypes(monkeypatch, tmp_path):
    """Headers that do not compile (here: a folder without Python.h) cost the fast entry point,
    not the function: the graph is built again and called through ctypes."""
    from reference_impl.compiler import fast_call

    monkeypatch.setattr(fast_call, "python_include_dir", lambda: tmp_path)
    _, sess, x, y = _mlp(widths=(5, 3), seed=22)
    f = jit(sess, y, [x], target="c", cache_dir=tmp_path)
    assert f.call_path == "ctypes"
    xs = np.ones((2, 5), np.float32)
    np.testing.assert_allclose(f(xs), sess.run(y, {x: xs}), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- the plain path and the fast path
def _layer(w, relu_bias=True):
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, w.shape[0]), name="x")
        y = G.matmul(x, G.constant(w))
        if relu_bias:
            y = G.relu(y + G.constant(np.linspace(-1, 1, w.shape[1]).astype(np.float32)))
    return G.Session(g), x, y


@pytest.mark.parametrize("form,shape,density,same_code", [
    ("dense", (70, 128), 1.0, False),  # fast: packed panels (N a multiple of 64)
    ("dense", (100, 10), 1.0, False),  # fast: Wᵀ dot products (N < 64)
    ("dense", (33, 80), 1.0, True),    # both: the row-major loop
    ("csr", (300, 90), 0.1, False),    # fast: four partial sums, the batch transposed once
    ("unrolled", (40, 30), 0.3, True),
])
def test_plain_and_fast_paths_give_the_same_outputs(form, shape, density, same_code, tmp_path):
    rng = np.random.default_rng(31)
    w = (rng.normal(size=shape) * (rng.random(shape) < density)).astype(np.float32)
    sess, x, y = _layer(w)
    fast = jit(sess, y, [x], "c", matmul_format=form, cache_dir=tmp_path, fast=True)
    plain = jit(sess, y, [x], "c", matmul_format=form, cache_dir=tmp_path, fast=False)
    assert fast.formats == plain.formats == {y.op.inputs[0].op.inputs[0].op.name: form}
    assert plain.call_path == "plain" and fast.call_path in ("entry", "ctypes")
    assert (plain.source == fast.source) == same_code  # the C differs where a fast kernel exists
    for batch in (1, 5):
        xs = rng.normal(size=(batch, shape[0])).astype(np.float32)
        want = sess.run(y, {x: xs})
        got_fast, got_plain = fast(xs), plain(xs)
        np.testing.assert_allclose(got_plain, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_fast, got_plain, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="feed x:0 must be float32, got float64"):
        plain(np.ones((2, shape[0])))


def test_the_fast_path_switch(monkeypatch, tmp_path):
    """``fast=`` wins; without it ``LAB_JIT_FAST=0`` selects the plain path; ``bitmask`` is fast only."""
    from reference_impl.compiler.c_codegen import generate_c

    rng = np.random.default_rng(32)
    w = rng.normal(size=(20, 64)).astype(np.float32)
    sess, x, y = _layer(w)
    panels = "float acc[2][64]"
    assert panels in jit(sess, y, [x], "c", cache_dir=tmp_path).source
    monkeypatch.setenv("LAB_JIT_FAST", "0")
    plain = jit(sess, y, [x], "c", cache_dir=tmp_path)
    assert plain.call_path == "plain" and panels not in plain.source
    forced = jit(sess, y, [x], "c", cache_dir=tmp_path, fast=True)
    assert forced.call_path != "plain" and panels in forced.source
    monkeypatch.setenv("LAB_JIT_FAST", "1")
    assert jit(sess, y, [x], "c", cache_dir=tmp_path).call_path != "plain"
    assert jit(sess, y, [x], "c", cache_dir=tmp_path, fast=False).call_path == "plain"
    xs = rng.normal(size=(3, 20)).astype(np.float32)
    np.testing.assert_allclose(plain(xs), forced(xs), rtol=1e-5, atol=1e-5)
    # the numpy target has no fast path: the switch changes nothing there
    assert jit(sess, y, [x], "numpy", fast=False).call_path == "numpy"
    mask = np.random.default_rng(33).random((300, 300))
    assert choose_format(np.where(mask < 0.3, 1.0, 0.0), fast=False) == "csr"
    with pytest.raises(ValueError, match="bitmask.*fast kernel"):
        generate_c(sess.graph, ["x"], [y.name], "bitmask", fast=False)


@pytest.mark.parametrize("crossing_off", [False, True])
def test_int8_fast_and_portable_kernels_agree(crossing_off, monkeypatch, tmp_path):
    """The int8 MLP: the VNNI kernel (where the CPU has it) and the portable loops, each through the
    C entry point or ctypes, reproduce ``QuantizedMLP`` bit for bit."""
    from reference_impl.compiler import c_entry
    from reference_impl.quantize import QuantizedMLP, compile_int8

    if crossing_off:
        monkeypatch.setattr(c_entry, "python_include_dir", lambda: None)
    rng = np.random.default_rng(34)
    params = [rng.normal(size=(48, 64)).astype(np.float32) / 7, rng.normal(size=64).astype(np.float32) * 0.1,
              rng.normal(size=(64, 10)).astype(np.float32) / 8, rng.normal(size=10).astype(np.float32) * 0.1]
    q = QuantizedMLP.from_float(params, rng.normal(size=(64, 48)).astype(np.float32))
    fast, portable = compile_int8(q, cache_dir=tmp_path), compile_int8(q, cache_dir=tmp_path, simd=False)
    assert not portable.uses_vnni and (fast.entry is None) == crossing_off
    for batch in (1, 7):
        xs = rng.normal(size=(batch, 48)).astype(np.float32)
        np.testing.assert_array_equal(fast(xs), q(xs))
        np.testing.assert_array_equal(portable(xs), q(xs))
