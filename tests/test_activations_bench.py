"""The ``activations`` section of ``python -m benchmarks model_parallel``, its figure, and the pages that quote it.

No timing is asserted. We check that

* the bytes each rank sends per layer, counted on thread ranks, equal
  ``tensor_parallel_model.layer_comm_bytes`` for every mode on 1, 2 and 4 ranks, and that the
  modes relate as the paper says: sequence parallelism sends tensor parallelism's bytes
  forward, and backward too when the gathered inputs are kept; Megatron's re-gather adds half
  again backward;
* a small run of the whole section (2 MPI processes, one timed repeat) gives the rows the
  plotter reads: each process's ``tracemalloc`` measurement within 2 % of the closed form
  ``sequence_parallel.activation_bytes``, the arrays' own bytes equal to it exactly, the paper's
  formula recomputed, fractions of one rank's that follow from the rows;
* the committed ``docs/assets/bench/model_parallel.json`` says the same of its own rows, the
  plotter draws its figure and refuses a broken section;
* the concept page and the question pages L04 and L05 quote the committed figures
  (``page_tools.assert_pages_quote``: re-running the benchmark says which sentences to update).
"""
from __future__ import annotations

import copy
import json
import math  # imported before docs/hooks, which holds a math.py, goes on sys.path
import statistics  # noqa: F401  (the plotter's import; likewise)
import sys
from pathlib import Path

import pytest
from page_tools import assert_pages_quote

from benchmarks import model_parallel as mp
from reference_impl.parallel import sequence_parallel as sqp

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BENCH = DOCS / "assets" / "bench" / "model_parallel.json"
PAGE = DOCS / "concepts" / "tensor-and-sequence-parallelism.md"

pytestmark = pytest.mark.timeout(120)


def plotter():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import plot_model_parallel
    finally:
        sys.path.pop(0)
    return plot_model_parallel


def committed() -> dict:
    return json.loads(BENCH.read_text(encoding="utf-8"))


def check_memory_rows(section: dict, processes: int, tolerance: float) -> None:
    """What must hold of any measured ``memory`` list, whatever machine ran it."""
    config = mp.act_config()
    rows = {(e["mode"], e["ranks"]): e for e in section["memory"]}
    ranks = sorted({t for _, t in rows})
    assert set(rows) == {(m, t) for m, _, _ in mp.ACT_MODES for t in ranks}
    for (mode, t), e in rows.items():
        sp, keep = next((s, k) for m, s, k in mp.ACT_MODES if m == mode)
        closed = sqp.activation_bytes(config, mp.ACT_BATCH, mp.ACT_SEQ, t, sp, 4, keep)
        assert e["closed_form"] == closed
        assert len(e["measured_per_process"]) == len(e["counted_per_process"]) == processes
        assert all(c == closed["total"] for c in e["counted_per_process"]), (mode, t)  # the arrays, exactly
        # tracemalloc also sees the Python objects around the arrays: a little more, never less
        assert all(closed["total"] <= m <= (1 + tolerance) * closed["total"] for m in e["measured_per_process"])
        assert e["measured_max"] == max(e["measured_per_process"])
        one = rows[(mode, 1)]
        assert e["fraction_of_one_rank"] == pytest.approx(e["measured_max"] / one["measured_max"])
        if keep:
            assert e["paper_bytes"] is None and e["paper_fraction_of_one_rank"] is None
        else:
            paper = sqp.paper_activation_bytes(mp.ACT_SEQ, mp.ACT_BATCH, config.n_embd, config.n_head, t, sp)
            assert e["paper_bytes"] == pytest.approx(paper)
            assert e["paper_fraction_of_one_rank"] == pytest.approx(paper / one["paper_bytes"])
    for t in ranks:  # sequence parallelism keeps least, tensor parallelism alone most
        if t > 1:
            assert rows[("TP+SP", t)]["measured_max"] < rows[("TP+SP keep", t)]["measured_max"] \
                < rows[("TP", t)]["measured_max"]


def check_bytes_rows(rows: list[dict], ranks: tuple[int, ...]) -> None:
    by = {(r["mode"], r["ranks"]): r for r in rows}
    assert set(by) == {(m, t) for m, _, _ in mp.ACT_MODES for t in ranks}
    assert all(r["exact"] for r in rows)
    for t in ranks:
        tp, sp, keep = (by[(m, t)]["closed_form"] for m in ("TP", "TP+SP", "TP+SP keep"))
        assert sp["forward"] == tp["forward"] and keep == tp
        assert 2 * sp["backward"] == 3 * tp["backward"]  # two more all-gathers: (4 + 2) halves against 4
        for r in by[("TP", t)]["measured"]:
            assert r["forward"] == 4 * (t - 1) * mp.ACT_BATCH * mp.ACT_SEQ * mp.act_config().n_embd * 4 // t


def test_bytes_per_layer_equal_the_closed_form_in_every_mode():
    rows = mp.activation_bytes_sent((1, 2, 4))
    check_bytes_rows(rows, (1, 2, 4))
    for r in rows:
        assert len(r["measured"]) == r["ranks"]
        assert all(s == {"forward": r["closed_form"]["forward"], "backward": r["closed_form"]["backward"]}
                   for s in r["measured"])


def test_a_small_run_has_the_rows_the_plotter_reads(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the mpiexec workers import benchmarks from here
    section = mp.activations_section(timeout=100, repeats=1, warmup=1, processes=2, time_ranks=2)
    assert "MPICH" in section["mpi_library"] or "Open MPI" in section["mpi_library"]
    check_memory_rows(section, processes=2, tolerance=0.02)
    assert sorted({e["ranks"] for e in section["memory"]}) == [1, 2]
    check_bytes_rows(section["bytes"], (1, 2))
    times = section["time"]["results"]
    assert [r["config"]["n_embd"] for r in times] == [64, 256]
    assert all(set(r["median_s"]) == {m for m, _, _ in mp.ACT_MODES} and r["relative_to_tp"]["TP"] == 1.0
               for r in times)
    data = {"benchmark": "model_parallel", "activations": section,
            "machine": {"cpu": "test", "cores": 2, "mpi_library": section["mpi_library"], "date": "2026-01-01"}}
    figures, _ = plotter().plot(tmp_path / "model_parallel.json", json.loads(json.dumps(data)))
    assert list(figures) == ["activations"] and figures["activations"].startswith(b"<?xml")


def test_the_committed_section_holds_and_the_plotter_draws_it(tmp_path):
    data = committed()
    section = data["activations"]
    check_memory_rows(section, processes=section["processes"], tolerance=0.02)
    check_bytes_rows(section["bytes"], tuple(sorted({r["ranks"] for r in section["bytes"]})))
    figures, _ = plotter().plot(BENCH, data)
    assert b"<svg" in figures["activations"]
    broken = copy.deepcopy(data)
    del broken["activations"]["memory"][0]["measured_max"]
    with pytest.raises(Exception, match="activations.memory"):
        plotter().plot(tmp_path / "model_parallel.json", broken)


def _n(value: int) -> str:
    return f"{value:,}".replace(",", " ")


def cited_figures() -> list[tuple[Path, str]]:
    """(page, text it must contain), formatted from the committed ``activations`` section."""
    section = committed()["activations"]
    mem = {(e["mode"], e["ranks"]): e for e in section["memory"]}
    sent = {(r["mode"], r["ranks"]): r["closed_form"] for r in section["bytes"] if r["exact"]}
    tp4, sp4, keep4, one = mem[("TP", 4)], mem[("TP+SP", 4)], mem[("TP+SP keep", 4)], mem[("TP", 1)]
    fwd, bwd_tp, bwd_sp = sent[("TP", 4)]["forward"], sent[("TP", 4)]["backward"], sent[("TP+SP", 4)]["backward"]
    worst = max(e["measured_over_closed_form"] for e in section["memory"]) - 1
    small, wide = section["time"]["results"]
    mib = lambda e: f"{e['measured_max'] / 2**20:.2f} MiB"  # noqa: E731
    l04, l05 = DOCS / "questions" / "l04.md", DOCS / "questions" / "l05.md"
    return [
        (PAGE, f"On 4 ranks each rank sent {_n(fwd)} bytes forward in all three modes, and {_n(bwd_tp)} bytes "
               f"backward under tensor parallelism and with the gathered inputs kept, {_n(bwd_sp)} with "
               "Megatron's default"),
        (PAGE, f"On 4 ranks, tensor parallelism alone kept {_n(tp4['measured_max'])} bytes per rank, "
               f"{tp4['fraction_of_one_rank']:.3f} of the {_n(one['measured_max'])} bytes one rank keeps alone, "
               f"while sequence parallelism kept {_n(sp4['measured_max'])} bytes, {sp4['fraction_of_one_rank']:.3f} "
               "of it"),
        (PAGE, f"that the paper's formula promises, {sp4['paper_fraction_of_one_rank']:.3f}."),
        (PAGE, f"Keeping the gathered inputs sits between, at {_n(keep4['measured_max'])} bytes."),
        (PAGE, f"Every measurement is within {math.ceil(worst * 1000) / 10:.1f} % of the closed form"),
        (PAGE, f"agree: {tp4['fraction_of_one_rank']:.3f} against {tp4['paper_fraction_of_one_rank']:.3f} for "
               "tensor parallelism"),
        (PAGE, f"tensor parallelism alone keeps {mib(one)} on one rank and {mib(tp4)} on each of 4, sequence "
               f"parallelism {mib(sp4)}, sequence parallelism keeping the gathered inputs {mib(keep4)}"),
        (PAGE, f"{tp4['fraction_of_one_rank']:.3f} measured and {tp4['paper_fraction_of_one_rank']:.3f} by the paper "
               f"for tensor parallelism at t = 4, {sp4['fraction_of_one_rank']:.3f} and "
               f"{sp4['paper_fraction_of_one_rank']:.3f} with sequence parallelism"),
        (PAGE, f"took {small['relative_to_tp']['TP+SP']:.2f} times as long with sequence parallelism as with tensor "
               f"parallelism alone on the {small['config']['n_embd']}-wide layer and "
               f"{wide['relative_to_tp']['TP+SP']:.2f} times on a {wide['config']['n_embd']}-wide layer with "
               f"{wide['seq']} tokens per sequence; keeping the gathered inputs, "
               f"{small['relative_to_tp']['TP+SP keep']:.2f} and {wide['relative_to_tp']['TP+SP keep']:.2f} times"),
        (PAGE, f"Counted here: {_n(fwd)} bytes per rank forward on 4 ranks in both"),
        (PAGE, f"sublayer backward, {_n(bwd_sp)} bytes against {_n(bwd_tp)}"),
        (l04, f"{_n(fwd)} bytes per rank forward and {_n(bwd_tp)} backward, the closed form exactly"),
        (l05, f"4 ranks: {_n(tp4['measured_max'])} bytes kept per rank under tensor parallelism and "
              f"{_n(sp4['measured_max'])} with sequence parallelism, {tp4['fraction_of_one_rank']:.3f} and "
              f"{sp4['fraction_of_one_rank']:.3f} of what one rank keeps alone; the paper's formula gives "
              f"{tp4['paper_fraction_of_one_rank']:.3f} and {sp4['paper_fraction_of_one_rank']:.3f}"),
        (l05, f"{_n(fwd)} forward in both; backward {_n(bwd_tp)} under tensor parallelism and {_n(bwd_sp)} with "
              "sequence parallelism as Megatron runs it"),
    ]


def test_pages_quote_the_committed_figures():
    assert_pages_quote(cited_figures())
