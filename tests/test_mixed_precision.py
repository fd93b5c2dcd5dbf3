"""Mixed precision: the loss-scale state machine, its graph version, underflow, and a real training run."""
import numpy as np
import pytest

import reference_impl.graph as g
from reference_impl.train import graph_mlp as gm
from reference_impl.train import mixed_precision as mp
from reference_impl.train import optimizers as opt
from reference_impl.train.data import synthetic_classification

pytestmark = pytest.mark.timeout(120)


def test_state_machine_by_hand():
    # growth_interval 3: grow on the third finite step in a row; an overflow halves and resets
    s, n = 8.0, 0
    trace = []
    for finite in [True, True, False, True, True, True, True, False, False, False, False]:
        s, n, applied = mp.update_loss_scale(s, n, finite, growth_interval=3, min_scale=1.0)
        trace.append((s, n, applied))
    assert trace == [(8, 1, True), (8, 2, True), (4, 0, False), (4, 1, True), (4, 2, True), (8, 0, True),
                     (8, 1, True), (4, 0, False), (2, 0, False), (1, 0, False), (1, 0, False)]


def test_unscale_divides_in_float32():
    tiny = np.float16(2.0 ** -10)  # a scaled gradient; its true value 2^-25 is below float16's range
    grads, finite = mp.unscale_gradients([np.array([tiny, 1.0], np.float16)], 2.0 ** 15)
    assert finite and grads[0].dtype == np.float32
    assert grads[0][0] == 2.0 ** -25 and np.float16(tiny / np.float16(2.0 ** 15)) == 0  # float16 would lose it
    assert not mp.unscale_gradients([np.ones(2, np.float16), np.array([np.inf], np.float16)], 4.0)[1]


def test_graph_loss_scaling_follows_the_state_machine():
    """Feeding inf makes the gradient overflow: the step is skipped and the scale halves."""
    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(np.array([1.0, 2.0], np.float32), name="w")
        x = g.placeholder("float32", [2])
        loss = g.reduce_sum(mp.cast(mp.half(w) * mp.half(x), "float32"))
        o = mp.LossScaleOptimizer(opt.GradientDescent(0.5), initial_scale=1024.0, growth_interval=2)
        train = o.minimize(loss)
        with g.Session(graph) as sess, np.errstate(all="ignore"):
            sess.run(g.global_variables_initializer())
            scale, good, w_ref, steps = 1024.0, 0, np.array([1.0, 2.0]), 0
            for finite in [True, False, True, True, True, False, False, True]:
                feed = np.array([0.25, -0.5]) if finite else np.array([np.inf, 1.0])
                sess.run(train, {x: feed})
                scale, good, applied = mp.update_loss_scale(scale, good, finite, growth_interval=2)
                if applied:
                    w_ref, steps = w_ref - 0.5 * feed, steps + 1  # d loss / d w = x (powers of two: exact)
                assert sess.run(o.loss_scale) == scale and sess.run(o.good_steps) == good
                np.testing.assert_array_equal(sess.run(w), w_ref)
                assert sess.run(o.optimizer.iterations) == steps


def test_overflow_step_is_skipped_and_counter_not_advanced():
    graph = g.Graph()
    with graph.as_default():
        w = g.Variable(np.array([1.0], np.float32), name="w")
        x = g.placeholder("float32", [1])
        o = mp.LossScaleOptimizer(opt.Adam(0.1), initial_scale=2.0 ** 15)
        train = o.minimize(g.reduce_sum(mp.cast(mp.half(w) * mp.half(x), "float32")))
        with g.Session(graph) as sess, np.errstate(over="ignore", invalid="ignore"):
            sess.run(g.global_variables_initializer())
            sess.run(train, {x: [4.0]})  # 4 * 32768 = 131072 > 65504: float16 overflows
            assert sess.run(o.optimizer.iterations) == 0 and sess.run(o.loss_scale) == 2.0 ** 14
            assert not sess.run(o.optimizer.get_slot(w, "m")).any()
            sess.run(train, {x: [1.0]})
            assert sess.run(o.optimizer.iterations) == 1 and sess.run(w)[0] < 1.0


def test_underflow_demo_fails_without_scaling_and_works_with_it():
    plain = mp.underflow_demo(1.0, steps=100)
    scaled = mp.underflow_demo(2.0 ** 15, steps=100)
    assert plain["zero_grad_fraction"] > 0.5 and scaled["zero_grad_fraction"] == 0.0
    assert plain["losses"][0] == scaled["losses"][0]
    assert plain["losses"][-1] > 0.05 * plain["losses"][0]  # stuck: most gradients are exactly zero
    assert scaled["losses"][-1] < 1e-3 * scaled["losses"][0]


def test_mixed_precision_reaches_float32_loss_on_a_real_task():
    data = synthetic_classification(2048, 4, 6, seed=1)
    widths = (4, 64, 64, 6)
    full = gm.train_classifier(gm.build_classifier(widths), gm.train_with(opt.Adam(0.01)), data, 150, 64)
    model = gm.build_classifier(widths, compute_dtype="float16")
    assert model.logits.op.inputs[0].dtype == "float16"  # the network really runs in float16
    o = mp.LossScaleOptimizer(opt.Adam(0.01), growth_interval=50)
    train = o.minimize(model.loss)
    with np.errstate(all="ignore"):  # the first steps overflow on purpose (scale 2^15)
        mixed = gm.train_classifier(model, lambda loss: train, data, 150, 64, fetch={"scale": o.loss_scale})
    assert full["losses"][0] > 1.0 > full["final_loss"]
    assert abs(mixed["final_loss"] - full["final_loss"]) < 0.02 + 0.02 * full["final_loss"]
    scales = mixed["scale"]
    assert max(scales) > 2.0 ** 15  # grown after 50 good steps ...
    assert any(b < a for a, b in zip(scales, scales[1:]))  # ... and halved after an overflow


def test_bad_configuration_is_named():
    with pytest.raises(TypeError, match="wraps an Optimizer"):
        mp.LossScaleOptimizer("adam")
    with pytest.raises(ValueError, match="initial_scale"):
        mp.LossScaleOptimizer(opt.Adam(), initial_scale=float("nan"))
    with g.Graph().as_default():
        w = g.Variable(np.ones(2, np.float16), name="w")
        with pytest.raises(g.GraphError, match="compute the loss in float32"):
            mp.LossScaleOptimizer(opt.Adam()).minimize(g.reduce_sum(w))


def test_sparse_gradients_are_unscaled_too():
    """An embedding lookup (IndexedSlices path): scaled by 2^10 and unscaled, SGD is unchanged exactly."""
    results = []
    for scaled in (False, True):
        graph = g.Graph()
        with graph.as_default():
            table = g.Variable(np.arange(12.0, dtype=np.float32).reshape(6, 2) / 8, name="emb")
            loss = g.reduce_sum(g.square(g.gather(table, g.constant(np.array([1, 4, 1])))))
            sgd = opt.GradientDescent(0.125)
            train = mp.LossScaleOptimizer(sgd, initial_scale=1024.0).minimize(loss) if scaled else sgd.minimize(loss)
            assert isinstance(sgd.compute_gradients(loss)[0][0], opt.IndexedSlices)
            with g.Session(graph) as sess:
                sess.run(g.global_variables_initializer())
                for _ in range(3):
                    sess.run(train)
                results.append(sess.run(table))
    np.testing.assert_array_equal(results[0], results[1])
    assert (results[1][[0, 2, 3, 5]] == np.arange(12.0).reshape(6, 2)[[0, 2, 3, 5]] / 8).all()
