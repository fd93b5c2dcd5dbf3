"""Helpers for the tests that grade the exercise notebooks end to end (tests/test_grader.py,
tests/test_exercises.py, tests/test_exercise_*.py): read and edit notebooks, run ``python -m
grader`` as child processes (several at once; ``GradedExercises`` grades each assignment once
a session), and execute a notebook's cells in process.

Not a test module (its name does not start with ``test_``); the tests import it as
``from notebook_tools import ...``, tests/ being on ``sys.path`` as for ``conftest``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from conftest import ROOT

# --------------------------------------------------------------------------- notebooks


def read_nb(path: Path) -> dict[str, Any]:
    """The notebook at ``path``, as parsed JSON."""
    return json.loads(path.read_text(encoding="utf-8"))


def write_nb(path: Path, nb: dict[str, Any]) -> Path:
    """Write ``nb`` to ``path`` (creating its folder) and return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))
    return path


def source_of(cell: dict[str, Any]) -> str:
    """A cell's source as one string (notebooks store it as a string or a list of lines)."""
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def grade_id(cell: dict[str, Any]) -> str | None:
    """A cell's nbgrader ``grade_id``, or None if it has none."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def cell_of(nb: dict[str, Any], gid: str) -> dict[str, Any]:
    """The cell of ``nb`` whose grade_id is ``gid`` (AssertionError if there is none)."""
    for cell in nb["cells"]:
        if grade_id(cell) == gid:
            return cell
    raise AssertionError(f"no cell {gid} in the notebook")


def edit_cell(nb: dict[str, Any], gid: str, edit: str | Callable[[str], str]) -> dict[str, Any]:
    """A copy of ``nb`` whose cell ``gid`` holds ``edit(source)``, or ``edit`` itself if it is a string.

    The edit must change the cell (AssertionError otherwise); ``nb`` is left as it was.
    """
    nb = json.loads(json.dumps(nb))
    cell = cell_of(nb, gid)
    old = source_of(cell)
    new = edit if isinstance(edit, str) else edit(old)
    assert new != old, f"the edit of cell {gid} changed nothing"
    cell["source"] = new
    return nb


def replacing(old: str, new: str) -> Callable[[str], str]:
    """An edit for :func:`edit_cell`: replace ``old`` by ``new``, which the cell must contain."""

    def edit(source: str) -> str:
        assert old in source, f"{old!r} is not in the cell:\n{source}"
        return source.replace(old, new)

    return edit


def with_cells_from(nb: dict[str, Any], source: dict[str, Any], gids: Iterable[str]) -> dict[str, Any]:
    """A copy of ``nb`` whose cells ``gids`` hold their text in ``source`` (a released notebook,
    filled in with the source's solutions, is what a learner who got everything right hands in)."""
    for gid in gids:
        nb = edit_cell(nb, gid, source_of(cell_of(source, gid)))
    return nb


# --------------------------------------------------------------------------- python -m grader


def grader_argv(*args: str) -> list[str]:
    """The command line of ``python -m grader ARGS``."""
    return [sys.executable, "-m", "grader", *args]


def grader_env(**extra: str) -> dict[str, str]:
    """This process's environment, with the repository root first on PYTHONPATH, plus ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


@dataclass
class Run:
    """One finished ``python -m grader`` child process."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> dict[str, Any]:
        """What the run printed (``--json``), parsed."""
        assert self.stdout.strip(), f"no output from {self.argv}; stderr:\n{self.stderr}"
        return json.loads(self.stdout)

    def ok(self) -> Run:
        """This run, which must have exited 0 (AssertionError with its stderr otherwise)."""
        assert self.returncode == 0, f"{self.argv} exited with {self.returncode}:\n{self.stderr[-3000:]}"
        return self

    def result(self) -> dict[str, Any]:
        """:meth:`json` of a run that must have exited 0."""
        return self.ok().json()


class Started:
    """A ``python -m grader`` child started now, collected later (so several run at once)."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None):
        self.argv = grader_argv(*args)
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, cwd=cwd, env=env or grader_env(), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )

    def wait(self, timeout: float = 240) -> Run:
        """Wait for the child (the test fails if it takes over ``timeout`` seconds)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"{self.argv} did not finish in {timeout} s:\n{err[-3000:]}")
        return Run(self.argv, self.proc.returncode, out, err, time.monotonic() - self.start)


def start_release(work: Path, out: Path) -> Started:
    """Start ``grader release --out OUT`` in ``work``."""
    return Started("release", "--out", str(out), cwd=work)


def start_check(work: Path, name: str, notebook: Path, *extra: str,
                env: dict[str, str] | None = None) -> Started:
    """Start ``grader check NOTEBOOK --json EXTRA`` in ``work``, its feedback going to ``work/fb-NAME``."""
    return Started("check", str(notebook), "--json", "--feedback-dir", str(work / f"fb-{name}"),
                   *extra, cwd=work, env=env)


class SharedRelease:
    """One ``grader release`` of the whole course into ``work/release``, started on first use and
    waited for once: every assignment graded in a session reads its learner version from it
    (``grader release`` writes all the assignments, whichever one a test needs)."""

    def __init__(self, work: Path):
        self.work, self.out = work, work / "release"
        self._started: Started | None = None
        self._run: Run | None = None

    def start(self) -> None:
        """Start the release, unless it is started already."""
        if self._started is None:
            self._started = start_release(self.work, self.out)

    def wait(self) -> Path:
        """The release folder, once the release has finished (AssertionError if it failed)."""
        self.start()
        if self._run is None:
            self._run = self._started.wait()
        self._run.ok()
        return self.out


def grade_assignment(work: Path, source_path: Path, assignment: str, solution_cells: Iterable[str],
                     wrong: dict[str, dict[str, Any]], release: SharedRelease | None = None) -> dict[str, Any]:
    """Grade an assignment's standard cases at once, each a parallel ``grader check --json``.

    Cases: every notebook of ``wrong`` (name -> notebook), ``released`` (the learner version
    from ``grader release``) and ``released_solved`` (that version with the ``solution_cells``
    filled in from the source, so its hidden tests can only come from the gradebook). The
    source notebook itself is not graded: autograde puts back the same locked and test cells
    from the gradebook, so it would run exactly what ``released_solved`` runs. ``release``: a
    release shared with other gradings (default: one of its own in ``work``). Returns each
    case's JSON result, ``released_path``, the released notebook, and ``released_text``, its text.
    """
    source = read_nb(source_path)
    release = release or SharedRelease(work)
    release.start()
    started = {}
    for name, nb in wrong.items():
        started[name] = start_check(work, name, write_nb(work / name / source_path.name, nb))
    released = release.wait() / assignment / source_path.name
    started["released"] = start_check(work, "released", released)
    solved = write_nb(work / "solved" / source_path.name,
                      with_cells_from(read_nb(released), source, solution_cells))
    started["released_solved"] = start_check(work, "released_solved", solved)
    results: dict[str, Any] = {name: run.wait().result() for name, run in started.items()}
    results["released_path"] = released
    results["released_text"] = released.read_text(encoding="utf-8")
    return results


class GradedExercises:
    """``graded(assignment)``: the results of :func:`grade_assignment` for an assignment of
    tests/exercise_specs.py (its release, the release with its solutions, and its ``wrong``
    notebooks, graded at once), computed on first use and then shared by every test of the
    session; all assignments read one shared release. A grading that failed fails every test
    that asks for it, without grading again."""

    def __init__(self, tmp_path_factory: Any):
        self.tmp_path_factory = tmp_path_factory
        self.release: SharedRelease | None = None
        self.done: dict[str, dict[str, Any] | BaseException] = {}

    def __call__(self, assignment: str) -> dict[str, Any]:
        from exercise_specs import EXERCISES

        if assignment not in self.done:
            spec = EXERCISES[assignment]
            if self.release is None:
                self.release = SharedRelease(self.tmp_path_factory.mktemp("course"))
            try:
                self.done[assignment] = grade_assignment(
                    self.tmp_path_factory.mktemp(assignment), spec.source, spec.assignment, spec.solution_cells,
                    spec.wrong_notebooks(), self.release)
            except (Exception, pytest.fail.Exception) as exc:
                self.done[assignment] = exc
                raise
        result = self.done[assignment]
        if isinstance(result, BaseException):
            pytest.fail(f"grading {assignment} failed (in an earlier test): {result}", pytrace=False)
        return result


def failed_tests(result: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(id, hint) of every test that did not pass: the message of a failed full-marks check."""
    return [(t["id"], t["hint"]) for t in result["tests"] if not t["passed"]]


def assert_full_marks(result: dict[str, Any], max_score: float) -> None:
    """Every test passed, and the score is the assignment's maximum."""
    assert result["max_score"] == max_score
    assert result["score"] == max_score, f"failed tests: {failed_tests(result)}"


def assert_solved(result: dict[str, Any], assignment: str, max_score: float, *, tests: int,
                  hidden: int | None = None) -> None:
    """A notebook with every solution in place: its assignment, full marks, ``tests`` tests
    (``hidden`` of them hidden), no tampered cell and no error outside the tests."""
    assert result["assignment"] == assignment
    assert_full_marks(result, max_score)
    assert len(result["tests"]) == tests, [t["id"] for t in result["tests"]]
    if hidden is not None:
        assert sum(t["id"].startswith("hidden_") for t in result["tests"]) == hidden
    assert result["tampered"] == [] and result["cell_errors"] == []


def assert_nothing_leaked(released_text: str, *secrets: str) -> None:
    """No solution or hidden-test region, nor any of ``secrets`` (lines only the source has),
    in the text of a released notebook."""
    for secret in ("BEGIN HIDDEN TESTS", "BEGIN SOLUTION", *secrets):
        assert secret not in released_text, f"{secret!r} leaked into the release"


def assert_unimplemented_scores_zero(result: dict[str, Any], max_score: float) -> None:
    """A released notebook as handed out: graded to completion, every test failing on the stubs."""
    assert result["error"] is None and result["score"] == 0 and result["max_score"] == max_score
    assert all(not t["passed"] and "NotImplementedError" in t["hint"] for t in result["tests"]), [
        t["hint"] for t in result["tests"]]


def by_id(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The tests of a grader result, by id."""
    return {t["id"]: t for t in result["tests"]}


def assert_partial_marks(result: dict[str, Any], max_score: float, *, failing: Iterable[str],
                         score: float | None = None) -> dict[str, dict[str, Any]]:
    """A plausible wrong solution: exactly the tests in ``failing`` fail and every other test
    passes; the score is ``score`` if given, else strictly between 0 and ``max_score``.
    Returns the tests by id, so the caller can check the hints the learner would read."""
    failing = set(failing)
    tests = by_id(result)
    assert failing <= set(tests), f"no such tests: {sorted(failing - set(tests))}"
    for test_id, test in tests.items():
        assert test["passed"] == (test_id not in failing), (test_id, test["hint"])
    if score is None:
        assert 0 < result["score"] < max_score, result["score"]
    else:
        assert result["score"] == score, result["score"]
    return tests


# --------------------------------------------------------------------------- in process


def run_cells(nb: dict[str, Any], *, strict: bool = False, upto: str | None = None,
              skip: tuple[str, ...] = (), namespace: dict[str, Any] | None = None) -> dict[str, str | None]:
    """Execute the code cells of ``nb`` in order in one namespace, in process (no kernel).

    Returns {grade_id: None, or "ExcType: message"} for each graded (test) cell. A cell that is
    not graded (set-up, solution) must run cleanly, and with ``strict`` every cell must: the first
    that fails raises AssertionError. ``upto``: stop after that cell; ``skip``: grade_id prefixes
    of cells not to run; ``namespace``: the dict to run in (filled in place).
    """
    namespace = {"__name__": "notebook"} if namespace is None else namespace
    outcome: dict[str, str | None] = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        gid = grade_id(cell)
        if gid is not None and gid.startswith(skip):
            continue
        graded = bool(cell.get("metadata", {}).get("nbgrader", {}).get("grade"))
        try:
            exec(compile(source_of(cell), f"<cell {gid}>", "exec"), namespace)
            error = None
        except Exception as exc:  # a failing test cell is a result here
            if strict or not graded:
                raise AssertionError(f"cell {gid} failed: {exc!r}") from exc
            error = f"{type(exc).__name__}: {exc}"
        if graded:
            outcome[gid] = error
        if gid == upto:
            break
    return outcome


def notebook_namespace(nb: dict[str, Any], *, upto: str | None = None,
                       skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The names ``nb``'s code cells define, run as :func:`run_cells` ``strict`` (every cell must pass)."""
    namespace: dict[str, Any] = {"__name__": "notebook"}
    run_cells(nb, strict=True, upto=upto, skip=skip, namespace=namespace)
    return namespace


# --------------------------------------------------------------------------- written hints


class Hints:
    """The hints a source notebook writes for its tests (``lab`` metadata, grader/hints.py), and
    the checks that a wrong solution is advised with the hint written for its mistake."""

    def __init__(self, source: Path):
        self.source = read_nb(source)

    def written(self, test_id: str) -> Any:
        """The ``WrittenHint`` of test ``test_id``; it must have a link to read."""
        from grader.hints import read_hint

        hint = read_hint(cell_of(self.source, test_id)["metadata"])
        assert hint is not None and hint.read, f"{test_id}: no written hint, or no link to read"
        return hint

    def case(self, test_id: str, pattern: str) -> str:
        """The hint written for the mistake whose failure message ``pattern`` selects, in ``test_id``."""
        return dict(self.written(test_id).cases)[pattern]

    def report(self, outcome: dict[str, str | None], *, whole: bool = False) -> dict[str, dict[str, Any]]:
        """``run_cells``'s outcome reported as ``grader check --json`` reports tests: passed, hint (the
        failure, one line), advice (the written hint that failure picks) and read (its link). With
        ``whole``, every failure must fit the grader's limit uncut (its reproduce line included)."""
        from grader.check import HINT_LIMIT, describe_error
        from grader.hints import site_link

        tests = {}
        for test_id, error in outcome.items():
            name, _, value = (error or "").partition(": ")
            hint = describe_error([{"ename": name, "evalue": value, "traceback": []}], None) if error else None
            if hint and whole:
                assert len(hint) <= HINT_LIMIT and not hint.endswith("..."), (test_id, hint)
            written = self.written(test_id)
            tests[test_id] = {"passed": error is None, "hint": hint, "advice": written.advice(hint) if error else None,
                              "read": site_link(written.read) if error else None}
        return tests

    def graded_in_process(self, nb: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Run ``nb``'s cells in process and report each test as the grader does (``report``)."""
        return self.report(run_cells(nb))

    def advice_in_process(self, outcome: dict[str, str | None], *, whole: bool = False) -> dict[str, str]:
        """{test: the written hint the grader would pick} for every test that failed in ``run_cells``."""
        return {test_id: t["advice"] for test_id, t in self.report(outcome, whole=whole).items() if not t["passed"]}

    def assert_general_hints(self, result: dict[str, Any], cases: dict[str, str] | None = None) -> None:
        """A notebook with no known mistake yet (the stubs): every failed test gets its general hint,
        or, for a test of ``cases`` ({test: pattern}), the hint written for that pattern's mistake."""
        from grader.hints import site_link

        cases = cases or {}
        for test in result["tests"]:
            if not test["passed"]:
                written = self.written(test["id"])
                expected = self.case(test["id"], cases[test["id"]]) if test["id"] in cases else written.hint
                assert test["advice"] == expected, (test["id"], test["hint"], test["advice"])
                assert test["read"] == site_link(written.read), test

    def assert_advised(self, tests: dict[str, dict[str, Any]], expected: dict[str, str], *,
                       whole: bool = False) -> None:
        """Each failed test in ``expected`` shows exactly the hint written for its mistake (the text)
        and links to its paragraph; with ``whole``, its failure fits the grader's limit uncut."""
        from grader.check import HINT_LIMIT
        from grader.hints import site_link

        for test_id, text in expected.items():
            test = tests[test_id]
            assert not test["passed"] and test["advice"] == text, (test_id, test["hint"], test["advice"])
            assert test["read"] == site_link(self.written(test_id).read) and "#" in test["read"], (test_id, test["read"])
            if whole:
                assert len(test["hint"]) <= HINT_LIMIT and not test["hint"].endswith("..."), (test_id, test["hint"])

    def assert_advice(self, tests: dict[str, dict[str, Any]], expected: dict[str, str]) -> None:
        """The failed tests are exactly those of ``expected`` ({test: a fragment of the hint written
        for that mistake}); each was advised that written hint, and linked to its concept paragraph."""
        from grader.hints import site_link

        failed = {test_id: t for test_id, t in tests.items() if not t["passed"]}
        assert set(failed) == set(expected), {test_id: t["hint"] for test_id, t in failed.items()}
        for test_id, fragment in expected.items():
            written = self.written(test_id)
            chosen = {h for h in (written.hint, *(h for _, h in written.cases)) if fragment in h}
            assert len(chosen) == 1, f"{test_id}: {fragment!r} is in {len(chosen)} of its written hints"
            assert failed[test_id]["advice"] in chosen, (test_id, failed[test_id]["hint"], failed[test_id]["advice"])
            assert failed[test_id]["read"] == site_link(written.read), (test_id, failed[test_id]["read"])
