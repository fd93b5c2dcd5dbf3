"""Initialisers: moments checked statistically with fixed seeds, truncation, orthogonality, graph use."""
import math

import numpy as np
import pytest

import reference_impl.graph as g
from reference_impl.train import initializers as init

pytestmark = pytest.mark.timeout(60)

SHAPE = (400, 300)  # 120 000 samples: the sample variance is within ~1 % of the true one


def _close(sample_var: float, expected: float, n: int) -> None:
    # the sample variance of n normal draws has relative standard error sqrt(2 / n)
    # (uniform draws have lighter tails, so less); allow 5 standard errors
    assert abs(sample_var / expected - 1) < 5 * math.sqrt(2 / n), (sample_var, expected)


@pytest.mark.parametrize("name, expected_var", [
    ("glorot_uniform", 2 / (400 + 300)), ("glorot_normal", 2 / (400 + 300)),
    ("he_uniform", 2 / 400), ("he_normal", 2 / 400),
])
def test_variance_scaling_moments(name, expected_var):
    w = init.get_initializer(name, seed=3)(SHAPE, "float64")
    assert w.shape == SHAPE
    assert abs(w.mean()) < 5 * math.sqrt(expected_var / w.size)
    _close(w.var(), expected_var, w.size)


def test_uniform_variants_stay_inside_their_limit():
    w = init.HeUniform(seed=1)(SHAPE, "float64")
    limit = math.sqrt(6 / 400)
    assert np.abs(w).max() <= limit
    assert np.abs(w).max() > 0.99 * limit  # the whole interval is used
    u = init.RandomUniform(-1.0, 3.0, seed=2)((50_000,), "float64")
    assert u.min() >= -1 and u.max() < 3
    _close(u.var(), 16 / 12, u.size)


def test_normal_and_truncated_normal():
    n = init.RandomNormal(mean=1.5, stddev=0.2, seed=4)((200_000,), "float64")
    assert abs(n.mean() - 1.5) < 5 * 0.2 / math.sqrt(n.size)
    _close(n.var(), 0.04, n.size)
    t = init.TruncatedNormal(mean=-1.0, stddev=0.5, seed=5)((200_000,), "float64")
    assert np.abs(t + 1.0).max() <= 1.0  # nothing beyond 2 standard deviations
    assert np.abs(t + 1.0).max() > 0.99
    # the variance of a standard normal cut at +-2, computed independently by quadrature
    x = np.linspace(-2, 2, 200_001)
    pdf = np.exp(-x**2 / 2)
    cut_var = np.trapezoid(x**2 * pdf, x) / np.trapezoid(pdf, x)
    assert init.TRUNCATED_VARIANCE == pytest.approx(cut_var, rel=1e-6)
    _close(t.var(), 0.25 * cut_var, t.size)


def test_fans_for_matrices_convolutions_and_vectors():
    assert init.compute_fans((3, 5)) == (3, 5)
    assert init.compute_fans((3, 3, 16, 32)) == (144, 288)
    assert init.compute_fans((7,)) == (7, 7)
    w = init.HeNormal(seed=0)((3, 3, 64, 32), "float64")
    _close(w.var(), 2 / (9 * 64), w.size)


@pytest.mark.parametrize("shape", [(64, 64), (100, 30), (30, 100), (4, 5, 20)])
def test_orthogonal_is_orthogonal(shape):
    w = init.Orthogonal(gain=2.0, seed=7)(shape, "float64")
    m = w.reshape(-1, shape[-1])
    small = min(m.shape)
    gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
    np.testing.assert_allclose(gram, 4.0 * np.eye(small), atol=1e-10)
    np.testing.assert_allclose(np.linalg.svd(m, compute_uv=False), 2.0, atol=1e-10)


def test_zeros_constant_and_seeds():
    assert not init.Zeros()((3, 4)).any()
    assert (init.Constant(0.25)((2, 2)) == 0.25).all()
    a, b = init.GlorotUniform(seed=9), init.GlorotUniform(seed=9)
    np.testing.assert_array_equal(a((5, 6)), b((5, 6)))  # same seed, same weights
    assert not np.array_equal(a((5, 6)), a((5, 6)))  # successive draws differ
    assert init.HeNormal()((2, 3)).dtype == np.float32


def test_variable_from_initializer_runs_in_a_session():
    graph = g.Graph()
    with graph.as_default():
        w = init.variable(init.Orthogonal(seed=1), (8, 8), name="w")
        with g.Session(graph) as sess:
            sess.run(g.global_variables_initializer())
            value = sess.run(w)
    assert value.dtype == np.float32
    np.testing.assert_allclose(value.T @ value, np.eye(8), atol=1e-5)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown initialiser 'xavier'"):
        init.get_initializer("xavier")
    with pytest.raises(ValueError, match="mode must be"):
        init.VarianceScaling(mode="fan_sum")
    with pytest.raises(ValueError, match="Orthogonal: needs a shape of rank >= 2"):
        init.Orthogonal()((5,))
    with pytest.raises(ValueError, match="floating-point dtype"):
        init.HeNormal()((2, 2), "int32")
    with pytest.raises(ValueError, match="minval < maxval"):
        init.RandomUniform(1.0, 1.0)
