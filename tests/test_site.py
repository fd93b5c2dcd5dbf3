"""The documentation site: it builds strictly, renders math and plots, and works offline.

The build runs ``mkdocs build --strict`` exactly as ``make site`` does (hooks included, so
it needs ``docs/assets/bench/allreduce.json``: run ``make bench`` if the build says it is
missing). The browser test serves the built site on 127.0.0.1 and drives Chromium through
Playwright; it is skipped when no Chromium is installed, unless ``CI`` is set.
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from html import unescape
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONCEPT = "concepts/allreduce-vs-parameter-servers/index.html"
PLOTS = ("assets/bench/allreduce-busbw.svg", "assets/bench/allreduce-ratio.svg")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module with ``mkdocs build --strict``."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_build_is_strict_clean(site: Path) -> None:
    for page in ("index.html", CONCEPT, "exercises/index.html"):
        assert (site / page).is_file(), f"{page} missing from the build"
    assert not (site / "hooks").exists(), "docs/hooks/ must not be published"


def test_math_is_mathml_and_plots_are_drawn(site: Path) -> None:
    html = (site / CONCEPT).read_text(encoding="utf-8")
    assert html.count("<math") >= 10, "formulas were not converted to MathML"
    prose = re.sub(r"<(pre|code)\b.*?</\1>", "", html, flags=re.DOTALL)
    assert "\\(" not in prose and "\\[" not in prose, "raw LaTeX delimiters left in the page"
    assert "<!-- bench:" not in html, "the benchmark summary marker was not replaced"
    assert "Machine:" in html, "the benchmark summary table (with its machine line) is missing"
    text = unescape(re.sub(r"<[^>]+>", "", html))
    source = (ROOT / "reference_impl/comm/ring.py").read_text(encoding="utf-8")
    signature = next(line for line in source.splitlines() if line.startswith("def ring_reduce_scatter"))
    assert signature in text, "the reference code was not rendered from source"
    for plot in PLOTS:
        svg = (site / plot).read_text(encoding="utf-8")
        assert svg.lstrip().startswith(("<?xml", "<svg")), f"{plot} is not an SVG"
        assert "<path" in svg and 'id="line2d_' in svg, f"{plot} has no plotted lines"
        assert Path(plot).name in html, f"the concept page does not show {plot}"


@pytest.fixture(scope="module")
def server(site: Path):
    """The built site over HTTP on 127.0.0.1, on a free port."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _chromium_or_skip():
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "the playwright package is not installed"
    if reason is None and not shutil.which(CHROMIUM):
        reason = f"no Chromium at {CHROMIUM} (set CHROMIUM to another binary)"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser test cannot run on CI: {reason}")
        pytest.skip(f"browser test skipped: {reason}")
    return sync_playwright


def test_site_in_a_real_browser_is_offline_and_works(server: str) -> None:
    sync_playwright = _chromium_or_skip()
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda request: requests.append(request.url))
            page.set_default_timeout(15_000)

            page.goto(f"{server}/", wait_until="load")
            assert "interview lab" in page.title().lower()

            page.goto(f"{server}/{CONCEPT.removesuffix('index.html')}", wait_until="load")
            plots = page.eval_on_selector_all(
                "img[src*='assets/bench/']",
                "els => els.map(e => ({src: e.getAttribute('src'), w: e.complete ? e.naturalWidth : 0}))",
            )
            assert len(plots) == len(PLOTS), f"expected {len(PLOTS)} plot images, found {plots}"
            assert all(img["w"] > 0 for img in plots), f"a plot did not load: {plots}"
            diagram = page.eval_on_selector(
                "img[src*='ring-allreduce.svg']", "e => e.complete ? e.naturalWidth : 0"
            )
            assert diagram > 0, "the ring diagram did not load"

            math = page.locator("math").first
            box = math.bounding_box()
            assert box is not None and box["width"] > 0 and box["height"] > 0, "MathML not rendered"

            page.locator("input.md-search__input").click()
            page.keyboard.type("busbw")
            page.wait_for_selector(".md-search-result__item", state="visible")
            assert page.locator(".md-search-result__item").count() >= 1
        finally:
            browser.close()

    assert requests, "no requests were recorded"
    outside = [
        url for url in requests
        if urlsplit(url).scheme not in ("data", "blob", "about") and urlsplit(url).hostname != "127.0.0.1"
    ]
    assert not outside, f"the site requested resources outside 127.0.0.1: {outside}"
