"""The optimisers and training_loop benchmarks run end to end in quick mode, and their plotters read the results.

No timing is asserted (figures come from ``make bench``). We check what the figures rest
on: the parallel map returns ``map``'s elements in order while running calls at once; the
ideal rates are the formulas the page states; the chosen learning rate is the grid's best;
the optimiser state read back from the session is the slot count times 4 bytes; resuming
halfway with the input fast-forwarded is bit-identical and without it is not; the plotters
draw the committed files and refuse broken ones with a message naming what is wrong.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from page_tools import assert_pages_quote
from conftest import ROOT

pytestmark = pytest.mark.timeout(120)

SLOTS = {"SGD": 0, "Momentum": 1, "Nesterov": 1, "Adagrad": 1, "RMSProp": 2, "Adam": 2, "AdamW": 2, "FTRL": 2}


def _plotter(name: str):
    sys.path.append(str(ROOT / "docs" / "hooks"))
    try:
        return __import__(f"plot_{name}")
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))


def _run(name: str, out) -> dict:
    threads = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}  # no re-exec
    run = subprocess.run([sys.executable, "-m", "benchmarks", name, "--quick", "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=100, check=False,
                         env={**os.environ, **threads})
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_parallel_map_keeps_the_order_of_map_and_overlaps_calls(workers):
    from benchmarks.training_loop import parallel_map
    from reference_impl.train.dataset import Dataset

    lock, running, most = threading.Lock(), [0], [0]

    def slow_square(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return int(i) ** 2

    source = Dataset.from_arrays(list(range(11)))  # 11: not a multiple of any worker count above 1
    assert list(parallel_map(source, slow_square, workers)) == [i * i for i in range(11)]
    assert list(parallel_map(source, slow_square, workers)) == list(source.map(slow_square))  # re-iterable
    assert most[0] >= min(workers, 2)  # with 2 or more workers, calls really overlapped


def test_make_bench_and_the_site_know_both_benchmarks():
    from benchmarks import optimizers, training_loop
    from benchmarks.__main__ import BENCHMARKS, NEEDS_ROOT

    assert BENCHMARKS["optimizers"] is optimizers.main and BENCHMARKS["training_loop"] is training_loop.main
    # `make bench` runs `python -m benchmarks --all`: every benchmark but the root-only ones
    assert "-m benchmarks --all" in (ROOT / "Makefile").read_text()
    assert not {"optimizers", "training_loop"} & set(NEEDS_ROOT)
    hooks = (ROOT / "docs" / "hooks" / "bench_plots.py").read_text()
    assert "plot_optimizers" in hooks and "plot_training_loop" in hooks


def test_ideal_rates_are_the_formulas_of_the_page():
    from benchmarks.training_loop import ideal_rate

    assert ideal_rate(0, 0.02, 0.01) == pytest.approx(1 / 0.03)
    assert ideal_rate(1, 0.02, 0.01) == pytest.approx(1 / 0.02)
    assert ideal_rate(4, 0.02, 0.01) == pytest.approx(1 / 0.01)
    assert ideal_rate(4, 0.08, 0.01) == pytest.approx(1 / 0.02)


def test_optimisers_benchmark_quick(tmp_path):
    doc = _run("optimizers", tmp_path / "optimizers.json")
    assert doc["benchmark"] == "optimizers" and "cpu" in doc["machine"] and doc["settings"]["quick"]
    assert list(doc["tuning"]) == ["SGD", "Momentum", "Nesterov", "Adagrad", "RMSProp", "Adam"]
    for name, t in doc["tuning"].items():
        usable = [row for row in t["grid"] if row["val_loss"] is not None]
        assert t["best_learning_rate"] == min(usable, key=lambda row: row["val_loss"])["learning_rate"], name
        assert all(len(run["losses"]) == doc["settings"]["steps"] for run in t["runs"])
        assert all(0 <= run["test_accuracy"] <= 1 for run in t["runs"])
    cost = doc["cost"]
    for name, row in cost["optimisers"].items():
        # float32 slots of every parameter, plus the optimiser's step counter (one float32)
        assert row["state_bytes"] == 4 * SLOTS[name] * cost["params"] + 4, name
        assert row["time_vs_sgd"] > 0 and len(row["step_seconds"]) == doc["settings"]["repeats"]
    assert cost["optimisers"]["SGD"]["time_vs_sgd"] == 1.0
    assert cost["optimisers"]["Adam"]["update_nodes"] > cost["optimisers"]["SGD"]["update_nodes"]
    figures, summary = _plotter("optimizers").plot(tmp_path / "optimizers.json", doc)
    assert set(figures) == {"curves", "cost"} and "| Adam |" in summary and "*Machine:*" in summary


def test_training_loop_benchmark_quick(tmp_path):
    from benchmarks.training_loop import ideal_rate

    doc = _run("training_loop", tmp_path / "training_loop.json")
    assert doc["benchmark"] == "training_loop" and doc["settings"]["quick"]
    for case in doc["input"]["wait"] + [doc["input"]["parse"]]:
        assert set(case["pipelines"]) == {"serial", "prefetch", "parallel map ×2 + prefetch",
                                          "parallel map ×4 + prefetch"}
        for p in case["pipelines"].values():
            assert p["ideal_steps_per_s"] == pytest.approx(ideal_rate(p["workers"], case["input_s"], case["step_s"]))
            assert p["steps_per_s"] > 0
    timing = doc["estimator"]["timing"]
    assert timing["hand-written Session loop"]["time_vs_hand_written"] == 1.0 and len(timing) == 3
    resume = doc["estimator"]["resume"]
    assert resume["input fast-forwarded"]["bit_identical"] and resume["input fast-forwarded"]["max_abs_diff"] == 0
    assert not resume["input restarted"]["bit_identical"] and resume["input restarted"]["max_abs_diff"] > 0
    figures, summary = _plotter("training_loop").plot(tmp_path / "training_loop.json", doc)
    assert set(figures) == {"input", "estimator"} and "bit-identical" in summary


@pytest.mark.parametrize("name, break_it, message", [
    ("optimizers", lambda d: d["cost"]["optimisers"].pop("SGD"), "'cost.optimisers' must be an object that includes SGD"),
    ("optimizers", lambda d: d["tuning"]["Adam"].pop("runs"), "'tuning.Adam' needs 'best_learning_rate'"),
    ("training_loop", lambda d: d["input"]["wait"][0]["pipelines"]["prefetch"].pop("ideal_steps_per_s"),
     "'input.wait\\[0\\].pipelines.prefetch' needs numbers"),
    ("training_loop", lambda d: d["estimator"]["timing"].pop("hand-written Session loop"),
     "must include the hand-written Session loop"),
])
def test_plotters_draw_the_committed_files_and_refuse_broken_ones(name, break_it, message):
    from mkdocs.exceptions import PluginError

    plotter = _plotter(name)
    path = ROOT / "docs" / "assets" / "bench" / f"{name}.json"
    data = json.loads(path.read_text())
    svgs, summary = plotter.plot(path, data)
    assert svgs and all(b"<path" in svg for svg in svgs.values()) and "*Machine:*" in summary
    broken = copy.deepcopy(data)
    break_it(broken)
    with pytest.raises(PluginError, match=message):
        plotter.plot(path, broken)


# --------------------------------------------------------------------------- the pages quote these runs


def _near_best(grid: list[dict]) -> int:
    """How many rates of the grid gave a validation loss within twice the best one."""
    best = min(row["val_loss"] for row in grid if row["val_loss"] is not None)
    return sum(row["val_loss"] is not None and row["val_loss"] <= 2 * best for row in grid)


def quoted_figures() -> list[tuple[str, str]]:
    """(concept page, text it must contain), formatted from the committed benchmark results.

    When a benchmark is run again, this says which sentences no longer match the data
    (update the page, not this list).
    """
    import statistics as st

    o = json.loads((ROOT / "docs" / "assets" / "bench" / "optimizers.json").read_text())
    t, c = o["tuning"], o["cost"]["optimisers"]
    acc = {n: 100 * st.median(r["test_accuracy"] for r in t[n]["runs"]) for n in t}
    adam_accs = [100 * r["test_accuracy"] for r in t["Adam"]["runs"]]
    tl = json.loads((ROOT / "docs" / "assets" / "bench" / "training_loop.json").read_text())
    wait = {row["ratio"]: row for row in tl["input"]["wait"]}
    rate = {r: {k: p["steps_per_s"] for k, p in row["pipelines"].items()} for r, row in wait.items()}
    ideal = {r: {k: p["ideal_steps_per_s"] for k, p in row["pipelines"].items()} for r, row in wait.items()}
    parse = tl["input"]["parse"]
    prate = {k: p["steps_per_s"] for k, p in parse["pipelines"].items()}
    pideal = {k: p["ideal_steps_per_s"] for k, p in parse["pipelines"].items()}
    two, four = "parallel map ×2 + prefetch", "parallel map ×4 + prefetch"
    timing = {k: v["time_vs_hand_written"] for k, v in tl["estimator"]["timing"].items()}
    hand = tl["estimator"]["timing"]["hand-written Session loop"]["steps_per_s"]
    resumed = tl["estimator"]["resume"]
    steps = tl["settings"]["estimator"]["steps"]
    inputs, est = "input-pipelines.md", "estimator.md"
    others = [1 - rate[r][k] / ideal[r][k] for r in rate for k in rate[r] if (r, k) != (4.0, four)]
    assert max(others) < 0.10, f"the page says the waits came within 10 % of the ideals: {max(others):.1%}"
    loop = [
        (inputs, f"except 4 workers at $X = 4Y$: {100 * (1 - rate[4.0][four] / ideal[4.0][four]):.0f} % below"),
        (inputs, (f"With $X = Y$, prefetch raised the rate from {rate[1.0]['serial']:.1f} to "
                  f"{rate[1.0]['prefetch']:.1f} steps/s (ideals {ideal[1.0]['serial']:.1f} and "
                  f"{ideal[1.0]['prefetch']:.1f})")),
        (inputs, (f"With $X = 4Y$, prefetch alone reached {rate[4.0]['prefetch']:.1f} steps/s (ideal "
                  f"{ideal[4.0]['prefetch']:.1f})")),
        (inputs, (f"2 workers reached {rate[4.0][two]:.1f} (ideal {ideal[4.0][two]:.1f}) and 4 workers "
                  f"{rate[4.0][four]:.1f} (ideal {ideal[4.0][four]:.1f})")),
        (inputs, f"{parse['lines_per_batch']} JSON lines per batch, $X \\approx {parse['input_s'] * 1e3:.0f}$ ms"),
        (inputs, f"from {prate['serial']:.1f} to {prate['prefetch']:.1f} steps/s"),
        (inputs, (f"2 and 4 parsing threads gave {prate[two]:.1f} and {prate[four]:.1f} steps/s, against ideals of "
                  f"{pideal[two]:.0f} and {pideal[four]:.0f}")),
        (est, f"{hand:.0f} steps/s"),
        (est, f"interleaved over {tl['settings']['estimator']['repeats']} repeats"),
        (est, f"**{timing['Estimator, one checkpoint at the end']:.2f}×** the hand-written loop's time"),
        (est, (f"every 10 steps {timing['Estimator, checkpoint every 10 steps']:.2f}×, every step "
              f"{timing['Estimator, checkpoint every step']:.2f}×")),
        (est, (f"every 50 steps took {timing['train_and_evaluate, evaluate every 50 steps']:.2f}× and every 10 steps "
              f"{timing['train_and_evaluate, evaluate every 10 steps']:.2f}×")),
        (est, f"stopped after {steps // 2} steps and continued by a new Estimator"),
        (est, f"all {resumed['input fast-forwarded']['variables']} variables"),
        (est, (f"weights differing by up to {resumed['input restarted']['max_abs_diff']:.3f} (the largest weight is "
              f"{resumed['input restarted']['max_weight']:.2f})")),
    ]
    assert resumed["input fast-forwarded"]["bit_identical"] and not resumed["input restarted"]["bit_identical"]
    others = [acc[n] for n in ("Momentum", "Nesterov", "Adagrad", "RMSProp")]
    assert all(acc["Adam"] <= a <= acc["SGD"] for a in others), "the page says the others lie between Adam and SGD"
    assert max(adam_accs) - min(adam_accs) > max(acc.values()) - min(acc.values()), \
        "the page says Adam's spread over seeds is larger than the spread between optimisers"
    page = "optimisers.md"
    return loop + [
        (page, (f"**{acc['SGD']:.1f} % for SGD at rate {t['SGD']['best_learning_rate']:g}** and "
               f"**{acc['Adam']:.1f} % for Adam at rate {t['Adam']['best_learning_rate']:g}**")),
        (page, f"(Adam: {min(adam_accs):.1f} % to {max(adam_accs):.1f} %)"),
        (page, (f"SGD's best rate is {t['SGD']['best_learning_rate'] / t['Adam']['best_learning_rate']:.0f} times "
               "Adam's")),
        (page, (f"within twice its best at {_near_best(t['Adam']['grid'])} of the {len(o['settings']['rates'])} "
               f"rates, SGD's at {_near_best(t['SGD']['grid'])}")),
        (page, f"measured on {o['cost']['params']:,} float32 parameters".replace(",", " ")),
        (page, (f"**{c['Adam']['time_vs_sgd']:.1f}× SGD's time for Adam** ({c['Adam']['update_nodes']} graph nodes "
               f"against {c['SGD']['update_nodes']}) and {c['Momentum']['time_vs_sgd']:.1f}× for Momentum")),
        (page, (f"{c['Adam']['peak_update_bytes_per_param']:.0f} bytes per parameter for Adam, "
               f"{c['SGD']['peak_update_bytes_per_param']:.0f} for SGD")),
        (page, f"(Adam about {c['Adam']['time_vs_sgd']:.0f} times)"),
        (page, f"({t['SGD']['best_learning_rate']:g} for SGD, {t['Adam']['best_learning_rate']:g} for Adam)"),
    ]


def test_concept_pages_quote_the_committed_results():
    assert_pages_quote((ROOT / "docs" / "concepts" / page, text) for page, text in quoted_figures())
