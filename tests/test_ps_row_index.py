"""The sparse table's id -> row index (two sorted runs) against a Python dict, on random and
adversarial ids, through many inserts that cross both merge thresholds."""
import numpy as np
import pytest

from reference_impl.ps import row_index
from reference_impl.ps.row_index import RowIndex

I64 = np.iinfo(np.int64)


def check_against(index: RowIndex, truth: dict[int, int], probes: np.ndarray, whole: bool = True) -> None:
    got = index.find(probes).tolist()
    assert got == [truth.get(k, -1) for k in probes.tolist()]
    if not whole:
        return
    keys, rows = index.items()
    assert keys.tolist() == sorted(truth) and rows.tolist() == [truth[k] for k in sorted(truth)]
    assert len(index) == len(truth)


def random_batches(rng):
    yield rng.integers(I64.min, I64.max, 5000, dtype=np.int64, endpoint=True)
    yield np.arange(4000, dtype=np.int64) * 8  # multiples of 8: a pattern that breaks id % n
    yield np.arange(1, 3000, dtype=np.int64) << 40  # only high bits vary
    yield np.array([I64.min, I64.max, -1, 0, 1], dtype=np.int64)  # the extremes
    yield -np.arange(1, 2500, dtype=np.int64)  # negative, descending: insert must sort
    for _ in range(60):  # many small batches: the recent run fills and merges into main again and again
        yield rng.integers(-10**6, 10**6, rng.integers(1, 200))


def test_find_and_insert_agree_with_a_dict_on_random_and_adversarial_ids(rng):
    index, truth = RowIndex(), {}
    merges = recent_used = flushes = 0
    for i, batch in enumerate(random_batches(rng)):
        main_before, recent_before = len(index.main_keys), len(index.recent_keys)
        recent_used += recent_before > 0
        new = np.array(sorted(set(batch.tolist()) - truth.keys()), dtype=np.int64)
        rng.shuffle(new)  # the public insert takes any order
        rows = np.arange(len(truth), len(truth) + len(new), dtype=np.int64)
        before = index.find(batch)
        assert all(b == truth.get(k, -1) for b, k in zip(before.tolist(), batch.tolist()))
        index.insert(new, rows)
        truth.update(zip(new.tolist(), rows.tolist()))
        merges += len(index.main_keys) > main_before
        flushes += len(index.recent_keys) < recent_before  # the recent run was merged into main
        probes = np.concatenate([batch, batch[::-1], rng.integers(I64.min, I64.max, 200, dtype=np.int64)])
        check_against(index, truth, probes, whole=i % 10 == 0)
    check_against(index, truth, np.array(list(truth), dtype=np.int64))
    assert merges >= 5 and recent_used >= 10 and flushes >= 1  # both runs used; recent merged into main
    assert len(index.recent_keys) <= max(row_index.MIN_RECENT,
                                         row_index.RECENT_FACTOR * int(np.sqrt(len(index.main_keys))) + 1)


def test_an_empty_index_finds_nothing_and_handles_empty_batches():
    index = RowIndex()
    assert index.find(np.array([0, I64.min, I64.max], dtype=np.int64)).tolist() == [-1, -1, -1]
    index.insert(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert len(index) == 0 and index.find(np.zeros(0, dtype=np.int64)).shape == (0,)


@pytest.mark.parametrize("limit", [1, 4])
def test_runs_stay_sorted_and_disjoint_whatever_the_merge_limit(rng, monkeypatch, limit):
    monkeypatch.setattr(row_index, "MIN_RECENT", limit)
    monkeypatch.setattr(row_index, "RECENT_FACTOR", limit)
    monkeypatch.setattr(row_index, "SMALL_MAIN", 0)  # use the recent run from the first insert
    index, truth = RowIndex(), {}
    used_recent = False
    for _ in range(40):
        new = np.array(sorted(set(rng.integers(-500, 500, 30).tolist()) - truth.keys()), dtype=np.int64)
        index.insert_sorted(new, np.arange(len(truth), len(truth) + len(new)))
        truth.update(zip(new.tolist(), range(len(truth), len(truth) + len(new))))
        for run in (index.main_keys, index.recent_keys):
            assert np.all(run[1:] > run[:-1])
        assert not set(index.main_keys.tolist()) & set(index.recent_keys.tolist())
        used_recent |= len(index.recent_keys) > 0
    assert used_recent
    check_against(index, truth, np.arange(-600, 600))
