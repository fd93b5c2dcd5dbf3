"""Feature columns against independent computations: intervals by loop, vocabularies by
dict, hashes recomputed with hashlib, crossed ids by their definition, and the measured
collision rate against the birthday-problem formula."""
import hashlib

import numpy as np
import pytest

from reference_impl.models import feature_columns as fc
from reference_impl.ps import ShardedSparseTable, sparse_table_pull, splitmix64


def test_numeric_column_normalises_and_checks_its_input():
    col = fc.numeric_column("age", mean=30.0, std=10.0)
    np.testing.assert_allclose(col.dense({"age": np.array([20, 45])}), [[-1.0], [1.5]])
    with pytest.raises(TypeError, match="numeric_column 'age': expected numbers, got dtype <U"):
        col.dense({"age": np.array(["x"])})
    with pytest.raises(KeyError, match="feature column 'age' not in the features; they have \\['agee'\\]"):
        col.dense({"agee": np.array([1.0])})


def test_bucketized_column_puts_each_value_in_its_interval(rng):
    bounds = [0.0, 1.0, 2.5]
    col = fc.bucketized_column(fc.numeric_column("x"), bounds)
    x = np.concatenate([rng.uniform(-1, 4, 50), bounds])
    expect = [sum(v >= b for b in bounds) for v in x]  # interval [b_i, b_i+1)
    assert col.ids({"x": x}).tolist() == expect
    assert col.num_buckets == 4
    with pytest.raises(ValueError, match="strictly increasing"):
        fc.bucketized_column(fc.numeric_column("x"), [1, 0])


def test_vocabulary_column_maps_known_values_and_hashes_unknown_ones():
    col = fc.categorical_column_with_vocabulary_list("dept", ["math", "cs", "bio"], num_oov_buckets=2)
    ids = col.ids({"dept": np.array(["cs", "bio", "art", "math", "art", "law"])})
    assert ids[[0, 1, 3]].tolist() == [1, 2, 0]
    assert ids[2] == ids[4] and 3 <= ids[2] < 5 and 3 <= ids[5] < 5
    assert col.num_buckets == 5


def test_hash_bucket_column_matches_blake2b_and_splitmix64():
    col = fc.categorical_column_with_hash_bucket("word", 1000)
    words = ["wide", "deep", "wide"]
    expect = [int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little") % 1000
              for w in words]
    assert col.ids({"word": np.array(words)}).tolist() == expect
    nums = np.array([3, 2**40])
    assert col.ids({"word": nums}).tolist() == (splitmix64(nums) % np.uint64(1000)).astype(int).tolist()
    with pytest.raises(TypeError, match="word: categorical values must be strings or integers, got dtype float64"):
        col.ids({"word": np.array([1.5])})


def test_crossed_column_hashes_the_combination():
    a = fc.categorical_column_with_vocabulary_list("a", ["x", "y"])
    b = fc.dynamic_categorical_column("b")
    col = fc.crossed_column([a, b], 10_007)
    feats = {"a": np.array(["x", "y", "x", "x"]), "b": np.array([5, 5, 6, 5])}
    h = np.full(4, 0x2545F4914F6CDD1D, dtype=np.int64)
    for ids in (a.ids(feats), b.ids(feats)):
        h = splitmix64(h ^ ids).view(np.int64)
    assert col.ids(feats).tolist() == (h.view(np.uint64) % np.uint64(10_007)).astype(int).tolist()
    got = col.ids(feats)
    assert got[0] == got[3] and len({got[0], got[1], got[2]}) == 3  # same pair, same id
    assert col.name == "a_X_b"


def test_dynamic_column_keys_raw_ids_into_a_growing_sparse_table():
    col = fc.dynamic_categorical_column("user")
    assert col.num_buckets is None
    users = np.array([2**62 + 1, 17, 2**62 + 1, -5])
    ids = col.ids({"user": users})
    assert ids[0] == ids[2] and len(set(ids.tolist())) == 3
    emb = fc.embedding_column(col, 4)
    table = ShardedSparseTable(2, emb.dimension)
    temp = sparse_table_pull(table, ids)
    assert temp.matrix.shape == (3, 4) and len(table) == 3
    with pytest.raises(ValueError, match="dynamic column has no fixed width"):
        fc.indicator_column(col)


def test_indicator_column_is_one_hot():
    col = fc.indicator_column(fc.bucketized_column(fc.numeric_column("x"), [0.0]))
    np.testing.assert_array_equal(col.dense({"x": np.array([-1.0, 2.0])}), [[1, 0], [0, 1]])


@pytest.mark.parametrize("n, buckets", [(1000, 10_000), (5000, 10_000), (2000, 1000)])
def test_collision_rate_follows_the_birthday_formula(n, buckets):
    expected = 1 - (1 - 1 / buckets) ** (n - 1)  # P(another of the n-1 values lands in my bucket)
    assert abs(fc.collision_rate(n, buckets) - expected) < 0.03


def test_expected_collision_rate_is_exact_on_every_assignment_of_a_small_table():
    """Enumerate all m^n ways n values can land in m buckets: the mean and variance are exact."""
    import itertools

    for n, m in [(2, 3), (3, 4), (4, 3), (5, 5)]:
        fractions = []
        for buckets in itertools.product(range(m), repeat=n):
            counts = np.bincount(buckets, minlength=m)
            fractions.append(np.mean(counts[list(buckets)] > 1))
        mean, sd = fc.expected_collision_rate(n, m)
        assert mean == pytest.approx(np.mean(fractions), rel=1e-12)
        assert sd == pytest.approx(np.std(fractions), rel=1e-9)


@pytest.mark.parametrize("n, buckets, seeds", [(1000, 100_000, 1500), (2000, 1000, 200)])
def test_expected_collision_rate_is_the_mean_and_spread_of_the_measurement(n, buckets, seeds):
    """The birthday formula is the mean of ``collision_rate`` over hash draws, not a bound on
    one draw: one draw at n = 1000, m = 100,000 counts about five colliding pairs, and its
    fraction scatters by the predicted standard deviation."""
    rates = np.array([fc.collision_rate(n, buckets, seed=s) for s in range(seeds)])
    mean, sd = fc.expected_collision_rate(n, buckets)
    assert abs(rates.mean() - mean) < 4 * sd / np.sqrt(seeds)
    assert rates.std() == pytest.approx(sd, rel=0.12)


def test_committed_collision_rates_lie_within_the_spread_of_one_draw():
    import json
    from pathlib import Path

    ps = json.loads((Path(__file__).resolve().parents[1] / "docs/assets/bench/ps.json").read_text())
    for row in ps["collisions"]:
        mean, sd = fc.expected_collision_rate(row["values"], row["buckets"])
        assert row["birthday_formula"] == pytest.approx(mean, rel=1e-12)
        assert abs(row["measured"] - mean) < 3 * sd, (row, sd)


def test_cross_hash_is_ordered_unsigned_and_rejects_bad_columns():
    a, b = np.array([3, 5, 7, -1]), np.array([5, 3, 7, 2**62])
    h = fc.cross_hash([a, b])
    assert h.dtype == np.int64 and h[0] != h[1] and h[2] != 0
    # uint64 input is the same 64 bits as its int64 view
    np.testing.assert_array_equal(fc.cross_hash([a.view(np.uint64), b]), h)
    # unsigned reduction: a negative hash gets the bucket of its unsigned value, as Python ints compute it
    buckets = fc.hash_to_bucket(h, 1_000_003)
    assert buckets.tolist() == [(int(v) % 2**64) % 1_000_003 for v in h]
    with pytest.raises(ValueError, match="at least two columns"):
        fc.cross_hash([a])
    with pytest.raises(ValueError, match="column 1 has 3 rows"):
        fc.cross_hash([a, b[:3]])
    with pytest.raises(ValueError, match="column 0 must be a 1-D integer array, got float64"):
        fc.cross_hash([a.astype(float), b])


def test_the_feature_columns_page_explains_the_committed_draw():
    """The figures of "One draw against the formula" on concepts/feature-columns.md, recomputed."""
    import json
    import math

    from page_tools import DOCS, assert_pages_quote

    ps = json.loads((DOCS / "assets/bench/ps.json").read_text(encoding="utf-8"))
    rows = {r["values"]: r for r in ps["collisions"]}
    first = rows[1000]
    n, m = first["values"], first["buckets"]
    mean, sd = fc.expected_collision_rate(n, m)
    colliding = round(first["measured"] * n)
    seeds = np.array([fc.collision_rate(n, m, seed=s) for s in range(4000)])
    at_most = np.mean(seeds <= first["measured"] + 1e-12)
    later = max(abs(r["measured"] - r["birthday_formula"]) for k, r in rows.items() if k >= 5000)
    assert later < 0.003
    any_pair = 1 - math.prod(1 - k / m for k in range(n))
    assert_pages_quote((DOCS / "concepts/feature-columns.md", s) for s in [
        f"/m \\approx {math.comb(n, 2) / m:.0f}$ colliding pairs on average (about {mean * n:.0f} of the "
        f"1,000 values, {first['birthday_formula']:.4f}), and a draw with {colliding // 2} pairs "
        f"({colliding} values, {first['measured']:.4f})",
        f"the standard deviation of one draw, {sd:.4f} here, and the measurement lies "
        f"{abs(first['measured'] - mean) / sd:.1f} of them below the mean",
        f"Over 4,000 seeds the measured fraction averages {seeds.mean():.4f}, and one seed in "
        f"{'eight' if round(1 / at_most) == 8 else round(1 / at_most)} gives {first['measured']:.4f} or less",
        "measured and expected agree to within 0.003",
        f"{any_pair:.2f} at $n = 1{{,}}000$, although only {mean:.0%} of the values are involved",
    ])
