"""Graph IR, build-time errors, GraphDef, Session (fetches, pruning, executor, errors) and the passes."""
from __future__ import annotations

import json

import numpy as np
import pytest

import reference_impl.graph as G


def test_names_shapes_and_default_graph():
    g = G.Graph()
    with g.as_default():
        assert G.get_default_graph() is g
        x = G.placeholder("float32", [None, 3], name="x")
        w = G.constant(np.ones((3, 2), np.float32))
        y = G.matmul(x, w)
        y2 = G.matmul(x, w)
    assert G.get_default_graph() is not g
    assert (y.name, y2.name, y.shape, y.dtype) == ("MatMul:0", "MatMul_1:0", (None, 2), "float32")
    assert g.get_tensor_by_name("MatMul_1:0") is y2 and y.op.inputs == [x, w]
    assert (x + 1.0).shape == (None, 3) and (x + 1.0).dtype == "float32"  # Python float adopts float32


@pytest.mark.parametrize("build,words", [
    (lambda a, b: G.matmul(a, b), ["MatMul", "(2, 3) float32", "(4, 5) float32", "inner dimensions"]),
    (lambda a, b: G.add(a, G.transpose(b)), ["Add", "(2, 3) float32", "(5, 4) float32", "broadcast"]),
])
def test_shape_mismatch_names_op_shapes_and_dtypes(build, words):
    with G.Graph().as_default():
        a = G.placeholder("float32", [2, 3])
        b = G.placeholder("float32", [4, 5])
        with pytest.raises(G.ShapeError) as info:
            build(a, b)
    for w in words:
        assert w in str(info.value)


def test_dtype_mismatch_is_a_build_time_error():
    with G.Graph().as_default():
        a = G.placeholder("float32", [2])
        b = G.placeholder("float64", [2])
        with pytest.raises(G.ShapeError, match=r"Add op 'Add'.*float32, float64.*\(2,\) float32.*\(2,\) float64"):
            a + b
        with pytest.raises(G.ShapeError, match="integer labels"):
            G.sparse_softmax_cross_entropy(G.placeholder("float32", [2]), G.placeholder("float32", [2, 3]))


def test_mixing_graphs_is_an_error():
    g1, g2 = G.Graph(), G.Graph()
    with g1.as_default():
        a = G.constant(1.0)
    with g2.as_default():
        b = G.constant(2.0)
    with pytest.raises(G.GraphError, match="another graph"):
        a + b


def test_every_listed_op_runs_and_matches_numpy():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(3, 4)), rng.uniform(0.5, 2, size=(3, 4))
    emb, ids = rng.normal(size=(5, 2)), np.array([4, 0, 4])
    g = G.Graph()
    with g.as_default():
        A, B = G.constant(a), G.constant(b)
        v = G.Variable(np.zeros(4))
        fetch = {
            "matmul": G.matmul(A, G.transpose(B)), "sub": G.sub(A, B), "div": G.div(A, B),
            "pow": G.pow(B, A), "max": G.maximum(A, B), "sqrt": G.sqrt(B), "sigmoid": G.sigmoid(A),
            "rmax": G.reduce_max(A, axis=0), "rmean": G.reduce_mean(A, axis=1),
            "softmax": G.softmax(A), "logsm": G.log_softmax(A), "reshape": G.reshape(A, [2, 6]),
            "concat": G.concat([A, B], axis=0), "gather": G.gather(G.constant(emb), G.constant(ids)),
        }
        init = G.global_variables_initializer()
        step = G.group(G.assign_add(v, G.constant(np.ones(4))))
    with G.Session(g) as s:
        out = s.run(fetch)
        s.run(init)
        s.run(step)
        s.run(step)
        assert np.array_equal(s.run(v), np.full(4, 2.0))
    e = np.exp(a - a.max(1, keepdims=True))
    want = {
        "matmul": a @ b.T, "sub": a - b, "div": a / b, "pow": b ** a, "max": np.maximum(a, b),
        "sqrt": np.sqrt(b), "sigmoid": 1 / (1 + np.exp(-a)), "rmax": a.max(0), "rmean": a.mean(1),
        "softmax": e / e.sum(1, keepdims=True), "logsm": np.log(e / e.sum(1, keepdims=True)),
        "reshape": a.reshape(2, 6), "concat": np.concatenate([a, b]), "gather": emb[ids],
    }
    for k in want:
        np.testing.assert_allclose(out[k], want[k], rtol=1e-12, err_msg=k)


# ------------------------------------------------------------------ GraphDef
def _model_graph():
    rng = np.random.default_rng(2)
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [None, 3], name="x")
        w = G.Variable(rng.normal(size=(3, 2)), name="w")
        y = G.softmax(G.matmul(x, w) + G.constant(rng.normal(size=2)), name="y")
        G.global_variables_initializer()
    return g, x, y


def test_graph_def_round_trip_is_exact():
    g, x, y = _model_graph()
    text = G.to_json(g)
    g2 = G.from_json(text)
    assert G.to_json(g2) == text
    assert json.loads(text)["node"][0] == {"name": "x", "op": "Placeholder", "input": [],
                                           "attr": {"shape": [None, 3], "dtype": "float64"}}
    feed = np.random.default_rng(3).normal(size=(4, 3))
    with G.Session(g) as s1, G.Session(g2) as s2:
        s1.run("init")
        s2.run("init")
        a = s1.run(y, {x: feed})
        b = s2.run("y:0", {"x:0": feed})
    assert np.array_equal(a, b)  # bit-identical: constants survived JSON exactly


def test_hand_written_graph_def_runs_in_any_node_order():
    doc = {"node": [
        {"name": "out", "op": "Add", "input": ["prod:0", "b:0"]},
        {"name": "prod", "op": "MatMul", "input": ["x:0", "w:0"]},
        {"name": "x", "op": "Placeholder", "attr": {"shape": [None, 2], "dtype": "float64"}},
        {"name": "w", "op": "Const", "attr": {"value": {"tensor": {"dtype": "float64", "shape": [2, 2],
                                                                  "values": [1, 2, 3, 4]}}}},
        {"name": "b", "op": "Const", "attr": {"value": {"tensor": {"dtype": "float64", "shape": [],
                                                                  "values": [10]}}}},
    ]}
    g = G.import_graph_def(json.dumps(doc))
    with G.Session(g) as s:
        got = s.run("out:0", {"x:0": [[1.0, 1.0]]})
    np.testing.assert_array_equal(got, [[14.0, 16.0]])


@pytest.mark.parametrize("nodes,match", [
    ([{"name": "a", "op": "Neg", "input": ["c:0"]}, {"name": "b", "op": "Neg", "input": ["a:0"]},
      {"name": "c", "op": "Neg", "input": ["b:0"]}], "cycle.*a, b, c"),
    ([{"name": "a", "op": "Neg", "input": ["ghost:0"]}], "no node 'ghost'"),
    ([{"name": "a", "op": "Frobnicate"}], "unknown op type 'Frobnicate'"),
    ([{"name": "a", "op": "Placeholder"}], "lacks attribute"),
])
def test_bad_graph_defs_are_clear_errors(nodes, match):
    with pytest.raises(G.GraphError, match=match):
        G.import_graph_def({"node": nodes})


# ------------------------------------------------------------------ Session
def test_nested_fetches_and_pruning_with_an_unfed_placeholder():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [2])
        unused = G.placeholder("float64", [2])
        a, b = x * 2.0, x + 1.0
        G.reduce_sum(unused)
    with G.Session(g) as s:
        out = s.run({"p": [a, (b, a.op)], "q": a}, {x: [1.0, 2.0]})
    assert out["p"][1][1] is None and isinstance(out["p"][1], tuple)
    np.testing.assert_array_equal(out["p"][0], [2.0, 4.0])
    np.testing.assert_array_equal(out["p"][1][0], [2.0, 3.0])
    np.testing.assert_array_equal(out["q"], [2.0, 4.0])


def test_session_errors():
    g, other = G.Graph(), G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [2], name="x")
        y = x * 3.0
    with other.as_default():
        z = G.constant(1.0)
    s = G.Session(g)
    with pytest.raises(G.GraphError, match="placeholder 'x' must be fed"):
        s.run(y)
    with pytest.raises(G.GraphError, match="only placeholders can be fed.*Mul"):
        s.run(y, {y: [1.0, 2.0]})
    with pytest.raises(G.GraphError, match="no operation named 'nope'"):
        s.run(y, {"nope:0": [1.0, 2.0]})
    with pytest.raises(G.GraphError, match="another graph"):
        s.run(z)
    with pytest.raises(G.GraphError, match=r"shape \(3,\) fed to x:0"):
        s.run(y, {x: [1.0, 2.0, 3.0]})
    with pytest.raises(G.GraphError, match="cannot fetch a int"):
        s.run(5)
    s.close()
    with pytest.raises(G.GraphError, match="closed"):
        s.run(y, {x: [1.0, 2.0]})
    with G.Session(g) as s2:
        pass
    with pytest.raises(G.GraphError, match="closed"):
        s2.run(y, {x: [1.0, 2.0]})


def test_variables_live_per_session_and_need_initialising():
    g = G.Graph()
    with g.as_default():
        v = G.Variable(np.array([1.0]), name="v")
        inc = G.assign_add(v, G.constant(np.array([1.0])))
        dec = v.assign_sub(np.array([0.25]))
        init = G.global_variables_initializer()
    with G.Session(g) as s1, G.Session(g) as s2:
        with pytest.raises(G.GraphError, match="'v' is not initialised"):
            s1.run(v)
        s1.run(init)
        s2.run(init)
        s1.run(inc)
        s1.run(inc)
        assert s1.run(v)[0] == 3.0 and s2.run(v)[0] == 1.0
        assert s2.run(dec)[0] == 0.75 and s2.run(v)[0] == 0.75


def test_control_inputs_order_execution():
    g = G.Graph()
    with g.as_default():
        v = G.Variable(np.array(0.0))
        first = G.assign(v, G.constant(5.0, dtype="float64"))
        after = G.group(first, name="after")
        double = G.assign(v, G.identity(v) * 2.0)
        both = G.group(after, double.op)
    with G.Session(g) as s:
        s.run(v.initializer)
        s.run(after)
        assert s.run(v) == 5.0
        s.run(double)
        assert s.run(v) == 10.0
        assert s.run(both) is None


# ------------------------------------------------------------------ passes
def test_cse_merges_duplicates_but_keeps_fetched_names():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [3], name="x")
        y = G.placeholder("float64", [3], name="y")
        G.add(G.mul(x, y), G.mul(x, y), name="s")
    assert len(g) == 5
    cse = G.common_subexpression_elimination(g, keep=["s"])
    assert len(cse) == 4 and [op.type for op in cse.operations] == ["Placeholder", "Placeholder", "Mul", "Add"]
    add = cse.get_operation_by_name("s")
    assert add.inputs[0] is add.inputs[1]
    kept = G.common_subexpression_elimination(g, keep=["Mul_1"])  # a fetched duplicate survives
    assert len(kept) == 5
    assert len(g) == 5  # the input graph is untouched


def test_constant_folding_then_dce():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [2], name="x")
        c = G.exp(G.constant(np.array([0.0, 1.0])) * 2.0)
        G.add(x, c, name="out")
    folded = G.constant_folding(g)
    assert folded.get_operation_by_name(c.op.name).type == "Const"
    assert len(folded) == len(g) == 6  # folding alone leaves the old constants behind
    small = G.dead_node_removal(folded, keep=["out"])
    assert [op.type for op in small.operations] == ["Placeholder", "Const", "Add"]
    with G.Session(small) as s:
        np.testing.assert_allclose(s.run("out:0", {"x:0": [1.0, 1.0]}), 1 + np.exp([0.0, 2.0]))


def test_stateful_ops_are_neither_folded_nor_merged():
    g = G.Graph()
    with g.as_default():
        v = G.Variable(np.array(1.0))
        a1 = G.assign_add(v, G.constant(1.0, dtype="float64"))
        a2 = G.assign_add(v, G.constant(1.0, dtype="float64"))
        G.group(a1, a2, name="both")
    out = G.constant_folding(G.common_subexpression_elimination(g))
    assert [op.type for op in out.operations].count("AssignAdd") == 2
    with G.Session(g) as s:
        s.run(v.initializer)
        s.run("both")
        assert s.run(v) == 3.0


def test_session_debug_reports_each_pass(capsys):
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [2])
        y = G.add(x * (G.constant(2.0, dtype="float64") * G.constant(3.0, dtype="float64")),
                  x * (G.constant(2.0, dtype="float64") * G.constant(3.0, dtype="float64")), name="y")
        G.placeholder("float64", [2], name="spare")
    with G.Session(g, debug=True) as s:
        got = s.run(y, {x: [1.0, 2.0]})
        (plan,) = s._plans.values()
        assert [op.type for op in plan.ops] == ["Placeholder", "Const", "Mul", "Add"]
    np.testing.assert_array_equal(got, [12.0, 24.0])
    names = [r[0] for r in s.last_report]
    assert names == ["prune", "common_subexpression_elimination", "constant_folding", "dead_node_removal"]
    assert [r[1:] for r in s.last_report] == [(11, 10), (10, 6), (6, 6), (6, 4)]
    out = capsys.readouterr().out
    assert "prune: 11 -> 10 ops" in out and "dead_node_removal: 6 -> 4 ops" in out
