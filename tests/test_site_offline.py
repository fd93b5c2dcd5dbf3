"""`make site-offline`: the site built with Material's offline plugin opens from file://,
links between pages work, and search finds pages, with no request leaving the folder."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from browser_tools import CHROMIUM, CHROMIUM_ARGS, chromium_or_skip
from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def offline_site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site-offline")
    env = dict(os.environ, LAB_OFFLINE="true", NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"the offline build failed:\n{proc.stderr[-3000:]}"
    return out


def test_the_offline_site_browses_and_searches_from_file_urls(offline_site):
    # page.html rather than page/index.html: a file:// URL of a folder shows a listing, not the page
    assert (offline_site / "concepts" / "allreduce-algorithms.html").is_file()
    assert not (offline_site / "concepts" / "allreduce-algorithms").exists()
    assert "var __index = " in (offline_site / "search" / "search_index.js").read_text(encoding="utf-8")[:20]
    sync_playwright = chromium_or_skip()
    outside: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()

            def route(r) -> None:
                if urlsplit(r.request.url).scheme in ("file", "data", "blob", "about"):
                    r.continue_()
                else:
                    outside.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((offline_site / "index.html").as_uri(), wait_until="load")
            link = page.locator('.md-content a[href*="concepts/"][href$=".html"]:visible').first
            target = link.get_attribute("href")
            link.click()
            page.wait_for_load_state("load")
            assert page.url.endswith(target.removeprefix(".").removeprefix("/")), (page.url, target)
            assert page.locator("article h1").first.inner_text().strip()
            page.locator("input.md-search__input").click()
            page.keyboard.type("allreduce")
            page.wait_for_selector(".md-search-result__item", state="visible", timeout=20_000)
            assert page.locator(".md-search-result__item").count() >= 3
        finally:
            browser.close()
    assert not outside, f"the offline site requested resources outside its folder: {outside}"
    assert not errors, f"console errors: {errors}"
