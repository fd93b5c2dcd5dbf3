"""The site as a reader meets it: the learning path, the code on concept pages, and search.

* The home page's learning path is a sequence of cards grouped by part, with a "Start here"
  first card, and every concept page and every exercise on it. In Chromium at phone width
  (360 px) the home page does not scroll sideways and no code identifier on a card is
  broken inside a word; at desktop size the "Start here" card shows without scrolling.
* Concept pages show the part of a source file that teaches (a snippet section) and keep the
  whole file one click away in a collapsed block; no whole ``.py`` file is pasted open. Code
  blocks wrap long lines: in Chromium, no visible code block of a concept page is wider than
  its box, at desktop or phone width.
* Search ranks the page that explains above the API reference: every concept page carries
  its search boost into the built index, and typing "stale synchronous" into the search box
  lists the Consistency models page first.

The built site and its server come from tests/conftest.py (one build per test session).
"""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from browser_tools import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, chromium_or_skip, keep_offline

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PARTS = [
    "Collective communication",
    "Dataflow graphs",
    "Training at scale",
    "Training models that do not fit",
    "Parameter servers and recommendation",
    "Deployment",
    "Practise for the interview",
]


# --------------------------------------------------------------------------- the learning path


class _PathCards(HTMLParser):
    """The home page's learning path: for each ``grid cards lab-path`` block, the heading before
    it and its cards, each card as its text and the links it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[tuple[str, list[dict]]] = []
        self._heading: str | None = None
        self._in_h3 = False
        self._depth = 0  # <div> nesting inside the current path block, 0 when outside
        self._card: dict | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "h3" and not self._depth:
            self._in_h3, self._heading = True, ""
        elif tag == "div" and self._depth:
            self._depth += 1
        elif tag == "div" and {"grid", "cards", "lab-path"} <= set(classes):
            self._depth = 1
            self.parts.append((self._heading or "", []))
        elif tag == "li" and self._depth:
            self._card = {"text": "", "links": [], "start": False}
            self.parts[-1][1].append(self._card)
        elif tag == "a" and self._card is not None:
            self._card["links"].append(dict(attrs).get("href"))
        if tag == "span" and "lab-path__step--start" in classes and self._card is not None:
            self._card["start"] = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "h3":
            self._in_h3 = False
        elif tag == "div" and self._depth:
            self._depth -= 1
        elif tag == "li":
            self._card = None

    def handle_data(self, data: str) -> None:
        if self._in_h3:
            self._heading += data
        if self._card is not None:
            self._card["text"] += data


def _path(site: Path) -> list[tuple[str, list[dict]]]:
    parser = _PathCards()
    parser.feed((site / "index.html").read_text(encoding="utf-8"))
    return parser.parts


def test_learning_path_is_numbered_cards_by_part_that_start_here(built_site: Path) -> None:
    parts = _path(built_site)
    assert [heading.strip(" ¶\n") for heading, _ in parts] == PARTS, "the path's parts, in order"
    cards = [card for _, part in parts for card in part]
    assert len(cards) >= 38, f"only {len(cards)} cards on the path"
    steps = [re.match(r"\s*Step (\d+)", card["text"]) for card in cards]
    assert all(steps), [card["text"][:60] for card, step in zip(cards, steps) if not step]
    assert [int(step.group(1)) for step in steps] == list(range(1, len(cards) + 1)), "steps not numbered 1, 2, …"
    assert cards[0]["start"] and "Start here" in cards[0]["text"], "the first card is not marked Start here"
    assert sum(card["start"] for card in cards) == 1, "more than one card is marked Start here"
    for card in cards:
        label = card["text"].split("\n")[0].strip()
        assert card["links"], f"{label}: the card links to no page"
        assert re.search(r"\bRun:", card["text"]), f"{label}: the card does not say what to run"
        assert re.search(r"\bTime:\s*\d", card["text"]), f"{label}: the card gives no time estimate"


def test_learning_path_holds_every_concept_page_and_every_exercise(built_site: Path) -> None:
    links = {link for _, part in _path(built_site) for card in part for link in card["links"]}
    pages = {link.split("#")[0] for link in links}
    concepts = sorted(p.stem for p in (DOCS / "concepts").glob("*.md"))
    missing = [name for name in concepts if f"concepts/{name}/" not in pages]
    assert not missing, f"concept pages missing from the learning path: {missing}"
    exercises = re.findall(r"^## Exercise (\d\d)\b.*?(?:\{#([a-z0-9_-]+)\})?$",
                           (DOCS / "exercises" / "index.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert len(exercises) >= 20, exercises
    anchors = {link.partition("#")[2] for link in links if link.startswith("exercises/")}
    missing = [number for number, anchor in exercises
               if not any(a.startswith(f"exercise-{number}") for a in anchors)]
    assert not missing, f"exercises missing from the learning path: {missing}"
    text = " ".join(card["text"] for _, part in _path(built_site) for card in part)
    for number, _ in exercises:
        assert f"grader start {number}" in text, f"the path does not say how to start exercise {number}"


# JavaScript: for every <code> in the path, the places where a line break falls between two
# word characters ("01_ring_al|lreduce"), found from the rendered box of each character.
_BROKEN_CODE = """() => {
  const broken = [];
  for (const code of document.querySelectorAll('.lab-path code')) {
    let text = '', tops = [];
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const box = range.getClientRects()[0];
        text += node.data[i];
        tops.push(box ? box.top : null);
      }
    }
    for (let i = 1; i < text.length; i++) {
      const wrapped = tops[i] !== null && tops[i - 1] !== null && tops[i] > tops[i - 1] + 2;
      if (wrapped && /\\w/.test(text[i - 1]) && /\\w/.test(text[i]))
        broken.push(text.slice(0, i) + ' | ' + text.slice(i));
    }
  }
  return broken;
}"""


def _browser(p):
    return p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def _offline(page) -> list[str]:
    """Abort every request that leaves 127.0.0.1; the list of those requests."""
    return keep_offline(page)


def test_learning_path_on_a_phone_and_on_a_desktop(site_url: str) -> None:
    sync_playwright = chromium_or_skip()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            phone = browser.new_page(viewport={"width": 360, "height": 740})
            outside = _offline(phone)
            phone.goto(f"{site_url}/", wait_until="load")
            width, view = phone.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
            wide = phone.evaluate("""() => [...document.querySelectorAll('article *')]
                .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
                .slice(0, 5).map(e => e.tagName + ': ' + e.textContent.slice(0, 50))""")
            assert width <= view, f"the home page scrolls sideways at 360 px ({width} > {view}): {wide}"
            assert phone.locator(".lab-path code").count() > 50, "the path shows no code"
            broken = phone.evaluate(_BROKEN_CODE)
            assert not broken, f"code broken inside a word on the path at 360 px: {broken[:5]}"
            phone.screenshot(path=str(ARTIFACTS / "learning-path-phone.png"), full_page=False)

            desktop = browser.new_page(viewport={"width": 1280, "height": 900})
            outside += _offline(desktop)
            desktop.goto(f"{site_url}/", wait_until="load")
            start = desktop.locator(".lab-path__step--start")
            assert start.inner_text().strip().lower().endswith("start here")
            box = start.bounding_box()
            assert box and 0 <= box["y"] and box["y"] + box["height"] <= 900, \
                f"'Start here' is not above the fold at 1280 × 900: {box}"
            broken = desktop.evaluate(_BROKEN_CODE)
            assert not broken, f"code broken inside a word on the path at 1280 px: {broken[:5]}"
            desktop.screenshot(path=str(ARTIFACTS / "learning-path-desktop.png"), full_page=False)
        finally:
            browser.close()
    assert not outside, f"the home page requested resources outside 127.0.0.1: {outside}"


# --------------------------------------------------------------------------- code on concept pages

WHOLE_FILE = re.compile(r'^(?P<indent> *)--8<-- "(?P<path>[^":]+\.py)"\s*$')


def _whole_py_includes_left_open(text: str) -> list[str]:
    """The lines of a page's Markdown that include a whole ``.py`` file outside a collapsed block.

    A snippet inside a collapsed block is indented under it: the nearest line above it with
    less indentation (fences aside) must be a ``??? `` line; ``???+`` opens by default, so it
    does not count, and a snippet at the margin is never inside one."""
    lines = text.splitlines()
    open_includes = []
    for number, line in enumerate(lines):
        match = WHOLE_FILE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        container = next((above for above in reversed(lines[:number])
                          if above.strip() and not above.lstrip().startswith("```")
                          and len(above) - len(above.lstrip(" ")) < indent), None)
        if container is None or not re.match(r"^\s*\?\?\? ", container):
            open_includes.append(f"{number + 1}: {line.strip()}")
    return open_includes


def test_no_page_pastes_a_whole_python_file_open() -> None:
    pages = sorted(DOCS.rglob("*.md"))
    assert len(pages) > 50
    open_includes = [f"{page.relative_to(ROOT)}:{hit}" for page in pages
                     for hit in _whole_py_includes_left_open(page.read_text(encoding="utf-8"))]
    assert not open_includes, "whole .py files included outside a collapsed block (show a snippet " \
                              "section, and the whole file under ??? note):\n" + "\n".join(open_includes)


@pytest.mark.parametrize("text, left_open", [
    ('```python\n--8<-- "reference_impl/comm/ring.py"\n```\n', 1),
    ('???+ note "open"\n\n    ```python\n    --8<-- "reference_impl/comm/ring.py"\n    ```\n', 1),
    ('!!! note "an admonition"\n\n    ```python\n    --8<-- "reference_impl/comm/ring.py"\n    ```\n', 1),
    ('??? note "The whole file"\n\n    ```python\n    --8<-- "reference_impl/comm/ring.py"\n    ```\n', 0),
    ('```python\n--8<-- "reference_impl/comm/ring.py:ring"\n```\n', 0),
])
def test_the_whole_file_check_tells_open_from_collapsed(text: str, left_open: int) -> None:
    assert len(_whole_py_includes_left_open(text)) == left_open


def test_concept_pages_include_the_teaching_section_and_the_whole_file_collapsed(built_site: Path) -> None:
    """Each page that keeps a whole file behind a click shows a section of the same file open."""
    checked = 0
    for page in sorted((DOCS / "concepts").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for path in re.findall(r'^ {4}--8<-- "([^":]+\.py)"$', text, re.MULTILINE):
            assert re.search(rf'^--8<-- "{re.escape(path)}:[a-z_]+"$', text, re.MULTILINE), \
                f"{page.name}: {path} is only behind a click; show its teaching section open"
            assert f'??? note "The whole file: {path}"' in text, f"{page.name}: {path}'s block has no title"
            html = (built_site / "concepts" / page.stem / "index.html").read_text(encoding="utf-8")
            assert re.search(r"<details class=\"note\">\s*<summary>The whole file: " + re.escape(path), html), \
                f"{page.name}: the whole {path} is not in a collapsed <details> in the built page"
            checked += 1
    assert checked >= 20, f"only {checked} whole files behind a click"


_OVERFLOWING_CODE = """() => [...document.querySelectorAll('article pre > code')]
  .filter(code => code.checkVisibility())
  .filter(code => code.scrollWidth > code.clientWidth + 1)
  .map(code => ({width: code.scrollWidth, box: code.clientWidth,
                 first: code.textContent.split('\\n').sort((a, b) => b.length - a.length)[0].slice(0, 80)}))"""


def test_code_blocks_of_concept_pages_are_never_cut_at_the_right_edge(built_site: Path, site_url: str) -> None:
    """Every concept page at phone width, where lines are cut most (a line that fits in 360 px
    fits wider); then a whole file opened at desktop width."""
    sync_playwright = chromium_or_skip()
    pages = sorted(p.parent.name for p in (built_site / "concepts").glob("*/index.html"))
    cut: list[str] = []
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 360, "height": 740})
            outside = _offline(page)
            # Images and scripts play no part in how code is laid out: leave them out, to keep
            # the sweep fast (routes registered last run first).
            page.route(re.compile(r"\.(svg|png|js)(\?.*)?$"), lambda r: r.abort())
            for name in pages:
                page.goto(f"{site_url}/concepts/{name}/", wait_until="domcontentloaded")
                page.wait_for_function("() => document.fonts.status === 'loaded'")
                cut += [f"{name} at 360 px: {block}" for block in page.evaluate(_OVERFLOWING_CODE)]

            page = browser.new_page(viewport={"width": 1280, "height": 900})
            outside += _offline(page)
            page.goto(f"{site_url}/concepts/allreduce-vs-parameter-servers/", wait_until="load")
            cut += [f"allreduce-vs-parameter-servers: {block}" for block in page.evaluate(_OVERFLOWING_CODE)]
            details = page.locator("details", has_text="The whole file: reference_impl/comm/ring.py")
            assert not details.locator("pre").first.is_visible(), "the whole file is not collapsed"
            details.locator("summary").click()
            assert details.locator("pre").first.is_visible(), "the whole file does not open on a click"
            cut += [f"ring.py opened: {block}" for block in page.evaluate(_OVERFLOWING_CODE)]
        finally:
            browser.close()
    assert len(pages) > 30
    assert not outside, f"requests outside 127.0.0.1: {outside}"
    assert not cut, f"{len(cut)} code blocks cut at the right edge:\n" + "\n".join(cut[:20])


# --------------------------------------------------------------------------- search


def test_every_concept_page_carries_its_search_boost_into_the_index(built_site: Path) -> None:
    index = json.loads((built_site / "search" / "search_index.json").read_text(encoding="utf-8"))
    boosts: dict[str, set] = {}
    for entry in index["docs"]:
        page = entry["location"].split("#")[0]
        boosts.setdefault(page, set()).add(entry.get("boost"))
    concepts = sorted(p.stem for p in (DOCS / "concepts").glob("*.md"))
    for name in concepts:
        assert boosts.get(f"concepts/{name}/") and None not in boosts[f"concepts/{name}/"], \
            f"concepts/{name}: entries without a search boost: {boosts.get(f'concepts/{name}/')}"
    reference = {b for page, bs in boosts.items() if page.startswith("reference/") for b in bs}
    concept = {b for page, bs in boosts.items() if page.startswith("concepts/") for b in bs}
    assert max(b or 1 for b in reference) < min(concept), "API reference pages are not ranked below concept pages"


def _search(page, query: str) -> list[str]:
    """Type ``query`` into the search box; the result pages' URLs, best first."""
    page.locator("label.md-search__icon, input.md-search__input").first.click()
    page.locator("input.md-search__input").fill("")
    page.keyboard.type(query)
    page.wait_for_function(
        "q => document.querySelector('.md-search-result__meta')?.textContent.match(/\\d/) && "
        "document.querySelector('input.md-search__input').value === q", arg=query)
    page.wait_for_selector(".md-search-result__item", state="visible")
    return page.eval_on_selector_all(".md-search-result__item > a.md-search-result__link",
                                     "els => els.map(e => new URL(e.href).pathname)")


def _search_from_home(site_url: str, query: str) -> tuple[list[str], list[str]]:
    """``query`` typed into the search box of the home page, in Chromium with every request
    outside 127.0.0.1 aborted (the test fails if there was one): the result pages' URLs, best
    first, and the texts the results mark as matches."""
    sync_playwright = chromium_or_skip()
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            outside = _offline(page)
            page.goto(f"{site_url}/", wait_until="load")
            results = _search(page, query)
            marked = page.eval_on_selector_all(".md-search-result__item mark", "els => els.map(e => e.textContent)")
        finally:
            browser.close()
    assert not outside, f"search requested resources outside 127.0.0.1: {outside}"
    return results, marked


@pytest.mark.parametrize("query, first", [
    ("stale synchronous", "/concepts/consistency-models/"),
    ("ring allreduce", "/concepts/allreduce-vs-parameter-servers/"),
])
def test_search_lists_the_concept_page_first(site_url: str, query: str, first: str) -> None:
    results, _ = _search_from_home(site_url, query)
    assert results, f"no results for {query!r}"
    assert results[0] == first, f"{query!r}: first result {results[0]}, expected {first}; all: {results[:8]}"


@pytest.mark.parametrize("query", ["参数服务器", "全归约", "异步随机梯度下降"])
def test_a_chinese_query_finds_the_glossary_term_highlighted(site_url: str, query: str) -> None:
    """Chinese text is indexed as words (jieba, with the glossary's terms kept whole), so a
    Chinese term finds the glossary, and the result marks that term, not the whole table."""
    assert query in (DOCS / "glossary.md").read_text(encoding="utf-8"), f"{query} is not a glossary term"
    results, marked = _search_from_home(site_url, query)
    assert "/glossary/" in results, f"{query!r}: the glossary is not among the results {results}"
    assert query in marked, f"{query!r}: the result does not mark the term (marked: {marked[:10]})"
