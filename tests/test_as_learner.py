"""The learner's loop, run as an ordinary user in a checkout of their own (tests/learner_account.py).

Root ignores file modes and reaches every folder, so a suite that only runs as root never
sees a permission bug: grading once failed for every ordinary user (nbgrader writes its
output read-only, and the grader then edited it). Here every learner-facing command runs
as the learner, exactly as the README tells them to:

* ``grader start`` for all 16 assignments, and again over a solved notebook, which survives;
* ``grader check`` of a correct notebook (full marks) and of a wrong one (partial marks, a
  written hint and a link on every failed test) for five assignments (every assignment's
  correct and wrong notebooks are graded as root by tests/test_exercise_NN.py);
* ``grader list`` with the best and the latest score;
* ``make release`` over a released notebook someone edited, which survives;
* ``make site-offline`` (the strict build, with the offline plugin), browsed and searched from
  file:// in Chromium; a benchmark (to bench-results/, the site's data untouched)
  and the training command;
* the feedback page in Chromium, on a phone-sized screen, with every outside request aborted;
* the started notebook opened in JupyterLab (Chromium), which does not mark it modified.
"""
from __future__ import annotations

import html
import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from browser_tools import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, chromium_or_skip
from conftest import ROOT
from learner_account import checkout, learner
from notebook_tools import cell_of, read_nb, source_of, with_cells_from, write_nb

pytestmark = pytest.mark.timeout(900)

SOURCES = sorted((ROOT / "exercises" / "source").glob("*/*.ipynb"))
# Notebooks graded as the learner, for a few assignments (grading, the feedback page, the score
# book and the hints are one code path for all of them, and what an ordinary user may not do
# breaks it for every assignment alike; every assignment's correct and wrong notebooks are
# graded in tests/test_exercise_NN.py): the first, the C custom op (compiled as the learner),
# and one of each later part.
WRONG = [p for p in SOURCES if p.parent.name[:2] in ("01", "07", "09", "13", "20")]
PY = ".venv/bin/python"


def stubbed_ids(mine: dict, source: dict) -> list[str]:
    """The solution cells of a learner's copy that differ from the source (the ones to write)."""
    return [c["metadata"]["nbgrader"]["grade_id"] for c in mine["cells"]
            if c.get("metadata", {}).get("nbgrader", {}).get("solution") and c["cell_type"] == "code"
            and source_of(c) != source_of(cell_of(source, c["metadata"]["nbgrader"]["grade_id"]))]


def filled(mine: dict, source: dict, ids: list[str]) -> dict:
    """``mine`` with the cells ``ids`` written as in ``source``."""
    return with_cells_from(mine, source, ids) if ids else mine


@pytest.fixture(scope="module")
def lab():
    """(learner, their checkout), the checkout removed afterwards."""
    who = learner()
    where = checkout(who)
    yield who, where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def started(lab):
    """``grader start`` of every assignment as the learner: the notebooks it wrote in work/."""
    who, where = lab
    names = [p.parent.name[:2] for p in SOURCES]
    run = who.run([PY, "-m", "grader", "start", *names], cwd=where, timeout=300)
    assert run.returncode == 0, run.stderr
    notebooks = {p.parent.name: where / "work" / p.parent.name / p.name for p in SOURCES}
    for path in notebooks.values():
        assert path.is_file() and os.stat(path).st_uid == who.uid, path
        # the hints are the grader's to show when their mistake happens, not the copy's to spoil
        assert not any("hint" in c["metadata"].get("lab", {}) for c in read_nb(path)["cells"]), path
    return notebooks


def test_start_never_overwrites_a_learners_work(lab):
    who, where = lab
    first = who.run([PY, "-m", "grader", "start", "02", "--dir", "mine"], cwd=where)
    assert first.returncode == 0, first.stderr
    notebook = where / "mine/02_alpha_beta/alpha_beta.ipynb"
    source = read_nb(ROOT / "exercises/source/02_alpha_beta/alpha_beta.ipynb")
    solved = json.dumps(filled(read_nb(notebook), source, stubbed_ids(read_nb(notebook), source)))
    notebook.write_text(solved)
    run = who.run([PY, "-m", "grader", "start", "02", "alpha_beta", "--dir", "mine"], cwd=where)
    assert run.returncode == 0, run.stderr
    assert "kept as it is" in run.stdout
    assert notebook.read_text() == solved


@pytest.fixture(scope="module")
def graded(lab, started):
    """The assignments of ``WRONG`` checked as the learner, two at a time: a correct notebook and
    a wrong one.

    Correct: the learner's copy with every solution cell filled in from the source. Wrong: the
    same with its last stubbed solution cell left as handed out."""
    who, where = lab
    cases: list[tuple[str, str, Path]] = []
    for source_path in SOURCES:
        name = source_path.parent.name
        source, mine = read_nb(source_path), read_nb(started[name])
        ids = stubbed_ids(mine, source)
        assert ids, f"{name}: the learner's copy has nothing to write"
        for case, written in (("correct", ids), ("wrong", ids[:-1]))[:2 if source_path in WRONG else 0]:
            path = write_nb(where / "attempts" / case / name / source_path.name, filled(mine, source, written))
            cases.append((name, case, path))
    for folder, _, files in os.walk(where / "attempts"):
        for entry in [folder, *(os.path.join(folder, f) for f in files)]:
            os.chown(entry, who.uid, who.gid)
    results, running = {}, []
    # every correct notebook first, then every wrong one: two notebooks of one assignment never
    # run at once, and each assignment's feedback page is the wrong notebook's, written last
    pending = sorted(cases, key=lambda case: case[1] == "wrong")
    while pending or running:
        while pending and len(running) < 2:
            name, case, path = pending.pop(0)
            argv = [PY, "-m", "grader", "check", str(path.relative_to(where)), "--json"]
            running.append(((name, case), who.popen(argv, cwd=where), time.monotonic()))
        key, proc, began = running.pop(0)
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{key}: exit {proc.returncode}\n{err[-3000:]}"
        results[key] = json.loads(out)
    return results


@pytest.mark.parametrize("source_path", WRONG, ids=[p.parent.name for p in WRONG])
def test_correct_notebook_scores_full_marks_as_the_learner(graded, source_path):
    result = graded[(source_path.parent.name, "correct")]
    failed = [(t["id"], t["hint"]) for t in result["tests"] if not t["passed"]]
    assert result["error"] is None and result["score"] == result["max_score"] > 0, failed


@pytest.mark.parametrize("source_path", WRONG, ids=[p.parent.name for p in WRONG])
def test_wrong_notebook_gets_hints_as_the_learner(graded, source_path):
    result = graded[(source_path.parent.name, "wrong")]
    assert result["error"] is None and result["score"] < result["max_score"]
    failed = [t for t in result["tests"] if not t["passed"]]
    assert failed
    for test in failed:
        assert test["hint"] and test["advice"], test
        assert urlsplit(test["read"]).path.startswith("/concepts/"), test


def test_list_shows_best_and_latest_as_the_learner(lab, graded):
    who, where = lab
    run = who.run([PY, "-m", "grader", "list"], cwd=where)
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()[2:-2]}
    assert len(rows) == len(SOURCES)
    for source_path in WRONG:
        best, latest = rows[source_path.parent.name][1:3]
        full = graded[(source_path.parent.name, "correct")]["max_score"]
        assert best == f"{full:g}/{full:g}", rows[source_path.parent.name]
        wrong = graded.get((source_path.parent.name, "wrong"))
        assert latest == (f"{wrong['score']:g}/{full:g}" if wrong else best), rows[source_path.parent.name]


def test_feedback_page_on_a_phone_is_offline_and_shows_no_internals(lab, graded):
    """The wrong notebook's page of the first assignment, in Chromium at 390 px: nothing loaded
    from outside, no horizontal scrolling, the hint and link visible, no grader internals."""
    result = graded[(SOURCES[0].parent.name, "wrong")]
    page_path = Path(result["feedback_html"])
    text = page_path.read_text(encoding="utf-8")
    for internal in ("_lab_guard", "lab-guard", "grader/guard.py", "BEGIN HIDDEN", "Cell In["):
        assert internal not in text, internal
    failed = [t for t in result["tests"] if not t["passed"]]
    shown = html.unescape(text)
    assert all(t["advice"].split("$")[0][:40] in shown and t["read"] in shown for t in failed), failed
    sync_playwright = chromium_or_skip()
    outside: list[str] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)

            def route(r) -> None:
                if urlsplit(r.request.url).scheme in ("file", "data", "about"):
                    r.continue_()
                else:
                    outside.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.goto(page_path.as_uri(), wait_until="load")
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            wide = page.evaluate("[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect()"
                                 ".right > window.innerWidth + 1).slice(0, 3).map(e => e.outerHTML.slice(0, 300))")
            assert overflow <= 0, f"the page scrolls sideways by {overflow} px on a phone: {wide}"
            sizes = page.eval_on_selector_all(".hint, pre", "els => els.map(e => parseFloat(getComputedStyle(e).fontSize))")
            assert sizes and min(sizes) >= 13, sizes
            page.screenshot(path=str(ARTIFACTS / "feedback-phone.png"), full_page=True)
        finally:
            browser.close()
    assert not outside, f"the feedback page requested {outside}"


def test_release_keeps_an_edited_notebook_as_the_learner(lab):
    who, where = lab
    first = who.run(["make", "release"], cwd=where, timeout=300)
    assert first.returncode == 0, first.stderr
    mine = where / "exercises/release/03_recursive_doubling/recursive_doubling.ipynb"
    edited = mine.read_text() + "\n"
    mine.write_text(edited)
    again = who.run(["make", "release"], cwd=where, timeout=300)
    assert again.returncode == 0, again.stderr
    assert mine.read_text() == edited
    assert f"{mine.relative_to(where)}: kept as it is" in again.stderr


def test_site_builds_as_the_learner_and_browses_offline(lab):
    """``make site-offline`` as the learner (the same strict ``mkdocs build`` as ``make site``,
    which tests/conftest.py's ``built_site`` runs, with Material's offline plugin on): the copy
    opens from file://, links between pages work, and search finds pages (through
    docs/assets/js/iframe-worker.js), with no request leaving the folder and no console error."""
    who, where = lab
    run = who.run(["make", "site-offline"], cwd=where, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    site = where / "site-offline"
    # page.html rather than page/index.html: a file:// URL of a folder shows a listing, not the page
    assert (site / "concepts" / "allreduce-algorithms.html").is_file()
    assert not (site / "concepts" / "allreduce-algorithms").exists()
    assert "var __index = " in (site / "search" / "search_index.js").read_text(encoding="utf-8")[:20]
    sync_playwright = chromium_or_skip()
    outside: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.route("**/*", lambda r: r.continue_() if urlsplit(r.request.url).scheme in
                       ("file", "data", "blob", "about") else (outside.append(r.request.url), r.abort()))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((site / "index.html").as_uri(), wait_until="load")
            link = page.locator('.md-content a[href*="concepts/"][href$=".html"]:visible').first
            target = link.get_attribute("href")
            link.click()
            page.wait_for_load_state("load")
            assert page.url.endswith(target.removeprefix(".").removeprefix("/")), (page.url, target)
            assert page.locator("article h1").first.inner_text().strip()
            page.locator("input.md-search__input").click()
            page.keyboard.type("allreduce")
            page.wait_for_selector(".md-search-result__item", state="visible", timeout=20_000)
            assert page.locator(".md-search-result__item").count() >= 3
        finally:
            browser.close()
    assert not outside, f"the offline site requested resources outside its folder: {outside}"
    assert not errors, f"console errors: {errors}"


def test_benchmark_and_training_run_as_the_learner(lab):
    who, where = lab
    site_json = where / "docs/assets/bench/determinism.json"
    before = site_json.read_bytes()
    bench = who.run([PY, "-m", "benchmarks", "determinism", "--steps", "1", "--sums", "1"], cwd=where)
    assert bench.returncode == 0, bench.stderr
    assert json.loads((where / "bench-results/determinism.json").read_text())
    assert site_json.read_bytes() == before
    train = who.run([PY, "-m", "reference_impl.train", "wide_deep", "--strategy", "ps", "--workers", "2",
                     "--servers", "1", "--epochs", "1", "--batch", "64", "--limit", "64"], cwd=where)
    assert train.returncode == 0, train.stderr
    assert "late gradients dropped" in train.stdout


def test_opening_a_started_notebook_in_jupyterlab_does_not_mark_it_modified(lab, started):
    """The README's `jupyter lab work/...` as the learner, the notebook opened in Chromium: once
    its kernel is idle the notebook is not marked modified (JupyterLab writes the kernel's
    ``language_info`` into the notebook; a notebook holding less would be), and the file on
    disk is unchanged. Every request other than to the learner's own server is aborted."""
    import socket
    import subprocess

    who, where = lab
    notebook = started["01_ring_allreduce"]
    before = notebook.read_bytes()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = who.popen([".venv/bin/jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                        "--ServerApp.token=", "--ServerApp.password=", "--LabApp.news_url=",
                        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                        str(notebook.relative_to(where))], cwd=where)
    outside: list[str] = []
    sync_playwright = chromium_or_skip()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert server.poll() is None, f"jupyter lab exited: {server.communicate()[1][-2000:]}"
                assert time.monotonic() < deadline, "jupyter lab did not listen within 60 s"
                time.sleep(0.2)
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) or
                           r.request.url.startswith("ws://127.0.0.1") or r.request.url.startswith("data:")
                           else (outside.append(r.request.url), r.abort()))
                # given a notebook, jupyter lab serves the notebook's own folder
                page.goto(f"{base}/lab/tree/{notebook.name}?reset")
                page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
                assert page.locator(".lm-TabBar-tab", has_text=notebook.name).count() >= 1, "the notebook is not open"
                # metadata from the kernel's reply lands just after it turns idle: watch a while
                modified = False
                for _ in range(10):
                    time.sleep(0.5)
                    modified = modified or page.locator(".jp-mod-dirty").count() > 0
                page.screenshot(path=str(ARTIFACTS / "jupyterlab-opened-notebook.png"))
            finally:
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    assert not modified, "JupyterLab marks the notebook modified as soon as it is opened"
    assert notebook.read_bytes() == before, "opening the notebook changed the file on disk"
    assert not outside, f"JupyterLab requested resources outside 127.0.0.1: {outside}"
