"""The back-of-envelope calculators: Python functions, and the same numbers in a real browser.

The Python side (``reference_impl.calculators``) is checked against independent
computations: the α–β closed forms written out, a simulated-network run, the bubble counted
slot by slot, and byte counts of the ZeRO accounting. The browser side builds the calculator
pages with the site's theme and hooks (only those pages, so it takes seconds; the strict
build of the whole site is ``tests/test_site.py``), serves them on 127.0.0.1, and drives
Chromium through Playwright: it fills each form with several inputs and compares every
displayed result with the Python function. Requests that leave 127.0.0.1 are aborted.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from browser_tools import CHROMIUM, CHROMIUM_ARGS, build_calculator_site, chromium_or_skip, keep_offline, serve_directory

from reference_impl import calculators as calc
from reference_impl.comm.communicator import run_threads
from reference_impl.comm.cost_model import ALLREDUCE_TIME, LinkParams, best_allreduce, ring_allreduce_time
from reference_impl.comm.ring import ring_allreduce as ring_allreduce_impl
from reference_impl.comm.simnet import INTERCONNECTS, SimulatedNetwork
from reference_impl.parallel import memory as parallel_memory
from reference_impl.parallel import transformer as parallel_transformer
from reference_impl.parallel import zero as parallel_zero

ROOT = Path(__file__).resolve().parents[1]
ALPHA_BETA = ROOT / "docs" / "assets" / "bench" / "alpha_beta.json"


# --------------------------------------------------------------------------- Python functions


def test_allreduce_seconds_is_the_ring_formula_on_the_profile() -> None:
    link = INTERCONNECTS["25GbE"]
    alpha, beta = link.latency_s, 8 / (link.link_gbps * 1e9)
    n, p = 100e6, 8
    expected = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta
    assert calc.allreduce_seconds(n, p, "25GbE") == pytest.approx(expected, rel=1e-12)
    assert calc.allreduce_seconds(n, 1, "25GbE") == 0.0


def test_allreduce_seconds_matches_a_simulated_ring() -> None:
    """The simulated network charges α + m·β per message; a real ring on it ends at the formula."""
    n_floats, p = 1 << 14, 4
    link = LinkParams(alpha=3e-6, beta=1e-9)

    def rank(comm):
        net = SimulatedNetwork(comm, link)
        x = np.full(n_floats, comm.rank + 1.0, dtype=np.float32)
        out = np.empty_like(x)
        ring_allreduce_impl(net, x, out)
        return net.now(), float(out[0])

    results = run_threads(p, rank)
    assert {value for _, value in results} == {sum(range(1, p + 1))}
    predicted = calc.allreduce_seconds(n_floats * 4, p, link)
    assert max(t for t, _ in results) == pytest.approx(predicted, rel=1e-9)


def test_parameter_server_model_and_traffic() -> None:
    link = LinkParams(alpha=5e-6, beta=8e-11)  # the worked example of the concept page
    one = calc.parameter_server_seconds(100e6, 8, 1, link)
    assert one == pytest.approx(2 * 8 * 5e-6 + 2 * 8 * 100e6 * 8e-11)  # 80 µs + 128 ms
    eight = calc.parameter_server_seconds(100e6, 8, 8, link)
    assert eight == pytest.approx(80e-6 + 16e-3)
    t = calc.ps_vs_allreduce(100e6, workers=16, servers=4, network=link)
    assert t.ring_bytes_per_worker == pytest.approx(187.5e6)
    assert t.ps_bytes_per_worker == pytest.approx(100e6)
    assert t.ps_bytes_per_server == pytest.approx(16 * 100e6 / 4)
    assert t.ps_bytes_total == pytest.approx(2 * 16 * 100e6)
    assert t.ring_seconds == pytest.approx(ring_allreduce_time(100e6, 16, link))
    assert t.ring_seconds < t.ps_seconds


def test_bubble_fraction_counts_idle_slots() -> None:
    for p, m in [(1, 1), (2, 1), (4, 4), (4, 16), (8, 3)]:
        slots = m + p - 1  # slot s: stage i works micro-batch s - i if 0 <= s - i < m
        idle = sum(1 for i in range(p) for s in range(slots) if not 0 <= s - i < m)
        assert calc.pipeline_bubble_fraction(p, m) == pytest.approx(idle / (p * slots))


def test_training_memory_follows_the_zero_accounting() -> None:
    psi = 1e9
    mixed = calc.training_memory(psi, "mixed", "adam")
    fp32 = calc.training_memory(psi, "fp32", "adam")
    assert mixed.total == pytest.approx(16 * psi) and fp32.total == pytest.approx(16 * psi)
    assert calc.training_memory(psi, "fp32", "sgd").total == pytest.approx(8 * psi)
    assert calc.training_memory(0, "mixed", "sgd", 1e6).activations == 2e6
    assert calc.training_memory(0, "fp32", "sgd", 1e6).activations == 4e6


# The ZeRO paper (Rajbhandari et al., SC'20, arXiv:1910.02054), Figure 1: Ψ = 7.5B, N_d = 64, K = 12.
ZERO_FIGURE_1_GB = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
LLAMA_SHAPE = dict(layers=32, hidden=4096, heads=32, seq=4096, batch=1, vocab=32000)


def _model_states(m: calc.ShardedMemory) -> float:
    return m.parameters + m.gradients + m.optimizer_state


def test_sharded_memory_reproduces_the_zero_paper() -> None:
    """16 bytes per parameter for mixed-precision Adam, and Figure 1's per-device memory."""
    for precision in ("bf16", "fp16"):
        one = calc.sharded_memory(1e9, **LLAMA_SHAPE, precision=precision, stage=0, ranks=1)
        assert (one.parameters, one.gradients, one.optimizer_state) == pytest.approx((2e9, 2e9, 12e9), rel=1e-12)
    paper = parallel_memory.zero_paper_memory(7.5e9, 64)
    for stage, gb in ZERO_FIGURE_1_GB.items():
        m = calc.sharded_memory(7.5e9, **LLAMA_SHAPE, precision="bf16", stage=stage, ranks=64)
        assert round(_model_states(m) / 1e9, 1) == gb
        assert _model_states(m) == pytest.approx(list(paper.values())[stage], rel=1e-12)
    fp32 = calc.sharded_memory(1e9, **LLAMA_SHAPE, precision="fp32", stage=0, ranks=1)
    assert (fp32.parameters, fp32.gradients, fp32.optimizer_state) == pytest.approx((4e9, 4e9, 8e9), rel=1e-12)


@pytest.mark.parametrize("stage", parallel_zero.STAGES)
@pytest.mark.parametrize("ranks", [1, 3, 8])
def test_sharded_memory_is_the_reference_accounting(stage: int, ranks: int) -> None:
    """With Ψ the layer sizes' own count, every part is memory_breakdown's and comm_elements' own."""
    config = parallel_transformer.GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=64)
    psi = parallel_transformer.n_params(config)
    for precision, recompute in (("bf16", False), ("fp32", True)):
        m = calc.sharded_memory(psi, layers=4, hidden=64, heads=4, seq=64, batch=8, vocab=96, precision=precision,
                                stage=stage, ranks=ranks, recompute=recompute)
        ref = parallel_memory.memory_breakdown(config, "adam", precision, 8, 64, stage=stage, ranks=ranks,
                                               recompute=recompute)
        assert m.architecture_parameters == psi
        assert (m.parameters, m.gradients, m.optimizer_state) == pytest.approx(
            (ref.parameters, ref.gradients, ref.optimizer_state), rel=1e-12)
        assert m.activations == ref.activations == parallel_memory.PRECISIONS[precision][0] * \
            parallel_memory.activation_elements(config, 8, 64, recompute=recompute)
        values = parallel_zero.comm_elements(config, stage, ranks) * psi / parallel_zero.padded_params(config, ranks)
        assert m.comm_bytes_per_step == pytest.approx(parallel_memory.PRECISIONS[precision][1] * values, rel=1e-12)
        assert m.comm_bytes_per_step == pytest.approx(
            parallel_memory.PRECISIONS[precision][1] * (3 if stage == 3 else 2) * (ranks - 1) / ranks * psi, rel=1e-12)


@pytest.mark.parametrize("kwargs, words", [
    (dict(layers=2.5), "layers must be a whole number"),
    (dict(ranks=0), "ranks must be a whole number"),
    (dict(heads=3), "multiple of heads"),
    (dict(stage=4), "stage"),
    (dict(precision="fp8"), "precision"),
    (dict(parameters=-1), "parameters"),
])
def test_sharded_memory_names_a_bad_input(kwargs, words) -> None:
    args = dict(parameters=7e9, **LLAMA_SHAPE)
    args.update(kwargs)
    with pytest.raises(ValueError, match=words):
        calc.sharded_memory(**args)


def test_measured_link_is_the_benchmark_fit(tmp_path) -> None:
    fit = json.loads(ALPHA_BETA.read_text())["fit"]
    link = calc.measured_link(ALPHA_BETA)
    assert (link.alpha, link.beta, link.gamma) == (fit["alpha_s"], fit["beta_s_per_byte"], fit["gamma_s_per_byte"])
    profiles = calc.calculator_constants(ALPHA_BETA)["interconnects"]
    assert profiles[calc.MEASURED_PROFILE]["alpha"] == link.alpha
    assert set(calc.calculator_constants()["interconnects"]) == set(INTERCONNECTS)
    broken = tmp_path / "alpha_beta.json"
    broken.write_text('{"fit": {"alpha_s": 1e-6}}')
    with pytest.raises(ValueError, match="alpha_beta.json"):
        calc.measured_link(broken)


@pytest.mark.parametrize("call", [
    lambda: calc.allreduce_seconds(1e6, 2.5, "100GbE"),
    lambda: calc.allreduce_seconds(1e6, float("nan"), "100GbE"),
    lambda: calc.parameter_server_seconds(1e6, 4, 1.5),
    lambda: calc.ps_vs_allreduce(1e6, workers=2.5, servers=1),
    lambda: calc.pipeline_bubble_fraction(4, 2.5),
])
def test_counts_must_be_whole_numbers(call) -> None:
    """2.5 ranks is refused, not rounded down to 2."""
    with pytest.raises(ValueError, match="must be a whole number"):
        call()
    assert calc.allreduce_seconds(1e6, 4.0, "100GbE") == calc.allreduce_seconds(1e6, np.int64(4), "100GbE")


def test_every_allreduce_algorithm_has_a_name_in_words() -> None:
    labels = calc.calculator_constants()["labels"]
    assert set(labels) == set(ALLREDUCE_TIME)
    assert all("_" not in text for text in labels.values()), labels
    assert labels["recursive_doubling"] == "recursive doubling"


@pytest.mark.parametrize("call, words", [
    (lambda: calc.training_memory(1, "fp8"), "precision"),
    (lambda: calc.training_memory(1, "fp32", "lion"), "optimizer"),
    (lambda: calc.pipeline_bubble_fraction(0, 4), "stages"),
    (lambda: calc.ps_vs_allreduce(1e6, 4, 0), "servers"),
    (lambda: calc.allreduce_seconds(1e6, 4, "56k-modem"), "interconnect"),
    (lambda: calc.allreduce_seconds(-1, 4), "model_bytes"),
])
def test_bad_input_names_the_problem(call, words) -> None:
    with pytest.raises(ValueError, match=words):
        call()


# --------------------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def calculator_site(tmp_path_factory) -> Path:
    """Only the calculator pages, built with the site's theme, math and calculators hooks."""
    return build_calculator_site(tmp_path_factory.mktemp("calc"), sorted((ROOT / "docs" / "calculators").glob("*.md")),
                                 [ALPHA_BETA])


@pytest.fixture(scope="module")
def server(calculator_site: Path):
    with serve_directory(calculator_site) as url:
        yield url


def _mem(inputs):
    m = calc.training_memory(inputs["parameters_millions"] * 1e6, inputs["precision"], inputs["optimizer"],
                             inputs["activations_millions"] * 1e6)
    return {"weights": m.weights, "gradients": m.gradients, "master_weights": m.master_weights,
            "optimizer_state": m.optimizer_state, "activations": m.activations, "total": m.total}


def _ps(inputs):
    t = calc.ps_vs_allreduce(inputs["megabytes"] * 1e6, inputs["workers"], inputs["servers"], inputs["interconnect"])
    return {"ring_seconds": t.ring_seconds, "ps_seconds": t.ps_seconds, "ps_bytes_per_server": t.ps_bytes_per_server,
            "ring_bytes_per_worker": t.ring_bytes_per_worker, "ps_bytes_per_worker": t.ps_bytes_per_worker,
            "ring_bytes_total": t.ring_bytes_total, "ps_bytes_total": t.ps_bytes_total}


def _allreduce(inputs):
    n = inputs["megabytes"] * 1e6
    name = inputs["interconnect"]
    link = calc.measured_link(ALPHA_BETA) if name == calc.MEASURED_PROFILE else INTERCONNECTS[name].link
    every = {f"time_{a}": calc.allreduce_seconds(n, inputs["ranks"], link, a) for a in ALLREDUCE_TIME}
    return {"seconds": calc.allreduce_seconds(n, inputs["ranks"], link, inputs["algorithm"]),
            "best": best_allreduce(n, inputs["ranks"], link), **every}


def _sharded(inputs):
    m = calc.sharded_memory(inputs["parameters_billions"] * 1e9, inputs["layers"], inputs["hidden"], inputs["heads"],
                            inputs["seq"], inputs["batch"], inputs["vocab"], inputs["precision"], inputs["optimizer"],
                            int(inputs["stage"]), inputs["ranks"], inputs["recompute"] == "yes")
    return {"parameters": m.parameters, "gradients": m.gradients, "optimizer_state": m.optimizer_state,
            "activations": m.activations, "total": m.total, "comm_bytes_per_step": m.comm_bytes_per_step,
            "architecture_parameters": m.architecture_parameters}


SHARDED_DEFAULTS = {"parameters_billions": 7.5, "layers": 32, "hidden": 4096, "heads": 32, "seq": 4096, "batch": 1,
                    "vocab": 32000, "precision": "bf16", "optimizer": "adam", "stage": "0", "ranks": 64,
                    "recompute": "no"}

CASES = [
    ("allreduce-time", _allreduce, [
        {"megabytes": 100, "ranks": 8, "interconnect": "100GbE", "algorithm": "ring"},
        {"megabytes": 0.004, "ranks": 8, "interconnect": "10GbE", "algorithm": "recursive_doubling"},
        {"megabytes": 1000, "ranks": 6, "interconnect": "IB-NDR", "algorithm": "rabenseifner"},
        {"megabytes": 0.5, "ranks": 13, "interconnect": "RoCE-100G", "algorithm": "tree"},
        {"megabytes": 64, "ranks": 5, "interconnect": calc.MEASURED_PROFILE, "algorithm": "rabenseifner"},
    ]),
    ("ps-vs-allreduce", _ps, [
        {"megabytes": 100, "workers": 8, "servers": 1, "interconnect": "100GbE"},
        {"megabytes": 25, "workers": 16, "servers": 4, "interconnect": "25GbE"},
        {"megabytes": 3, "workers": 3, "servers": 5, "interconnect": "IB-HDR"},
    ]),
    ("pipeline-bubble", lambda i: {"fraction": calc.pipeline_bubble_fraction(i["stages"], i["microbatches"])}, [
        {"stages": 4, "microbatches": 16}, {"stages": 8, "microbatches": 1}, {"stages": 1, "microbatches": 5},
    ]),
    ("training-memory", _mem, [
        {"parameters_millions": 1000, "precision": "mixed", "optimizer": "adam", "activations_millions": 500},
        {"parameters_millions": 7.5, "precision": "fp32", "optimizer": "momentum", "activations_millions": 0},
        {"parameters_millions": 350, "precision": "mixed", "optimizer": "sgd", "activations_millions": 12.25},
    ]),
    ("sharded-memory", _sharded, [
        *({**SHARDED_DEFAULTS, "stage": str(s)} for s in parallel_zero.STAGES),
        {**SHARDED_DEFAULTS, "parameters_billions": 7, "ranks": 8, "stage": "2", "recompute": "yes"},
        {"parameters_billions": 0.124, "layers": 12, "hidden": 768, "heads": 12, "seq": 1024, "batch": 8,
         "vocab": 50257, "precision": "fp32", "optimizer": "momentum", "stage": "3", "ranks": 3, "recompute": "no"},
        {"parameters_billions": 70, "layers": 80, "hidden": 8192, "heads": 64, "seq": 2048, "batch": 2,
         "vocab": 32000, "precision": "fp16", "optimizer": "sgd", "stage": "1", "ranks": 1, "recompute": "yes"},
    ]),
]


READ_OUTPUTS = "f => Object.fromEntries([...f.querySelectorAll('output')].map(o => [o.name, [o.dataset.value, o.textContent]]))"


def test_calculator_pages_agree_with_python(server: str) -> None:
    sync_playwright = chromium_or_skip()
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            outside = keep_offline(page)
            for name, python, cases in CASES:
                page.goto(f"{server}/calculators/{name}/", wait_until="load")
                form = page.locator(f'form[data-calculator="{name}"]')
                for inputs in cases:
                    for field, value in inputs.items():
                        element = form.locator(f'[name="{field}"]')
                        if isinstance(value, str):
                            element.select_option(value)
                        else:
                            element.fill(str(value))
                    shown = form.evaluate(READ_OUTPUTS)  # one round trip for all results
                    for output, expected in python(inputs).items():
                        value, text = shown[output]
                        where = f"{name} with {inputs}: {output}"
                        assert text.strip(), f"{where}: the page shows nothing"
                        if isinstance(expected, str):
                            assert value == expected, f"{where}: page {value!r}, Python {expected!r}"
                        else:
                            assert math.isclose(float(value), expected, rel_tol=1e-12, abs_tol=1e-300), \
                                f"{where}: page {value}, Python {expected}"
                form.locator("input").first.fill("-3")
                assert "valid" in form.locator("output").first.inner_text(), f"{name}: bad input not reported"
        finally:
            browser.close()
    assert not errors, f"console errors: {errors}"
    assert not outside, f"the calculator pages requested resources outside 127.0.0.1: {outside}"


def test_sharded_memory_page_shows_the_papers_figures_and_names_bad_counts(server: str) -> None:
    """Figure 1 of the ZeRO paper as the page displays it, and a clear message for a bad count."""
    sync_playwright = chromium_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            keep_offline(page)
            page.goto(f"{server}/calculators/sharded-memory/", wait_until="load")
            form = page.locator('form[data-calculator="sharded-memory"]')
            for stage, gb in ZERO_FIGURE_1_GB.items():  # the page's defaults are the paper's Ψ and N_d
                form.locator('[name="stage"]').select_option(str(stage))
                shown = form.evaluate(READ_OUTPUTS)
                states = sum(float(shown[k][0]) for k in ("parameters", "gradients", "optimizer_state"))
                assert round(states / 1e9, 1) == gb, f"stage {stage}: {states / 1e9} GB, the paper says {gb} GB"
                assert shown["parameters"][1].endswith(" GB") or shown["parameters"][1].endswith(" MB")
            form.locator('[name="stage"]').select_option("0")
            one = form.evaluate(READ_OUTPUTS)
            per_param = sum(float(one[k][0]) for k in ("parameters", "gradients", "optimizer_state")) / 7.5e9
            assert per_param == pytest.approx(16.0, rel=1e-12), "mixed-precision Adam is 16 bytes per parameter"
            assert one["optimizer_state"][1] == "90.0 GB" and one["total"][1].endswith(" GB")
            for field, value, words in (("layers", "2.5", "layers must be a whole number"),
                                        ("ranks", "0", "ranks must be a whole number"),
                                        ("heads", "5", "multiple of the number of heads"),
                                        ("parameters_billions", "", "parameters must be a number")):
                form.locator(f'[name="{field}"]').fill(value)
                text = form.locator('output[name="total"]').inner_text()
                assert words in text, f"{field}={value!r}: the page says {text!r}"
                form.locator(f'[name="{field}"]').fill(str(SHARDED_DEFAULTS[field]))
                assert form.locator('output[name="total"]').get_attribute("data-value"), f"{field}: not restored"
        finally:
            browser.close()


# --------------------------------------------------------------------------- the Python snippet, labels


UNITS = {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "%": 1e-2,
         "billion": 1e9}


def _shown_number(text: str) -> float:
    """The quantity a result's text shows, in base units: '14.3 ms' -> 0.0143, 'ring (14.3 ms)' -> 0.0143."""
    import re

    match = re.search(r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?) ?(µs|ms|s|B|kB|MB|GB|TB|%|billion)(?!\w)", text)
    assert match, f"no number with a unit in {text!r}"
    return float(match.group(1)) * UNITS[match.group(2)]


def _snippet_results(code: str) -> dict[str, float]:
    """Run a page's snippet as a reader would (from the repository root); its results by output name:
    a variable named like an output, or the fields (and ``total``) of a dataclass it made."""
    import contextlib
    import dataclasses
    import io

    namespace: dict = {"__name__": "__snippet__"}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, "<calculator snippet>", "exec"), namespace)
    finally:
        os.chdir(cwd)
    out = {}
    for name, value in namespace.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not name.startswith("__"):
            out[name] = float(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update({f.name: float(getattr(value, f.name)) for f in dataclasses.fields(value)})
            if hasattr(value, "total"):
                out["total"] = float(value.total)
    return out


SNIPPET_TEXT = "f => { const b = [...document.querySelectorAll('.calculator-python')].find(e => " \
               "f.compareDocumentPosition(e) & Node.DOCUMENT_POSITION_FOLLOWING); " \
               "return b ? (b.querySelector('code') || b).textContent : null; }"


def test_python_snippet_follows_the_inputs_and_gives_the_shown_results(server: str, calculator_site: Path) -> None:
    """Each calculator's Python snippet is rewritten with the form's inputs; run, it gives every
    number the page shows (to 1e-12 against the unrounded value, and as the rounded text)."""
    import re
    from html import unescape

    sync_playwright = chromium_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            keep_offline(page)
            for name, _, cases in CASES:
                page.goto(f"{server}/calculators/{name}/", wait_until="load")
                form = page.locator(f'form[data-calculator="{name}"]')
                # without JavaScript the page shows the snippet of the form's defaults
                built = (calculator_site / "calculators" / name / "index.html").read_text(encoding="utf-8")
                static = re.search(r'class="[^"]*calculator-python[^"]*".*?<code>(.*?)</code>', built, flags=re.S)
                assert static, f"{name}: no calculator-python code block on the page"
                assert unescape(re.sub(r"<[^>]+>", "", static.group(1))) == form.evaluate(SNIPPET_TEXT), \
                    f"{name}: the page's written snippet is not the one for the form's defaults"
                seen = []
                for inputs in cases:
                    for field, value in inputs.items():
                        element = form.locator(f'[name="{field}"]')
                        element.select_option(value) if isinstance(value, str) else element.fill(str(value))
                    code = form.evaluate(SNIPPET_TEXT)
                    shown = form.evaluate(READ_OUTPUTS)
                    results = _snippet_results(code)
                    compared = [k for k in results if k in shown]
                    assert compared, f"{name} with {inputs}: the snippet computes none of the outputs:\n{code}"
                    for output in compared:
                        value, text = shown[output]
                        where = f"{name} with {inputs}: {output}"
                        assert math.isclose(results[output], float(value), rel_tol=1e-12, abs_tol=1e-300), \
                            f"{where}: snippet {results[output]}, page {value}\n{code}"
                        assert math.isclose(_shown_number(text), results[output], rel_tol=6e-3, abs_tol=1e-300), \
                            f"{where}: the page shows {text!r}, the snippet gives {results[output]}"
                    seen.append(code)
                assert len(set(seen)) == len(cases), f"{name}: the snippet did not change with the inputs"
        finally:
            browser.close()


def test_calculators_refuse_fractional_counts_and_show_words(server: str) -> None:
    """2.5 ranks is refused with a message (and no result, no snippet); algorithm names are words;
    labels read as one line of text, a superscript next to its base."""
    sync_playwright = chromium_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            keep_offline(page)
            for name, _, _ in CASES:
                page.goto(f"{server}/calculators/{name}/", wait_until="load")
                form = page.locator(f'form[data-calculator="{name}"]')
                # a flex or grid label makes each text run and each <sup> a box of its own, set apart
                labels = form.evaluate("f => [...f.querySelectorAll('label')].map(l => "
                                       "[l.textContent.trim().slice(0, 30), getComputedStyle(l).display])")
                split = [text for text, display in labels if "flex" in display or "grid" in display]
                assert not split, f"{name}: labels laid out in pieces (flex or grid): {split}"
                texts = form.evaluate("f => [...f.querySelectorAll('option, output')].map(e => e.textContent)")
                assert not [t for t in texts if "_" in t], f"{name}: code names shown: {[t for t in texts if '_' in t]}"
            page.goto(f"{server}/calculators/allreduce-time/", wait_until="load")
            form = page.locator('form[data-calculator="allreduce-time"]')
            gap = form.evaluate("""f => {
                const sup = f.querySelector('[name="megabytes"]').closest('label').querySelector('sup');
                const base = sup.previousSibling, r = document.createRange();
                r.setStart(base, base.length - 2); r.setEnd(base, base.length);
                return sup.getBoundingClientRect().left - r.getBoundingClientRect().right; }""")
            assert abs(gap) < 2, f"the exponent of 10^6 stands {gap:.1f} px from its base"
            form.locator('[name="algorithm"]').select_option("recursive_doubling")
            assert form.locator('[name="algorithm"] option:checked').inner_text() == "recursive doubling"
            form.locator('[name="megabytes"]').fill("0.004")
            assert form.locator('output[name="best"]').inner_text().startswith("recursive doubling (")
            form.locator('[name="ranks"]').fill("2.5")
            for out in form.locator("output").all():
                assert "ranks must be a whole number" in out.inner_text() and not out.get_attribute("data-value")
            assert "ranks must be a whole number" in form.evaluate(SNIPPET_TEXT)
        finally:
            browser.close()
