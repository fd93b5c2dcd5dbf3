"""Optimisers and schedules: every step checked against the closed-form update equations in NumPy.

The loss is ``0.5 * sum(s * (w - c)^2)``, whose gradient ``s * (w - c)`` NumPy computes
independently of the graph's autodiff; the sparse case is an embedding lookup with repeated
ids.  Each reference below is written from the papers' equations, not from the module.
"""
import math

import numpy as np
import pytest

import reference_impl.graph as g
from reference_impl.train import optimizers as opt
from reference_impl.train import schedules as sch

pytestmark = pytest.mark.timeout(60)
STEPS = 6


# ---------------------------------------------------------------- NumPy references, one per paper
def ref_sgd(w, gr, s, t, lr):
    return w - lr * gr, s


def ref_momentum(w, gr, s, t, lr, mu=0.9, nesterov=False):
    v = mu * s.get("momentum", 0) + gr
    return w - lr * (gr + mu * v if nesterov else v), {"momentum": v}


def ref_adagrad(w, gr, s, t, lr, init=0.1):
    a = s.get("accumulator", init) + gr**2
    return w - lr * gr / np.sqrt(a), {"accumulator": a}


def ref_rmsprop(w, gr, s, t, lr, rho=0.9, mu=0.5, eps=1e-7):
    ms = rho * s.get("ms", 0) + (1 - rho) * gr**2
    mom = mu * s.get("mom", 0) + lr * gr / np.sqrt(ms + eps)
    return w - mom, {"ms": ms, "mom": mom}


def ref_adam(w, gr, s, t, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0):
    m = b1 * s.get("m", 0) + (1 - b1) * gr
    v = b2 * s.get("v", 0) + (1 - b2) * gr**2
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    return w - lr * (m_hat / (np.sqrt(v_hat) + eps) + wd * w), {"m": m, "v": v}


def ref_ftrl(w, gr, s, t, lr, l1=0.05, l2=0.1, beta=1.0):
    n, z = s.get("n", 0), s.get("z", 0)
    sigma = (np.sqrt(n + gr**2) - np.sqrt(n)) / lr
    z = z + gr - sigma * w
    n = n + gr**2
    w_new = np.where(np.abs(z) <= l1, 0.0, -(z - np.sign(z) * l1) / ((beta + np.sqrt(n)) / lr + l2))
    return w_new, {"z": z, "n": n}


CASES = {
    "sgd": (lambda: opt.GradientDescent(0.1), ref_sgd, 0.1),
    "momentum": (lambda: opt.Momentum(0.05, momentum=0.9), ref_momentum, 0.05),
    "nesterov": (lambda: opt.Momentum(0.05, momentum=0.9, use_nesterov=True),
                 lambda *a: ref_momentum(*a, nesterov=True), 0.05),
    "adagrad": (lambda: opt.Adagrad(0.3), ref_adagrad, 0.3),
    "rmsprop": (lambda: opt.RMSProp(0.01, rho=0.9, momentum=0.5), ref_rmsprop, 0.01),
    "adam": (lambda: opt.Adam(0.02), ref_adam, 0.02),
    "adamw": (lambda: opt.AdamW(0.02, weight_decay=0.1), lambda *a: ref_adam(*a, wd=0.1), 0.02),
    "ftrl": (lambda: opt.Ftrl(0.5, l1=0.05, l2=0.1), ref_ftrl, 0.5),
}


def _problem(seed, shape=(4, 3)):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape), rng.standard_normal(shape), rng.uniform(0.5, 2.0, shape))


@pytest.mark.parametrize("name", list(CASES))
def test_dense_steps_match_closed_form(name):
    make, ref, lr = CASES[name]
    w0, c, s = _problem(1)
    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(w0, name="w")
        loss = 0.5 * g.reduce_sum(g.constant(s) * g.square(w - g.constant(c)))
        o = make()
        train = o.minimize(loss)
        with g.Session(graph) as sess:
            sess.run(g.global_variables_initializer())
            w_ref, state = w0.copy(), {}
            for t in range(1, STEPS + 1):
                sess.run(train)
                w_ref, state = ref(w_ref, s * (w_ref - c), state, t, lr)
                np.testing.assert_allclose(sess.run(w), w_ref, rtol=1e-10, atol=1e-12, err_msg=f"step {t}")
                for slot, value in state.items():
                    np.testing.assert_allclose(sess.run(o.get_slot(w, slot)), value, rtol=1e-10, atol=1e-12)
            assert sess.run(o.iterations) == STEPS


@pytest.mark.parametrize("name", list(CASES))
def test_sparse_updates_only_the_gathered_rows(name):
    """An embedding lookup with repeated ids: duplicates are summed, then the rows are updated lazily."""
    make, ref, lr = CASES[name]
    rng = np.random.default_rng(2)
    table0 = rng.standard_normal((10, 3))
    batches = [np.array([[1, 4], [4, 7]]), np.array([[0, 1], [1, 1]]), np.array([[9, 4], [2, 2]])]
    targets = rng.standard_normal((2, 2, 3))
    graph = g.Graph()
    with graph.as_default():
        table = g.Variable(table0, name="emb")
        ids = g.placeholder("int64", [2, 2])
        rows = g.gather(table, ids)
        loss = 0.5 * g.reduce_sum(g.square(rows - g.constant(targets)))
        o = make()
        grads = o.compute_gradients(loss)
        assert isinstance(grads[0][0], opt.IndexedSlices)
        train = o.apply_gradients(grads)
        with g.Session(graph) as sess:
            sess.run(g.global_variables_initializer())
            w_ref, slots = table0.copy(), {}
            for t, batch in enumerate(batches, start=1):
                sess.run(train, {ids: batch})
                dense = np.zeros_like(w_ref)
                np.add.at(dense, batch.reshape(-1), (w_ref[batch] - targets).reshape(-1, 3))
                used = np.unique(batch)
                row_slots = {k: v[used] for k, v in slots.items()}
                new_rows, new_slots = ref(w_ref[used], dense[used], row_slots, t, lr)
                w_ref = w_ref.copy()
                w_ref[used] = new_rows
                for k, v in new_slots.items():
                    full = slots.get(k, np.full_like(w_ref, 0.1 if k == "accumulator" else 0.0)).copy()
                    full[used] = v
                    slots[k] = full
                np.testing.assert_allclose(sess.run(table), w_ref, rtol=1e-10, atol=1e-12, err_msg=f"step {t}")
                untouched = np.setdiff1d(np.arange(10), np.concatenate(batches[:t]))
                np.testing.assert_array_equal(sess.run(table)[untouched], table0[untouched])


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_sparse_equals_dense_where_zero_gradients_do_nothing(name):
    make = CASES[name][0]
    ids_value = np.array([3, 0, 3, 5])
    results = []
    for sparse in (True, False):
        graph = g.Graph()
        with graph.as_default():
            table = g.Variable(np.arange(24.0).reshape(8, 3) / 10, name="emb")
            ids = g.constant(ids_value)
            looked_up = g.gather(table, ids) if sparse else g.matmul(g.constant(np.eye(8)[ids_value]), table)
            loss = g.reduce_sum(g.square(looked_up - 1.0))
            train = make().minimize(loss)
            with g.Session(graph) as sess:
                sess.run(g.global_variables_initializer())
                for _ in range(3):
                    sess.run(train)
                results.append(sess.run(table))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-12)


def test_condition_false_skips_the_whole_step():
    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(np.ones(3), name="w")
        ok = g.placeholder("bool", [])
        o = opt.Adam(0.1)
        train = o.minimize(g.reduce_sum(g.square(w)), condition=ok)
        with g.Session(graph) as sess:
            sess.run(g.global_variables_initializer())
            sess.run(train, {ok: False})
            np.testing.assert_array_equal(sess.run(w), np.ones(3))
            assert sess.run(o.iterations) == 0 and not sess.run(o.get_slot(w, "m")).any()
            sess.run(train, {ok: True})
            w_ref, _ = ref_adam(np.ones(3), 2 * np.ones(3), {}, 1, 0.1)
            np.testing.assert_allclose(sess.run(w), w_ref, rtol=1e-12)


def test_adding_an_optimiser_is_one_class():
    class SignSGD(opt.Optimizer):
        """w <- w - lr * sign(g), with no state."""

        def update(self, var, grad, slots, lr, t):
            return var - lr * opt.apply("Sign", [grad]), {}

    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(np.array([3.0, -2.0, 0.5]), name="w")
        train = SignSGD(0.25).minimize(g.reduce_sum(g.square(w)))
        with g.Session(graph) as sess:
            sess.run(g.global_variables_initializer())
            sess.run(train)
            np.testing.assert_allclose(sess.run(w), [2.75, -1.75, 0.25])


@pytest.mark.parametrize("bad", [float("nan"), -0.1, float("inf"), "fast"])
def test_bad_learning_rate_is_named(bad):
    with pytest.raises(ValueError, match="Adam: learning_rate must be"):
        opt.Adam(bad)


def test_schedule_giving_nan_fails_at_run_time():
    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(np.ones(2), name="w")
        o = opt.GradientDescent(sch.LinearWarmup(1.0, 4))
        o.learning_rate.after.learning_rate = float("nan")  # corrupted after construction
        train = o.minimize(g.reduce_sum(g.square(w)))
        with g.Session(graph) as sess:
            sess.run(g.global_variables_initializer())
            with pytest.raises(g.GraphError, match="LearningRate.*learning_rate must be finite, got nan"):
                sess.run(train)


def test_no_gradient_and_no_variables_are_errors():
    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(np.ones(2), name="w")
        u = g.Variable(np.ones(2), name="unused")
        with pytest.raises(g.GraphError, match="no gradient reaches any variable"):
            opt.GradientDescent(0.1).minimize(g.reduce_sum(g.square(w)), var_list=[u])
    with g.Graph().as_default():
        x = g.constant(np.ones(2))
        with pytest.raises(g.GraphError, match="no trainable variables"):
            opt.GradientDescent(0.1).minimize(g.reduce_sum(x))


# ---------------------------------------------------------------- schedules
def test_schedules_closed_forms():
    steps = np.arange(0, 100)
    np.testing.assert_allclose(sch.StepDecay(0.1, 0.5, 30)(steps), 0.1 * 0.5 ** (steps // 30))
    np.testing.assert_allclose(sch.ExponentialDecay(0.1, 0.5, 30)(steps), 0.1 * 0.5 ** (steps / 30))
    cos = sch.CosineDecay(0.1, 50, alpha=0.1)(steps)
    assert cos[0] == pytest.approx(0.1) and cos[25] == pytest.approx(0.1 * (0.1 + 0.9 * 0.5))
    np.testing.assert_allclose(cos[50:], 0.01)
    warm = sch.LinearWarmup(sch.CosineDecay(0.1, 50), 10)(steps)
    np.testing.assert_allclose(warm[:10], sch.CosineDecay(0.1, 50)(steps[:10]) * (steps[:10] + 1) / 10)
    np.testing.assert_allclose(warm[10:], sch.CosineDecay(0.1, 50)(steps[10:]))
    assert sch.linear_scaling_rule(0.1, 256, 8192) == pytest.approx(3.2)
    with pytest.raises(ValueError, match="batch sizes must be >= 1"):
        sch.linear_scaling_rule(0.1, 0, 8)
    with pytest.raises(ValueError, match="unknown schedule kind 'linear'"):
        sch.from_config({"kind": "linear"})


def test_schedule_drives_the_graph_learning_rate():
    """SGD on a linear loss moves w by exactly lr(step) per step: read the schedule back from w."""
    schedule = sch.LinearWarmup(sch.StepDecay(0.5, 0.1, 3), 4)
    assert sch.from_config(schedule.config()).config() == schedule.config()
    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(np.zeros(1), name="w")
        train = opt.GradientDescent(schedule).minimize(g.reduce_sum(w))
        with g.Session(graph) as sess:
            sess.run(g.global_variables_initializer())
            seen = []
            for _ in range(8):
                before = sess.run(w)[0]
                sess.run(train)
                seen.append(before - sess.run(w)[0])
    np.testing.assert_allclose(seen, schedule(np.arange(8)), rtol=1e-6)
    assert math.isclose(seen[0], 0.5 / 4, rel_tol=1e-6)


def test_train_graph_with_schedule_and_sparse_update_survives_graphdef():
    """The schedule is an attribute (JSON), so the whole train graph serialises and still trains."""
    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(np.ones((4, 2)), name="emb")
        loss = g.reduce_sum(g.square(g.gather(w, g.constant(np.array([0, 2, 0])))))
        opt.Adam(sch.LinearWarmup(sch.CosineDecay(0.1, 10), 3)).minimize(loss, var_list=[w])
        g.global_variables_initializer()
    names = [op.name for op in graph.operations]
    train_name = next(n for n in names if n.endswith("/update"))
    results = []
    for gr in (graph, g.from_json(g.to_json(graph))):
        with g.Session(gr) as sess:
            sess.run(gr.get_operation_by_name("init"))
            for _ in range(4):
                sess.run(gr.get_operation_by_name(train_name))
            results.append(sess.run(gr.get_tensor_by_name("emb:0")))
    np.testing.assert_array_equal(results[0], results[1])
    assert (results[0][[1, 3]] == 1).all() and (results[0][[0, 2]] < 1).all()
