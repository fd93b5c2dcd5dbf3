"""Eager mode: same kernels and gradient functions as graph mode, driven by a GradientTape."""
from __future__ import annotations

import numpy as np
import pytest

import reference_impl.graph as G


def _init(rng):
    return [rng.normal(size=(4, 6)) * 0.5, np.zeros(6), rng.normal(size=(6, 3)) * 0.5, np.zeros(3)]


def _forward(x, labels, p):
    h = G.tanh(G.matmul(x, p[0]) + p[1])
    return G.reduce_mean(G.sparse_softmax_cross_entropy(labels, G.matmul(h, p[2]) + p[3]))


def test_eager_training_matches_graph_training():
    rng = np.random.default_rng(5)
    x, labels = rng.normal(size=(16, 4)), rng.integers(0, 3, size=16)
    lr, steps = 0.5, 4

    eager_vars = [G.EagerVariable(p) for p in _init(np.random.default_rng(9))]
    eager_losses = []
    with G.eager_mode():
        for _ in range(steps):
            with G.GradientTape() as tape:
                loss = _forward(G.constant(x), G.constant(labels), eager_vars)
            for v, gr in zip(eager_vars, tape.gradient(loss, eager_vars)):
                v.assign_sub(lr * gr.value)
            eager_losses.append(float(loss.value))

    g = G.Graph()
    with g.as_default():
        xp, yp = G.placeholder("float64", [None, 4]), G.placeholder("int64", [None])
        vs = [G.Variable(p) for p in _init(np.random.default_rng(9))]
        loss = _forward(xp, yp, vs)
        grads = G.gradients(loss, vs)
        train = G.group(*[v.assign_sub(gr * lr) for v, gr in zip(vs, grads)])
    graph_losses = []
    with G.Session(g) as s:
        s.run(G.global_variables_initializer(g))
        for _ in range(steps):
            graph_losses.append(float(s.run([loss, train], {xp: x, yp: labels})[0]))
        final = s.run(vs)
    assert graph_losses[-1] < graph_losses[0]
    np.testing.assert_allclose(eager_losses, graph_losses, rtol=1e-12)
    for a, b in zip(final, eager_vars):
        np.testing.assert_allclose(a, b.value, rtol=1e-10, atol=1e-14)


def test_eager_ops_run_immediately_on_eager_tensors():
    a = G.EagerTensor(np.array([[1.0, -2.0]]))
    out = G.relu(a) @ G.EagerTensor(np.array([[3.0], [4.0]]))  # no eager_mode() needed
    assert isinstance(out, G.EagerTensor) and out.value.tolist() == [[3.0]]
    with pytest.raises(G.ShapeError, match="MatMul.*inner dimensions"):
        a @ a


def test_tape_rules_and_errors():
    with G.eager_mode():
        x, c = G.EagerTensor(np.array(3.0)), G.EagerTensor(np.array(2.0))
        with G.GradientTape() as tape:
            tape.watch(x)
            y = x * x * c + x
        assert tape.gradient(y, x).value == 2 * 3.0 * 2.0 + 1
        with pytest.raises(G.GraphError, match="only once"):
            tape.gradient(y, x)
        with G.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = x * c
        assert tape.gradient(y, [x, c]) [1] is None  # c was never watched
        assert tape.gradient(y, [x])[0].value == 2.0
        with pytest.raises(G.GraphError, match="watch expects an eager tensor"):
            tape.watch(np.ones(2))
        with pytest.raises(G.GraphError, match="placeholder"):
            G.placeholder("float32", [2])
    with G.Graph().as_default():
        with pytest.raises(G.GraphError, match="cannot mix graph tensors and eager tensors"):
            G.constant(1.0) + G.EagerTensor(np.array(1.0, np.float32))
