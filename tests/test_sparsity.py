"""Pruning, the CSR/BSR formats and kernels, and gradual pruning on the digits task."""
from __future__ import annotations

import numpy as np
import pytest

from reference_impl.sparsity import (BSR, CSR, block_mask, digits_split, global_magnitude_masks, magnitude_mask,
                                     polynomial_sparsity, sparsity_of, train_digits)

pytestmark = pytest.mark.timeout(120)


def test_magnitude_mask_keeps_the_largest_exactly():
    w = np.random.default_rng(0).normal(size=(20, 30))
    m = magnitude_mask(w, 0.7)
    assert m.sum() == 180
    assert np.abs(w[m]).min() >= np.abs(w[~m]).max()


def test_global_masks_share_one_threshold():
    rng = np.random.default_rng(1)
    small, big = rng.normal(size=(10, 10)) * 0.01, rng.normal(size=(10, 10))
    ms = global_magnitude_masks([small, big], 0.5)
    assert ms[0].sum() + ms[1].sum() == 100
    assert ms[0].sum() < 10 < ms[1].sum()  # the layer of small weights loses most of them
    kept = np.concatenate([np.abs(small[ms[0]]), np.abs(big[ms[1]])])
    dropped = np.concatenate([np.abs(small[~ms[0]]), np.abs(big[~ms[1]])])
    assert kept.min() >= dropped.max()


def test_block_and_row_masks_are_structured():
    w = np.random.default_rng(2).normal(size=(8, 12))
    m = block_mask(w, 0.5, (2, 3))
    tiles = m.reshape(4, 2, 4, 3).transpose(0, 2, 1, 3).reshape(16, 6)
    assert set(tiles.all(1) | ~tiles.any(1)) == {True} and tiles.all(1).sum() == 8
    norms = np.sqrt((w.reshape(4, 2, 4, 3) ** 2).sum(axis=(1, 3))).ravel()
    assert norms[tiles.all(1)].min() >= norms[~tiles.all(1)].max()
    rows = block_mask(w, 0.25, (1, 12))
    assert rows.all(1).sum() == 6 and (rows.all(1) | ~rows.any(1)).all()
    with pytest.raises(ValueError, match=r"block \(3, 5\) does not tile"):
        block_mask(w, 0.5, (3, 5))
    with pytest.raises(ValueError, match="sparsity must be in"):
        magnitude_mask(w, 1.5)


def test_polynomial_schedule():
    s = [polynomial_sparsity(t, 10, 110, 0.9) for t in (0, 10, 60, 110, 500)]
    assert s[0] == s[1] == 0.0 and s[3] == s[4] == pytest.approx(0.9)
    assert s[2] == pytest.approx(0.9 * (1 - 0.5 ** 3))
    assert all(a <= b for a, b in zip(s, s[1:]))


@pytest.mark.parametrize("density", [0.0, 0.05, 0.3, 1.0])
def test_csr_and_bsr_kernels_match_dense(density):
    rng = np.random.default_rng(3)
    a = rng.normal(size=(24, 16)).astype(np.float32)
    a *= block_mask(a, 1 - density, (4, 4))
    a[5] = 0  # an empty row inside a non-empty block row
    x, xs = rng.normal(size=16).astype(np.float32), rng.normal(size=(16, 7)).astype(np.float32)
    for m in (CSR.from_dense(a), BSR.from_dense(a, (4, 4)), BSR.from_dense(a, (2, 8))):
        np.testing.assert_array_equal(m.to_dense(), a)
        np.testing.assert_allclose(m.matmul(x), a @ x, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(m.matmul(xs), a @ xs, rtol=1e-5, atol=1e-5)
    assert CSR.from_dense(a).nnz == np.count_nonzero(a)
    with pytest.raises(ValueError, match="operand has shape"):
        CSR.from_dense(a).matmul(np.ones(5, np.float32))


def test_csr_matches_scipy():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(4)
    a = rng.normal(size=(50, 40)) * (rng.random((50, 40)) < 0.1)
    ours, theirs = CSR.from_dense(a), scipy_sparse.csr_matrix(a)
    np.testing.assert_array_equal(ours.indptr, theirs.indptr)
    np.testing.assert_array_equal(ours.indices, theirs.indices)
    x = rng.normal(size=(40, 3))
    np.testing.assert_allclose(ours.matmul(x), theirs @ x)


def test_gradual_pruning_on_digits_reaches_target_and_still_learns():
    data = digits_split(seed=0)
    model = train_digits(epochs=3, batch=64, lr=0.3, data=data, method="layer", prune_every=5,
                         schedule=lambda t: polynomial_sparsity(t, 0, 40, 0.8))
    for w in model.weight_values():
        assert sparsity_of(w) == pytest.approx(0.8, abs=0.01)
    assert model.accuracy(data[2], data[3]) > 0.8  # 10 classes: chance is 0.1
