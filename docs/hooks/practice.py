"""MkDocs hook: the question bank as data for the practice page (``assets/practice/bank.json``).

Every question page ``docs/questions/<id>.md`` and its answer file ``docs/answers/<id>.md``
(the single source of the question and the model answer) become one entry of the bank:

* ``id``, ``title``, ``topic``, ``level`` and ``url``: from the page's heading and tags;
* ``question`` and ``answer``: the answer file's sections, rendered to HTML with the site's
  Markdown extensions and its MathML conversion (``docs/hooks/math.py``);
* ``rubric``: the 3 to 6 points an interviewer listens for (the rule is ``rubric_items``);
* ``wrong``: the page's "Common wrong answer" boxes, the claim and why it fails;
* ``follow_ups``: the page's follow-up questions;
* ``pages`` and ``exercises``: the concept pages and exercises its "Deeper explanation" links
  to, which a mock interview's report lists for the points that were missed.

``bank_entries`` works on the sources alone, so tests/test_answers.py checks the same rubric
the page shows. A question whose rubric cannot be made fails the build, naming the file.
"""
from __future__ import annotations

import importlib.util
import json
import posixpath
import re
from pathlib import Path

RUBRIC_MIN, RUBRIC_MAX = 3, 6
BANK_PATH = "assets/practice/bank.json"
BANK_VERSION = 1

_SECTION_MARK = re.compile(r"^<!-- --8<-- \[(start|end):([a-z][-a-z0-9]*)\] -->$", re.MULTILINE)
_TAG = re.compile(r'^\s*-\s*"(topic|level): ([^"]+)"\s*$', re.MULTILINE)
_TITLE = re.compile(r"^# (.+?)(?:\s*\{#[^}]*\})?\s*$", re.MULTILINE)
_WRONG = re.compile(r'^(?:!!!|\?\?\?\+?) failure "Common wrong answer: (.*)"\n((?:(?: {4}.*)?\n)+)', re.MULTILINE)
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_EXERCISE = re.compile(r"exercises/index\.md#exercise-(\d{2})")
# A sentence ends at . ! or ? followed by white space, except after the usual abbreviations.
_SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bvs\.)(?<!\betc\.)(?<=[.!?])\s+")


class RubricError(ValueError):
    """A question whose rubric cannot be made from its answer file."""


def answer_sections(path: Path) -> dict[str, str]:
    """The named ``--8<--`` sections of an answer file, in order."""
    text = path.read_text(encoding="utf-8")
    out: dict[str, str] = {}
    start = None
    for mark in _SECTION_MARK.finditer(text):
        kind, name = mark.groups()
        if kind == "start":
            start = (name, mark.end())
        elif start is not None and start[0] == name:
            out[name] = text[start[1]:mark.start()].strip("\n")
            start = None
    return out


def bullets(markdown: str) -> list[str]:
    """The top-level ``* `` items of a Markdown list, each with its continuation lines joined."""
    items: list[str] = []
    for line in markdown.split("\n"):
        if line.startswith("* "):
            items.append(line[2:].strip())
        elif line.startswith("  ") and items:
            items[-1] += " " + line.strip()
    return items


def sentences(markdown: str) -> list[str]:
    """The sentences of a paragraph (three words or more each)."""
    text = " ".join(markdown.split())
    return [s for s in _SENTENCE_END.split(text) if len(s.split()) >= 3]


def rubric_items(sections: dict[str, str]) -> tuple[str, list[str]]:
    """The rubric of one answer file, as (where it comes from, its points in Markdown).

    The rule, first that applies:

    1. a ``rubric`` section (a bulleted list) when the file has one;
    2. the bullets of its ``points`` and ``points-<topic>`` sections, when there are 3 to 6;
    3. the sentences of the model answer, one point each (a model answer has 2 to 5).

    The result must have 3 to 6 points; ``RubricError`` otherwise."""
    if "rubric" in sections:
        source, items = "rubric", bullets(sections["rubric"])
    else:
        points = [b for name, body in sections.items() if name.startswith("points") for b in bullets(body)]
        if RUBRIC_MIN <= len(points) <= RUBRIC_MAX:
            source, items = "points", points
        else:
            source, items = "answer", sentences(sections.get("answer", ""))
    if not RUBRIC_MIN <= len(items) <= RUBRIC_MAX:
        raise RubricError(f"{len(items)} rubric points from its {source!r} section, want "
                          f"{RUBRIC_MIN} to {RUBRIC_MAX}: add a 'rubric' section (a bulleted list)")
    return source, items


def _section(markdown: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, flags=re.M | re.S)
    return "" if match is None else match.group(1)


def _resolve(target: str) -> str:
    """A link of a page under questions/ as a URL relative to the site root (directory URLs)."""
    path, _, anchor = target.partition("#")
    path = posixpath.normpath(posixpath.join("questions", path))
    if path.endswith("index.md"):
        path = path[: -len("index.md")]
    elif path.endswith(".md"):
        path = path[:-3] + "/"
    return path + (f"#{anchor}" if anchor else "")


def bank_entries(docs: Path) -> list[dict]:
    """One entry per question page, in Markdown (``render`` turns the text fields into HTML)."""
    assignments = {p.name[:2]: p.name for p in (docs.parent / "exercises" / "source").iterdir() if p.is_dir()}
    entries = []
    pages = sorted((docs / "questions").glob("n*.md")) + sorted((docs / "questions").glob("l*.md"))
    for page in pages:
        text = page.read_text(encoding="utf-8")
        answer = docs / "answers" / page.name
        sections = answer_sections(answer)
        try:
            source, rubric = rubric_items(sections)
        except RubricError as exc:
            raise RubricError(f"docs/answers/{page.name}: {exc}") from None
        tags = dict(_TAG.findall(text))
        title = _TITLE.search(text).group(1)
        wrong = []
        for claim, body in _WRONG.findall(text):
            paragraph = "\n".join(line[4:] for line in body.split("\n")).strip().split("\n\n")[0]
            wrong.append({"claim": claim.strip(), "why": paragraph})
        deeper = _section(text, "Deeper explanation")
        links, exercises = [], []
        for label, target in _LINK.findall(deeper):
            if "://" in target or not target.split("#")[0].endswith(".md"):
                continue
            number = _EXERCISE.search(target)
            if number:
                exercise = {"label": label, "url": _resolve(target),
                            "assignment": assignments.get(number.group(1), "")}
                if exercise not in exercises:
                    exercises.append(exercise)
            elif target.startswith("../concepts/") or target.startswith("../calculators/"):
                link = {"label": label, "url": _resolve(target)}
                if link not in links:
                    links.append(link)
        entries.append({
            "id": page.stem,
            "title": title,
            "topic": tags.get("topic", ""),
            "level": tags.get("level", ""),
            "url": f"questions/{page.stem}/",
            "question": sections["question"],
            "answer": sections["answer"],
            "rubric_source": source,
            "rubric": rubric,
            "wrong": wrong,
            "follow_ups": bullets(_section(text, "Follow-up questions")),
            "pages": links,
            "exercises": exercises,
        })
    return entries


def _relink(markdown: str) -> str:
    """Links of a question page's text, rewritten for the practice page (``practice/``)."""
    def one(match: re.Match) -> str:
        label, target = match.groups()
        if "://" in target or target.startswith("#") or not target.split("#")[0].endswith(".md"):
            return match.group(0)
        return f"[{label}](../{_resolve(target)})"
    return _LINK.sub(one, markdown)


def _markdown_renderer(config):
    """Markdown to HTML with the site's extensions, math turned into MathML as on the pages."""
    import markdown

    spec = importlib.util.spec_from_file_location("_practice_math", Path(__file__).with_name("math.py"))
    math = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(math)

    class _Where:  # what math.py's error messages name
        class file:
            src_uri = BANK_PATH

    md = markdown.Markdown(extensions=config["markdown_extensions"], extension_configs=config["mdx_configs"])

    def render(text: str, inline: bool = False) -> str:
        md.reset()
        out = math.on_page_content(md.convert(_relink(text)), _Where, config, None)
        if inline and out.startswith("<p>") and out.endswith("</p>") and out.count("<p>") == 1:
            out = out[3:-4]
        return out

    return render


def on_post_build(config, **kwargs) -> None:
    docs = Path(config["docs_dir"])
    render = _markdown_renderer(config)
    bank = []
    for entry in bank_entries(docs):
        entry = dict(entry)
        entry["question"] = render(entry["question"])
        entry["answer"] = render(entry["answer"])
        entry["rubric"] = [render(item, inline=True) for item in entry["rubric"]]
        entry["wrong"] = [{"claim": render(w["claim"], inline=True), "why": render(w["why"])} for w in entry["wrong"]]
        entry["follow_ups"] = [render(item, inline=True) for item in entry["follow_ups"]]
        bank.append(entry)
    out = Path(config["site_dir"]) / BANK_PATH
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"version": BANK_VERSION, "questions": bank}, ensure_ascii=False, indent=1),
                   encoding="utf-8")
