"""The parallel layout planner's page (docs/calculators/parallel-layout.md) against planner.py.

The page runs the planner's enumeration in the browser (docs/assets/js/parallel-layout.js). This
test builds the page with the site's theme and hooks, serves it on 127.0.0.1, drives Chromium
through Playwright (as tests/test_calculators.py does), and for several inputs (a dense 70B on
1024 H100s, the 1T model on 3072 A100s, a mixture of experts, a model that fits nowhere) holds
every displayed number to ``planner.plan``: the 20 fastest layouts in order, each one's memory,
step time and MFU, the 20 fastest of those too big for memory, the count of layouts dropped for
each reason, and the first layout's step and memory breakdown and links, at a relative 1e-12.
It also checks that the Megatron-LM table written on the page is what the planner computes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import re
from pathlib import Path

import pytest
from browser_tools import CHROMIUM, CHROMIUM_ARGS, build_calculator_site, chromium_or_skip, keep_offline, serve_directory

from reference_impl.parallel import planner as P

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "calculators" / "parallel-layout.md"
SHOW = 20
PAPER_FEATURES = dict(zero_stages=(0,), recompute=("full",), sequence_parallel=(False,))


def megatron_table_rows() -> list[list[str]]:
    """The page's table, cell by cell, from the planner."""
    rows = []
    for run in P.narayanan_table_1():
        L = run.layout
        est = P.predict_step(L, run.model, run.cluster, run.global_batch)
        paper = P.plan(run.model, run.cluster, run.global_batch, **PAPER_FEATURES)
        every = P.plan(run.model, run.cluster, run.global_batch)
        top, best = paper.ranked[0], every.ranked[0]
        over = [e for e in paper.ranked if e.layout.tp > 8]
        label = best.layout.label().replace(" recompute=", ", recompute ").replace(
            f" dp={best.layout.dp}", f" dp={best.layout.dp},")
        rows.append([run.name, f"{L.tp}, {L.pp}, {L.dp}, {L.micro_batch}", f"{run.tflops_per_gpu}",
                     f"{P.paper_tflops(run.model, run.global_batch, est.step_s, run.cluster.gpus):.0f}",
                     f"{est.memory['total'] / 1e9:.0f} GB",
                     f"{top.layout.tp}, {top.layout.pp}, {top.layout.dp}, {top.layout.micro_batch}",
                     f"{paper.rank_of(tp=L.tp, pp=L.pp, dp=L.dp)} of {len(paper.ranked)}",
                     "none valid" if not over else f"+{100 * (over[0].step_s / top.step_s - 1):.0f} %",
                     label, f"{est.step_s / best.step_s:.2f}x"])
    return rows


def test_the_pages_megatron_table_is_the_planners() -> None:
    text = PAGE.read_text(encoding="utf-8")
    block = text[text.index("<!-- megatron-table -->"):text.index("<!-- /megatron-table -->")]
    written = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.splitlines()
               if line.startswith("| ") and not line.startswith("| model")]
    assert written == megatron_table_rows()


# --------------------------------------------------------------------------- in the browser
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    site = build_calculator_site(tmp_path_factory.mktemp("layout"), [PAGE])
    with serve_directory(site) as url:
        yield url


DEFAULTS = {"preset": "H100", "nodes": 128, "efficiency": 0.62, "layers": 80, "hidden": 8192, "heads": 64,
            "seq": 4096, "vocab": 32000, "experts": 1, "top_k": 1, "global_batch": 1024}
ONE_T = {"preset": "A100", "nodes": 384, "efficiency": 0.62, "layers": 128, "hidden": 25600, "heads": 160,
         "seq": 2048, "vocab": 51200, "experts": 1, "top_k": 1, "global_batch": 3072}
CASES = [
    DEFAULTS,
    ONE_T,
    {"preset": "H100", "nodes": 4, "efficiency": 0.5, "layers": 16, "hidden": 2048, "heads": 16, "seq": 2048,
     "vocab": 50257, "experts": 8, "top_k": 2, "global_batch": 256},
    {**ONE_T, "nodes": 1, "global_batch": 8},  # nothing fits on one node
]


def _key(L: P.Layout) -> str:
    return ",".join(str(x) for x in (L.tp, L.pp, L.dp, L.ep, L.zero, L.micro_batch, int(L.sequence_parallel),
                                     L.recompute))


def _python(inputs: dict) -> tuple[P.Plan, P.Cluster, P.Model]:
    cluster = dataclasses.replace(P.PRESETS[inputs["preset"]](inputs["nodes"]), efficiency=inputs["efficiency"])
    model = P.Model(inputs["layers"], inputs["hidden"], inputs["heads"], inputs["seq"], inputs["vocab"],
                    inputs["experts"], inputs["top_k"])
    return P.plan(model, cluster, inputs["global_batch"]), cluster, model


READ = """f => ({
  ranked: [...f.querySelectorAll('tbody.ranked tr')].map(tr => [tr.dataset.layout,
           ...[...tr.querySelectorAll('td')].slice(3, 6).map(td => td.dataset.value)]),
  dropped: [...f.querySelectorAll('tbody.dropped tr')].map(tr => [tr.dataset.layout,
            ...[...tr.querySelectorAll('td')].slice(1, 3).map(td => td.dataset.value)]),
  reasons: [...f.querySelectorAll('tbody.reasons tr')].map(tr => [tr.dataset.kind, tr.lastChild.textContent]),
  outputs: Object.fromEntries([...f.querySelectorAll('output')].map(o => [o.name, [o.dataset.value, o.textContent]])),
})"""


def _close(a: str | None, b: float, where: str) -> None:
    assert a not in (None, ""), f"{where}: the page shows nothing"
    assert math.isclose(float(a), b, rel_tol=1e-12, abs_tol=1e-300), f"{where}: page {a}, Python {b}"


def test_the_page_ranks_and_drops_layouts_as_the_planner_does(server: str) -> None:
    sync_playwright = chromium_or_skip()
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            outside = keep_offline(page)
            page.goto(f"{server}/calculators/parallel-layout/", wait_until="load")
            form = page.locator("form[data-layout-planner]")
            for inputs in CASES:
                where = f"{inputs['preset']} x {inputs['nodes']}, {inputs['layers']} layers"
                form.locator('[name="preset"]').select_option(inputs["preset"])
                for field, value in inputs.items():
                    if field != "preset":
                        form.locator(f'[name="{field}"]').fill(str(value))
                shown = form.evaluate(READ)
                result, cluster, model = _python(inputs)
                # the page's Python follows the form: run, it builds the same model, cluster and plan
                namespace: dict = {}
                with contextlib.redirect_stdout(io.StringIO()) as printed:
                    exec(compile(page.locator(".calculator-python code").inner_text(), "page", "exec"), namespace)
                assert (namespace["model"], namespace["cluster"]) == (model, cluster), where
                assert [e.layout for e in namespace["result"].ranked] == [e.layout for e in result.ranked], where
                assert "tp=" in printed.getvalue() or not result.ranked, where

                ranked = result.ranked[:SHOW]
                assert [r[0] for r in shown["ranked"]] == [_key(e.layout) for e in ranked], where
                for (_, memory, step, mfu), est in zip(shown["ranked"], ranked):
                    _close(memory, est.memory["total"], f"{where}: {est.layout.label()} memory")
                    _close(step, est.step_s, f"{where}: {est.layout.label()} step")
                    _close(mfu, P.step_flops(model, inputs["global_batch"]) / est.step_s / cluster.gpus /
                           cluster.peak_flops, f"{where}: {est.layout.label()} MFU")

                too_big = [e for e in result.dropped if e.kind == "memory"][:SHOW]
                assert [r[0] for r in shown["dropped"]] == [_key(e.layout) for e in too_big], where
                for (_, memory, step), est in zip(shown["dropped"], too_big):
                    _close(memory, est.memory["total"], f"{where}: dropped {est.layout.label()} memory")
                    _close(step, est.step_s, f"{where}: dropped {est.layout.label()} step")

                counts = result.reasons()
                for kind in P.REASONS:
                    if f"reason_{kind}" in shown["outputs"]:
                        assert shown["outputs"][f"reason_{kind}"][0] == str(counts[kind]), f"{where}: {kind}"
                first = {}  # the first layout dropped for each reason that is not memory, as the page shows
                for est in result.dropped:
                    if est.kind != "memory":
                        first.setdefault(est.kind, est.reason)
                assert dict(shown["reasons"]) == first, where

                out = shown["outputs"]
                if result.ranked:
                    top = result.ranked[0]
                    assert out["top_layout"][0] == _key(top.layout), where
                    for part, value in top.time.items():
                        _close(out[f"top_{part}"][0], value, f"{where}: top {part}")
                    for part, value in top.memory.items():
                        _close(out[f"top_memory_{part}"][0], value, f"{where}: top memory {part}")
                    L = top.layout
                    for name, stride, size in (("tp", 1, L.tp), ("dp", L.tp, L.dp), ("pp", L.tp * L.dp, L.pp)):
                        assert out[f"top_link_{name}"][0] == P.group_link(cluster, stride, size)[1], where
                else:
                    assert "no layout fits" in out["top_layout"][1] and shown["dropped"], where
                assert out["summary"][0] == str(len(result.ranked)), where

            form.locator('[name="heads"]').fill("0")
            assert "enter valid numbers: heads must be a whole number of at least 1" in \
                form.locator('output[name="summary"]').inner_text()
            form.locator('[name="heads"]').fill("7")
            assert "multiple of the number of heads" in form.locator('output[name="summary"]').inner_text()
        finally:
            browser.close()
    assert not errors, f"console errors: {errors}"
    assert not outside, f"the page requested resources outside 127.0.0.1: {outside}"


def test_the_page_shows_the_70b_answer_and_says_what_it_leaves_out() -> None:
    """The prose's numbers are the planner's, and the page names its sources."""
    text = PAGE.read_text(encoding="utf-8")
    result, cluster, model = _python(DEFAULTS)
    best = result.ranked[0]
    L = best.layout
    said = re.search(r"tp = (\d+) inside each node on NVLink, pp = (\d+) stages, dp = (\d+)", text)
    assert said and tuple(map(int, said.groups())) == (L.tp, L.pp, L.dp)
    assert f"{best.memory['total'] / 1e9:.0f} GB per GPU, {best.step_s:.1f} s a step" in text
    mfu = P.step_flops(model, 1024) / best.step_s / 1024 / cluster.peak_flops
    assert f"{100 * mfu:.0f} % MFU" in text
    assert "What it leaves out" in text and "## Sources" in text and "placeholder" not in text.lower()
