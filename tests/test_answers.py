"""Each answer has one home: a question page and a concept page cannot disagree.

The interviewer's question and the short answer of every question-bank entry are written once,
in ``docs/answers/<id>.md``, as named sections:

* ``question``: the question as an interviewer asks it;
* ``answer``: the model answer, two to five sentences;
* ``points`` or ``points-<topic>`` (optional): key points, a bulleted list each;
* ``rubric`` (optional): the 3 to 6 points an interviewer listens for, a bulleted list, for a
  question whose points sections do not already hold 3 to 6 bullets.

The practice page's rubric of each question comes from these sections
(``docs/hooks/practice.py``, ``rubric_items``): the ``rubric`` section if there is one, else
the points bullets when there are 3 to 6, else one point per sentence of the model answer.

Pages include those sections with pymdownx.snippets (``--8<-- "docs/answers/<id>.md:answer"``).
The question page shows the question, the answer and every points section; a concept page
shows the question and the answer, or the points sections of its part of the question, for
each question it answers. The checks below keep it that way:

* a question page's question box and "Model answer" hold includes and nothing else, the
  model answer inside one collapsed block, so that the reader answers before reading it;
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
COLLAPSED = re.compile(r'^\?\?\? success "[^"]+"$')  # collapsed until opened (``???+`` would open it)


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
            assert POINTS.fullmatch(name) or name == "rubric", \
                f"{answer.name}: section {name!r} is not 'points', 'points-<topic>' or 'rubric'"
            items = [line for line in body.split("\n") if line and not line.startswith("  ")]
            assert items and all(line.startswith("* ") for line in items), \
                f"{answer.name}: section {name!r} must be a bulleted list ('* ' items)"
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", sections["answer"]) if len(s.split()) >= 3]
    assert 2 <= len(sentences) <= 5, f"{answer.name}: the answer has {len(sentences)} sentences (want 2 to 5)"


def test_every_question_page_has_an_answer_file() -> None:
    missing = [p.name for p in question_pages() if not (ANSWERS / p.name).is_file()]
    assert not missing, f"question pages without docs/answers/<id>.md: {missing}"


# --------------------------------------------------------------------------- rubrics


def _practice_hook():
    import importlib.util

    spec = importlib.util.spec_from_file_location("practice_hook", DOCS / "hooks" / "practice.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("answer", answer_files(), ids=lambda p: p.stem)
def test_every_question_has_a_rubric_of_three_to_six_points_from_its_answer_file(answer: Path) -> None:
    hook = _practice_hook()
    sections = answer_sections(answer)
    source, rubric = hook.rubric_items(sections)
    assert 3 <= len(rubric) <= 6, f"{answer.name}: {len(rubric)} rubric points"
    # every point is text of the answer file itself (no second copy to drift from the answer)
    flat = " ".join(" ".join(body.split()) for body in sections.values())
    for point in rubric:
        assert len(point.split()) >= 3 and point in flat, f"{answer.name}: rubric point not in the file: {point[:80]!r}"
    if source == "answer":  # the fallback is one point per sentence: they must add up to the answer
        assert " ".join(rubric) == " ".join(sections["answer"].split()), f"{answer.name}: sentences lost"


def test_the_rubric_rule_prefers_a_rubric_section_then_points_then_sentences() -> None:
    hook = _practice_hook()
    three = "* one point here\n* two points here\n* three points here"
    answer = "First sentence is here. Second sentence, e.g. this one, is here. Third one is here."
    assert hook.rubric_items({"answer": answer, "points": three, "rubric": "* a b c\n* d e f\n* g h i"}) \
        == ("rubric", ["a b c", "d e f", "g h i"])
    assert hook.rubric_items({"answer": answer, "points": three})[0] == "points"
    assert hook.rubric_items({"answer": answer, "points": three + "\n" + three + "\n* seven is here"}) \
        == ("answer", ["First sentence is here.", "Second sentence, e.g. this one, is here.", "Third one is here."])
    with pytest.raises(hook.RubricError):
        hook.rubric_items({"answer": "Only one sentence here. And a second one here.", "points": "* x y z"})


def test_every_question_page_in_the_bank_has_its_title_topic_level_and_wrong_answers() -> None:
    bank = _practice_hook().bank_entries(DOCS)
    assert [e["id"] for e in bank] == [p.stem for p in question_pages()]
    for entry in bank:
        page = (QUESTIONS / f"{entry['id']}.md").read_text(encoding="utf-8")
        assert entry["title"] and entry["topic"] and entry["level"] in ("basic", "intermediate", "advanced"), entry["id"]
        assert len(entry["wrong"]) == page.count('failure "Common wrong answer:'), entry["id"]
        assert all(w["claim"] and w["why"] for w in entry["wrong"]), entry["id"]
    assert sum(bool(e["wrong"]) for e in bank) >= len(bank) - 5, "the bank lost the pages' common wrong answers"


# --------------------------------------------------------------------------- question pages


@pytest.mark.parametrize("page", question_pages(), ids=lambda p: p.stem)
def test_question_page_includes_its_question_and_every_section_of_its_answer(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    boxes = question_boxes(text)
    assert len(boxes) == 1, f"{page.name}: {len(boxes)} question boxes, want 1"
    assert includes(boxes[0][1]) == [(page.stem, "question")], f"{page.name}: the question box"
    body = section_body(text, "Model answer")
    assert body is not None, f"{page.name}: no '## Model answer'"
    sections = [s for s in answer_sections(ANSWERS / page.name) if s not in ("question", "rubric")]
    # The reader answers aloud first: the answer sits in one collapsed block (``???``, not
    # ``???+``, pymdownx.details) that holds the includes and nothing else.
    lines = [line for line in body.split("\n") if line.strip()]
    assert lines and COLLAPSED.match(lines[0]), \
        f"{page.name}: 'Model answer' must open with a collapsed '??? success \"…\"' block, found {lines[:1]}"
    assert all(line.startswith("    ") for line in lines[1:]), f"{page.name}: an include outside the collapsed block"
    got = includes(lines[1:])
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
