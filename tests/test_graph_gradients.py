"""Every op's gradient against central finite differences (float64), in graph and eager mode,
plus weight sharing, an MLP against hand-written backprop, and the no-gradient error."""
from __future__ import annotations

import numpy as np
import pytest

import reference_impl.graph as G
from reference_impl.graph import ops
from reference_impl.graph.registry import NO_GRADIENT, REGISTRY

RNG = np.random.default_rng(0)


def r(*shape, low=-1.0, high=1.0):
    return RNG.uniform(low, high, size=shape)


def away_from_zero(*shape):
    return RNG.choice([-1, 1], size=shape) * RNG.uniform(0.2, 1.0, size=shape)


# (name, function of tensors, float inputs (differentiated), extra non-differentiated inputs)
CASES = [
    ("MatMul", lambda a, b: G.matmul(a, b), [r(3, 4), r(4, 2)]),
    ("Add", lambda a, b: a + b, [r(3, 4), r(4)]),
    ("Add/outer", lambda a, b: G.add(a, b), [r(3, 1), r(1, 4)]),
    ("Sub", lambda a, b: G.sub(a, b), [r(3, 4), r(3, 1)]),
    ("Mul", lambda a, b: G.mul(a, b), [r(2, 3, 4), r(3, 1)]),
    ("RealDiv", lambda a, b: G.div(a, b), [r(3, 4), r(4, low=0.5, high=2.0)]),
    ("Pow", lambda a, b: G.pow(a, b), [r(3, 4, low=0.5, high=2.0), r(3, 4)]),
    ("Maximum", lambda a, b: G.maximum(a, b), [r(3, 4), r(3, 4)]),
    ("Neg", lambda a: G.neg(a), [r(3, 4)]),
    ("Exp", lambda a: G.exp(a), [r(3, 4)]),
    ("Log", lambda a: G.log(a), [r(3, 4, low=0.5, high=2.0)]),
    ("Tanh", lambda a: G.tanh(a), [r(3, 4)]),
    ("Sigmoid", lambda a: G.sigmoid(a), [r(3, 4)]),
    ("Relu", lambda a: G.relu(a), [away_from_zero(3, 4)]),
    ("Square", lambda a: G.square(a), [r(3, 4)]),
    ("Sqrt", lambda a: G.sqrt(a), [r(3, 4, low=0.5, high=2.0)]),
    ("Sum", lambda a: G.reduce_sum(a), [r(3, 4)]),
    ("Sum/axis", lambda a: G.reduce_sum(a, axis=[0, 2]), [r(2, 3, 4)]),
    ("Sum/keepdims", lambda a: G.reduce_sum(a, axis=1, keepdims=True), [r(3, 4)]),
    ("Mean", lambda a: G.reduce_mean(a, axis=0), [r(3, 4)]),
    ("Mean/all", lambda a: G.reduce_mean(a), [r(3, 4)]),
    ("Max", lambda a: G.reduce_max(a, axis=1), [r(3, 5)]),
    ("Softmax", lambda a: G.softmax(a), [r(3, 5)]),
    ("LogSoftmax", lambda a: G.log_softmax(a, axis=0), [r(3, 5)]),
    ("SparseSoftmaxCrossEntropyWithLogits",
     lambda a: G.sparse_softmax_cross_entropy(np.array([0, 4, 2]), a), [r(3, 5)]),
    ("Reshape", lambda a: G.reshape(a, [-1, 2]), [r(3, 4)]),
    ("Transpose", lambda a: G.transpose(a, [2, 0, 1]), [r(2, 3, 4)]),
    ("Transpose/default", lambda a: G.transpose(a), [r(3, 4)]),
    ("Concat", lambda a, b, c: G.concat([a, b, c], axis=1), [r(2, 1), r(2, 3), r(2, 2)]),
    ("Gather", lambda a: G.gather(a, np.array([3, 0, 3, 1])), [r(5, 2)]),
    ("Identity", lambda a: G.identity(a), [r(3, 4)]),
    ("SumToShapeOf", lambda g, x: ops.sum_to(g, x), [r(3, 4), r(1, 4)]),
    ("BroadcastLike", lambda g, x: ops.broadcast_like(g, x, axis=1, keepdims=False, mean=True), [r(3), r(3, 4)]),
    ("ReshapeLike", lambda a, b: ops.reshape_like(a, b), [r(3, 4), r(2, 6)]),
    ("ReluGrad", lambda g, x: ops.relu_grad(g, x), [r(3, 4), away_from_zero(3, 4)]),
    ("Cast", lambda a: ops.cast(a, "float64"), [r(3, 4)]),
]


def _graph_grads(fn, arrays, weights):
    g = G.Graph()
    with g.as_default():
        phs = [G.placeholder("float64", a.shape) for a in arrays]
        out = fn(*phs)
        loss = G.reduce_sum(out * G.constant(weights))
        grads = G.gradients(loss, phs)
    feed = dict(zip(phs, arrays))
    with G.Session(g) as sess:
        analytic = [None if t is None else sess.run(t, feed) for t in grads]
        numeric = []
        for i, a in enumerate(arrays):
            num = np.zeros_like(a)
            for idx in np.ndindex(a.shape):
                eps = 1e-6
                plus, minus = a.copy(), a.copy()
                plus[idx] += eps
                minus[idx] -= eps
                f_plus = sess.run(loss, {**feed, phs[i]: plus})
                f_minus = sess.run(loss, {**feed, phs[i]: minus})
                num[idx] = (f_plus - f_minus) / (2 * eps)
            numeric.append(num)
    return analytic, numeric


def _output_shape(fn, arrays):
    with G.eager_mode():
        return fn(*[G.EagerTensor(a) for a in arrays]).shape


def _eager_grads(fn, arrays, weights):
    with G.eager_mode():
        xs = [G.EagerTensor(a) for a in arrays]
        with G.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            loss = G.reduce_sum(fn(*xs) * G.constant(weights))
        return [None if t is None else t.value for t in tape.gradient(loss, xs)]


@pytest.mark.parametrize("name,fn,arrays", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, fn, arrays):
    weights = RNG.normal(size=_output_shape(fn, arrays))
    analytic, numeric = _graph_grads(fn, arrays, weights)
    for a, n in zip(analytic, numeric):
        if a is None:  # an input used only for its shape: the function is flat in it
            np.testing.assert_array_equal(n, 0)
            continue
        assert a.shape == n.shape
        np.testing.assert_allclose(a, n, rtol=1e-5, atol=1e-7)
    for e, a in zip(_eager_grads(fn, arrays, weights), analytic):
        assert (e is None) == (a is None)
        if a is not None:
            np.testing.assert_allclose(e, a, rtol=1e-12, atol=1e-12)  # same gradient functions  # same gradient functions


def test_every_differentiable_op_is_checked():
    """Every built-in op with a gradient has a case above (ops that other packages register,
    such as the C custom ops, are checked by their own tests)."""
    covered = {c[0].split("/")[0] for c in CASES}
    differentiable = {t for t, d in REGISTRY.items() if d.grad not in (None, NO_GRADIENT)
                      and d.kernel.__module__.startswith("reference_impl.graph.")}
    assert differentiable <= covered, differentiable - covered


def test_weight_sharing_sums_both_uses():
    x, w, rw = r(2, 3), r(3, 3), r(2, 3)
    g = G.Graph()
    with g.as_default():
        W = G.Variable(w)
        y = G.matmul(G.matmul(G.constant(x), W), W)  # W used twice
        (gw,) = G.gradients(G.reduce_sum(y * G.constant(rw)), [W])
        with G.Session(g) as s:
            s.run(G.global_variables_initializer())
            got = s.run(gw)
    expected = x.T @ rw @ w.T + (x @ w).T @ rw  # first use + second use
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def _numpy_mlp(x, labels, w1, b1, w2, b2):
    """Hand-written forward and backward of relu MLP + mean softmax cross-entropy."""
    h_pre = x @ w1 + b1
    h = np.maximum(h_pre, 0)
    logits = h @ w2 + b2
    z = logits - logits.max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    n = len(labels)
    loss = -np.log(p[np.arange(n), labels]).mean()
    dlogits = p.copy()
    dlogits[np.arange(n), labels] -= 1
    dlogits /= n
    dw2, db2 = h.T @ dlogits, dlogits.sum(0)
    dh = dlogits @ w2.T * (h_pre > 0)
    return loss, [x.T @ dh, dh.sum(0), dw2, db2]


def test_mlp_softmax_cross_entropy_against_handwritten_backprop():
    x, labels = r(8, 5), RNG.integers(0, 4, size=8)
    params = [r(5, 6), r(6), r(6, 4), r(4)]
    g = G.Graph()
    with g.as_default():
        xp = G.placeholder("float64", [None, 5])
        yp = G.placeholder("int64", [None])
        vs = [G.Variable(p) for p in params]
        logits = G.matmul(G.relu(G.matmul(xp, vs[0]) + vs[1]), vs[2]) + vs[3]
        loss = G.reduce_mean(G.sparse_softmax_cross_entropy(yp, logits))
        grads = G.gradients(loss, vs)
    with G.Session(g) as s:
        s.run(G.global_variables_initializer(g))
        got_loss, got = s.run((loss, grads), {xp: x, yp: labels})
    want_loss, want = _numpy_mlp(x, labels, *params)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-12)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)


def test_no_gradient_function_is_a_clear_error():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [3])
        v = G.Variable(np.zeros(3))
        y = G.assign(v, x * 2.0)
        with pytest.raises(G.GraphError, match="type 'Assign' has no gradient"):
            G.gradients(G.reduce_sum(y), [x])


def test_unconnected_and_integer_inputs_get_none():
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [3])
        z = G.placeholder("float64", [3])
        assert G.gradients(G.reduce_sum(x), [x, z])[1] is None
