"""MkDocs hook: rank the pages that explain above the pages that list.

The site's search (Material's lunr index) scores a section by how often and where the
query's words occur in it. The API reference pages repeat the words of every docstring, so a
query such as "stale synchronous" used to list ``reference/ps`` and other API pages above the
concept page that explains it. Material reads a per-page boost from the page's front matter
(``search: boost: N``, copied into the page's entries of ``search/search_index.json`` and
applied by lunr as a document boost). This hook sets that boost in ``page.meta`` for every
page of an area, before Material indexes the page (``on_page_context``), so a new page gets
it without anyone writing front matter. A page's own ``search: boost:`` wins.
"""
from __future__ import annotations

# Boost by the first folder of the page's source path; pages elsewhere keep lunr's 1.
BOOSTS = {
    "concepts/": 4.0,   # the explanations: what a reader searching a term wants first
    "questions/": 2.0,  # the interview questions with their model answers
    "reference/": 0.5,  # the API reference, generated from docstrings
}


def boost_for(src_uri: str) -> float | None:
    for prefix, boost in BOOSTS.items():
        if src_uri.startswith(prefix):
            return boost
    return None


def on_page_markdown(markdown: str, page, config, files) -> str:
    boost = boost_for(page.file.src_uri)
    if boost is not None:
        search = page.meta.get("search")
        search = dict(search) if isinstance(search, dict) else {}
        search.setdefault("boost", boost)
        page.meta["search"] = search
    return markdown
