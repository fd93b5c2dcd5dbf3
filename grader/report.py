"""What a grading run found, and the two ways of showing it: a table for people, JSON for tools.

The JSON has a fixed shape, relied on by scripts and by the tests::

    {"assignment", "notebook", "score", "max_score",
     "tests": [{"id", "score", "max_score", "passed", "hint", "seconds"}],
     "feedback_html", ...}

plus a few extra keys: ``timed_out``, ``error`` (why grading did not complete),
``cell_errors`` (failures outside test cells, e.g. a solution cell that raised or was
stopped), ``tampered`` (locked cells whose text the learner changed; nbgrader grades the
original text, and the report says so) and ``isolation`` (what the sandbox enforced on the
run: wall-clock, per-cell, memory and CPU limits, network, processes, files) and ``steps``
(seconds per nbgrader step, and whether the assignment was generated or came from the
cache of ``grader.generated``).
"""
from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import asdict, dataclass, field


@dataclass
class TestResult:
    """One autograded test cell: its nbgrader grade id, points, and why it failed."""

    __test__ = False  # not a pytest test class, whatever its name

    id: str
    score: float
    max_score: float
    passed: bool
    hint: str | None = None  # the failure itself: the assertion's message, or why the test did not run
    seconds: float | None = None  # the test cell's run time in the kernel (None: it did not run)
    advice: str | None = None  # the instructor's hint for this mistake (grader.hints), failed tests only
    read: str | None = None  # the address of the paragraph of the site that explains the concept
    line: str | None = None  # the learner's own line the failure went through ("cell ring, line 7: ...")


@dataclass
class CellError:
    """An error in a cell that is not a test (setup, a solution, given code)."""

    cell: str
    error: str
    line: str | None = None  # the learner's own line the error went through


@dataclass
class GradingResult:
    """The outcome of ``python -m grader check``."""

    assignment: str
    notebook: str
    tests: list[TestResult] = field(default_factory=list)
    feedback_html: str | None = None
    timed_out: bool = False
    error: str | None = None
    cell_errors: list[CellError] = field(default_factory=list)
    tampered: list[str] = field(default_factory=list)
    isolation: dict[str, str] = field(default_factory=dict)  # what the sandbox enforced
    steps: dict[str, object] = field(default_factory=dict)  # nbgrader's steps: seconds, generated how
    concept_page: str | None = None  # the site address of the assignment's concept page
    threads: dict[str, str] = field(default_factory=dict)  # test -> the notebook's threads still running after it

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    @property
    def completed(self) -> bool:
        """Whether every test ran (the score is a real grade, not a stopped run's zero)."""
        return self.error is None

    def to_json(self) -> str:
        data = {
            "assignment": self.assignment,
            "notebook": self.notebook,
            "score": self.score,
            "max_score": self.max_score,
            "tests": [asdict(t) for t in self.tests],
            "feedback_html": self.feedback_html,
            "timed_out": self.timed_out,
            "error": self.error,
            "cell_errors": [asdict(e) for e in self.cell_errors],
            "tampered": self.tampered,
            "isolation": self.isolation,
            "steps": self.steps,
            "concept_page": self.concept_page,
            "threads": self.threads,
        }
        return json.dumps(data, indent=2)

    def to_table(self) -> str:
        return render_table(self)


def _points(x: float) -> str:
    return f"{x:g}"


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def _wrapped(text: str, width: int, first: str, rest: str) -> list[str]:
    lines = textwrap.wrap(text, width - len(first)) or [""]
    return [first + lines[0]] + [rest + line for line in lines[1:]]


def render_table(result: GradingResult, *, verbose: bool = False) -> str:
    """A plain-text report: errors in the learner's own cells first, one row per test (with the
    failure, the learner's line and the hint), the total, then the feedback page and where to read.

    Tests that did not run for the same reason (an earlier cell stopped the run) share one
    line. ``verbose`` adds what the sandbox enforced.
    """
    width = max(72, min(shutil.get_terminal_size((100, 24)).columns, 160))
    lines = [
        f"Assignment {result.assignment}: {result.notebook}"
        + (f"  (device: {result.isolation['device']})" if "device" in result.isolation else ""),
        "",
    ]
    if result.cell_errors:
        lines.append("Fix these first (errors in cells that are not tests):")
        for e in result.cell_errors:
            lines.extend(_wrapped(f"cell {e.cell}: {e.error}", width, "  - ", "    "))
            if e.line and e.line not in e.error:
                lines.extend(_wrapped(e.line, width, "    at ", "       "))
        lines.append("")
    id_w = max([len("test")] + [len(t.id) for t in result.tests])
    head = f"{'test':<{id_w}}  {'points':>6}  {'max':>4}  {'time':>7}  status"
    lines += [head, "-" * len(head)]
    indent = " " * (id_w + 4)
    tests = result.tests
    for i, t in enumerate(tests):
        status = "pass" if t.passed else "FAIL"
        lines.append(f"{t.id:<{id_w}}  {_points(t.score):>6}  {_points(t.max_score):>4}  {_seconds(t.seconds):>7}  {status}")
        shared = bool(t.hint) and t.hint.startswith("not run") and i + 1 < len(tests) and tests[i + 1].hint == t.hint
        if t.hint and not shared:
            lines.extend(_wrapped(t.hint, width, indent, indent))
        if t.line:
            lines.extend(_wrapped(t.line, width, indent + "at ", indent + "   "))
        if t.advice:
            lines.extend(_wrapped(t.advice, width, indent + "hint: ", indent + "      "))
        if t.read:
            lines.append(f"{indent}read: {t.read}")
    lines.append("-" * len(head))
    lines.append(f"{'total':<{id_w}}  {_points(result.score):>6}  {_points(result.max_score):>4}")
    notes = []
    if result.error:
        notes.append(f"grading did not complete: {result.error}")
    if result.threads:
        test, names = next(iter(result.threads.items()))
        notes.append(f"threads your code started were still running at test {test}: {names}; they take "
                     "CPU from every test after it (end them, or join them before returning)")
    if result.tampered:
        notes.append(
            "locked cells that differ from the released notebook were graded with their "
            "original text: "
            + ", ".join(result.tampered)
        )
    if notes:
        lines.append("")
        lines.append("Notes:")
        for note in notes:
            lines.extend(_wrapped(note, width, "  - ", "    "))
    if verbose and result.isolation:
        lines.append("")
        walls = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in result.isolation.items())
        lines.extend(textwrap.wrap("Sandbox: " + walls, width, subsequent_indent="  "))
    lines.append("")
    lines.append(f"Feedback: {result.feedback_html}" if result.feedback_html else "Feedback: none written")
    if result.concept_page:
        lines.append(f"Read more: {result.concept_page}")
    return "\n".join(lines)
