"""What the page tests share: pages as a reader sees them, and their figures against the data.

* ``rendered_markdown``: a page with its ``--8<--`` includes expanded (each question's text
  and short answer live once, in ``docs/answers/``, and pages include them);
* ``answer_sections``: the named sections of one answer file;
* ``assert_pages_quote``: a page that quotes a measured figure must say what the JSON says.
  Each test module that owns a benchmark lists ``(page, sentence)`` pairs, the sentences
formatted from the committed ``docs/assets/bench/*.json``; ``assert_pages_quote`` collects
every sentence a page no longer contains (whitespace-insensitive) and fails once, naming
them all, so re-running a benchmark says exactly which sentences to update.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def assert_pages_quote(quotes: Iterable[tuple[Path, str]]) -> None:
    """Every ``(page, sentence)``: the page (a path under docs/) contains the sentence."""
    bodies: dict[Path, str] = {}
    stale = []
    for page, sentence in quotes:
        if page not in bodies:
            bodies[page] = " ".join(rendered_markdown(page).split())
        if sentence not in bodies[page]:
            stale.append(f"{page.relative_to(DOCS)} should say: {sentence}")
    assert not stale, "figures that no longer match docs/assets/bench/*.json:\n" + "\n".join(stale)


def rendered_markdown(page: Path) -> str:
    """The page's Markdown with its ``--8<--`` includes expanded, as the site build sees it.

    Pages include each question's text and short answer from ``docs/answers/`` (and code from
    ``reference_impl/``) with pymdownx.snippets; this runs that extension's own preprocessor
    with the site's settings, so a test reads what a reader reads."""
    import markdown
    from pymdownx.snippets import SnippetExtension

    root = DOCS.parent
    md = markdown.Markdown(extensions=[SnippetExtension(base_path=[str(root)], check_paths=True,
                                                        dedent_subsections=True)])
    lines = page.read_text(encoding="utf-8").split("\n")
    return "\n".join(md.preprocessors["snippet"].run(lines))


ANSWERS = DOCS / "answers"
_SECTION_MARK = re.compile(r"^<!-- --8<-- \[(start|end):([a-z][-a-z0-9]*)\] -->$", re.MULTILINE)


def answer_sections(answer_file: Path) -> dict[str, str]:
    """The named sections of an answer file (``question``, ``answer``, ``points``…), in order.

    Raises ``ValueError`` naming the file when a section is opened twice, nested, or not closed:
    an answer file is a flat list of sections."""
    text = answer_file.read_text(encoding="utf-8")
    out: dict[str, str] = {}
    open_name, open_end = None, 0
    for mark in _SECTION_MARK.finditer(text):
        kind, name = mark.groups()
        if kind == "start":
            if open_name is not None:
                raise ValueError(f"{answer_file.name}: section {name!r} starts inside {open_name!r}")
            if name in out:
                raise ValueError(f"{answer_file.name}: section {name!r} appears twice")
            open_name, open_end = name, mark.end()
        else:
            if name != open_name:
                raise ValueError(f"{answer_file.name}: [end:{name}] does not close {open_name!r}")
            out[name] = text[open_end:mark.start()].strip("\n")
            open_name = None
    if open_name is not None:
        raise ValueError(f"{answer_file.name}: section {open_name!r} is never closed")
    return out
