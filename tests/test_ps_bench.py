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


def test_the_parameter_server_page_quotes_the_committed_run():
    """The "Measured" section of concepts/parameter-servers.md says what ``ps.json`` says."""
    from pathlib import Path

    from page_tools import DOCS, assert_pages_quote

    ps = json.loads((DOCS / "assets/bench/ps.json").read_text(encoding="utf-8"))
    tra = {t["vocab_rows"]: t for t in ps["traffic"]}
    small, large = tra[min(tra)], tra[max(tra)]
    kib = lambda b: f"{b / 1024:.1f} KiB"  # noqa: E731
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    thr = {(t["batch"], t["table_rows_before"] > 0): t for t in ps["throughput"]}
    ratio = lambda batch, full: f"{thr[(batch, full)]['slowdown_vs_lower_bound']:.2f}×"  # noqa: E731
    span = lambda batch: "{} to {}".format(*sorted((ratio(batch, False), ratio(batch, True))))  # noqa: E731
    page = Path(DOCS / "concepts/parameter-servers.md")
    assert_pages_quote((page, s) for s in [
        f"{small['unique_ids_per_step']:.0f} per step with a {small['vocab_rows']}-row table, "
        f"{large['unique_ids_per_step']:.0f} with {large['vocab_rows']:,} rows",
        f"move about the same, {kib(small['ps_bytes_per_step'])} against {kib(small['mirrored_bytes_per_step'])}",
        f"sends {kib(large['ps_bytes_per_step'])} and the all-reduce {large['mirrored_bytes_per_step'] / 2**20:.1f} MiB, "
        f"{large['mirrored_bytes_per_step'] / large['ps_bytes_per_step']:.0f} times as much",
        f"({ms(tra[400]['mirrored_s_per_step'])} against {ms(tra[400]['ps_s_per_step'])} per step at 400 rows, "
        f"{ms(tra[4000]['mirrored_s_per_step'])} against {ms(tra[4000]['ps_s_per_step'])} at 4,000)",
        f"({ms(tra[40000]['mirrored_s_per_step'])} against {ms(tra[40000]['ps_s_per_step'])} at 40,000 rows, "
        f"{ms(tra[200000]['mirrored_s_per_step'])} against {ms(tra[200000]['ps_s_per_step'])} at 200,000)",
        f"{span(65536)} the lower bound's time at 65,536 ids per batch, {span(8192)} at 8,192, "
        f"and {ratio(1024, False)} (empty table) and {ratio(1024, True)} "
        f"({thr[(1024, True)]['table_rows_before']:,} rows) at 1,024",
        f"about {round(thr[(1024, False)]['unique_per_batch'], -1):.0f} unique ones",
    ])
    # the crossover the prose describes: the all-reduce is faster for the small tables only
    assert all(tra[r]["mirrored_s_per_step"] < tra[r]["ps_s_per_step"] for r in (400, 4000))
    assert all(tra[r]["mirrored_s_per_step"] > tra[r]["ps_s_per_step"] for r in (40000, 200000))


def test_a_summary_part_runs_to_the_next_part():
    """``<!-- bench:ps:summary:<part> -->`` shows one part of a plotter's summary (docs/hooks/bench_plots.py)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "hooks"))
    try:
        from bench_plots import summary_part
    finally:
        sys.path.pop(0)
    text = "<!-- part:a -->\n**A** table\n\n| x |\n\n<!-- part:b -->\n**B**\n"
    assert summary_part(text, "a") == "**A** table\n\n| x |\n"
    assert summary_part(text, "b") == "**B**\n"
    assert summary_part(text, "c") is None
