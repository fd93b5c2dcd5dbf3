"""Chromium for the browser tests (tests/test_site.py, tests/test_as_learner.py).

Debian's Chromium driven by Playwright, started with the flags that keep it off the network
(this machine's network is closed, and a page test must load nothing from outside anyway).
The tests are skipped with the reason when Playwright or Chromium is missing, unless ``CI``
is set, where that is a failure. Screenshots go under ``build/test-artifacts/``.

Not a test module: tests import it as ``from browser_tools import ...``.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

ARTIFACTS = Path(__file__).resolve().parents[1] / "build" / "test-artifacts"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_or_skip():
    """Playwright's ``sync_playwright``, or skip (fail under CI) saying what is missing."""
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


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """Serve ``directory`` over HTTP on a free local port for as long as the block runs; yields its URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def keep_offline(target: Any, outside: list[str] | None = None) -> list[str]:
    """Abort every request of ``target`` (a Playwright page or context) that leaves 127.0.0.1.

    The site must work offline, so a page test lets through only the local server and
    ``data:``/``blob:``/``about:`` URLs, and records every other request in ``outside`` (a new
    list unless one is passed), which it returns for the test to assert empty.
    """
    from urllib.parse import urlsplit

    outside = [] if outside is None else outside

    def route(r: Any) -> None:
        url = urlsplit(r.request.url)
        if url.scheme in ("data", "blob", "about") or url.hostname == "127.0.0.1":
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    target.route("**/*", route)
    return outside


# Every host name but 127.0.0.1 fails to resolve, inside Chromium: a page cannot reach the
# network, and no request waits on the test's Python (as one routed by ``keep_offline`` does).
OFFLINE_ARGS = ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]


def record_outside(target: Any, outside: list[str]) -> list[str]:
    """Record in ``outside`` every request of ``target`` (a page or context) that leaves 127.0.0.1,
    without intercepting any: for a browser launched with ``OFFLINE_ARGS``, where such a request
    fails by itself. Cheaper than ``keep_offline`` on a sweep of every page."""
    from urllib.parse import urlsplit

    def seen(request: Any) -> None:
        url = urlsplit(request.url)
        if url.scheme not in ("data", "blob", "about") and url.hostname != "127.0.0.1":
            outside.append(request.url)

    target.on("request", seen)
    return outside


def build_calculator_site(work: Path, pages: list[Path], bench: list[Path] = ()) -> Path:
    """Build only the given calculator pages (with the site's JS, CSS, math and calculators hooks)
    under ``work``, copying the benchmark JSON files ``bench`` they read; return the built site."""
    import subprocess
    import sys
    import textwrap

    root = Path(__file__).resolve().parents[1]
    docs = work / "docs"
    (docs / "calculators").mkdir(parents=True)
    for page in pages:
        shutil.copy(page, docs / "calculators" / page.name)
    shutil.copytree(root / "docs" / "assets" / "js", docs / "assets" / "js")
    shutil.copytree(root / "docs" / "assets" / "stylesheets", docs / "assets" / "stylesheets")
    (docs / "assets" / "bench").mkdir()
    for path in bench:
        shutil.copy(path, docs / "assets" / "bench" / path.name)
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
          - {root / 'docs/hooks/math.py'}
          - {root / 'docs/hooks/calculators.py'}
        markdown_extensions:
          - tables
          - attr_list
          - md_in_html
          - pymdownx.superfences
          - pymdownx.highlight
          - pymdownx.arithmatex:
              generic: true
        """))
    site = work / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "-d", str(site)], cwd=work,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return site
