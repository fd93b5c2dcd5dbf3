"""Each answer has one home: a question page and a concept page cannot disagree.

The interviewer's question and the short answer of every question-bank entry are written once,
in ``docs/answers/<id>.md``, as named sections:

* ``question``: the question as an interviewer asks it;
* ``answer``: the model answer, two to five sentences;
* ``points`` or ``points-<topic>`` (optional): key points, a bulleted list each.

Pages include those sections with pymdownx.snippets (``--8<-- "docs/answers/<id>.md:answer"``).
The question page shows the question, the answer and every points section; a concept page
shows the question and the answer, or the points sections of its part of the question, for
each question it answers. The checks below keep it that way:

* a question page's question box and "Model answer" hold includes and nothing else;
* a concept page's question boxes and "Short answer" hold includes (and sub-headings) only;
* every question a concept page says it answers is included on it;
* no page repeats a sentence of an answer file in its own words-for-words copy.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from page_tools import ANSWERS, DOCS, answer_sections, rendered_markdown

QUESTIONS = DOCS / "questions"
CONCEPTS = DOCS / "concepts"
ID = re.compile(r"\bN\d{3}-[QC]\d+\b|(?<![\w.])L\d{2}\b")  # the notes' IDs and the syllabus's (L01 …)
INCLUDE = re.compile(r'^(?P<indent> *)--8<-- "docs/answers/(?P<file>[a-z0-9-]+)\.md:(?P<section>[a-z][-a-z0-9]*)"$')
POINTS = re.compile(r"points(-[a-z0-9]+)*")


def question_pages() -> list[Path]:
    return sorted(QUESTIONS.glob("n*.md")) + sorted(QUESTIONS.glob("l*.md"))


def answer_files() -> list[Path]:
    return sorted(ANSWERS.glob("*.md"))


def section_body(markdown: str, heading: str) -> str | None:
    """Text under ``## heading`` up to the next ``## `` heading (None if there is no such heading)."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, flags=re.M | re.S)
    return None if match is None else match.group(1)


def question_boxes(markdown: str) -> list[tuple[str, list[str]]]:
    """Every ``!!! question "title"`` admonition: (title, its indented body lines)."""
    boxes = []
    for match in re.finditer(r'^!!! question "([^"]*)"\n((?:(?:    .*)?\n)+)', markdown, flags=re.M):
        boxes.append((match.group(1), [line for line in match.group(2).split("\n") if line.strip()]))
    return boxes


def includes(lines: list[str]) -> list[tuple[str, str]]:
    """(answer file stem, section) of each include line; a line that is not one is an error."""
    out = []
    for line in lines:
        match = INCLUDE.match(line)
        assert match, f"expected only includes of docs/answers/ here, found: {line.strip()[:90]!r}"
        out.append((match.group("file"), match.group("section")))
    return out


# --------------------------------------------------------------------------- the answer files


@pytest.mark.parametrize("answer", answer_files(), ids=lambda p: p.stem)
def test_answer_file_has_a_question_an_answer_and_only_points_besides(answer: Path) -> None:
    assert (QUESTIONS / answer.name).is_file(), f"{answer.name} answers no question page"
    sections = answer_sections(answer)
    assert list(sections)[:2] == ["question", "answer"], \
        f"{answer.name}: sections {list(sections)}, want 'question' and 'answer' first"
    for name, body in sections.items():
        assert body.strip(), f"{answer.name}: section {name!r} is empty"
        if name not in ("question", "answer"):
            assert POINTS.fullmatch(name), f"{answer.name}: section {name!r} is not 'points' or 'points-<topic>'"
            items = [line for line in body.split("\n") if line and not line.startswith("  ")]
            assert items and all(line.startswith("* ") for line in items), \
                f"{answer.name}: section {name!r} must be a bulleted list ('* ' items)"
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", sections["answer"]) if len(s.split()) >= 3]
    assert 2 <= len(sentences) <= 5, f"{answer.name}: the answer has {len(sentences)} sentences (want 2 to 5)"


def test_every_question_page_has_an_answer_file() -> None:
    missing = [p.name for p in question_pages() if not (ANSWERS / p.name).is_file()]
    assert not missing, f"question pages without docs/answers/<id>.md: {missing}"


# --------------------------------------------------------------------------- question pages


@pytest.mark.parametrize("page", question_pages(), ids=lambda p: p.stem)
def test_question_page_includes_its_question_and_every_section_of_its_answer(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    boxes = question_boxes(text)
    assert len(boxes) == 1, f"{page.name}: {len(boxes)} question boxes, want 1"
    assert includes(boxes[0][1]) == [(page.stem, "question")], f"{page.name}: the question box"
    body = section_body(text, "Model answer")
    assert body is not None, f"{page.name}: no '## Model answer'"
    sections = [s for s in answer_sections(ANSWERS / page.name) if s != "question"]
    got = includes([line for line in body.split("\n") if line.strip()])
    assert got == [(page.stem, s) for s in sections], \
        f"{page.name}: 'Model answer' must include {sections} of docs/answers/{page.name}, in order; has {got}"


# --------------------------------------------------------------------------- concept pages


def answered_ids(markdown: str) -> list[str]:
    """The IDs the page's opening paragraph says it answers ("This page answers **N002-Q8** …")."""
    body = re.sub(r"^# .*\n", "", markdown, count=1).lstrip("\n")
    opening = body.split("\n\n", 1)[0]
    return sorted(set(ID.findall(opening)))


@pytest.mark.parametrize("page", sorted(CONCEPTS.glob("*.md")), ids=lambda p: p.stem)
def test_concept_page_includes_the_answers_it_gives(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    answered = answered_ids(text)
    assert answered, f"{page.name}: its opening paragraph names no question it answers"
    boxes = question_boxes(text)
    assert boxes, f"{page.name}: no question box"
    shown = set()
    for title, lines in boxes:
        got = includes(lines)
        assert len(got) == 1 and got[0][1] == "question", f"{page.name}: box {title!r} must include one :question"
        stem = got[0][0]
        assert title == f"{stem.upper()}, as an interviewer asks it", \
            f"{page.name}: box {title!r} should be titled '{stem.upper()}, as an interviewer asks it'"
        shown.add(stem.upper())
    assert set(answered) <= shown, f"{page.name}: answers {sorted(set(answered) - shown)} without showing the question"
    body = section_body(text, "Short answer")
    assert body is not None, f"{page.name}: no '## Short answer'"
    lines = [line for line in body.split("\n") if line.strip() and not line.startswith("### ")]
    got = includes(lines)
    assert got, f"{page.name}: the short answer includes nothing"
    for stem, section in got:
        assert stem.upper() in shown, f"{page.name}: the short answer includes {stem} but the page does not ask it"
        available = answer_sections(ANSWERS / f"{stem}.md")
        assert section in available and section != "question", \
            f"{page.name}: docs/answers/{stem}.md has no answer section {section!r} (has {list(available)})"
    assert {stem.upper() for stem, _ in got} == shown, \
        f"{page.name}: every question asked on the page needs its answer (or points) in the short answer"


# --------------------------------------------------------------------------- no second copy


def _runs(text: str, n: int = 10) -> set[str]:
    words = re.findall(r"[\w'’-]+", text.lower())
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def test_no_page_copies_an_answer_instead_of_including_it() -> None:
    owned: dict[str, str] = {}
    for answer in answer_files():
        for name, body in answer_sections(answer).items():
            for run in _runs(body):
                owned.setdefault(run, f"{answer.name}:{name}")
    copies = []
    for page in sorted(DOCS.rglob("*.md")):
        if page.parent == ANSWERS:
            continue
        raw = "\n".join(line for line in page.read_text(encoding="utf-8").split("\n") if "--8<--" not in line)
        hits = sorted({owned[run] for run in _runs(raw) if run in owned})
        if hits:
            copies.append(f"{page.relative_to(DOCS)} repeats text of {', '.join(hits)}")
    assert not copies, "include the answer instead of copying it:\n" + "\n".join(copies)


def test_rendered_pages_expand_every_include() -> None:
    for page in question_pages() + sorted(CONCEPTS.glob("*.md")):
        assert 'docs/answers/' not in rendered_markdown(page), f"{page.name}: an include was not expanded"
