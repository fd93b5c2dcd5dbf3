"""The graph runtime's kernels are array-API code: one graph runs on NumPy, on
``array_api_strict`` and on PyTorch CPU tensors (through array-api-compat) and gives NumPy's
results; so do the graph-building optimisers of ``train.optimizers`` and mixed precision.

One graph exercises every built-in kernel: forward ops (elementwise, matmul, reductions,
reshape/transpose/concat, gather, softmax and the cross-entropy), their gradient kernels
(``SumToShapeOf``, ``BroadcastLike``, ``ReluGrad``, ``ConcatSlice``, ``GatherGrad``, the
cross-entropy's gradient), and the training ops (``UniqueRows``, ``SumRows``,
``ScatterUpdate``, ``Cast``, ``AllFinite``, ``SelectIf``, ``LearningRate``, the variable
updates). ``Session(device=...)`` puts the feeds and constants on that namespace; every
fetched value must be an array of it (nothing fell back to NumPy) and equal NumPy's.

Tolerances: on ``strict`` the arrays *are* NumPy arrays underneath, so results must be
bit-identical; PyTorch has its own float32 kernels (exp, log, tanh, matmul, summation
order), so there ``rtol=1e-5, atol=1e-6``; integer results are exact everywhere.
"""
from __future__ import annotations

import numpy as np
import pytest

from reference_impl import backend
from reference_impl import graph as g
from reference_impl.graph import ops
from reference_impl.train.schedules import ExponentialDecay

TOLERANCE = {"strict": {"rtol": 0, "atol": 0}, "torch": {"rtol": 1e-5, "atol": 1e-6}}


def build() -> tuple:
    """A graph touching every kernel: (graph, fetches, feeds, updates, variables)."""
    graph = g.Graph()
    with graph.as_default():
        x = g.placeholder("float32", [4, 3], name="x")
        ids = g.placeholder("int64", [6], name="ids")
        labels = g.placeholder("int32", [4], name="labels")
        w = g.Variable(np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5), name="w")
        table = g.Variable(np.arange(24, dtype=np.float32).reshape(8, 3) / 10, name="table")
        step = g.Variable(np.asarray(3, dtype=np.int64), name="step", trainable=False)
        bias = g.constant(np.asarray([0.5, -0.25, 0.0, 1.0, 2.0], dtype=np.float32))

        h = g.relu(g.matmul(x, w) + bias)                                      # (4, 5), broadcast add
        s = g.sigmoid(h) * g.tanh(h) - g.exp(g.neg(h)) / (1.0 + g.square(h))
        s = g.maximum(s, g.sqrt(g.pow(h + 1.0, g.constant(2.0))) * 0.1)
        embedded = g.gather(table, g.reshape(ids, [2, 3]))                     # (2, 3, 3): 2-D ids
        wide = g.concat([g.transpose(g.reshape(embedded, [3, 6])), g.reshape(embedded, [6, 3])], axis=1)
        logits = g.matmul(x, g.reshape(wide, [3, 12]))                         # (4, 12)
        xent = g.sparse_softmax_cross_entropy(g.cast(labels, "int64"), logits)
        loss = (g.reduce_mean(xent) + 0.01 * g.reduce_sum(g.softmax(s)) + 0.001 * g.reduce_sum(g.log_softmax(s, 0))
                + g.reduce_mean(g.log(g.reduce_mean(g.exp(h), axis=0) + 1.0))
                + 0.1 * g.reduce_sum(g.reduce_max(wide, axis=1)))
        dw, dtable, dx = g.gradients(loss, [w, table, x])
        rows = g.unique_rows(ids)
        summed = g.sum_rows(g.reshape(embedded, [6, 3]), ids)
        updates = [
            g.scatter_update(table, rows, g.gather(table, rows) - 0.5 * summed),
            g.assign_sub(w, 0.1 * dw),
            g.assign_add(step, g.constant(np.asarray(1, dtype=np.int64))),
        ]
        lr = g.learning_rate(ExponentialDecay(0.1, 0.5, 2).config(), step, "float32")
        ok = g.all_finite([loss, dw])
        fetches = {
            "h": h, "s": s, "embedded": embedded, "wide": wide, "logits": logits, "xent": xent, "loss": loss,
            "dw": dw, "dtable": dtable, "dx": dx, "rows": rows, "summed": summed, "lr": lr, "ok": ok,
            "chosen": g.select_if(ok, g.ones_like(loss), loss), "ge": ops.greater_equal(h, s),
            "eq": ops.equal(rows, rows), "sign": ops.sign(s - 0.5),
        }
    rng = np.random.default_rng(7)
    feeds = {x: rng.normal(size=(4, 3)).astype(np.float32), ids: np.asarray([5, 1, 5, 0, 5, 1]),
             labels: np.asarray([0, 11, 1, 7], dtype=np.int32)}
    return graph, fetches, feeds, updates, (w, table, step)


def run(device: str) -> dict:
    """Every fetch, then the variables after one round of updates, on ``device``; checks that
    each value is an array of that device's namespace."""
    graph, fetches, feeds, updates, variables = build()
    sess = g.Session(graph, device=device)
    sess.run(g.global_variables_initializer(graph))
    out = sess.run(fetches, feed_dict=feeds)
    sess.run(updates, feed_dict=feeds)
    out.update(zip(("w_after", "table_after", "step_after"), sess.run(list(variables))))
    for name, value in out.items():
        assert backend.namespace_of(value) is sess.xp, (device, name, type(value))
    return {name: backend.to_numpy(value) for name, value in out.items()}


@pytest.fixture(scope="module")
def on_numpy() -> dict:
    return run("cpu")


@pytest.mark.parametrize("device", ["strict", "torch"])
def test_graph_runs_on_device_and_matches_numpy(device, on_numpy):
    got = run(device)
    assert set(got) == set(on_numpy)
    for name, expected in on_numpy.items():
        assert got[name].dtype == expected.dtype and got[name].shape == expected.shape, name
        np.testing.assert_allclose(got[name], expected, err_msg=f"{name} on {device}", **TOLERANCE[device])


def test_numpy_results_against_an_independent_computation(on_numpy):
    """The NumPy run itself checked by hand-written NumPy: the sparse ops and one gradient."""
    table0 = np.arange(24, dtype=np.float32).reshape(8, 3) / 10
    ids = np.asarray([5, 1, 5, 0, 5, 1])
    np.testing.assert_array_equal(on_numpy["rows"], [0, 1, 5])
    expected_sum = np.stack([table0[0], 2 * table0[1], 3 * table0[5]])
    np.testing.assert_allclose(on_numpy["summed"], expected_sum, rtol=1e-6)
    after = table0.copy()
    after[[0, 1, 5]] = table0[[0, 1, 5]] - 0.5 * expected_sum
    np.testing.assert_allclose(on_numpy["table_after"], after, rtol=1e-6)
    assert on_numpy["step_after"] == 4 and on_numpy["ok"]
    np.testing.assert_allclose(on_numpy["lr"], 0.1 * 0.5 ** (3 / 2), rtol=1e-6)
    dtable = on_numpy["dtable"]  # rows never looked up get no gradient
    assert np.all(dtable[[2, 3, 4, 6, 7]] == 0) and np.all(np.abs(dtable[[0, 1, 5]]).sum(axis=1) > 0)
    np.testing.assert_array_equal(on_numpy["embedded"], table0[ids.reshape(2, 3)])


def test_segment_sum_adds_rows_in_order_like_add_at():
    """``segment_sum`` gives np.add.at's bits on NumPy (rows added in the order they come)."""
    from reference_impl.graph.ops.array import scatter_rows, segment_sum

    rng = np.random.default_rng(3)
    ids = rng.integers(0, 7, size=200)
    values = (rng.normal(size=(200, 4)) * 10.0 ** rng.integers(-4, 5, size=(200, 1))).astype(np.float32)
    unique, sums = segment_sum(values, ids)
    expected = np.zeros((7, 4), np.float32)
    np.add.at(expected, ids, values)
    np.testing.assert_array_equal(unique, np.unique(ids))
    np.testing.assert_array_equal(sums, expected[np.unique(ids)])
    base = rng.normal(size=(9, 4)).astype(np.float32)
    want = base.copy()
    want[ids[:12]] = values[:12]  # repeated rows: the last write wins
    np.testing.assert_array_equal(scatter_rows(base, ids[:12], values[:12]), want)


def train_three_steps(device: str, make_optimizer) -> list[np.ndarray]:
    """Three steps of ``make_optimizer().minimize`` on a dense weight and an embedding (sparse
    gradient: IndexedSlices) on ``device``; the variables afterwards, as NumPy arrays."""
    from reference_impl.train import mixed_precision as mp

    graph = g.Graph()
    with graph.as_default():
        x = g.placeholder("float32", [4, 3])
        ids = g.placeholder("int64", [5])
        w = g.Variable(np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2), name="w")
        emb = g.Variable(np.arange(12, dtype=np.float32).reshape(6, 2) / 10, name="emb")
        h = g.matmul(mp.half(x), mp.half(w)) if make_optimizer is None else g.matmul(x, w)
        loss = g.reduce_mean(g.square(g.cast(h, "float32"))) + g.reduce_sum(g.gather(emb, ids))
        if make_optimizer is None:  # mixed precision: float16 compute, dynamic loss scaling
            from reference_impl.train.optimizers import Adam

            train = mp.LossScaleOptimizer(Adam(0.1), initial_scale=2.0 ** 15, growth_interval=2).minimize(loss)
        else:
            train = make_optimizer().minimize(loss)
        init = g.global_variables_initializer()
    sess = g.Session(graph, device=device)
    sess.run(init)
    rng = np.random.default_rng(0)
    for _ in range(3):
        sess.run(train, {x: rng.normal(size=(4, 3)).astype(np.float32) * 30, ids: np.asarray([1, 4, 1, 0, 5])})
    return [backend.to_numpy(v) for v in sess.run([w, emb])]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # an overflowed float16 step (skipped, as it should be)
def test_graph_optimizers_train_the_same_on_every_namespace():
    """The optimisers of ``train.optimizers`` build graph ops only, so they run on a device
    Session as they are: strict bit-identical, PyTorch to float32 round-off; mixed precision
    runs on PyTorch, and strict refuses its float16 by name (the standard has no float16)."""
    from reference_impl.train import optimizers as opt

    makers = {name: (lambda cls=getattr(opt, name): cls(0.1, 0.9) if cls is opt.Momentum else cls(0.1))
              for name in ("GradientDescent", "Momentum", "Adagrad", "RMSProp", "Adam", "AdamW", "Ftrl")}
    for name, make in makers.items():
        expected = train_three_steps("cpu", make)
        assert not np.array_equal(expected[0], np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)), name
        for device in ("strict", "torch"):
            for got, want in zip(train_three_steps(device, make), expected):
                np.testing.assert_allclose(got, want, err_msg=f"{name} on {device}", **TOLERANCE[device])
    for got, want in zip(train_three_steps("torch", None), train_three_steps("cpu", None)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)  # float16 products
    with pytest.raises(g.GraphError, match="the namespace array_api_strict has no dtype 'float16'"):
        train_three_steps("strict", None)
