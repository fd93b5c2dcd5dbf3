"""Where a benchmark writes: ``bench-results/NAME.json`` by default, the site's data only with ``--publish``.

A quick run by hand must never replace the committed ``docs/assets/bench/NAME.json`` that the
site plots; ``make bench`` passes ``--publish`` to do exactly that. The runs here use the
cheapest benchmark (``determinism`` with one step and one sum: well under a second of work).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import BENCHMARKS
from benchmarks.__main__ import main as bench_main
from benchmarks.harness import BLAS_THREAD_VARS, bench_parser, results_json, site_json

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["determinism", "--steps", "1", "--sums", "1"]


def bench(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # importable from any cwd, installed or not
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


def snapshot(path: Path) -> tuple[bytes, int] | None:
    return (path.read_bytes(), path.stat().st_mtime_ns) if path.exists() else None


def test_site_file_is_the_checkouts_docs_assets_bench():
    assert site_json("determinism") == ROOT / "docs" / "assets" / "bench" / "determinism.json"
    assert results_json("determinism") == Path("bench-results") / "determinism.json"


def test_a_plain_run_writes_bench_results_in_its_cwd_and_leaves_the_site_data_alone(tmp_path):
    site = ROOT / "docs" / "assets" / "bench" / "determinism.json"
    before = snapshot(site)
    run = bench(QUICK, tmp_path)
    assert run.returncode == 0, run.stderr
    out = tmp_path / "bench-results" / "determinism.json"
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "determinism" and doc["settings"]["steps"] == 1
    assert "wrote bench-results/determinism.json" in run.stdout
    assert snapshot(site) == before  # same bytes, same mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-results"]  # nothing else written here


def test_out_still_chooses_any_file(tmp_path):
    run = bench([*QUICK, "--out", "sub/mine.json"], tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "sub" / "mine.json").read_text())["benchmark"] == "determinism"
    assert not (tmp_path / "bench-results").exists()


def test_out_and_publish_together_are_refused(tmp_path):
    site = ROOT / "docs" / "assets" / "bench" / "determinism.json"
    before = snapshot(site)
    run = bench([*QUICK, "--out", "x.json", "--publish"], tmp_path)
    assert run.returncode == 2
    assert "--publish" in run.stderr and "not allowed with" in run.stderr
    assert list(tmp_path.iterdir()) == [] and snapshot(site) == before


def test_parsed_destinations(tmp_path, monkeypatch):
    """What each command line resolves to, without running (so the site's file is never written)."""
    monkeypatch.chdir(tmp_path)  # --publish must not depend on the cwd
    parser = lambda: bench_parser("determinism", "doc\n")  # noqa: E731
    assert parser().parse_args([]).out == Path("bench-results/determinism.json")
    published = parser().parse_args(["--publish"]).out
    assert published.is_absolute() and published == ROOT / "docs/assets/bench/determinism.json"
    assert parser().parse_args(["--out", "a/b.json"]).out == Path("a/b.json")
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--publish", "--out", "a/b.json"])
    assert exc.value.code == 2


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_documents_both_destinations_in_its_help(name, capsys, monkeypatch):
    """No benchmark bypasses the shared parser (``cluster`` included): each help names both files."""
    monkeypatch.setenv("COLUMNS", "200")
    for var in BLAS_THREAD_VARS:  # so a benchmark that restarts itself for BLAS never execs here
        monkeypatch.setenv(var, "1")
    with pytest.raises(SystemExit) as exc:
        bench_main([name, "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--publish" in text and "--out PATH" in text
    assert f"default: bench-results/{name}.json" in text
    assert str(site_json(name)) in text
