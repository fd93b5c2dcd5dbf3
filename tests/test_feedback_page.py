"""The feedback page (grader/feedback.py), rendered from a grading record: what it shows, and
what it must never show."""
from __future__ import annotations

import json

from grader.feedback import render_page, write_feedback_page
from grader.report import CellError, GradingResult, TestResult


def record() -> GradingResult:
    return GradingResult(
        "02_alpha_beta", "work/02_alpha_beta/alpha_beta.ipynb",
        tests=[TestResult("test_fit", 2, 2, True, None, 0.12),
               TestResult("hidden_predict", 0, 3, False, "AssertionError: predict(1024) = 3.1e-05 s, expected 2.0e-05 s",
                          0.05, advice="Time is $\\alpha + \\beta n$: fit $\\beta$ on the large messages <only>.",
                          read="http://127.0.0.1:8000/concepts/latency-vs-throughput/#the-model",
                          line="cell fit, line 4: beta = sizes.mean() / times.mean()")],
        cell_errors=[CellError("predict", "NameError: name 'np' is not defined", "cell predict, line 2: np.log(x)")],
        concept_page="http://127.0.0.1:8000/concepts/latency-vs-throughput/")


def test_page_shows_each_test_with_its_failure_line_hint_and_link(tmp_path):
    page = write_feedback_page(tmp_path / "fb" / "a.html", record()).read_text(encoding="utf-8")
    for shown in ("test_fit", "hidden_predict", "0 / 3 points", "0.05 s", "predict(1024) = 3.1e-05 s",
                  "cell fit, line 4: beta = sizes.mean() / times.mean()", "Fix first", "cell predict, line 2",
                  'href="http://127.0.0.1:8000/concepts/latency-vs-throughput/#the-model"'):
        assert shown in page, shown
    assert "&lt;only&gt;" in page  # the hint's text is escaped, not markup


def test_math_in_a_hint_is_mathml_and_nothing_is_loaded():
    page = render_page("Feedback", [json.loads(record().to_json())])
    assert page.count("<math") == 2 and "$" not in page
    for loads in ("<script", "<link", "src=", "@import", "url("):
        assert loads not in page, loads
    assert '<meta name="viewport"' in page and "prefers-color-scheme:dark" in page


def test_several_records_have_a_total():
    one = json.loads(record().to_json())
    page = render_page("Feedback for ada", [one, {**one, "submission": "again.ipynb"}])
    assert "Total: 4 / 10 points over 2 submissions" in page and "02_alpha_beta: again.ipynb" in page
