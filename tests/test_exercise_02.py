"""Exercise 02 (fitting α and β), graded end to end with ``python -m grader`` as a learner would.

The grader runs are slow (a Jupyter kernel each), so they start together, once, in the
module fixture ``runs``, and each test reads its result. What is checked:

* the source notebook (with its solutions) scores full marks;
* the released notebook scores 0, every test failing with a NotImplementedError hint, and
  grading still completes;
* the released notebook with its solution cells filled from the source scores full marks
  (so the hidden tests come from the gradebook, not from the learner's file);
* a plausible wrong solution scores partial marks, failing the tests meant to catch it:
  ordinary least squares on the seconds (α drowned by the large messages) together with a
  ring formula that forgets the 2(p−1)/p factor; a fit against log(size) fails exactly the
  fit tests (checked in process, which is quick);
* released notebooks hold no solution and no hidden test;
* in process (fast): every cell of the source notebook passes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT

ASSIGNMENT = "02_alpha_beta"
SOURCE = ROOT / "exercises" / "source" / ASSIGNMENT / "alpha_beta.ipynb"
MAX_SCORE = 20.0
SOLUTION_CELLS = ("pingpong", "fit_alpha_beta", "ring_allreduce_time", "recursive_doubling_time")

pytestmark = pytest.mark.timeout(300)


def read_nb(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def source_of(cell: dict[str, Any]) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def cell_of(nb: dict[str, Any], grade_id: str) -> dict[str, Any]:
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise AssertionError(f"no cell {grade_id} in the notebook")


def edited(nb: dict[str, Any], grade_id: str, old: str, new: str) -> dict[str, Any]:
    """A copy of ``nb`` with ``old`` replaced by ``new`` in cell ``grade_id`` (which must contain it)."""
    nb = json.loads(json.dumps(nb))
    cell = cell_of(nb, grade_id)
    assert old in source_of(cell), f"{old!r} is not in cell {grade_id}"
    cell["source"] = source_of(cell).replace(old, new)
    return nb


OLS = ("design = np.stack([1 / t, m / t], axis=1)\n    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)",
       "design = np.stack([np.ones_like(m), m], axis=1)\n    (alpha, beta), *_ = np.linalg.lstsq(design, t, rcond=None)")
NO_FACTOR = ("2 * (p - 1) / p * n_bytes * beta", "n_bytes * beta")
LOG_SIZE = ("design = np.stack([1 / t, m / t], axis=1)", "design = np.stack([1 / t, np.log2(np.maximum(m, 1)) / t], axis=1)")


class Started:
    """A ``python -m grader`` child started now, collected later (so several run at once)."""

    def __init__(self, cwd: Path, *args: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.argv = [sys.executable, "-m", "grader", *args]
        self.proc = subprocess.Popen(self.argv, cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait(self, timeout: float = 240) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"{self.argv} did not finish in {timeout} s:\n{err[-3000:]}")
        assert self.proc.returncode == 0, (self.argv, err)
        return json.loads(out) if out.strip().startswith("{") else {"stdout": out}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("exercise02")
    source = read_nb(SOURCE)
    release_out = work / "release"
    release = Started(work, "release", "--out", str(release_out))

    notebooks = {
        "wrong_ols_no_factor": edited(edited(source, "fit_alpha_beta", *OLS), "ring_allreduce_time", *NO_FACTOR),
    }

    def check(name: str, notebook: Path) -> Started:
        return Started(work, "check", str(notebook), "--json", "--feedback-dir", str(work / f"fb-{name}"))

    started = {"source": check("source", SOURCE)}
    for name, nb in notebooks.items():
        (work / name).mkdir()
        path = work / name / "alpha_beta.ipynb"
        path.write_text(json.dumps(nb))
        started[name] = check(name, path)
    release.wait()
    released = release_out / ASSIGNMENT / "alpha_beta.ipynb"
    started["released"] = check("released", released)
    solved = read_nb(released)
    for grade_id in SOLUTION_CELLS:
        cell_of(solved, grade_id)["source"] = source_of(cell_of(source, grade_id))
    (work / "solved").mkdir()
    (work / "solved" / "alpha_beta.ipynb").write_text(json.dumps(solved))
    started["released_solved"] = check("released_solved", work / "solved" / "alpha_beta.ipynb")
    results = {name: run.wait() for name, run in started.items()}
    results["released_path"] = released
    return results


def by_id(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in result["tests"]}


def test_source_notebook_scores_full_marks(runs):
    result = runs["source"]
    failed = [(t["id"], t["hint"]) for t in result["tests"] if not t["passed"]]
    assert result["assignment"] == ASSIGNMENT and result["max_score"] == MAX_SCORE
    assert result["score"] == MAX_SCORE, f"failed tests: {failed}"
    assert len(result["tests"]) == 10 and result["cell_errors"] == [] and result["tampered"] == []


def test_released_notebook_scores_zero_without_crashing(runs):
    result = runs["released"]
    assert result["score"] == 0 and result["max_score"] == MAX_SCORE and result["error"] is None
    assert all(not t["passed"] and "NotImplementedError" in t["hint"] for t in result["tests"]), [
        t["hint"] for t in result["tests"]]


def test_released_notebook_with_the_solutions_filled_in_scores_full_marks(runs):
    result = runs["released_solved"]
    failed = [(t["id"], t["hint"]) for t in result["tests"] if not t["passed"]]
    assert result["score"] == MAX_SCORE, f"failed tests: {failed}"
    assert sum(t["id"].startswith("hidden_") for t in result["tests"]) == 6


def test_least_squares_on_seconds_and_a_forgotten_factor_get_partial_marks(runs):
    result = runs["wrong_ols_no_factor"]
    tests = by_id(result)
    assert 0 < result["score"] < MAX_SCORE, result
    for failing in ("hidden_fit_noisy", "test_ring_example", "hidden_ring", "hidden_end_to_end"):
        assert not tests[failing]["passed"] and tests[failing]["score"] == 0, tests[failing]
    for passing in ("test_fit_example", "hidden_fit_exact", "hidden_pingpong", "hidden_recursive_doubling"):
        assert tests[passing]["passed"], tests[passing]
    hint = tests["hidden_fit_noisy"]["hint"]
    assert "expected alpha within 10 %" in hint and "found" in hint, hint
    assert "expected 0.01407 s, found 0.00807" in tests["test_ring_example"]["hint"]


def run_cells(nb: dict[str, Any]) -> dict[str, str | None]:
    """Every code cell of ``nb`` in one namespace, in process: {grade_id: error text or None}."""
    namespace: dict[str, Any] = {"__name__": "alpha_beta_notebook"}
    outcome: dict[str, str | None] = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        grade_id = cell["metadata"]["nbgrader"]["grade_id"]
        try:
            exec(compile(source_of(cell), f"<cell {grade_id}>", "exec"), namespace)
            outcome[grade_id] = None
        except Exception as exc:  # noqa: BLE001 - a failing test cell is the point
            outcome[grade_id] = f"{type(exc).__name__}: {exc}"
    return outcome


def test_fitting_against_log_size_fails_the_fit_tests_only():
    """In process (the graded runs above show in-process outcomes are what the grader scores)."""
    outcome = run_cells(edited(read_nb(SOURCE), "fit_alpha_beta", *LOG_SIZE))
    for failing in ("test_fit_example", "hidden_fit_exact", "hidden_fit_noisy", "hidden_end_to_end"):
        assert outcome[failing] is not None and "expected" in outcome[failing], (failing, outcome[failing])
    for passing in ("test_pingpong_example", "hidden_pingpong", "hidden_ring", "hidden_recursive_doubling"):
        assert outcome[passing] is None, (passing, outcome[passing])


def test_release_has_no_solutions_and_no_hidden_tests(runs):
    released = read_nb(runs["released_path"])
    text = json.dumps(released)
    for secret in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "np.linalg.lstsq(design", "statistics.median(halves)",
                   "_ref_fit", "2 * (p - 1) / p * n_bytes * beta"):
        assert secret not in text, f"{secret!r} leaked into the release"
    stubs = [source_of(c) for c in released["cells"] if c["metadata"].get("nbgrader", {}).get("solution")]
    assert len(stubs) == len(SOLUTION_CELLS) and all("raise NotImplementedError()" in s for s in stubs)
    assert released["metadata"]["lab"] == {"assignment": ASSIGNMENT, "concept_page": "concepts/latency-vs-throughput.md"}


def test_every_cell_of_the_source_notebook_passes_in_process():
    """The fast version of the full-marks test: run every code cell in one namespace."""
    start = time.monotonic()
    failed = {gid: err for gid, err in run_cells(read_nb(SOURCE)).items() if err is not None}
    assert not failed, failed
    assert time.monotonic() - start < 30, "the notebook must stay quick to grade"
