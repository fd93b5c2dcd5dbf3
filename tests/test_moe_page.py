"""The ``routing`` section of ``python -m benchmarks model_parallel``, and the MoE page's figures.

* the section runs ``moe.routing_sweep`` for every top-k, auxiliary coefficient, capacity
  factor and seed; each run's curves are its per-step values averaged over windows of
  ``every`` steps (recomputed here from a fresh sweep), the summary is the mean over the
  seeds (recomputed here), and no run drops fewer assignments than capacity allows
  (``1 - E * capacity / (T k)``, counted per step); the plotter draws both routing figures
  and a table that states the summary;
* every measured figure that docs/concepts/moe-and-alltoall.md and docs/questions/l07.md quote
  is formatted here from the committed docs/assets/bench/model_parallel.json (sections
  ``routing`` and ``alltoall``), and claims such as "our Bruck lost to our pairwise at every
  size" are checked against its rows;
* the page's two Python checks print what the page says they print (the cost-model crossover
  of Bruck and pairwise, and the all-to-all against expert compute table), and the share of
  spaces in the corpus is what the page states.
"""
from __future__ import annotations

import contextlib
import io
import json
import math  # noqa: F401  (imported before docs/hooks, which holds a math.py, goes on sys.path)
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
from page_tools import DOCS, assert_pages_quote

from benchmarks import model_parallel as mp
from reference_impl.parallel import corpus, moe

ROOT = Path(__file__).resolve().parents[1]
PAGE = DOCS / "concepts" / "moe-and-alltoall.md"
QUESTION = DOCS / "questions" / "l07.md"

pytestmark = pytest.mark.timeout(120)


def plotter():
    sys.path.append(str(ROOT / "docs" / "hooks"))
    try:
        import plot_model_parallel
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    return plot_model_parallel


# --------------------------------------------------------------------------- the benchmark section


@pytest.fixture(scope="module")
def small_section() -> dict:
    return mp.routing_section(steps=30, seeds=2, every=10)


def test_the_section_keeps_every_run_with_its_curves(small_section):
    runs = small_section["runs"]
    settings = [(k, a, cf, seed) for k in mp.ROUTING_TOP_K for seed in range(2) for a in mp.ROUTING_AUX
                for cf in mp.ROUTING_CAPACITY]
    assert sorted((r["top_k"], r["aux_loss_coeff"], r["capacity_factor"], r["seed"]) for r in runs) == sorted(settings)
    # one fresh sweep: the curves are window means of its per-step values
    fresh = moe.routing_sweep(mp.ROUTING_CAPACITY, mp.ROUTING_AUX, top_k=2, steps=30, seed=1)
    for row in fresh:
        kept = next(r for r in runs if (r["top_k"], r["aux_loss_coeff"], r["capacity_factor"], r["seed"])
                    == (2, row["aux_loss_coeff"], row["capacity_factor"], 1))
        assert kept["step"] == [10, 20, 30]
        for key in mp.ROUTING_CURVES:
            assert kept[key] == pytest.approx([np.mean(row[key][i:i + 10]) for i in (0, 10, 20)])
        assert kept["dropped_last"] == row["dropped_last"] and kept["tokens_per_expert"] == row["tokens_per_expert"]


def test_the_summary_is_the_mean_over_seeds(small_section):
    runs, summary = small_section["runs"], small_section["summary"]
    assert len(summary) == len(mp.ROUTING_TOP_K) * len(mp.ROUTING_AUX) * len(mp.ROUTING_CAPACITY)
    for entry in summary:
        same = [r for r in runs if (r["top_k"], r["aux_loss_coeff"], r["capacity_factor"])
                == (entry["top_k"], entry["aux_loss_coeff"], entry["capacity_factor"])]
        assert entry["seeds"] == len(same) == 2
        for key in ("max_load_last", "dropped_first", "loss_last"):
            values = [r[key] for r in same]
            assert entry[key] == pytest.approx(sum(values) / 2)
            assert entry[f"{key}_range"] == [min(values), max(values)]


def test_no_run_drops_fewer_than_capacity_forces(small_section):
    for r in small_section["runs"]:
        cfg = moe.MoEConfig(n_embd=16, n_experts=r["n_experts"], top_k=r["top_k"], capacity_factor=r["capacity_factor"])
        slots = r["n_experts"] * moe.expert_capacity(r["tokens"], cfg)
        floor = max(0.0, 1 - slots / (r["tokens"] * r["top_k"]))
        assert min(r["dropped"]) >= floor - 1e-12, (r["top_k"], r["capacity_factor"], min(r["dropped"]), floor)
        assert all(load >= 1.0 for load in r["max_load"])  # the busiest expert is at least the mean


def test_the_plotter_draws_the_routing_figures_and_table(small_section):
    doc = {"benchmark": "model_parallel", "routing": small_section,
           "machine": {"cpu": "test cpu", "cores": 2, "mpi_library": "none", "date": "2026-01-01T00:00:00+00:00",
                       "numpy": np.__version__}}
    figures, summary = plotter().plot(Path("model_parallel.json"), doc)
    assert set(figures) == {"routing", "routing-capacity"}
    assert all(b"<svg" in f[:1000] for f in figures.values())
    e = next(s for s in small_section["summary"] if (s["top_k"], s["aux_loss_coeff"], s["capacity_factor"]) == (1, 0.0, 1.25))
    assert f"{e['max_load_last']:.2f}× / {e['dropped_last'] * 100:.1f} %" in summary
    bad = {**doc, "routing": {**small_section, "runs": [{"top_k": 1}]}}
    with pytest.raises(Exception, match=r"routing\.runs\[0\]"):
        plotter().plot(Path("model_parallel.json"), bad)


def test_bad_routing_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        mp.main(["--routing-steps", "5", "--out", "/tmp/never-written-routing.json"])
    assert "--routing-steps must be >= 10" in capsys.readouterr().err


# --------------------------------------------------------------------------- the pages against the data


def _bench() -> dict:
    return json.loads((DOCS / "assets" / "bench" / "model_parallel.json").read_text(encoding="utf-8"))


def _pct(v: float) -> str:
    return f"{v * 100:.0f} %" if v >= 0.01 else f"{v * 100:.1f} %"


def page_quotes() -> list[tuple[Path, str]]:
    data = _bench()
    summary = {(e["top_k"], e["aux_loss_coeff"], e["capacity_factor"]): e for e in data["routing"]["summary"]}
    off, on = (lambda k, cf: summary[(k, 0.0, cf)]), (lambda k, cf: summary[(k, 0.01, cf)])
    a, b = off(1, 1.25), on(1, 1.25)
    spread = (min(a["loss_last_range"][0], b["loss_last_range"][0]), max(a["loss_last_range"][1], b["loss_last_range"][1]))
    loads = [e["max_load_last"] for e in summary.values()]
    cfs = sorted({cf for _, _, cf in summary})
    quotes = [
        (PAGE, f"the busiest expert got {a['max_load_last']:.2f} times the mean load at capacity factor 1.25, up "
               f"from {a['max_load_first']:.2f} at the start, and {a['dropped_last'] * 100:.1f} % of the assignments "
               f"were dropped."),
        (PAGE, f"With the loss the busiest expert stayed at {b['max_load_last']:.2f} times the mean and "
               f"{b['dropped_last'] * 100:.1f} % were dropped; at capacity factor 1, {off(1, 1.0)['dropped_last'] * 100:.1f} "
               f"% against {on(1, 1.0)['dropped_last'] * 100:.1f} %."),
        (PAGE, f"Top-2 starts more even and gains less: {off(2, 1.25)['dropped_last'] * 100:.1f} % dropped against "
               f"{on(2, 1.25)['dropped_last'] * 100:.1f} % at capacity factor 1.25."),
        (PAGE, f"({min(off(1, 0.5)['dropped_last'], on(1, 0.5)['dropped_last']) * 100:.1f} % at best for top-1, "
               f"{min(off(2, 0.5)['dropped_last'], on(2, 0.5)['dropped_last']) * 100:.1f} % for top-2)"),
        (PAGE, f"top-2 drops almost nothing with or without the loss ({off(2, 2.0)['dropped_last'] * 100:.1f} % "
               f"against {on(2, 2.0)['dropped_last'] * 100:.1f} %)"),
        (PAGE, f"({b['loss_last']:.3f} with it and {a['loss_last']:.3f} without, for top-1 at factor 1.25, while "
               f"the seeds alone spread it from {spread[0]:.3f} to {spread[1]:.3f})"),
        (PAGE, f"(in the sweep above it ended with {min(loads):.1f} to {max(loads):.1f} times the mean load)"),
        (PAGE, f"top-1 routing still had its busiest expert at {b['max_load_last']:.2f} times the mean and dropped "
               f"{b['dropped_last'] * 100:.1f} % of the assignments at capacity factor 1.25"),
        (PAGE, f"top-1 without the auxiliary loss climbs from about {a['max_load_first']:.1f} to "
               f"{a['max_load_last']:.1f}, top-1 with it stays near {b['max_load_last']:.1f}, top-2 stays near "
               f"{off(2, 1.25)['max_load_last']:.1f} without it and {on(2, 1.25)['max_load_last']:.1f} with it"),
        (PAGE, f"top-1 without the loss rises to {a['dropped_last'] * 100:.1f} %, with it {b['dropped_last'] * 100:.1f} %; "
               f"top-2 drops {off(2, 1.25)['dropped_last'] * 100:.1f} % without and "
               f"{on(2, 1.25)['dropped_last'] * 100:.1f} % with."),
        (PAGE, "Top-1 without the loss drops " + ", ".join(_pct(off(1, c)["dropped_last"]) for c in cfs[:-1])
               + f" and {_pct(off(1, cfs[-1])['dropped_last'])}; with it "
               + ", ".join(_pct(on(1, c)["dropped_last"]) for c in cfs[:-1]) + f" and {_pct(on(1, cfs[-1])['dropped_last'])}. "
               + "Top-2 without it " + ", ".join(_pct(off(2, c)["dropped_last"]) for c in cfs[:-1])
               + f" and {_pct(off(2, cfs[-1])['dropped_last'])}; with it "
               + ", ".join(_pct(on(2, c)["dropped_last"]) for c in cfs[:-1]) + f" and {_pct(on(2, cfs[-1])['dropped_last'])}."),
        (QUESTION, f"the busiest expert ended with {a['max_load_last']:.2f} times the mean load and "
                   f"{a['dropped_last'] * 100:.1f} % of the assignments were dropped without the load-balancing loss, "
                   f"against {b['max_load_last']:.2f} times and {b['dropped_last'] * 100:.1f} % with it"),
    ]

    section = data["alltoall"]
    large = {n: [r["ours_over_mpi"] for r in section["ratios"] if r["ranks"] == n and r["job"] == "main"
                 and r["op"] == "alltoall" and r["bytes"] >= 1 << 20] for n in (2, 4)}
    small = [r["ours_over_mpi"] for r in section["ratios"] if r["job"] == "main" and r["op"] == "alltoall"
             and r["bytes"] < 8 << 10]
    time = {(r["job"], r["ranks"], r["bytes"], r["impl"]): r["time_s"] for r in section["results"] if r["op"] == "alltoall"}
    forced = next(r for r in section["ratios"] if r["job"] == "forced:brucks" and r["ranks"] == 2
                  and r["op"] == "alltoall" and r["bytes"] == 64 << 20)
    quotes += [
        (PAGE, f"our best all-to-all ran at a median of {statistics.median(large[2]):.2f} of the library's busbw on 2 "
               f"ranks ({min(large[2]):.2f} to {max(large[2]):.2f}) and {statistics.median(large[4]):.2f} on 4 ranks "
               f"({min(large[4]):.2f} to {max(large[4]):.2f}, four processes on two cores)"),
        (PAGE, f"Below 8 KiB ours reaches {min(small):.2f} to {max(small):.2f} of the library; the ratio climbs with "
               f"size and from 1 MiB up it is {min(large[2]):.2f} to {max(large[2]):.2f} on 2 ranks and "
               f"{min(large[4]):.2f} to {max(large[4]):.2f} on 4."),
        (PAGE, f"at 8 B on 2 ranks ours took {time[('main', 2, 8, 'pairwise')] * 1e6:.1f} µs and MPI_Alltoall "
               f"{time[('main', 2, 8, 'mpi')] * 1e6:.1f} µs"),
        (PAGE, f"for 64 MiB it took {time[('main', 2, 64 << 20, 'bruck')] / time[('main', 2, 64 << 20, 'pairwise')]:.2f} "
               f"times as long on 2 ranks"),
        (PAGE, f"our pairwise ran {forced['pairwise_over_mpi']:.2f} times faster than it at 64 MiB on 2 ranks"),
        (QUESTION, f"a median of {statistics.median(large[2]):.2f} of its bus bandwidth on 2 ranks and "
                   f"{statistics.median(large[4]):.2f} on 4"),
    ]
    return quotes


def test_the_pages_quote_the_committed_results():
    assert_pages_quote(page_quotes())


def test_the_pages_claims_hold_on_the_committed_rows():
    section = _bench()["alltoall"]
    time = {(r["ranks"], r["bytes"], r["impl"]): r["time_s"] for r in section["results"]
            if r["op"] == "alltoall" and r["job"] == "main"}
    sizes = {(n, b) for n, b, _ in time}
    # "Our Bruck lost to our pairwise at every size here"
    assert all(time[(n, b, "bruck")] > time[(n, b, "pairwise")] for n, b in sizes)
    # "ours took 44.4 µs": the page's "ours" at 8 B is the faster of our two
    assert time[(2, 8, "pairwise")] < time[(2, 8, "bruck")]
    summary = _bench()["routing"]["summary"]
    # "Without the loss, top-1 routing collapses as it trains": the load rises at every capacity factor
    assert all(e["max_load_last"] > e["max_load_first"] for e in summary if e["top_k"] == 1 and e["aux_loss_coeff"] == 0)
    # the loss lowers the busiest expert's load and the drops for top-1 at every capacity factor
    by = {(e["top_k"], e["aux_loss_coeff"], e["capacity_factor"]): e for e in summary}
    for (k, alpha, cf), e in by.items():
        if k == 1 and alpha == 0:
            assert by[(1, 0.01, cf)]["max_load_last"] < e["max_load_last"]
            assert by[(1, 0.01, cf)]["dropped_last"] < e["dropped_last"]


# --------------------------------------------------------------------------- the page's own Python checks


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.M | re.S)


def _run(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(PAGE), "exec"), {"__name__": "__page__"})
    return out.getvalue()


def test_the_crossover_check_prints_what_the_page_says():
    code = next(c for c in _python_blocks(PAGE) if "bruck_alltoall_time" in c)
    printed = _run(code)
    kib = dict(re.findall(r"^(\d+) ranks: Bruck is faster below about (\d+) KiB", printed, flags=re.M))
    assert kib == {"8": "512", "64": "4096"}
    assert f"It prints {kib['8']} KiB for 8 ranks and {kib['64']} KiB for 64" in " ".join(PAGE.read_text().split())


def test_the_limits_table_is_what_its_check_prints():
    code = next(c for c in _python_blocks(PAGE) if "def layer_ms" in c)
    printed = re.findall(r"ep=\s*(\d+) F=\s*(\d+): all-to-all ([\d.]+) ms, experts ([\d.]+) ms, ratio ([\d.]+)",
                         _run(code))
    assert len(printed) == 5
    text = PAGE.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \([^)]*\) \| \$([^$]+)\$ \| ([\d.]+) ms \| ([\d.]+) ms \| ([\d.]+) \|$", text, flags=re.M)
    widths = {"4C": "16384", "C/2": "2048"}
    assert [(ep, widths[f], a2a, experts, ratio) for ep, f, a2a, experts, ratio in rows] == printed
    one_node, two_nodes = float(printed[0][2]), float(printed[1][2])
    assert f"the exchange takes {two_nodes / one_node:.1f} times as" in " ".join(text.split())
    assert round(float(printed[4][4])) == 3  # "three times as long as the experts compute"
    assert float(printed[0][4]) < 0.1  # "under a tenth of the experts' time"


def test_the_share_of_spaces_is_what_the_page_says():
    data = corpus.split()[0]
    share = float(np.mean(data == corpus.STOI[" "]))
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    assert f"spaces alone are {share * 100:.1f} % of the corpus, {share * 8:.2f} times an eighth" in text
