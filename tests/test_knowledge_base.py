"""The knowledge base covers the notes: question bank, concept pages and exercises link up.

* Every INVENTORY ID (the committed list ``docs/questions/inventory_ids.txt``, checked
  against ``../shared/notes/INVENTORY.md`` when that file is present), and every ID of the
  large-model syllabus the bank answers (``docs/questions/syllabus_ids.txt``: L01, L02 …,
  checked against ``../shared/notes/SYLLABUS.md`` when present), has a question-bank
  page with the ID in its heading and anchor, a topic and a level tag, a model answer (its
  text lives in ``docs/answers/``, see test_answers.py), follow-up questions and a source
  for every "numbers worth knowing" section.
* Every Python snippet on a question-bank page runs (the "common wrong answer" evidence).
* Every concept page names at least one INVENTORY or syllabus ID (and no unknown one) and links to an existing exercise
  section; every exercise notebook's ``lab.concept_page`` names an existing page.
* Every glossary entry links to a page that exists.

All checks read files only (no site build), so the module runs in a few seconds.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from page_tools import assert_pages_quote, rendered_markdown

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
QUESTIONS = DOCS / "questions"
IDS_FILE = QUESTIONS / "inventory_ids.txt"
SYLLABUS_IDS_FILE = QUESTIONS / "syllabus_ids.txt"
INVENTORY = ROOT.parent / "shared" / "notes" / "INVENTORY.md"
SYLLABUS = ROOT.parent / "shared" / "notes" / "SYLLABUS.md"
INVENTORY_ID = re.compile(r"\bN\d{3}-[QC]\d+\b")
SYLLABUS_ID = re.compile(r"(?<![\w.])L\d{2}\b")  # L01 …; not an assembler label such as .L12
ID_PATTERN = re.compile(f"{INVENTORY_ID.pattern}|{SYLLABUS_ID.pattern}")
LEVELS = {"basic", "intermediate", "advanced"}


def _id_list(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def inventory_ids() -> list[str]:
    return _id_list(IDS_FILE)


def syllabus_ids() -> list[str]:
    """The large-model syllabus IDs the question bank answers (not every ID of the syllabus)."""
    return _id_list(SYLLABUS_IDS_FILE)


def question_pages() -> list[Path]:
    """Question-bank entries: n000-q1.md … for the notes, l01.md … for the syllabus."""
    return sorted(QUESTIONS.glob("n*.md")) + sorted(QUESTIONS.glob("l*.md"))


def question_page(ident: str) -> Path:
    return QUESTIONS / f"{ident.lower()}.md"


def sections(markdown: str) -> dict[str, str]:
    """``## Heading`` -> the text under it, up to the next ``##`` heading or admonition."""
    out: dict[str, str] = {}
    for match in re.finditer(r"^## (.+?)\n(.*?)(?=^## |^!!! |\Z)", markdown, flags=re.M | re.S):
        out[match.group(1).strip()] = match.group(2).strip()
    return out


def markdown_links(markdown: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", markdown)


def anchors_of(page: Path) -> set[str]:
    """Heading anchors of a Markdown page: explicit ``{#id}`` ones and toc-style slugs."""
    found: set[str] = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            continue
        explicit = re.search(r"\{#([^}\s]+)", line)
        if explicit:
            found.add(explicit.group(1))
        title = re.sub(r"\{.*\}\s*$", "", line.lstrip("#")).strip().lower()
        found.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", title)).strip("-"))
    return found


# --------------------------------------------------------------------------- question bank


def test_id_list_matches_the_inventory() -> None:
    ids = inventory_ids()
    assert len(ids) == len(set(ids)), "inventory_ids.txt lists an ID twice"
    assert all(INVENTORY_ID.fullmatch(i) for i in ids), [i for i in ids if not INVENTORY_ID.fullmatch(i)]
    if not INVENTORY.is_file():
        pytest.skip(f"{INVENTORY} is not present (clean clone): checked the committed list only")
    text = INVENTORY.read_text(encoding="utf-8")
    listed = []
    for match in re.finditer(r"^- (N\d{3})-([QC]\d+(?:/[QC]\d+)*)", text, flags=re.M):
        listed += [f"{match.group(1)}-{part}" for part in match.group(2).split("/")]
    assert ids == listed, "docs/questions/inventory_ids.txt is out of date with INVENTORY.md"


def test_syllabus_id_list_names_syllabus_items() -> None:
    ids = syllabus_ids()
    assert ids and len(ids) == len(set(ids)), "syllabus_ids.txt is empty or lists an ID twice"
    assert all(SYLLABUS_ID.fullmatch(i) for i in ids), [i for i in ids if not SYLLABUS_ID.fullmatch(i)]
    if not SYLLABUS.is_file():
        pytest.skip(f"{SYLLABUS} is not present (clean clone): checked the committed list only")
    listed = re.findall(r"^- (L\d{2}) ", SYLLABUS.read_text(encoding="utf-8"), flags=re.M)
    assert set(ids) <= set(listed), f"not in SYLLABUS.md: {sorted(set(ids) - set(listed))}"


@pytest.mark.parametrize("ident", inventory_ids() + syllabus_ids())
def test_every_id_has_an_answered_question_page(ident: str) -> None:
    page = question_page(ident)
    assert page.is_file(), f"{ident}: no question-bank page {page.relative_to(ROOT)}"
    text = rendered_markdown(page)
    heading = re.search(r"^# (.+)$", text, flags=re.M)
    assert heading and heading.group(1).startswith(ident), f"{ident}: the page title must start with the ID"
    assert f"{{#{ident.lower()}}}" in heading.group(1), f"{ident}: the title needs the anchor #{ident.lower()}"

    front = re.match(r"---\n(.*?)\n---\n", text, flags=re.S)
    assert front, f"{ident}: no front matter with tags"
    tags = re.findall(r'^\s+- "([^"]+)"$', front.group(1), flags=re.M)
    topics = [t for t in tags if t.startswith("topic: ")]
    levels = [t.removeprefix("level: ") for t in tags if t.startswith("level: ")]
    assert len(topics) == 1 and len(levels) == 1 and levels[0] in LEVELS, f"{ident}: tags {tags}"

    assert '!!! question "As an interviewer asks it"' in text, f"{ident}: no interviewer's question"
    parts = sections(text)
    # The answer itself (2 to 5 sentences, then key points) is checked in test_answers.py.
    assert len(parts.get("Model answer", "").split()) >= 30, f"{ident}: no model answer"
    assert parts.get("Deeper explanation"), f"{ident}: no deeper explanation"
    follow = parts.get("Follow-up questions", "")
    assert follow.count("\n* ") + follow.startswith("* ") >= 2, f"{ident}: fewer than two follow-ups"
    numbers = parts.get("Numbers worth knowing", "")
    assert numbers, f"{ident}: no 'Numbers worth knowing' section"
    for bullet in re.findall(r"^\* (.+?)(?=^\* |\Z)", numbers, flags=re.M | re.S):
        if re.search(r"\d", bullet):
            assert re.search(r"docs/assets/bench/\w+\.json|reference_impl/|computed|snippet|formula|numpy\.finfo",
                             bullet), f"{ident}: a number without a source: {bullet.strip()[:80]}"


def test_question_pages_cite_existing_bench_files_and_pages() -> None:
    for page in question_pages():
        text = rendered_markdown(page)
        for cited in re.findall(r"docs/assets/bench/(\w+\.json)", text):
            assert (DOCS / "assets/bench" / cited).is_file(), f"{page.name} cites a missing {cited}"
        for cited in re.findall(r"`(reference_impl/[\w/]+\.py)`", text):
            assert (ROOT / cited).is_file(), f"{page.name} cites a missing {cited}"
        for link in markdown_links(text):
            if "://" in link:
                continue
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page.name} links to a missing page {link}"
            if anchor and path.suffix == ".md":
                assert anchor in anchors_of(path), f"{page.name} links to a missing anchor {link}"


def _bench(name: str) -> dict:
    return json.loads((DOCS / "assets" / "bench" / f"{name}.json").read_text(encoding="utf-8"))


def cited_figures() -> list[tuple[str, str]]:
    """(page, text it must contain), the text formatted from the committed benchmark results.

    The question bank quotes measured figures; when a benchmark is run again, this says
    which sentences no longer match the data (update the page, not this list).
    """
    ab = _bench("alpha_beta")["fit"]
    ov = _bench("overlap")
    fusion = {(r["ranks"], r["impl"], r["bucket_bytes"]): r["time_s"] for r in ov["results"] if r["part"] == "fusion"}
    unfused, fused = fusion[(4, "ours", 0)], fusion[(4, "ours", 1 << 20)]
    step = next(r for r in ov["results"] if r["part"] == "overlap" and r["ranks"] == 2 and r["target_ratio"] == 1.0)
    model = ov["simulation"]["model"]
    scaling = {(r["interconnect"], r["workers"]): r["efficiency_overlap"] for r in ov["simulation"]["scaling"]}
    gain = ov["simulation"]["gain"]
    best_gain = max(gain, key=lambda r: r["gain"])
    de = _bench("determinism")
    drift = {r["pair"]: max(r["max_abs_diff"]) for r in de["results"]}  # largest during the run
    final = {r["pair"]: r["max_abs_diff"][-1] for r in de["results"]}     # after the last step
    order = de["arrival_order"]
    gr = _bench("graph")
    ratio, per_op = gr["ratio_to_numpy"], gr["dispatch_overhead_us_per_op"]
    ar = {(r["ranks"], r["bytes"], r["impl"]): r for r in _bench("allreduce")["results"]}
    ring64, mpi64 = ar[(2, 64 << 20, "ring")], ar[(2, 64 << 20, "mpi")]
    ic = {(r["profile"], r["bytes"]): r["time_s"] for r in _bench("interconnects")["results"]
          if r["kind"] == "model" and r["ranks"] == 8}
    step_s = model["forward_s"] + model["backward_s"]
    dep = _bench("deploy")
    cross, acc = dep["sweep"]["crossover_density"], dep["accuracy"]
    at95, at90 = acc["sparsities"].index(0.95), acc["sparsities"].index(0.9)
    unrolled = [r for r in dep["sweep"]["compile"] if r["form"] == "unrolled"]
    u0, u1 = unrolled[0], unrolled[-1]
    return [
        ("n000-q1", f"α ≈ {ab['alpha_s'] * 1e6:.1f} µs per message and ≈ {ab['bandwidth_GBps']:.1f} GB/s"),
        ("n000-q1", f"n½, is ≈ {ab['n_half_bytes'] / 1e3:.0f} KB"),
        ("n004-c3", f"was ≈ {ab['n_half_bytes'] / 1e3:.0f} KB"),
        ("n000-q1", f"took {unfused:.2f} s one tensor at a time and {fused:.3f} s"),
        ("n000-q1", f"the same bytes, {unfused / fused:.0f}× faster"),
        ("n000-q4", f"{unfused:.2f} s unfused against {fused:.3f} s in 1 MiB buckets"),
        ("n004-c3", f"measured at {unfused / fused:.0f}× for 1000 small tensors"),
        ("n000-q2", f"made some weight differ by up to {drift['staleness 4']:.2f} in absolute value during the run "
                    f"(the largest weight at the end was {de['settings']['max_abs_weight']:.2f}), and by "
                    f"{final['staleness 4']:.2f} after the last step; with 1 step of staleness, up to "
                    f"{drift['staleness 1']:.2f} during the run and {final['staleness 1']:.2f} at the end"),
        ("n000-q6", f"(largest difference {drift['rerun']:.1f}); 4-step staleness made some weight differ by up to "
                    f"{drift['staleness 4']:.2f} during the run and by {final['staleness 4']:.2f} after the last step"),
        ("n002-q11", f"the largest weight difference from synchronous training was {drift['staleness 1']:.2f} with "
                     f"1 step of staleness and {drift['staleness 4']:.2f} with 4 steps ({final['staleness 1']:.2f} and "
                     f"{final['staleness 4']:.2f} after the last step)"),
        ("n004-c3", f"Staleness of 4 steps moved some weight by up to {drift['staleness 4']:.2f} against synchronous "
                    f"training during a 300-step run ({final['staleness 4']:.2f} after the last step"),
        ("n004-c4", f"Summing in {order['runs']} different arrival orders on {order['ranks']} ranks gave "
                    f"{order['distinct_results']} different results, up to "
                    f"{order['max_abs_diff_vs_rank_order'] * 1e7:.1f} × 10⁻⁷"),
        ("n000-q3", f"forward {model['forward_s'] * 1e3:.0f} ms + backward {model['backward_s'] * 1e3:.0f} ms"),
        ("n000-q3", f"1024 / {step_s:.2f} s ≈ {round(1024 / step_s, -2):,.0f}".replace(",", " ")),
        ("n000-q7", f"falls from {scaling[('10GbE', 2)]:.2f} at 2 workers to {scaling[('10GbE', 16)]:.2f} at 16"),
        ("n001-q4", f"forward {step['forward_s'] * 1e3:.0f} ms, backward {step['backward_s'] * 1e3:.0f} ms, "
                    f"update {step['update_s'] * 1e3:.1f} ms, so backward ≈ {step['backward_s'] / step['forward_s']:.1f}× forward"),
        ("n002-q6", f"Backward ≈ {step['backward_s'] / step['forward_s']:.1f}× forward"),
        ("n002-q6", f"{step['backward_s'] * 1e3:.0f} ms against {step['forward_s'] * 1e3:.0f} ms"),
        ("n004-c5", f"(100 MB gradients, {model['forward_s'] * 1e3:.0f} ms forward, {model['backward_s'] * 1e3:.0f} ms backward)"),
        ("n004-c5", f"by {best_gain['gain']:.2f}× when communication took about as long as the backward pass, "
                    f"{gain[0]['gain']:.2f}× when it was a fifth of it, and {gain[-1]['gain']:.2f}× when it was "
                    f"{1 / gain[-1]['backward_ratio']:.0f} times longer"),
        ("n001-q1", f"took {ratio['graph']:.2f}× the time of hand-written NumPy"),
        ("n001-q1", f"eager mode took {ratio['eager']:.2f}×"),
        ("n001-q9", f"ran at {ratio['graph']:.2f}× NumPy's time"),
        ("n002-q13", f"within {ratio['graph']:.2f}× of hand-written NumPy"),
        ("n002-q3", f"graph mode {ratio['graph']:.2f}× and eager mode {ratio['eager']:.2f}×"),
        ("n002-q3", f"≈ {per_op['graph']:.0f} µs (graph) and ≈ {per_op['eager']:.0f} µs (eager)"),
        ("n001-q10", f"≈ {per_op['graph']:.0f} µs in graph mode and ≈ {per_op['eager']:.0f} µs in eager mode, "
                     f"against ≈ {gr['numpy_us_per_op']:.1f} µs"),
        ("n001-q8", f"about {per_op['graph']:.0f} µs per op on a chain of 1000 tiny ops, against "
                    f"{gr['numpy_us_per_op']:.1f} µs"),
        ("n003-q5", f"took ≈ {gr['numpy_us_per_op']:.1f} µs per op, while the Python-level graph executor added "
                    f"≈ {per_op['graph']:.0f} µs"),
        ("n004-c1", f"our ring took {ring64['time_s'] * 1e3:.1f} ms (bus bandwidth {ring64['busbw_GBps']:.1f} GB/s), "
                    f"the MPI library's allreduce {mpi64['time_s'] * 1e3:.1f} ms"),
        ("n004-c2", f"4 KiB takes {ic[('10GbE', 4096)] * 1e6:.0f} µs on 10 GbE and {ic[('100GbE', 4096)] * 1e6:.0f} µs "
                    f"on 100 GbE"),
        ("n004-c2", f"but {ic[('IB-NDR', 4096)] * 1e6:.0f} µs on InfiniBand NDR; 1 GiB takes "
                    f"{ic[('10GbE', 1 << 30)]:.2f} s on 10 GbE, {ic[('100GbE', 1 << 30)]:.2f} s on 100 GbE and "
                    f"{ic[('IB-NDR', 1 << 30)]:.3f} s on NDR"),
        ("n004-c6", f"SciPy's CSR beat single-threaded dense BLAS up to about {cross['1']['csr_scipy'] * 100:.0f} % "
                    f"density at batch 1 ({cross['64']['csr_scipy'] * 100:.0f} % at batch 64), a NumPy CSR only up to "
                    f"about {cross['1']['csr_numpy'] * 100:.0f} %, and a kernel compiled for the fixed weights (the "
                    f"JIT's bitmask form) up to about {cross['1']['jit_bitmask'] * 100:.0f} %"),
        ("n004-c6", f"kept the benchmark's digits MLP at {acc['gradual']['layer'][at95] * 100:.1f} % test accuracy at "
                    f"95 % sparsity against {acc['dense_accuracy'] * 100:.1f} % dense, while one-shot pruning without "
                    f"retraining fell to {acc['one_shot_layer'][at90] * 100:.1f} % at 90 %"),
        ("n004-c6", f"about {cross['1']['csr_scipy'] * 100:.0f} % density at batch 1, the JIT's bitmask kernel at about "
                    f"{cross['1']['jit_bitmask'] * 100:.0f} %; gradual pruning kept "
                    f"{acc['gradual']['layer'][at95] * 100:.1f} % digits accuracy at 95 % sparsity (dense "
                    f"{acc['dense_accuracy'] * 100:.1f} %)"),
        ("n004-c7", f"was {u0['so_bytes']:,} bytes at {u0['nnz']:,} non-zeros and {u1['so_bytes']:,} bytes at "
                    f"{u1['nnz']:,}, about {(u1['so_bytes'] - u0['so_bytes']) / (u1['nnz'] - u0['nnz']):.0f} bytes "
                    f"per added non-zero"),
    ]


def test_cited_figures_match_the_committed_results() -> None:
    assert_pages_quote((QUESTIONS / f"{page}.md", text) for page, text in cited_figures())


def test_every_snippet_in_the_question_bank_runs() -> None:
    snippets = []
    for page in question_pages():
        for block in re.findall(r"^( *)```python\n(.*?)^\1```", rendered_markdown(page), flags=re.M | re.S):
            indent, code = block
            code = "\n".join(line[len(indent):] for line in code.splitlines())
            snippets.append((page.name, code))
    assert len(snippets) >= 10, f"expected the wrong-answer boxes to carry snippets, found {len(snippets)}"
    # One child process runs them all, each in a fresh namespace, so a snippet sees only what
    # it imports itself (as a reader pasting it would).
    runner = (
        "import io, json, sys, contextlib\n"
        "failures = []\n"
        "for name, code in json.load(sys.stdin):\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(io.StringIO()):\n"
        "            exec(compile(code, name, 'exec'), {'__name__': '__snippet__'})\n"
        "    except Exception as exc:\n"
        "        failures.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print(json.dumps(failures))\n"
    )
    proc = subprocess.run([sys.executable, "-c", runner], input=json.dumps(snippets), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [], proc.stdout


# --------------------------------------------------------------------------- concepts, exercises


def concept_pages() -> list[Path]:
    return sorted((DOCS / "concepts").glob("*.md"))


@pytest.mark.parametrize("page", concept_pages(), ids=lambda p: p.name)
def test_concept_page_names_an_id_and_links_an_exercise(page: Path) -> None:
    text = rendered_markdown(page)
    known = set(inventory_ids()) | set(syllabus_ids())
    named = set(ID_PATTERN.findall(text))
    assert named & known, f"{page.name} names no INVENTORY or syllabus ID"
    assert named <= known, f"{page.name} names IDs that are not in the INVENTORY or syllabus_ids.txt: " \
                           f"{sorted(named - known)}"
    exercises = DOCS / "exercises" / "index.md"
    links = [link for link in markdown_links(text) if link.split("#")[0].endswith("exercises/index.md")]
    assert links, f"{page.name} links to no exercise (expected a link to exercises/index.md#exercise-NN-...)"
    for link in links:
        anchor = link.partition("#")[2]
        assert not anchor or anchor in anchors_of(exercises), f"{page.name}: {link} is not a section of the exercises page"


FIGURE = re.compile(r"\]\(\.\./assets/bench/([a-z0-9_]+)-([a-z0-9_-]+)\.svg\)")
DIAGRAM = re.compile(r"\]\(\.\./assets/diagrams/([a-z0-9_-]+\.svg)\)")
SNIPPET = re.compile(r'^--8<-- "((?:reference_impl|grader)/[^":]+)(?::([a-z_]+))?"$', re.MULTILINE)


@pytest.mark.parametrize("page", concept_pages(), ids=lambda p: p.name)
def test_concept_page_has_a_measured_figure_a_diagram_and_code_from_source(page: Path) -> None:
    """Issue 9's bar for a concept page: a plot of committed benchmark JSON, a diagram, real code."""
    text = page.read_text(encoding="utf-8")
    figures = FIGURE.findall(text)
    assert figures, f"{page.name} shows no measured figure (![...](../assets/bench/<benchmark>-<kind>.svg))"
    for stem, kind in figures:
        assert (DOCS / "assets" / "bench" / f"{stem}.json").is_file(), \
            f"{page.name}: figure {stem}-{kind}.svg has no committed benchmark JSON {stem}.json"
    diagrams = DIAGRAM.findall(text)
    assert diagrams, f"{page.name} shows no diagram (![...](../assets/diagrams/<name>.svg))"
    for name in diagrams:
        assert (DOCS / "assets" / "diagrams" / name).is_file(), f"{page.name}: diagram {name} does not exist"
    snippets = SNIPPET.findall(text)
    assert snippets, f"{page.name} renders no code from reference_impl/ or grader/ (--8<-- snippet)"
    for path, section in snippets:
        source = ROOT / path
        assert source.is_file(), f"{page.name}: snippet source {path} does not exist"
        if section:
            assert f"--8<-- [start:{section}]" in source.read_text(encoding="utf-8"), \
                f"{page.name}: {path} has no snippet section {section!r}"


def test_every_exercise_names_an_existing_concept_page() -> None:
    notebooks = sorted((ROOT / "exercises" / "source").glob("*/*.ipynb"))
    assert notebooks, "no exercise notebooks found"
    for notebook in notebooks:
        lab = json.loads(notebook.read_text(encoding="utf-8"))["metadata"].get("lab", {})
        page = lab.get("concept_page")
        assert page, f"{notebook.relative_to(ROOT)} has no lab.concept_page metadata"
        assert (DOCS / page).is_file(), f"{notebook.relative_to(ROOT)}: concept page {page} does not exist"


# --------------------------------------------------------------------------- glossary


def test_glossary_terms_link_to_existing_pages() -> None:
    glossary = DOCS / "glossary.md"
    rows = [line for line in glossary.read_text(encoding="utf-8").splitlines() if line.startswith("| ")][2:]
    assert len(rows) >= 50, f"the glossary has only {len(rows)} terms"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4 and all(cells[:3]), f"malformed glossary row: {row}"
        assert re.search(r"[\u4e00-\u9fff]", cells[1]), f"no Chinese term in: {row}"
        links = markdown_links(cells[3])
        assert links, f"glossary term {cells[0]} links to no page"
        for link in links:
            target, _, anchor = link.partition("#")
            path = (glossary.parent / target).resolve()
            assert path.is_file(), f"glossary term {cells[0]} links to a missing page {link}"
            if anchor:
                assert anchor in anchors_of(path), f"glossary term {cells[0]}: missing anchor {link}"
