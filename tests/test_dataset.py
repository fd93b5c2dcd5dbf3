"""Input pipelines: sources, map/batch/shuffle/repeat/prefetch, sharding, and the heterogeneous-record parser."""
import json
import threading
import time

import numpy as np
import pytest

from reference_impl.train import Dataset, Field, RecordParser

pytestmark = pytest.mark.timeout(60)

SCHEMA = [Field("id", "int"), Field("price", "float"), Field("active", "bool"), Field("name", "str"),
          Field("scores", "floats", required=False, default=[])]


def write_jsonl(path, ids):
    path.write_text("".join(json.dumps({"id": i, "price": i * 0.5, "active": i % 2 == 0, "name": f"n{i}",
                                        "scores": [i, i + 1.5]}) + "\n" for i in ids))
    return path


def test_from_arrays_map_batch_and_remainder():
    x, y = np.arange(10.0).reshape(5, 2), np.arange(5)
    batches = list(Dataset.from_arrays(x, y).map(lambda e: (e[0] * 2, e[1])).batch(2))
    assert [b[0].shape for b in batches] == [(2, 2), (2, 2), (1, 2)]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x * 2)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y)
    assert len(list(Dataset.from_arrays(x).batch(2, drop_remainder=True))) == 2
    with pytest.raises(ValueError, match="share their first dimension"):
        Dataset.from_arrays(x, np.arange(4))


def test_shuffle_is_a_permutation_reseeded_each_pass_and_bounded_by_its_buffer():
    ds = Dataset.from_arrays(np.arange(200)).shuffle(buffer_size=10, seed=3)
    first, second = [int(v) for v in ds], [int(v) for v in ds]
    assert sorted(first) == sorted(second) == list(range(200))
    assert first != list(range(200)) and first != second
    # With a buffer of 10, element k cannot be emitted before position k - 10.
    assert all(pos >= v - 10 for pos, v in enumerate(first))
    assert [int(v) for v in Dataset.from_arrays(np.arange(200)).shuffle(10, seed=3)] == first  # seeded


def test_repeat_take_and_empty_repeat():
    assert [int(v) for v in Dataset.from_arrays(np.arange(3)).repeat(2)] == [0, 1, 2, 0, 1, 2]
    assert [int(v) for v in Dataset.from_arrays(np.arange(3)).repeat().take(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert list(Dataset.from_arrays(np.arange(3)).filter(lambda v: v > 5).repeat()) == []


def test_prefetch_runs_the_producer_on_another_thread_and_overlaps_it():
    producers = set()

    def slow(v):
        producers.add(threading.current_thread().name)
        time.sleep(0.02)
        return v

    ds = Dataset.from_arrays(np.arange(20)).map(slow).prefetch(4)
    start = time.perf_counter()
    out = []
    for v in ds:
        time.sleep(0.02)  # the "training step"
        out.append(int(v))
    elapsed = time.perf_counter() - start
    assert out == list(range(20)) and producers == {"prefetch"}
    assert elapsed < 0.7  # serial: 20 * (0.02 + 0.02) = 0.8 s; overlapped: about 0.42 s


def test_prefetch_raises_the_producers_error_and_stops_when_abandoned():
    def boom(v):
        if v == 3:
            raise ValueError("bad element 3")
        return v

    with pytest.raises(RuntimeError, match="input pipeline failed: bad element 3"):
        list(Dataset.from_arrays(np.arange(10)).map(boom).prefetch(2))
    before = threading.active_count()
    it = iter(Dataset.from_arrays(np.arange(10**6)).prefetch(2))
    next(it)
    it.close()
    time.sleep(0.3)
    assert threading.active_count() <= before


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_record_level_shard_sees_every_record_exactly_once(tmp_path, workers):
    files = [write_jsonl(tmp_path / f"part{k}.jsonl", range(k * 7, k * 7 + 7)) for k in range(3)]
    parser = RecordParser(SCHEMA, tmp_path / "rejects.jsonl")
    seen = [r["id"] for w in range(workers) for r in Dataset.from_jsonl(files, parser).shard(workers, w)]
    assert sorted(seen) == list(range(21))


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_file_level_shard_gives_whole_files_and_every_record_once(tmp_path, workers):
    files = [write_jsonl(tmp_path / f"part{k}.jsonl", range(k * 5, k * 5 + 5)) for k in range(4)]
    parser = RecordParser(SCHEMA, tmp_path / "rejects.jsonl")
    per_worker = []
    for w in range(workers):
        ds = Dataset.from_jsonl(files, parser).shard(workers, w, level="file")
        assert ds.files == tuple(files[w::workers])
        per_worker.append([r["id"] for r in ds.shuffle(3, seed=w)])
    assert sorted(sum(per_worker, [])) == list(range(20))
    for ids in per_worker:  # whole files: each worker's ids come in blocks of 5 from one file
        assert len({i // 5 for i in ids}) * 5 == len(ids)


def test_file_level_shard_errors(tmp_path):
    files = [write_jsonl(tmp_path / f"p{k}.jsonl", [k]) for k in range(2)]
    parser = RecordParser(SCHEMA, tmp_path / "rejects.jsonl")
    with pytest.raises(ValueError, match="2 files cannot be split over 3 workers"):
        Dataset.from_jsonl(files, parser).shard(3, 0, level="file")
    with pytest.raises(ValueError, match="must come right after from_csv/from_jsonl"):
        Dataset.from_jsonl(files, parser).map(dict).shard(2, 0, level="file")
    with pytest.raises(ValueError, match="worker index 2 is outside 0..1"):
        Dataset.from_arrays(np.arange(3)).shard(2, 2)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        Dataset.from_jsonl([tmp_path / "nope.jsonl"], parser)


BROKEN_CSV = "\n".join([
    'id,price,active,name,scores',
    '1,2.5,true,apple,1;2',
    '2,3.0,no,"pear, green",',
    'x3,1.0,true,plum,1',
    '4,abc,true,kiwi,1',
    '5,1.0,maybe,fig,1',
    '6,1.0,true',
    '7,1.0,true,lime,1,extra',
    '',
    '8,nan,false,date,1',
    '9,1.0,1,"unclosed,1',
    '10,1.0,0,ok,1;two',
    ',1.0,0,noid,1',
    '11,-4e3,YES,"quoted ""name""",0.5',
    '',
])


def test_broken_csv_lines_go_to_the_reject_file_with_reasons_and_the_counts_add_up(tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes(BROKEN_CSV.encode() + b"12,1.0,true,caf\xe9,1\n13,1.0,false,end,\n")
    rejects = tmp_path / "rejects.jsonl"
    parser = RecordParser(SCHEMA, rejects)
    records = list(Dataset.from_csv([path], parser))
    assert [r["id"] for r in records] == [1, 2, 11, 13]
    assert records[0] == {"id": 1, "price": 2.5, "active": True, "name": "apple", "scores": [1.0, 2.0]}
    assert records[1]["name"] == "pear, green" and records[1]["scores"] == [] and records[1]["active"] is False
    assert records[2] == {"id": 11, "price": -4000.0, "active": True, "name": 'quoted "name"', "scores": [0.5]}
    s = parser.stats
    assert (s.lines, s.parsed, s.rejected, s.blank) == (15, 4, 10, 1) and s.balanced()
    lines = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert len(lines) == s.rejected == sum(s.by_reason.values())
    reasons = {entry["line"]: entry["reason"] for entry in lines}
    assert reasons[4] == "field 'id': cannot convert 'x3' to int"
    assert reasons[5] == "field 'price': cannot convert 'abc' to float"
    assert reasons[6] == "field 'active': cannot convert 'maybe' to bool"
    assert reasons[7] == "expected 5 columns, got 3" and reasons[8] == "expected 5 columns, got 6"
    assert reasons[10] == "field 'price': 'nan' is not a finite number"
    assert reasons[11] == "malformed CSV: unexpected end of data"
    assert reasons[12] == "field 'scores': cannot convert 'two' to float"
    assert reasons[13] == "missing required field 'id'"
    assert reasons[15].startswith("not UTF-8")
    assert all(entry["file"] == str(path) for entry in lines)
    assert next(e for e in lines if e["line"] == 4)["raw"] == "x3,1.0,true,plum,1"


def test_broken_json_lines_and_a_fraction_limit(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"id": 1, "price": 1, "active": true, "name": "a"}\n'
                    '{"id": 2, "price": 1, "active": true, "name": "b"\n'
                    '[1, 2]\n'
                    '{"id": 3.5, "price": 1, "active": true, "name": "c"}\n'
                    '{"id": 4, "price": "1", "active": 1, "name": "d"}\n'
                    '{"id": 5, "price": 1, "active": true, "name": 5}\n'
                    '{"id": 6, "price": 1, "active": true, "name": "f", "colour": "red"}\n'
                    '{"id": true, "price": 1, "active": true, "name": "g"}\n'
                    '{"id": 9, "price": 1, "active": true, "name": "h", "scores": [1, "x"]}\n')
    parser = RecordParser(SCHEMA, tmp_path / "rejects.jsonl")
    assert [r["id"] for r in parser.parse_file(path, "jsonl")] == [1]
    assert (parser.stats.parsed, parser.stats.rejected) == (1, 8) and parser.stats.balanced()
    reasons = [json.loads(x)["reason"] for x in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert reasons[0].startswith("not valid JSON")
    assert reasons[1] == "expected a JSON object, got list"
    assert reasons[2] == "field 'id': 3.5 is not an integer"
    assert reasons[3] == "field 'active': cannot convert 1 to bool"
    assert reasons[4] == "field 'name': expected a string, got int 5"
    assert reasons[5] == "unexpected field(s) ['colour']"
    assert reasons[6] == "field 'id': expected int, got bool True"
    assert reasons[7] == "field 'scores': cannot convert 'x' to float"
    strict = RecordParser(SCHEMA, tmp_path / "rejects2.jsonl", max_reject_fraction=0.5)
    with pytest.raises(ValueError, match="8 of 9 lines rejected"):
        list(strict.parse_file(path, "jsonl"))


def test_csv_header_that_does_not_match_the_schema(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("id;price;active;name\n1;2;true;a\n")
    with pytest.raises(ValueError, match=r"d.csv: CSV header .* does not match the schema"):
        list(Dataset.from_csv([path], RecordParser(SCHEMA, tmp_path / "r.jsonl")))
