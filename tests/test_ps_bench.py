"""``python -m benchmarks ps --only throughput``: re-measures one part and keeps the rest."""
import json

import pytest

from benchmarks import ps as bench


def test_only_throughput_replaces_that_part_and_keeps_the_others(tmp_path):
    out = tmp_path / "ps.json"
    kept = {"benchmark": "ps", "machine": {"cpu": "earlier machine"}, "traffic": [{"vocab_rows": 7}],
            "throughput": [{"batch": -1}]}
    out.write_text(json.dumps(kept))
    assert bench.main(["--only", "throughput", "--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["traffic"] == kept["traffic"] and doc["machine"] == kept["machine"]
    rows = doc["throughput"]
    assert [(r["batch"], r["warm_draws"]) for r in rows] == [(4096, 0), (4096, 1_000_000)]
    assert rows[0]["table_rows_before"] == 0 and rows[1]["table_rows_before"] > 100_000
    for r in rows:
        assert r["table_rows_after"] > r["table_rows_before"]  # the timed batches created rows
        assert r["slowdown_vs_lower_bound"] == pytest.approx(
            r["median_s"]["sparse_table"] / r["median_s"]["numpy_lower_bound"])
    assert set(doc["section_machines"]) == {"throughput"}


def test_only_needs_an_existing_file(tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--only", "throughput", "--quick", "--out", str(tmp_path / "missing.json")])
