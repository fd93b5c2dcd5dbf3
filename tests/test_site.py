"""The documentation site: it builds strictly, renders math and plots, and works offline.

The build runs ``mkdocs build --strict`` exactly as ``make site`` does (hooks included, so
it needs the committed ``docs/assets/bench/*.json``: run ``make bench`` if the build says one
is missing). Every internal link and anchor of the built HTML is then checked. The browser
tests serve the built site on 127.0.0.1 and drive Chromium through Playwright with every
other request aborted; they are skipped when no Chromium is installed, unless ``CI`` is set.
Screenshots of the home page and a concept page are saved under ``build/test-artifacts/``.
That every page's images decode and that no page logs an error is checked where every page
is visited anyway: the accessibility sweep (tests/test_accessibility.py).
"""
from __future__ import annotations

import functools
import http.server
import re
import threading
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest
from browser_tools import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, chromium_or_skip, keep_offline

ROOT = Path(__file__).resolve().parents[1]
CONCEPT = "concepts/allreduce-vs-parameter-servers/index.html"
PLOTS = ("assets/bench/allreduce-busbw.svg", "assets/bench/allreduce-ratio.svg", "assets/bench/allreduce-torch.svg")
MATH_PAGE = "concepts/allreduce-algorithms/"


@pytest.fixture(scope="module")
def site(built_site: Path) -> Path:
    """The site, built once a session with ``mkdocs build --strict`` (tests/conftest.py)."""
    return built_site


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


class _LinksAndIds(HTMLParser):
    """Collect the ``href``/``src`` targets and the element ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id":
                self.ids.add(value)
            elif (name == "href" and tag in ("a", "link")) or (name == "src" and tag in ("img", "script")):
                self.links.append(value)


def _parse(page: Path) -> _LinksAndIds:
    parser = _LinksAndIds()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def test_every_internal_link_and_anchor_of_the_built_site_resolves(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 50, f"only {len(pages)} pages were built"
    parsed = {page: _parse(page) for page in pages}
    broken: list[str] = []
    for page, found in parsed.items():
        base = "/" + page.relative_to(site).as_posix()
        for link in found.links:
            parts = urlsplit(link)
            if parts.scheme in ("data", "mailto", "javascript") or (parts.scheme and parts.netloc):
                continue  # not a file of this site (external links are allowed in prose, never loaded)
            target_url = urlsplit(urljoin(base, link))
            target = site / unquote(target_url.path).lstrip("/")
            if target.is_dir() or target_url.path.endswith("/"):
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{base}: {link} (no file {target.relative_to(site)})")
            elif target_url.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if unquote(target_url.fragment) not in ids:
                    broken.append(f"{base}: {link} (no anchor #{target_url.fragment})")
    assert not broken, f"{len(broken)} broken internal links:\n" + "\n".join(broken[:40])


def test_every_written_hint_links_to_an_anchor_of_the_built_site(site: Path) -> None:
    """The ``read`` link of every test's hint (grader/hints.py) names a page and an anchor that exist."""
    from grader.course import Course
    from grader.hints import written_hints

    broken = []
    course = Course.at(ROOT / "exercises")
    for assignment in course.assignments:
        for test_id, hint in written_hints(course, assignment.name).items():
            page, _, anchor = (hint.read or "").partition("#")
            built = site / (page[:-3] + "/index.html" if page.endswith(".md") else page)
            if not built.is_file() or anchor not in _parse(built).ids:
                broken.append(f"{assignment.name}/{test_id}: {hint.read}")
    assert not broken, "hint links without their page or anchor:\n" + "\n".join(broken)


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


def _offline_page(browser, outside: list[str], errors: list[str]):
    """A page that aborts (and records) every request leaving 127.0.0.1 and records console errors."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(15_000)

    keep_offline(page, outside)
    page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
    return page


def test_site_in_a_real_browser_is_offline_and_works(server: str) -> None:
    sync_playwright = chromium_or_skip()
    outside: list[str] = []
    errors: list[str] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = _offline_page(browser, outside, errors)
            page.goto(f"{server}/", wait_until="load")
            assert "interview lab" in page.title().lower()
            page.screenshot(path=str(ARTIFACTS / "home.png"), full_page=True)

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
            page.screenshot(path=str(ARTIFACTS / "concept-allreduce-vs-parameter-servers.png"), full_page=True)

            page.goto(f"{server}/{MATH_PAGE}", wait_until="load")
            boxes = page.eval_on_selector_all(
                "math", "els => els.map(e => { const r = e.getBoundingClientRect(); return r.width * r.height; })"
            )
            assert len(boxes) >= 10 and all(area > 0 for area in boxes), f"MathML not rendered: {boxes[:5]}"

            page.locator("input.md-search__input").click()
            page.keyboard.type("allreduce")
            page.wait_for_selector(".md-search-result__item", state="visible")
            assert page.locator(".md-search-result__item").count() >= 3, "search found too little for 'allreduce'"
        finally:
            browser.close()
    assert not outside, f"the site requested resources outside 127.0.0.1: {outside}"
    assert not errors, f"console errors: {errors}"
