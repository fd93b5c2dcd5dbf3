"""Sparse tables: hashing and shard balance, first-pull initialisation, the temporary
embedding matrix against a dense embedding table, and refusals that leave tables intact."""
import numpy as np
import pytest

from reference_impl.ps.embedding import (
    dedupe,
    embedding_lookup,
    embedding_lookup_grad,
    sparse_table_pull,
    sparse_table_push,
)
from reference_impl.ps.hashing import (
    as_ids,
    group_by_shard,
    load_imbalance,
    shard_of,
    splitmix64,
    uniform_from_ids,
)
from reference_impl.ps.optimizers import SGD
from reference_impl.ps.sparse_table import ShardedSparseTable, SparseTable

MASK = 2**64 - 1


def splitmix64_python(x: int) -> int:
    """SplitMix64's finaliser in plain Python integers, written from the published constants."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_splitmix64_matches_a_plain_python_implementation(rng):
    xs = [0, 1, 2**63 - 1, 2**64 - 1, *rng.integers(0, 2**63, 20).tolist()]
    got = splitmix64(np.array(xs, dtype=np.uint64)).tolist()
    assert got == [splitmix64_python(x) for x in xs]


def test_random_ids_balance_over_8_shards(rng):
    ids = rng.integers(-(2**63), 2**63 - 1, 1_000_000, dtype=np.int64)
    assert load_imbalance(ids, 8) <= 1.02


def test_adversarial_ids_still_balance():
    multiples = np.arange(1_000_000, dtype=np.int64) * 8  # every id a multiple of the shard count
    assert np.all(multiples % 8 == 0)  # plain modulo would put all of them on shard 0
    assert load_imbalance(multiples, 8) <= 1.02
    strided = np.arange(200_000, dtype=np.int64) << 32  # only high bits vary
    assert load_imbalance(strided, 8) <= 1.02


def test_ids_must_be_64_bit_integers():
    with pytest.raises(TypeError, match="must be integers.*float64"):
        shard_of(np.array([1.5]), 4)
    with pytest.raises(ValueError, match="fits in 64 bits"):
        as_ids([2**64])
    with pytest.raises(ValueError, match="n_shards"):
        shard_of([1], 0)
    assert as_ids([2**64 - 1]).tolist() == [-1]  # an unsigned id keeps its bits


def test_dedupe_gives_unique_ids_and_local_rows(rng):
    ids = rng.integers(0, 20, (7, 5))
    unique, local = dedupe(ids)
    assert np.array_equal(unique, np.unique(ids))
    assert np.array_equal(unique[local], ids)


def test_new_ids_are_initialised_on_first_pull_and_kept():
    table = SparseTable(3, init_scale=0.1, seed=4)
    ids = np.array([5, 2**62 + 7, -3])
    first = table.pull(ids)
    assert np.array_equal(first, 0.1 * uniform_from_ids(ids, 3, 4))
    assert len(table) == 3
    assert np.array_equal(table.pull(ids[::-1]), first[::-1])
    assert len(table) == 3


def test_memory_grows_with_ids_seen_not_vocabulary(rng):
    small = SparseTable(8)
    huge = SparseTable(8)
    small.pull(rng.choice(1000, 300, replace=False))
    huge.pull(rng.choice(2**62, 300, replace=False))  # ids from a vocabulary of 4.6e18
    assert len(small) == len(huge) == 300
    assert small.nbytes() == huge.nbytes()


@pytest.mark.parametrize("n_shards", [1, 3])
def test_temporary_matrix_equals_a_dense_embedding_table(rng, n_shards):
    vocab, dim, lr = 50, 6, 0.3
    table = ShardedSparseTable(n_shards, dim, SGD(lr), init_scale=0.2, seed=9)
    dense = 0.2 * uniform_from_ids(np.arange(vocab), dim, 9)  # the same initial rows, all of them
    ids = rng.integers(0, vocab, (16, 4))  # many duplicates
    upstream = rng.standard_normal((16, 4, dim))

    temp = sparse_table_pull(table, ids)
    assert len(temp.unique_ids) < ids.size
    out = embedding_lookup(temp)
    np.testing.assert_allclose(out, dense[ids], atol=1e-6, rtol=0)

    d_matrix = embedding_lookup_grad(temp, upstream)
    d_dense = np.zeros_like(dense)  # gradient of sum(dense[ids] * upstream) by a loop
    for pos in np.ndindex(ids.shape):
        d_dense[ids[pos]] += upstream[pos]
    np.testing.assert_allclose(d_matrix, d_dense[temp.unique_ids], atol=1e-6, rtol=0)

    sparse_table_push(table, temp, d_matrix)
    after = table.pull(np.arange(vocab))  # also creates the untouched rows, at their initial value
    np.testing.assert_allclose(after, dense - lr * d_dense, atol=1e-6, rtol=0)


def test_push_for_rows_never_pulled_is_refused_and_changes_nothing():
    table = ShardedSparseTable(2, 2, SGD(1.0))
    table.pull(np.array([1, 2, 3]))
    before = table.pull(np.array([1, 2, 3]))
    with pytest.raises(KeyError, match="never pulled.*nothing was updated"):
        table.push(np.array([1, 99]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="NaN"):
        table.push(np.array([1, 2]), np.array([[1.0, np.nan], [0, 0]]))
    with pytest.raises(ValueError, match="twice"):
        table.push(np.array([1, 1]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="shape"):
        table.push(np.array([1, 2]), np.ones((2, 3)))
    assert len(table) == 3
    np.testing.assert_array_equal(table.pull(np.array([1, 2, 3])), before)


def test_gradient_shape_errors_are_named(rng):
    table = SparseTable(2)
    temp = sparse_table_pull(table, [1, 2, 2])
    with pytest.raises(ValueError, match="d_out has shape"):
        embedding_lookup_grad(temp, np.ones((3, 5)))
    with pytest.raises(ValueError, match="does not match the temporary matrix"):
        sparse_table_push(table, temp, np.ones((3, 2)))


def test_pulls_mixing_known_new_and_repeated_ids_give_each_id_its_own_row(rng):
    table = SparseTable(2, init_scale=1.0, seed=7)
    seen = set()
    for _ in range(20):
        ids = rng.integers(0, 60, 25)  # repeats within a pull, and ids seen in earlier pulls
        rows = table.pull(ids)
        np.testing.assert_array_equal(rows, uniform_from_ids(ids, 2, 7))
        seen |= set(ids.tolist())
        assert len(table) == len(seen)
    keys, rows = table.index.items()
    assert set(keys.tolist()) == seen and sorted(rows.tolist()) == list(range(len(seen)))


def test_uniform_from_ids_is_the_published_formula_bit_for_bit(rng):
    ids = np.concatenate([rng.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64), [0, -1, 2**63 - 1]])
    base = splitmix64(ids ^ np.int64(11)).view(np.int64)
    cols = np.arange(5, dtype=np.int64) * np.int64(0x5851F42D4C957F2D)
    bits = splitmix64(base[:, None] + cols[None, :])
    expected = (bits >> np.uint64(11)).astype(np.float64) * (2.0 / 2**53) - 1.0
    assert np.array_equal(uniform_from_ids(ids, 5, 11), expected)


@pytest.mark.parametrize("n_shards", [3, 300, 70_000])
def test_group_by_shard_gives_each_shard_a_contiguous_stable_slice(rng, n_shards):
    ids = rng.integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64)
    order, bounds = group_by_shard(ids, n_shards)
    assert sorted(order.tolist()) == list(range(len(ids))) and len(bounds) == n_shards
    owner = shard_of(ids, n_shards)[order]
    lo, hi = np.array(bounds).T
    assert np.array_equal(hi - lo, np.bincount(owner, minlength=n_shards)) and lo[0] == 0 and hi[-1] == len(ids)
    assert np.array_equal(np.repeat(np.arange(n_shards), hi - lo), owner)  # shard s fills [lo_s, hi_s)
    same = np.diff(owner) == 0
    assert np.all(np.diff(order)[same] > 0)  # stable: within a shard, the original order is kept


def test_scatter_add_by_bincount_equals_add_at_exactly(rng):
    ids = rng.integers(0, 40, (64, 3))
    temp = sparse_table_pull(SparseTable(7), ids)
    d_out = rng.standard_normal((64, 3, 7))
    expected = np.zeros_like(temp.matrix)
    np.add.at(expected, temp.local_index.ravel(), d_out.reshape(-1, 7))
    assert np.array_equal(embedding_lookup_grad(temp, d_out), expected)


def test_a_push_after_the_caller_changed_its_id_array_uses_the_new_ids():
    table = SparseTable(2, SGD(1.0), init_scale=0.0)
    ids = np.array([1, 2, 3])
    table.pull(ids)
    ids[0] = 99  # the same array object, now naming an id never pulled
    with pytest.raises(KeyError, match="never pulled"):
        table.push(ids, np.ones((3, 2)))
    ids[0] = 3
    ids[2] = 1  # [3, 2, 1]: known ids in another order
    table.push(ids, np.array([[3.0, 3], [2, 2], [1, 1]]))
    np.testing.assert_array_equal(table.pull(np.array([1, 2, 3])), -np.array([[1.0, 1], [2, 2], [3, 3]]))


@pytest.mark.parametrize("n_shards", [1, 4])
def test_many_batches_match_a_dense_table_updated_with_numpy(rng, n_shards):
    """Thousands of rows created over many batches (the index merges its runs several
    times), pulls and pushes interleaved: every row ends where a dense table says."""
    vocab, dim, lr = 6000, 4, 0.5
    table = ShardedSparseTable(n_shards, dim, SGD(lr), init_scale=0.3, seed=2)
    ids_all = rng.permutation(vocab).astype(np.int64) * 1_000_003 - 2**40  # sparse, negative and positive
    dense = 0.3 * uniform_from_ids(ids_all, dim, 2)
    for _ in range(30):
        pick = rng.integers(0, vocab, rng.integers(50, 600)) % rng.integers(200, vocab + 1)
        temp = sparse_table_pull(table, ids_all[pick])
        np.testing.assert_allclose(embedding_lookup(temp), dense[pick], atol=1e-12, rtol=0)
        d_out = rng.standard_normal((len(pick), dim))
        sparse_table_push(table, temp, embedding_lookup_grad(temp, d_out))
        np.add.at(dense, pick, -lr * d_out)
    np.testing.assert_allclose(table.pull(ids_all), dense, atol=1e-9, rtol=0)
