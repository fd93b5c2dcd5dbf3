"""The practice page (docs/practice/index.md) in Chromium, on the built site, fully offline.

* the page's FSRS scheduler (docs/assets/js/fsrs.js) against the reference implementation,
  the ``fsrs`` package (py-fsrs), as an oracle: the same review histories give the same
  states, steps and due dates, and stability and difficulty to 1e-9 relative;
* a practice session: filters, reveal, the rubric as checkboxes, ratings scheduled by FSRS,
  a question coming back when it is due (a fast-forwarded clock), and a reload that keeps it;
* a mock interview against an injected clock that runs out, and its report;
* progress files: export, a corrupt or wrong-version file refused with a message and nothing
  changed, the exported file restoring progress in a fresh browser;
* ``python -m grader progress --export`` run as an ordinary user on a real score book, and
  that file imported into the dashboard.

Every request that leaves 127.0.0.1 is aborted and recorded; a test fails on any, and on any
console error.
"""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from browser_tools import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, chromium_or_skip, keep_offline
from conftest import ROOT

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def browser():
    sync_playwright = chromium_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def bank(built_site: Path) -> list[dict]:
    data = json.loads((built_site / "assets" / "practice" / "bank.json").read_text(encoding="utf-8"))
    assert data["version"] == 1
    return data["questions"]


class Offline:
    """A fresh browser context (its own localStorage) whose page aborts every outside request."""

    def __init__(self, browser, site_url: str, clock: datetime | None = None, storage_state=None) -> None:
        self.outside: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True,
                                           storage_state=storage_state)
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        if clock is not None:
            self.page.clock.install(time=clock)

        keep_offline(self.page, self.outside)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.url = f"{site_url}/practice/"

    def open(self) -> None:
        self.page.goto(self.url, wait_until="load")
        self.page.wait_for_selector("#practice-card h3")

    def stored(self) -> dict:
        return json.loads(self.page.evaluate("localStorage.getItem('dl-lab-progress')") or "null")

    def close(self) -> None:
        self.context.close()
        assert not self.outside, f"requests outside 127.0.0.1: {self.outside}"
        assert not self.errors, f"console errors: {self.errors}"


# --------------------------------------------------------------------------- FSRS against py-fsrs


def _histories(n: int, length: int, seed: int = 7) -> list[list[tuple[int, int]]]:
    """Review histories: (milliseconds after T0, rating), gaps from seconds to months, some at the due date."""
    rng = random.Random(seed)
    gaps = [timedelta(seconds=40), timedelta(minutes=3), timedelta(minutes=12), timedelta(hours=5),
            timedelta(hours=23), timedelta(days=1, hours=2), timedelta(days=4), timedelta(days=17),
            timedelta(days=95), None]  # None: review when due
    out = []
    for _ in range(n):
        out.append([(rng.choice(gaps), rng.choice([1, 2, 3, 3, 3, 4])) for _ in range(length)])
    return out


def _py_fsrs(history) -> tuple[list[dict], list[tuple[int, int]]]:
    from fsrs import Card, Rating, Scheduler

    scheduler = Scheduler(enable_fuzzing=False)
    card = Card(card_id=1, due=T0)
    when = T0
    results, timed = [], []
    for gap, rating in history:
        when = card.due if gap is None else when + gap
        card, _ = scheduler.review_card(card, Rating(rating), when)
        ms = round((when - T0).total_seconds() * 1000)
        timed.append((ms, rating))
        results.append({"state": int(card.state), "step": card.step, "stability": card.stability,
                        "difficulty": card.difficulty, "due": round((card.due - T0).total_seconds() * 1000)})
    return results, timed


def test_fsrs_port_matches_py_fsrs_on_the_same_review_histories(browser, site_url: str) -> None:
    import fsrs
    from fsrs.scheduler import DEFAULT_PARAMETERS

    scheduler = fsrs.Scheduler()
    assert (scheduler.desired_retention, scheduler.learning_steps, scheduler.relearning_steps,
            scheduler.maximum_interval) == (0.9, (timedelta(minutes=1), timedelta(minutes=10)),
                                            (timedelta(minutes=10),), 36500), "py-fsrs changed its defaults"
    expected, timed = [], []
    for history in _histories(60, 14):
        results, reviews = _py_fsrs(history)
        expected.append(results)
        timed.append(reviews)
    states = {r["state"] for h in expected for r in h}
    assert states == {1, 2, 3}, f"the histories must reach learning, review and relearning: {states}"

    b = Offline(browser, site_url)
    try:
        b.open()
        params = b.page.evaluate("window.LabFSRS.DEFAULT_PARAMETERS")
        assert params == list(DEFAULT_PARAMETERS), "the page's default parameters are not py-fsrs's"
        got = b.page.evaluate("""([t0, histories]) => {
            const s = new window.LabFSRS.Scheduler();
            return histories.map((h) => {
                let card = s.newCard(t0);
                return h.map(([ms, rating]) => {
                    card = s.review(card, rating, t0 + ms);
                    return {state: card.state, step: card.step, stability: card.stability,
                            difficulty: card.difficulty, due: card.due - t0};
                });
            });
        }""", [int(T0.timestamp() * 1000), timed])
    finally:
        b.close()
    for i, (want_h, got_h) in enumerate(zip(expected, got, strict=True)):
        for j, (want, have) in enumerate(zip(want_h, got_h, strict=True)):
            where = f"history {i}, review {j + 1}: {timed[i][:j + 1]}"
            assert (have["state"], have["step"], have["due"]) == (want["state"], want["step"], want["due"]), \
                f"{where}: page {have}, py-fsrs {want}"
            for key in ("stability", "difficulty"):
                assert have[key] == pytest.approx(want[key], rel=1e-9), f"{where}: {key} page {have}, py-fsrs {want}"


# --------------------------------------------------------------------------- a practice session


def test_a_practice_session_schedules_with_fsrs_and_survives_a_reload(browser, site_url: str, bank) -> None:
    from fsrs import Card, Rating, Scheduler

    b = Offline(browser, site_url, clock=T0)
    try:
        page = b.page
        b.open()
        now = T0 + timedelta(minutes=1)
        page.clock.pause_at(now)  # from here on, time moves only when the test says
        assert page.locator("#practice-title").inner_text() == bank[0]["title"], "the first new question comes first"
        page.select_option("#practice-topic", "large models")
        page.select_option("#practice-level", "intermediate")
        chosen = [q for q in bank if q["topic"] == "large models" and q["level"] == "intermediate"]
        first = chosen[0]
        assert page.locator("#practice-title").inner_text() == first["title"]
        assert page.locator("#practice-answer").is_hidden(), "the model answer shows before the learner answered"
        page.fill("#practice-notes", "Parameters, gradients, optimiser state, activations, temporaries.")
        page.click("#practice-reveal")
        boxes = page.locator("#practice-answer input[type=checkbox]")
        assert boxes.count() == len(first["rubric"])
        boxes.nth(0).check()
        boxes.nth(2).check()
        page.screenshot(path=str(ARTIFACTS / "practice.png"), full_page=True)
        page.click("#practice-answer button[data-rating='3']")  # Good
        assert f"2 of {len(first['rubric'])} points covered; next review in 10 min" in page.locator("#practice-status").inner_text()

        second = chosen[1]
        assert page.locator("#practice-title").inner_text() == second["title"]
        page.click("#practice-reveal")
        page.click("#practice-answer button[data-rating='4']")  # Easy: straight to review

        stored = b.stored()
        oracle = Scheduler(enable_fuzzing=False)
        for qid, rating in ((first["id"], Rating.Good), (second["id"], Rating.Easy)):
            want, _ = oracle.review_card(Card(card_id=1, due=now), rating, now)
            have = stored["cards"][qid]
            assert have["state"] == int(want.state) and have["stability"] == pytest.approx(want.stability, rel=1e-9)
            assert have["due"] == round(want.due.timestamp() * 1000), (qid, have, want.due)
        assert [(r["id"], r["rating"], r["covered"]) for r in stored["reviews"]] == \
            [(first["id"], 3, [0, 2]), (second["id"], 4, [])]

        # 11 minutes on, the first question is due again and comes before the new ones
        page.clock.fast_forward("11:00")
        page.reload(wait_until="load")
        page.wait_for_selector("#practice-card h3")
        page.select_option("#practice-topic", "large models")
        page.select_option("#practice-level", "intermediate")
        assert page.locator("#practice-title").inner_text() == first["title"]
        assert "review" in page.locator(".practice-meta").first.inner_text()
        assert b.stored() == stored, "the reload changed the stored progress"
        row = page.locator("#progress-table tr[data-topic='large models'] td")
        assert row.nth(1).inner_text() == f"2 of {sum(q['topic'] == 'large models' for q in bank)}"
        page.locator("#progress-dashboard").screenshot(path=str(ARTIFACTS / "practice-dashboard.png"))
    finally:
        b.close()


# --------------------------------------------------------------------------- a mock interview


def test_a_mock_interview_runs_against_the_clock_and_reports_what_to_revisit(browser, site_url: str, bank) -> None:
    by_id = {q["id"]: q for q in bank}
    b = Offline(browser, site_url, clock=T0)
    try:
        page = b.page
        page.emulate_media(color_scheme="dark")  # this round in the dark scheme
        b.open()
        page.clock.pause_at(T0 + timedelta(minutes=1))  # from here on, time moves only when the test says
        page.select_option("#mock-minutes", "45")
        page.click("#mock-start")
        assert page.locator("#mock-clock").inner_text() == "45:00 left"
        assert "Opening question" in page.locator("#mock-part").inner_text()
        page.click("#mock-done-answering")
        page.locator("#mock-rubric input[type=checkbox]").nth(0).check()
        page.click("#mock-next")
        assert "Topic 2 of 3" in page.locator("#mock-part").inner_text()
        page.clock.run_for("10:00")
        assert page.locator("#mock-clock").inner_text() == "35:00 left"
        page.clock.run_for("35:01")  # the time runs out during the second question
        page.wait_for_selector("#mock-report h3")
        assert "time is up" in page.locator("#mock-report h3").inner_text()
        page.screenshot(path=str(ARTIFACTS / "practice-mock-report-dark.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        assert page.evaluate("document.body.getAttribute('data-md-color-scheme')") == "slate"
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= 390, f"the report is {overflow} px wide on a 390 px phone"
        page.screenshot(path=str(ARTIFACTS / "practice-mock-report-phone-dark.png"), full_page=True)

        mock = b.stored()["mocks"][-1]
        asked = [by_id[q["id"]] for q in mock["questions"]]
        assert len(asked) == 3 and len({q["topic"] for q in asked}) == 3, "three questions, three topics"
        assert asked[0]["level"] != "basic" and asked[0]["follow_ups"]
        assert [q["covered"] for q in mock["questions"]] == [[0], [], []]
        rows = page.locator("#mock-report tbody tr")
        assert rows.count() == 3
        for i, q in enumerate(asked):
            assert rows.nth(i).locator("td").nth(2).inner_text() == \
                f"{len(mock['questions'][i]['covered'])} of {len(q['rubric'])}"
        revisit = page.locator("#mock-revisit").inner_text()
        hrefs = page.eval_on_selector_all("#mock-revisit a", "els => els.map(e => e.href)")
        for q in asked:
            assert q["title"] in revisit
            for link in q["pages"] + q["exercises"]:
                assert any(h.endswith("/" + link["url"]) for h in hrefs), f"{q['id']}: {link} not offered"
        for href in set(h.split("#")[0] for h in hrefs):
            assert page.request.get(href).ok, f"a revisit link is broken: {href}"
    finally:
        b.close()


# --------------------------------------------------------------------------- progress files


def _import(page, name: str, payload: bytes) -> str:
    page.set_input_files("#progress-import", files=[{"name": name, "mimeType": "application/json", "buffer": payload}])
    page.wait_for_function("document.querySelector('#progress-message').textContent.length > 0")
    text = page.locator("#progress-message").inner_text()
    page.evaluate("document.querySelector('#progress-message').textContent = ''")
    return text


def test_progress_export_import_and_refusal_of_bad_files(browser, site_url: str, tmp_path: Path) -> None:
    b = Offline(browser, site_url, clock=T0)
    try:
        page = b.page
        b.open()
        page.click("#practice-reveal")
        page.locator("#practice-answer input[type=checkbox]").nth(1).check()
        page.click("#practice-answer button[data-rating='2']")
        before = page.evaluate("localStorage.getItem('dl-lab-progress')")
        with page.expect_download() as download:
            page.click("#progress-export")
        exported = tmp_path / "progress.json"
        download.value.save_as(exported)
        data = json.loads(exported.read_text(encoding="utf-8"))
        assert (data["format"], data["version"], len(data["reviews"])) == ("dl-lab-progress", 1, 1)
        assert data["reviews"][0]["covered"] == [1]

        bad = {
            "not JSON": b"{\"format\": \"dl-lab-progress\", ",
            "another version": json.dumps(dict(data, version=2)).encode(),
            "a malformed card": json.dumps(dict(data, cards={"n000-q1": {"state": 9}})).encode(),
            "another format": json.dumps({"format": "anki", "version": 1}).encode(),
        }
        for why, payload in bad.items():
            message = _import(page, "bad.json", payload)
            assert message.startswith("Refused bad.json") and "Nothing was changed" in message, (why, message)
            assert page.evaluate("localStorage.getItem('dl-lab-progress')") == before, f"{why}: progress changed"
        assert "version 2 is not supported" in _import(page, "bad.json", bad["another version"])
    finally:
        b.close()

    fresh = Offline(browser, site_url, clock=T0)
    try:
        fresh.open()
        assert fresh.stored() is None
        message = _import(fresh.page, "progress.json", exported.read_bytes())
        assert message.startswith("Imported 1 reviews"), message
        stored = fresh.stored()
        assert stored["cards"] == data["cards"] and stored["reviews"] == data["reviews"]
        fresh.page.reload(wait_until="load")
        fresh.page.wait_for_selector("#progress-summary")
        assert fresh.page.locator("#progress-summary").inner_text().startswith("1 reviews, 1 questions scheduled")
    finally:
        fresh.close()


# --------------------------------------------------------------------------- the grader's export


def _score_book(folder: Path) -> None:
    """A score book as ``grader check`` writes it: 17 graded twice (6/10, then 3/10), 19 timed out."""
    from grader.report import GradingResult, TestResult
    from grader.scores import record_result

    def result(name: str, passed: int, timed_out: bool = False) -> GradingResult:
        tests = [TestResult(id=f"t{i}", score=2.0 if i < passed else 0.0, max_score=2.0, passed=i < passed)
                 for i in range(5)]
        return GradingResult(assignment=name, notebook=str(folder / f"{name}.ipynb"), tests=tests, timed_out=timed_out,
                             error="the time budget ran out" if timed_out else None)

    record_result(folder, result("17_zero_stage2", 3))
    record_result(folder, result("17_zero_stage2", 1))
    record_result(folder, result("19_tensor_parallel", 4, timed_out=True))


def test_grader_progress_export_as_a_learner_imports_into_the_dashboard(browser, site_url: str, bank) -> None:
    from learner_account import learner

    who = learner()
    home = Path(tempfile.mkdtemp(prefix="dl-lab-progress-"))
    try:
        _score_book(home / "grader-feedback")
        if who.switch:
            for path in [home, *home.rglob("*")]:
                shutil.chown(path, who.uid, who.gid)
        home.chmod(0o755)
        proc = who.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "grader", "progress", "--export", "grades.json"],
                       cwd=home, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "best scores of 1 assignments" in proc.stdout
        export = home / "grades.json"
        if who.switch:
            assert export.stat().st_uid == who.uid, "the export is not the learner's file"
        data = json.loads(export.read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert (data["format"], data["version"]) == ("dl-lab-grader-scores", 1)
    assert list(data["assignments"]) == ["17_zero_stage2"], "only completed checks count"
    assert (data["assignments"]["17_zero_stage2"]["best_score"], data["assignments"]["17_zero_stage2"]["max_score"]) == (6.0, 10.0)

    missing = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "grader", "progress"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--export" in missing.stderr

    topic = "large models"
    assignments = sorted({x["assignment"] for q in bank if q["topic"] == topic for x in q["exercises"]})
    assert "17_zero_stage2" in assignments
    b = Offline(browser, site_url, clock=T0)
    try:
        b.open()
        cell = b.page.locator(f"#progress-table tr[data-topic='{topic}'] td.progress-exercises")
        assert cell.inner_text() == f"0 % (0 of {len(assignments)} graded)"
        message = _import(b.page, "grades.json", json.dumps(data).encode())
        assert message == "Imported the best scores of 1 assignments.", message
        assert cell.inner_text() == f"{round(100 * 0.6 / len(assignments))} % (1 of {len(assignments)} graded)"
        b.page.reload(wait_until="load")
        b.page.wait_for_selector("#progress-table")
        assert cell.inner_text().endswith(f"(1 of {len(assignments)} graded)"), "the grades did not survive a reload"
        before = b.page.evaluate("localStorage.getItem('dl-lab-progress')")
        message = _import(b.page, "grades.json", json.dumps(dict(data, version=3)).encode())
        assert message.startswith("Refused grades.json: grader export version 3"), message
        assert b.page.evaluate("localStorage.getItem('dl-lab-progress')") == before
    finally:
        b.close()


def test_the_practice_page_is_in_the_navigation_after_the_question_bank(built_site: Path) -> None:
    home = (built_site / "index.html").read_text(encoding="utf-8")
    tabs = [t.strip() for t in __import__("re").findall(r'class="md-tabs__link[^"]*"[^>]*>\s*([^<]+?)\s*<', home)]
    assert "Practice" in tabs and tabs.index("Practice") == tabs.index("Question bank") + 1, tabs
    bank_index = (built_site / "questions" / "index.html").read_text(encoding="utf-8")
    assert 'href="../practice/"' in bank_index, "the question bank does not link to the practice page"
