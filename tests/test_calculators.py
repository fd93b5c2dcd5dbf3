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

import functools
import json
import http.server
import math
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from reference_impl import calculators as calc
from reference_impl.comm.communicator import run_threads
from reference_impl.comm.cost_model import ALLREDUCE_TIME, LinkParams, best_allreduce, ring_allreduce_time
from reference_impl.comm.ring import ring_allreduce as ring_allreduce_impl
from reference_impl.comm.simnet import INTERCONNECTS, SimulatedNetwork

ROOT = Path(__file__).resolve().parents[1]
ALPHA_BETA = ROOT / "docs" / "assets" / "bench" / "alpha_beta.json"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


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
    work = tmp_path_factory.mktemp("calc")
    docs = work / "docs"
    shutil.copytree(ROOT / "docs" / "calculators", docs / "calculators")
    shutil.copytree(ROOT / "docs" / "assets" / "js", docs / "assets" / "js")
    shutil.copytree(ROOT / "docs" / "assets" / "stylesheets", docs / "assets" / "stylesheets")
    (docs / "assets" / "bench").mkdir()
    shutil.copy(ALPHA_BETA, docs / "assets" / "bench" / "alpha_beta.json")
    (work / "mkdocs.yml").write_text(textwrap.dedent(f"""\
        site_name: calculators
        docs_dir: docs
        theme:
          name: material
          font: false
        extra_javascript:
          - assets/js/calculators.js
        extra_css:
          - assets/stylesheets/calculators.css
        hooks:
          - {ROOT / 'docs/hooks/math.py'}
          - {ROOT / 'docs/hooks/calculators.py'}
        markdown_extensions:
          - tables
          - attr_list
          - md_in_html
          - pymdownx.arithmatex:
              generic: true
        """))
    out = work / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "-d", str(out)], cwd=work,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def server(calculator_site: Path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(calculator_site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "the playwright package is not installed"
    else:
        if shutil.which(CHROMIUM):
            return sync_playwright
        reason = f"no Chromium at {CHROMIUM} (set CHROMIUM to another binary)"
    if os.environ.get("CI"):
        pytest.fail(f"browser test cannot run on CI: {reason}")
    pytest.skip(f"browser test skipped: {reason}")


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
]


READ_OUTPUTS = "f => Object.fromEntries([...f.querySelectorAll('output')].map(o => [o.name, [o.dataset.value, o.textContent]]))"


def test_calculator_pages_agree_with_python(server: str) -> None:
    sync_playwright = _playwright()
    requests: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.route("**/*", lambda route: route.continue_() if urlsplit(route.request.url).hostname
                       in ("127.0.0.1", None) else route.abort())
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
    outside = [u for u in requests if urlsplit(u).scheme in ("http", "https") and urlsplit(u).hostname != "127.0.0.1"]
    assert not outside, f"the calculator pages requested resources outside 127.0.0.1: {outside}"
