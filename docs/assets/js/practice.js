/* The practice page: questions one at a time with FSRS scheduling, a timed mock interview,
 * and a dashboard of progress. Runs only on a page with #practice-app; keeps everything in
 * the browser's localStorage (key "dl-lab-progress"), with export and import as a file.
 *
 * The bank (assets/practice/bank.json) is written at build time by docs/hooks/practice.py
 * from the question pages and their answer files. The scheduler is assets/js/fsrs.js.
 */
(function () {
  "use strict";

  const STORE_KEY = "dl-lab-progress";
  const PROGRESS_FORMAT = "dl-lab-progress";
  const GRADES_FORMAT = "dl-lab-grader-scores";
  const VERSION = 1;
  const MINUTE = 60 * 1000;
  const RATING_NAMES = ["Again", "Hard", "Good", "Easy"];

  const now = () => Date.now();

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "html") node.innerHTML = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children || []) node.append(c);
    return node;
  }

  function emptyProgress() {
    return { format: PROGRESS_FORMAT, version: VERSION, cards: {}, reviews: [], grades: {}, mocks: [] };
  }

  // ------------------------------------------------------------------ validation of files

  const isObj = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
  const isNum = (x) => typeof x === "number" && Number.isFinite(x);

  function checkCard(card) {
    return isObj(card) && [1, 2, 3].includes(card.state) && isNum(card.due) &&
      (card.step === null || Number.isInteger(card.step)) &&
      (card.stability === null || isNum(card.stability)) && (card.difficulty === null || isNum(card.difficulty)) &&
      (card.last_review === null || isNum(card.last_review));
  }

  function checkGrade(g) {
    return isObj(g) && isNum(g.best_score) && isNum(g.max_score) && g.max_score > 0 && g.best_score >= 0;
  }

  // The progress file: returns the progress, or throws an Error whose message the page shows.
  function parseProgress(data) {
    if (!isObj(data) || data.format !== PROGRESS_FORMAT) throw new Error("this is not a progress file of this site");
    if (data.version !== VERSION) throw new Error(`progress file version ${data.version} is not supported (this page reads version ${VERSION})`);
    if (!isObj(data.cards) || !Object.values(data.cards).every(checkCard)) throw new Error("its cards are malformed");
    if (!Array.isArray(data.reviews) || !data.reviews.every((r) => isObj(r) && typeof r.id === "string" &&
      isNum(r.at) && [1, 2, 3, 4].includes(r.rating) && Array.isArray(r.covered) && isNum(r.points))) {
      throw new Error("its reviews are malformed");
    }
    if (!isObj(data.grades) || !Object.values(data.grades).every(checkGrade)) throw new Error("its exercise grades are malformed");
    if (!Array.isArray(data.mocks)) throw new Error("its mock interviews are malformed");
    return { format: PROGRESS_FORMAT, version: VERSION, cards: data.cards, reviews: data.reviews, grades: data.grades, mocks: data.mocks };
  }

  // The file of `python -m grader progress --export`: returns {assignment: grade}, or throws.
  function parseGrades(data) {
    if (!isObj(data) || data.format !== GRADES_FORMAT) throw new Error("this is not a grader export");
    if (data.version !== VERSION) throw new Error(`grader export version ${data.version} is not supported (this page reads version ${VERSION})`);
    if (!isObj(data.assignments) || !Object.values(data.assignments).every(checkGrade)) throw new Error("its assignments are malformed");
    return data.assignments;
  }

  // ------------------------------------------------------------------ the app

  function App(root, bank) {
    this.root = root;
    this.bank = bank.questions;
    this.byId = Object.fromEntries(this.bank.map((q) => [q.id, q]));
    this.fsrs = new window.LabFSRS.Scheduler();
    this.progress = this.load();
    this.filter = { topic: "", level: "" };
    this.current = null;
    this.mock = null;
  }

  App.prototype.load = function () {
    try {
      const raw = localStorage.getItem(STORE_KEY);
      return raw ? parseProgress(JSON.parse(raw)) : emptyProgress();
    } catch (e) {
      return emptyProgress();
    }
  };

  App.prototype.save = function () {
    localStorage.setItem(STORE_KEY, JSON.stringify(this.progress));
    this.renderDashboard();
  };

  App.prototype.url = function (path) {
    return new URL("../" + path, window.location.href).href;
  };

  App.prototype.topics = function () {
    return [...new Set(this.bank.map((q) => q.topic))].sort();
  };

  // ---------------------------------------------------------------- practice

  App.prototype.filtered = function () {
    return this.bank.filter((q) => (!this.filter.topic || q.topic === this.filter.topic) &&
      (!this.filter.level || q.level === this.filter.level));
  };

  App.prototype.pickNext = function () {
    const t = now();
    const pool = this.filtered();
    const due = pool.filter((q) => this.progress.cards[q.id] && this.progress.cards[q.id].due <= t)
      .sort((a, b) => this.progress.cards[a.id].due - this.progress.cards[b.id].due);
    const fresh = pool.filter((q) => !this.progress.cards[q.id]);
    return due[0] || fresh[0] || null;
  };

  App.prototype.renderFilters = function () {
    const box = this.root.querySelector("#practice-filters");
    const topic = el("select", { id: "practice-topic", onchange: (e) => { this.filter.topic = e.target.value; this.nextQuestion(); } },
      [el("option", { value: "", text: "all topics" }), ...this.topics().map((t) => el("option", { value: t, text: t }))]);
    const level = el("select", { id: "practice-level", onchange: (e) => { this.filter.level = e.target.value; this.nextQuestion(); } },
      [el("option", { value: "", text: "all levels" }), ...["basic", "intermediate", "advanced"].map((t) => el("option", { value: t, text: t }))]);
    box.replaceChildren(el("label", {}, ["Topic ", topic]), " ", el("label", {}, ["Level ", level]));
  };

  App.prototype.nextQuestion = function () {
    this.current = this.pickNext();
    this.renderQuestion();
  };

  function formatInterval(ms) {
    if (ms < 60 * MINUTE) return `${Math.round(ms / MINUTE)} min`;
    if (ms < 24 * 60 * MINUTE) return `${Math.round(ms / (60 * MINUTE))} h`;
    const days = Math.round(ms / (24 * 60 * MINUTE));
    return days === 1 ? "1 day" : `${days} days`;
  }

  App.prototype.rubricList = function (q, prefix) {
    return el("ul", { class: "practice-rubric" }, q.rubric.map((point, i) => el("li", {}, [
      el("input", { type: "checkbox", id: `${prefix}-point-${i}`, "data-point": String(i) }),
      el("label", { for: `${prefix}-point-${i}`, html: point }),
    ])));
  };

  App.prototype.wrongList = function (q) {
    if (!q.wrong.length) return el("div");
    return el("details", { class: "practice-wrong" }, [
      el("summary", { text: `Common wrong answers (${q.wrong.length})` }),
      ...q.wrong.map((w) => el("div", {}, [el("p", {}, [el("strong", { html: w.claim })]), el("div", { html: w.why })])),
    ]);
  };

  App.prototype.renderQuestion = function () {
    const box = this.root.querySelector("#practice-card");
    const q = this.current;
    if (!q) {
      const pool = this.filtered().map((x) => this.progress.cards[x.id]).filter(Boolean);
      const next = pool.length ? Math.min(...pool.map((c) => c.due)) : null;
      box.replaceChildren(el("p", { id: "practice-done", text: next
        ? `Nothing is due in this selection. The next review is due ${new Date(next).toLocaleString()}.`
        : "No question matches this selection." }));
      return;
    }
    const card = this.progress.cards[q.id];
    const reveal = el("button", { type: "button", class: "md-button md-button--primary", id: "practice-reveal", text: "Reveal the model answer" });
    const answer = el("div", { id: "practice-answer", hidden: "" });
    box.replaceChildren(
      el("p", { class: "practice-meta", text: `${q.topic} · ${q.level} · ${card ? "review" : "new"}` }),
      el("h3", { id: "practice-title" }, [el("a", { href: this.url(q.url), text: q.title })]),
      el("div", { class: "practice-question", html: q.question }),
      el("label", { for: "practice-notes", text: "Your answer (type it, or say it aloud first):" }),
      el("textarea", { id: "practice-notes", rows: "5" }),
      reveal, answer,
    );
    reveal.addEventListener("click", () => {
      reveal.hidden = true;
      const base = card || this.fsrs.newCard(now());
      const buttons = RATING_NAMES.map((name, i) => {
        const projected = this.fsrs.review(base, i + 1, now());
        return el("button", { type: "button", class: "md-button", "data-rating": String(i + 1),
          onclick: () => this.rate(q, i + 1, answer) }, [`${name} · ${formatInterval(projected.due - now())}`]);
      });
      answer.replaceChildren(
        el("h4", { text: "Model answer" }), el("div", { html: q.answer }),
        el("h4", { text: "What an interviewer listens for: tick what you covered" }), this.rubricList(q, "practice"),
        this.wrongList(q),
        el("p", { text: "How well did you recall it?" }), el("div", { class: "practice-ratings" }, buttons),
      );
      answer.hidden = false;
    });
  };

  App.prototype.rate = function (q, rating, answerBox) {
    const t = now();
    const covered = [...answerBox.querySelectorAll("input[data-point]:checked")].map((x) => Number(x.dataset.point));
    const card = this.fsrs.review(this.progress.cards[q.id] || this.fsrs.newCard(t), rating, t);
    this.progress.cards[q.id] = card;
    this.progress.reviews.push({ id: q.id, at: t, rating: rating, covered: covered, points: q.rubric.length });
    this.save();
    this.root.querySelector("#practice-status").textContent =
      `${q.title}: rated ${RATING_NAMES[rating - 1]}, ${covered.length} of ${q.rubric.length} points covered; next review in ${formatInterval(card.due - t)}.`;
    this.nextQuestion();
  };

  // ---------------------------------------------------------------- mock interview

  function shuffled(list) {
    const out = list.slice();
    for (let i = out.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [out[i], out[j]] = [out[j], out[i]];
    }
    return out;
  }

  // One opening question (with its follow-ups) and one question from each of two other topics.
  App.prototype.planMock = function () {
    const openers = shuffled(this.bank.filter((q) => q.level !== "basic" && q.follow_ups.length));
    const opening = openers[0];
    const others = [];
    for (const q of shuffled(this.bank)) {
      if (others.length === 2) break;
      if (q.topic !== opening.topic && !others.some((o) => o.topic === q.topic)) others.push(q);
    }
    return [opening, ...others];
  };

  App.prototype.startMock = function () {
    const minutes = Number(this.root.querySelector("#mock-minutes").value);
    this.mock = { started: now(), minutes: minutes, questions: this.planMock(), index: 0, covered: [], ended: null };
    this.root.querySelector("#mock-report").replaceChildren();
    this.renderMockQuestion();
    this.mock.timer = window.setInterval(() => this.tick(), 1000);
    this.tick();
  };

  App.prototype.tick = function () {
    if (!this.mock || this.mock.ended) return;
    const left = this.mock.started + this.mock.minutes * MINUTE - now();
    const clock = this.root.querySelector("#mock-clock");
    const s = Math.max(0, Math.ceil(left / 1000));
    clock.textContent = `${String(Math.floor(s / 60)).padStart(2, "0")}:${String(s % 60).padStart(2, "0")} left`;
    if (left <= 0) this.endMock("time is up");
  };

  App.prototype.renderMockQuestion = function () {
    const m = this.mock;
    const q = m.questions[m.index];
    const box = this.root.querySelector("#mock-stage");
    const part = m.index === 0 ? "Opening question" : `Topic ${m.index + 1} of ${m.questions.length}`;
    const rubric = el("div", { id: "mock-rubric", hidden: "" }, [
      el("p", { text: "Tick the points you made:" }), this.rubricList(q, "mock"),
      el("button", { type: "button", class: "md-button md-button--primary", id: "mock-next",
        text: m.index + 1 < m.questions.length ? "Next question" : "Finish the round",
        onclick: () => this.recordMock(rubric) }),
    ]);
    box.replaceChildren(
      el("p", { class: "practice-meta", id: "mock-part", text: `${part} · ${q.topic} · ${q.level}` }),
      el("div", { class: "practice-question", html: q.question }),
      m.index === 0 && q.follow_ups.length ? el("div", {}, [el("p", { text: "Then the interviewer follows up:" }),
        el("ul", {}, q.follow_ups.map((f) => el("li", { html: f })))]) : el("div"),
      el("textarea", { id: "mock-notes", rows: "4", "aria-label": "Your notes" }),
      el("button", { type: "button", class: "md-button", id: "mock-done-answering", text: "I have answered: show the rubric",
        onclick: (e) => { e.target.hidden = true; rubric.hidden = false; } }),
      rubric,
    );
  };

  App.prototype.recordMock = function (rubricBox) {
    const m = this.mock;
    const covered = [...rubricBox.querySelectorAll("input[data-point]:checked")].map((x) => Number(x.dataset.point));
    m.covered[m.index] = covered;
    m.index += 1;
    if (m.index < m.questions.length) this.renderMockQuestion();
    else this.endMock("round finished");
  };

  App.prototype.endMock = function (why) {
    const m = this.mock;
    window.clearInterval(m.timer);
    m.ended = now();
    const result = { started: m.started, ended: m.ended, minutes: m.minutes, why: why,
      questions: m.questions.map((q, i) => ({ id: q.id, covered: m.covered[i] || [], points: q.rubric.length, asked: i <= m.index })) };
    this.progress.mocks.push(result);
    this.save();
    this.root.querySelector("#mock-stage").replaceChildren();
    this.renderMockReport(result);
  };

  App.prototype.renderMockReport = function (result) {
    const used = Math.round((result.ended - result.started) / 1000);
    const rows = [];
    const revisit = [];
    for (const r of result.questions) {
      const q = this.byId[r.id];
      rows.push(el("tr", {}, [el("td", { text: q.topic }), el("td", {}, [el("a", { href: this.url(q.url), text: q.title })]),
        el("td", { text: `${r.covered.length} of ${r.points}` })]));
      const missed = q.rubric.filter((_, i) => !r.covered.includes(i));
      if (missed.length) {
        revisit.push(el("li", {}, [
          el("a", { href: this.url(q.url), text: q.title }), `: ${missed.length} point${missed.length > 1 ? "s" : ""} missed`,
          el("ul", {}, [...missed.map((p) => el("li", { html: p })),
            ...q.pages.map((p) => el("li", {}, ["Read ", el("a", { href: this.url(p.url), text: p.label })])),
            ...q.exercises.map((x) => el("li", {}, ["Do ", el("a", { href: this.url(x.url), text: x.label })]))]),
        ]));
      }
    }
    this.root.querySelector("#mock-report").replaceChildren(
      el("h3", { text: `Report: ${result.why}, ${Math.floor(used / 60)} min ${used % 60} s used` }),
      el("table", {}, [el("thead", {}, [el("tr", {}, [el("th", { text: "topic" }), el("th", { text: "question" }), el("th", { text: "rubric points covered" })])]),
        el("tbody", {}, rows)]),
      el("h4", { text: "To revisit" }),
      revisit.length ? el("ul", { id: "mock-revisit" }, revisit) : el("p", { id: "mock-revisit", text: "Nothing: every point was covered." }),
    );
  };

  // ---------------------------------------------------------------- progress

  App.prototype.topicStats = function () {
    const t = now();
    const latest = {};
    for (const r of this.progress.reviews) latest[r.id] = r;
    return this.topics().map((topic) => {
      const qs = this.bank.filter((q) => q.topic === topic);
      const practised = qs.filter((q) => latest[q.id]);
      const recall = qs.reduce((s, q) => s + (this.progress.cards[q.id] ? this.fsrs.retrievability(this.progress.cards[q.id], t) : 0), 0) / qs.length;
      const coverage = practised.length ? practised.reduce((s, q) => s + latest[q.id].covered.length / latest[q.id].points, 0) / qs.length : 0;
      const assignments = [...new Set(qs.flatMap((q) => q.exercises.map((x) => x.assignment)).filter(Boolean))].sort();
      const graded = assignments.filter((a) => this.progress.grades[a]);
      const exercise = assignments.length
        ? assignments.reduce((s, a) => s + (this.progress.grades[a] ? this.progress.grades[a].best_score / this.progress.grades[a].max_score : 0), 0) / assignments.length
        : null;
      const parts = [recall, coverage].concat(exercise === null ? [] : [exercise]);
      return { topic, questions: qs.length, practised: practised.length, recall, coverage, assignments, graded, exercise,
        mastery: parts.reduce((a, b) => a + b, 0) / parts.length };
    });
  };

  const pct = (x) => `${Math.round(100 * x)} %`;

  App.prototype.renderDashboard = function () {
    const box = this.root.querySelector("#progress-dashboard");
    if (!box) return;
    const rows = this.topicStats().map((s) => el("tr", { "data-topic": s.topic }, [
      el("td", { text: s.topic }),
      el("td", { text: `${s.practised} of ${s.questions}` }),
      el("td", { text: pct(s.recall) }),
      el("td", { text: pct(s.coverage) }),
      el("td", { class: "progress-exercises", text: s.exercise === null ? "no exercise" : `${pct(s.exercise)} (${s.graded.length} of ${s.assignments.length} graded)` }),
      el("td", {}, [el("meter", { min: "0", max: "1", value: String(s.mastery), "aria-label": `mastery of ${s.topic}` }), " ", pct(s.mastery)]),
    ]));
    // On a phone the table scrolls sideways: focusable, so the keyboard can scroll it too.
    box.replaceChildren(el("table", { id: "progress-table", tabindex: "0", "aria-label": "Mastery per topic" }, [
      el("thead", {}, [el("tr", {}, ["topic", "practised", "recall now", "rubric points covered", "exercises", "mastery"].map((h) => el("th", { text: h })))]),
      el("tbody", {}, rows),
    ]), el("p", { id: "progress-summary", text:
      `${this.progress.reviews.length} reviews, ${Object.keys(this.progress.cards).length} questions scheduled, ` +
      `${Object.keys(this.progress.grades).length} exercise grades, ${this.progress.mocks.length} mock interviews.` }));
  };

  App.prototype.message = function (text, ok) {
    const box = this.root.querySelector("#progress-message");
    box.textContent = text;
    box.className = ok ? "practice-ok" : "practice-error";
  };

  App.prototype.exportProgress = function () {
    const data = Object.assign({ exported_at: new Date(now()).toISOString() }, this.progress);
    const blob = new Blob([JSON.stringify(data, null, 1)], { type: "application/json" });
    const a = el("a", { href: URL.createObjectURL(blob), download: "dl-lab-progress.json" });
    document.body.append(a);
    a.click();
    a.remove();
  };

  App.prototype.importFile = function (file) {
    file.text().then((text) => {
      let data;
      try {
        data = JSON.parse(text);
      } catch (e) {
        throw new Error("the file is not valid JSON");
      }
      if (isObj(data) && data.format === GRADES_FORMAT) {
        const grades = parseGrades(data);
        this.progress.grades = grades;
        this.save();
        this.message(`Imported the best scores of ${Object.keys(grades).length} assignments.`, true);
      } else {
        this.progress = parseProgress(data);
        this.save();
        this.current = null;
        this.nextQuestion();
        this.message(`Imported ${this.progress.reviews.length} reviews and ${Object.keys(this.progress.cards).length} scheduled questions.`, true);
      }
    }).catch((e) => this.message(`Refused ${file.name}: ${e.message}. Nothing was changed.`, false));
  };

  App.prototype.renderProgressControls = function () {
    const box = this.root.querySelector("#progress-controls");
    const input = el("input", { type: "file", id: "progress-import", accept: ".json,application/json" });
    input.addEventListener("change", () => { if (input.files[0]) this.importFile(input.files[0]); input.value = ""; });
    box.replaceChildren(
      el("button", { type: "button", class: "md-button", id: "progress-export", text: "Export progress", onclick: () => this.exportProgress() }),
      " ", el("label", { for: "progress-import", text: "Import a progress file or a grader export: " }), input,
    );
  };

  App.prototype.start = function () {
    this.root.querySelector("#practice-loading").remove();
    for (const part of this.root.querySelectorAll("[data-practice-part]")) part.hidden = false;
    this.renderFilters();
    this.nextQuestion();
    const minutes = el("select", { id: "mock-minutes" }, [45, 30, 20].map((m) => el("option", { value: String(m), text: `${m} minutes` })));
    this.root.querySelector("#mock-controls").replaceChildren(
      el("label", {}, ["Length ", minutes]), " ",
      el("button", { type: "button", class: "md-button md-button--primary", id: "mock-start", text: "Start a mock interview", onclick: () => this.startMock() }),
      " ", el("button", { type: "button", class: "md-button", id: "mock-end", text: "End now", onclick: () => this.mock && !this.mock.ended && this.endMock("ended early") }),
      " ", el("span", { id: "mock-clock", class: "practice-clock", role: "timer", "aria-live": "off" }),
    );
    this.renderProgressControls();
    this.renderDashboard();
  };

  function boot() {
    const root = document.getElementById("practice-app");
    if (!root) return;
    fetch(root.dataset.bank).then((r) => {
      if (!r.ok) throw new Error(`${r.status}`);
      return r.json();
    }).then((bank) => {
      const app = new App(root, bank);
      window.labPractice = app;
      app.start();
    }).catch((e) => {
      root.querySelector("#practice-loading").textContent = `The question bank could not be loaded (${e.message}).`;
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
