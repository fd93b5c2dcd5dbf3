"""Accessibility: every page of the built site passes axe-core in Chromium, and screenshots.

axe-core (shipped inside the ``axe-playwright-python`` package, never copied here) runs on
every HTML page of the site built once a session (tests/conftest.py's ``built_site``), in
Debian's Chromium through Playwright, with every request outside 127.0.0.1 aborted. A page
fails on any violation that axe rates "serious" or "critical"; the message lists the page,
the rule, and each offending element. Moderate and minor findings (best practices such as
unique landmark names) are not failures.

Every page is checked in the light scheme at desktop width with all of axe's default rules
(the costly colour-contrast rule on each page that draws some text in a colour, background,
size or weight no page before it did: ``TEXT_STYLES``); the same visit checks that each of its
images decodes and that it logs no error.
The screenshots (home, a concept page, a question page, a calculator, the practice page; at desktop 1280 px and
phone 360 px widths; light and dark) go to ``build/test-artifacts/`` as
``a11y-<page>-<width>-<scheme>.png``, and axe checks each of those views too, so the
dark scheme's colours (code highlighting included) and the phone layout are checked on one
page of each kind (the desktop light views are the sweep's).

Pages run a few at a time (one browser, one context per scheme and width, a pool of tabs).
Loading a page and axe's run on it are the slow parts, and they use both cores already.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from browser_tools import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, OFFLINE_ARGS, chromium_or_skip, record_outside

FAILING_IMPACTS = ("serious", "critical")
TABS = 2  # pages checked at once; each has its own renderer process
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 360, "height": 740}
SHOTS = {  # screenshot name: page
    "home": "",
    "concept": "concepts/allreduce-vs-parameter-servers/",
    "question": "questions/n000-q1/",
    "calculator": "calculators/allreduce-time/",
    "practice": "practice/",
}
SHOT_HEIGHT = 4000  # px of a long page kept in its screenshot (concept pages run far longer)

# axe.run's options: violations only (the passes would be megabytes). ``RUN_ALL`` checks every
# rule axe enables by default (WCAG 2.x A and AA, and best practices).
RUN_ALL = {"resultTypes": ["violations"]}
# axe's colour-contrast rule takes about 70 % of its time, and its verdict on a piece of text
# depends only on how that text is drawn: its colour, the backgrounds behind it, its size and
# weight, and the opacity it is drawn with. ``TEXT_STYLES`` lists those, one string per distinct
# combination on a page (computed in the page, so the site's CSS, the scheme and inline styles
# all count). The sweep runs the rule on a page only when the page draws some text in a way no
# page checked before it did; every other rule runs on every page.
NO_CONTRAST = {"resultTypes": ["violations"], "rules": {"color-contrast": {"enabled": False}}}
TEXT_STYLES = """() => {
  const behind = new Map();  // element -> [backgrounds showing through it, opacity it is drawn with]
  const under = (e) => {
    if (!e) return ["", 1];
    if (!behind.has(e)) {
      const s = getComputedStyle(e);
      const [further, opacity] = under(e.parentElement);
      const colour = s.backgroundColor;
      const opaque = colour !== "rgba(0, 0, 0, 0)" && !colour.startsWith("rgba");
      const here = [s.backgroundImage === "none" ? "" : s.backgroundImage.slice(0, 80),
                    colour === "rgba(0, 0, 0, 0)" ? "" : colour].filter(Boolean).join(" ");
      behind.set(e, [opaque ? here : [here, further].filter(Boolean).join(" over "), opacity * Number(s.opacity)]);
    }
    return behind.get(e);
  };
  const styles = new Set();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let text = walker.nextNode(); text; text = walker.nextNode()) {
    const el = text.parentElement;
    if (!el || !text.data.trim()) continue;
    const s = getComputedStyle(el);
    styles.add([s.color, ...under(el), s.fontSize, s.fontWeight, s.textShadow].join(" | "));
  }
  return [...styles];
}"""


def contrast_needed(page, checked: set[str]) -> bool:
    """True when ``page`` draws text in a style (``TEXT_STYLES``) not in ``checked``, which then
    takes this page's styles: the page is the first to need the colour-contrast rule for them."""
    styles = set(page.evaluate(TEXT_STYLES))
    if styles <= checked:
        return False
    checked |= styles
    return True


def _axe_script() -> str:
    try:
        from axe_playwright_python.base import AXE_SCRIPT
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("axe-playwright-python is not installed (pyproject.toml lists it)")
        pytest.skip("axe-playwright-python is not installed")
    return AXE_SCRIPT


def _pages(site: Path) -> list[str]:
    """Every HTML page of the built site, as a path relative to its root URL."""
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    return [p.removesuffix("index.html") for p in pages]


def _offline_context(browser, viewport: dict, scheme: str, outside: list[str], errors: list[str]):
    """A context with axe injected into every page, the colour scheme emulated, and every
    request leaving 127.0.0.1 recorded (the browser is launched with ``OFFLINE_ARGS``: such a
    request fails in Chromium)."""
    context = browser.new_context(viewport=viewport, color_scheme=scheme, reduced_motion="reduce")
    context.set_default_timeout(30_000)
    context.add_init_script(_axe_script())

    record_outside(context, outside)
    context.on("weberror", lambda e: errors.append(str(e.error)))
    return context


def _goto(page, url: str, scheme: str) -> None:
    page.goto(url, wait_until="load")
    # the page's own scripts lay it out again once its fonts are in (accessibility.js), before axe
    page.evaluate("document.fonts.ready.then(() => true)")
    want = "slate" if scheme == "dark" else "default"
    got = page.evaluate("document.body.getAttribute('data-md-color-scheme')")
    assert got == want, f"{url}: the {scheme} scheme did not apply (data-md-color-scheme={got!r})"


def _failures(label: str, result: dict) -> list[str]:
    """One readable block per serious or critical violation of one page."""
    out = []
    for v in result["violations"]:
        if v["impact"] not in FAILING_IMPACTS:
            continue
        nodes = v["nodes"]
        lines = [f"{label}: {v['id']} ({v['impact']}, {len(nodes)} elements): {v['help']}"]
        for node in nodes[:5]:
            html = " ".join(node["html"].split())[:160]
            summary = " ".join((node.get("failureSummary") or "").split())[:200]
            lines.append(f"    {' '.join(map(str, node['target']))}: {html}\n      {summary}")
        if len(nodes) > 5:
            lines.append(f"    ... and {len(nodes) - 5} more")
        out.append("\n".join(lines))
    return out


def _sweep(context, base: str, paths: list[str], scheme: str, contrast: list[str],
           missing: list[str], errors: list[str]) -> dict[str, dict]:
    """axe on each page, ``TABS`` pages at a time: a tab loads its page and starts axe, then
    the next tab does, and a tab's result is collected just before it loads its next page.
    The colour-contrast rule runs where ``contrast_needed`` says (those pages go to
    ``contrast``). While a page is loaded, each of its images must have decoded (else it goes
    to ``missing``) and every message the page logs as an error goes to ``errors``."""
    checked: set[str] = set()
    tabs = [context.new_page() for _ in range(min(TABS, len(paths)))]
    for tab in tabs:
        tab.on("console", lambda m, tab=tab: errors.append(f"{tab.url}: {m.text}") if m.type == "error" else None)
    pending: list[str | None] = [None] * len(tabs)
    results: dict[str, dict] = {}

    def collect(i: int) -> None:
        if pending[i] is not None:
            results[pending[i]] = tabs[i].evaluate("window.__axe")
            pending[i] = None

    for n, path in enumerate(paths):
        i = n % len(tabs)
        collect(i)
        _goto(tabs[i], f"{base}/{path}", scheme)
        missing += [f"/{path}: {src}" for src in tabs[i].eval_on_selector_all(
            "article img", "imgs => imgs.filter(i => !i.naturalWidth).map(i => i.getAttribute('src'))")]
        options = NO_CONTRAST
        if contrast_needed(tabs[i], checked):
            options = RUN_ALL
            contrast.append(path)
        tabs[i].evaluate(f"() => {{ window.__axe = axe.run(document, {json.dumps(options)}); }}")
        pending[i] = path
    for i in range(len(tabs)):
        collect(i)
    for tab in tabs:
        tab.close()
    return results


def test_axe_reports_a_known_violation() -> None:
    """The check can fail: axe, as injected here, reports an image without alt text, an
    unlabelled input and pale text on pages made to have them, and the sweep runs the
    colour-contrast rule on a page that brings a new text style."""
    sync_playwright = chromium_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            context.add_init_script(_axe_script())
            page = context.new_page()
            page.set_content(
                "<!doctype html><html lang='en'><head><title>t</title></head><body><main>"
                "<img src='data:image/gif;base64,R0lGODlhAQABAAAAACw='><input type='text'></main></body></html>"
            )
            result = page.evaluate(f"axe.run(document, {json.dumps(RUN_ALL)})")
            # the sweep's choice of pages for the colour-contrast rule: a page in new text styles
            # needs it, the same page again does not, and pale grey text on white is a new style
            checked: set[str] = set()
            needed = []
            for body in ("<p>readable</p>", "<p>readable</p>", "<p>readable</p><p style='color:#ccc'>pale</p>"):
                page.set_content(f"<!doctype html><html lang='en'><head><title>t</title></head><body><main>{body}</main></body></html>")
                needed.append(contrast_needed(page, checked))
            pale = page.evaluate(f"axe.run(document, {json.dumps(RUN_ALL)})")
        finally:
            browser.close()
    found = {v["id"]: v["impact"] for v in result["violations"]}
    assert found.get("image-alt") == "critical", found
    assert found.get("label") == "critical", found
    assert len(_failures("made-up page", result)) >= 2
    assert needed == [True, False, True]
    assert [v["impact"] for v in pale["violations"] if v["id"] == "color-contrast"] == ["serious"], pale


@pytest.mark.timeout(900)
def test_every_page_passes_axe_loads_its_images_and_logs_no_error(built_site: Path, site_url: str) -> None:
    """No serious or critical axe violation on any page (light scheme, desktop width); on every
    page each image decodes, no script fails and nothing is logged as an error; and no page asks
    for anything outside 127.0.0.1."""
    sync_playwright = chromium_or_skip()
    paths = _pages(built_site)
    assert len(paths) > 50, f"only {len(paths)} pages were built"
    outside: list[str] = []
    errors: list[str] = []
    failures: list[str] = []
    missing: list[str] = []
    contrast: list[str] = []
    timings = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + OFFLINE_ARGS)
        try:
            for scheme in ("light",):
                began = time.monotonic()
                context = _offline_context(browser, DESKTOP, scheme, outside, errors)
                results = _sweep(context, site_url, paths, scheme, contrast, missing, errors)
                context.close()
                timings[scheme] = time.monotonic() - began
                assert set(results) == set(paths), "axe did not report on every page"
                for path, result in results.items():
                    failures += _failures(f"/{path} ({scheme})", result)
        finally:
            browser.close()
    print(f"axe on {len(paths)} pages, colour contrast on {len(contrast)}: "
          + ", ".join(f"{s} {t:.0f} s" for s, t in timings.items()))
    assert not failures, f"{len(failures)} serious or critical accessibility violations:\n" + "\n".join(failures)
    assert not missing, f"images that did not load: {missing}"
    assert not outside, f"the site requested resources outside 127.0.0.1: {outside}"
    assert not errors, f"page errors: {errors}"


def test_screenshots_at_desktop_and_phone_width_in_light_and_dark(site_url: str) -> None:
    """Screenshots of five kinds of page at two widths in two schemes, each view checked by axe
    (but the desktop light one, which the sweep above checks on every page)."""
    sync_playwright = chromium_or_skip()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    outside: list[str] = []
    errors: list[str] = []
    failures: list[str] = []
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + OFFLINE_ARGS)
        try:
            for width, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
                for scheme in ("light", "dark"):
                    context = _offline_context(browser, viewport, scheme, outside, errors)
                    page = context.new_page()
                    for name, path in SHOTS.items():
                        _goto(page, f"{site_url}/{path}", scheme)
                        if (width, scheme) != ("desktop", "light"):  # the sweep checked that view
                            failures += _failures(f"/{path} ({width}, {scheme})", page.evaluate(
                                f"axe.run(document, {json.dumps(RUN_ALL)})"))
                        height = page.evaluate("document.documentElement.scrollHeight")
                        shot = ARTIFACTS / f"a11y-{name}-{width}-{scheme}.png"
                        page.screenshot(
                            path=str(shot), full_page=True, animations="disabled",
                            clip={"x": 0, "y": 0, "width": viewport["width"], "height": min(height, SHOT_HEIGHT)},
                        )
                        written.append(shot)
                    context.close()
        finally:
            browser.close()
    assert all(shot.is_file() and shot.stat().st_size > 10_000 for shot in written), written
    assert len(written) == len(SHOTS) * 4  # two widths, two schemes
    assert not failures, f"{len(failures)} serious or critical accessibility violations:\n" + "\n".join(failures)
    assert not outside, f"the site requested resources outside 127.0.0.1: {outside}"
    assert not errors, f"page errors: {errors}"
