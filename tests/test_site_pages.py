"""What a reader sees on the built pages: box titles, question pages, and the titles of pages.

* No admonition or collapsible-block title shows a backslash: a title written with escaped
  quotes (``!!! failure "Wrong answer: \\"…\\""``) renders the backslashes literally, since
  Python-Markdown's admonition title is the text between the outer quotes, taken as it is.
* A question page keeps its model answer (and its key points) in one collapsed block, so that
  the reader answers aloud before reading it: nothing of the answer lies outside the closed
  ``<details>``, and in Chromium the answer is hidden until its summary is clicked.
* A question page's title carries words, not only its ID (N000-Q1 …): in the navigation, in
  the browser's title bar and in the search index, and the three agree.

The site is the session's strict build (``built_site`` in tests/conftest.py).
"""
from __future__ import annotations

import json
import re
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from browser_tools import CHROMIUM, CHROMIUM_ARGS, chromium_or_skip, keep_offline

ID = re.compile(r"N\d{3}-[QC]\d+|L\d{2}")
QUESTION_DIR = re.compile(r"questions/(n\d{3}-[qc]\d+|l\d{2})/index\.html$")


def question_pages(site: Path) -> list[Path]:
    pages = sorted(p for p in (site / "questions").glob("*/index.html")
                   if QUESTION_DIR.search(p.relative_to(site).as_posix()))
    assert len(pages) >= 55, f"only {len(pages)} question pages were built"
    return pages


def _text(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", "", html)).split())


# --------------------------------------------------------------------------- box titles


def box_titles(html: str) -> list[str]:
    """The title text of every admonition (``p.admonition-title``) and collapsible block (``summary``)."""
    titles = re.findall(r'<p class="admonition-title">(.*?)</p>', html, flags=re.S)
    titles += re.findall(r"<summary\b[^>]*>(.*?)</summary>", html, flags=re.S)
    return [_text(t) for t in titles]


def test_no_box_title_shows_a_backslash(built_site: Path) -> None:
    bad, count = [], 0
    for page in sorted(built_site.rglob("*.html")):
        titles = box_titles(page.read_text(encoding="utf-8"))
        count += len(titles)
        bad += [f"{page.relative_to(built_site)}: {t}" for t in titles if "\\" in t]
    assert count > 100, f"found only {count} box titles: the title pattern no longer matches the theme's HTML"
    assert not bad, f"{len(bad)} box titles show a backslash (write “…” instead of \\\"…\\\"):\n" + "\n".join(bad)


# --------------------------------------------------------------------------- model answers


class _TopLevel(HTMLParser):
    """The top-level elements (tag, attributes) and stray text of an HTML fragment."""

    VOID = {"br", "hr", "img", "input", "meta", "link", "wbr"}

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.stray: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        if self.depth == 0:
            self.elements.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.depth += 1

    def handle_endtag(self, tag) -> None:
        if tag not in self.VOID:
            self.depth -= 1

    def handle_data(self, data) -> None:
        if self.depth == 0 and data.strip():
            self.stray.append(data.strip())


def test_every_question_page_keeps_its_model_answer_collapsed(built_site: Path) -> None:
    """Between the "Model answer" heading and the next one there is one closed ``<details>``, nothing else."""
    problems = []
    for page in question_pages(built_site):
        html = page.read_text(encoding="utf-8")
        name = page.parent.name
        match = re.search(r'<h2 id="model-answer">.*?</h2>(.*?)(?=<h2\b)', html, flags=re.S)
        if match is None:
            problems.append(f"{name}: no 'Model answer' heading")
            continue
        top = _TopLevel()
        top.feed(match.group(1))
        tags = [tag for tag, _ in top.elements]
        if tags != ["details"] or top.stray:
            problems.append(f"{name}: under 'Model answer' {tags} and text {top.stray[:2]}, want one <details>")
            continue
        attrs = top.elements[0][1]
        if "open" in attrs:
            problems.append(f"{name}: the model answer's block is open on load")
        if len(_text(match.group(1)).split()) < 30:
            problems.append(f"{name}: the collapsed block holds almost nothing")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("ident", ["n000-q1", "l01"])
def test_model_answer_is_hidden_until_the_reader_opens_it(site_url: str, ident: str) -> None:
    sync_playwright = chromium_or_skip()
    outside: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(15_000)

            keep_offline(page, outside)
            page.goto(f"{site_url}/questions/{ident}/", wait_until="load")
            block = page.locator("h2#model-answer ~ details").first
            summary, answer = block.locator("summary"), block.locator("p").first
            assert summary.is_visible(), "the model answer's summary line is not shown"
            assert block.get_attribute("open") is None and not answer.is_visible(), \
                "the model answer is visible before the reader opens it"
            summary.click()
            answer.wait_for(state="visible")
            assert block.get_attribute("open") is not None
            assert len(answer.inner_text().split()) >= 20, "the opened block shows no answer"
            assert block.locator("li").count() >= 2, "the key points are not inside the opened block"
        finally:
            browser.close()
    assert not outside, f"requests outside 127.0.0.1: {outside}"


# --------------------------------------------------------------------------- page titles


def human_words(title: str) -> list[str]:
    """The words of a title other than IDs and code names (``sparse_table_pull``)."""
    words = [w.strip("()[],.:;?!·“”\"'") for w in title.split()]
    return [w for w in words if re.search(r"[A-Za-z]", w) and not ID.fullmatch(w) and "_" not in w]


def test_question_pages_have_human_titles_in_navigation_and_search(built_site: Path) -> None:
    index = json.loads((built_site / "search" / "search_index.json").read_text(encoding="utf-8"))
    searched = {doc["location"]: _text(doc["title"]) for doc in index["docs"]}
    nav_html = (built_site / "questions" / "index.html").read_text(encoding="utf-8")
    nav = {href: _text(text) for href, text in re.findall(
        r'<a href="([^"#]+/)" class="md-nav__link">\s*<span class="md-ellipsis">(.*?)</span>', nav_html, flags=re.S)}
    problems = []
    for page in question_pages(built_site):
        name = page.parent.name
        ident = name.upper()
        html = page.read_text(encoding="utf-8")
        in_search = searched.get(f"questions/{name}/")
        title_bar = _text(re.search(r"<title>(.*?)</title>", html, flags=re.S).group(1))
        in_nav = nav.get(f"{name}/")
        if in_search is None or in_nav is None:
            problems.append(f"{name}: search entry {in_search!r}, navigation entry {in_nav!r}")
            continue
        # "N000-Q1 · Words" in the search index (the page's heading), "N000-Q1 Words" in the navigation.
        words = in_search.removeprefix(f"{ident} · ")
        if words == in_search:
            problems.append(f"{name}: search title {in_search!r} does not start with '{ident} · '")
        if len(human_words(words)) < 2:
            problems.append(f"{name}: {in_search!r} is no title a reader understands (want at least two words)")
        if in_nav != f"{ident} {words}":
            problems.append(f"{name}: navigation says {in_nav!r}, the page's heading {in_search!r}")
        if not title_bar.startswith(f"{ident} {words} - "):
            problems.append(f"{name}: the title bar says {title_bar!r}")
    assert not problems, "\n".join(problems)


def test_human_words_ignores_ids_and_code_names() -> None:
    assert human_words("N003-Q6 sparse_table_pull") == []
    assert human_words("N000-Q1") == []
    assert len(human_words("Pulling embedding rows from sharded tables (sparse_table_pull)")) == 6
    assert human_words("fp16, bf16 and fp8") == ["fp16", "bf16", "and", "fp8"]


# --------------------------------------------------------------------------- measured tables


PS_TABLES = {  # the page that explains each table of ``python -m benchmarks ps`` (plot_ps's summary parts)
    "concepts/parameter-servers": ["Traffic per step", "Pull + push throughput"],
    "concepts/consistency-models": ["Time to target"],
    "concepts/wide-and-deep": ["Wide &amp; Deep on InstEval", "Synthetic click log"],
    "concepts/feature-columns": ["Hash-bucket collisions", "Collisions against the bucket count"],
}


def test_each_measured_table_is_on_the_page_that_explains_it(built_site: Path) -> None:
    """The parameter-server page's "Measured" section explains its own two tables; the others sit
    beside their explanations, each once, and no table caption is the garbled one of old."""
    every = [caption for captions in PS_TABLES.values() for caption in captions]
    problems = []
    for page, captions in PS_TABLES.items():
        html = (built_site / page / "index.html").read_text(encoding="utf-8")
        for caption in every:
            count = html.count(f"<strong>{caption}</strong>")
            want = 1 if caption in captions else 0
            if count != want:
                problems.append(f"{page}: table '{caption}' {count} times, want {want}")
        if "sits at over" in html:
            problems.append(f"{page}: the garbled time-to-target caption")
    assert not problems, "\n".join(problems)
