"""``python -m grader check NOTEBOOK``: grade one learner notebook against its hidden tests.

``check_notebook`` is one run on one device, all inside a scratch copy of the course
(``course.scratch_course``):

1. read the notebook, find its assignment (metadata ``lab.assignment``, else its name, else
   the learner's ``--assignment``), and parse its solution cells (a ``SyntaxError`` is
   reported first, with the learner's line, ``grader.tracebacks``);
2. put it where nbgrader expects a submission: ``submitted/<student>/<assignment>/``, and
   wrap the scratch source's test cells with ``grader.guard`` (a secret token per run: a
   test counts only if its cell ran to its end, untampered); the source gets a fixed slot
   where the token goes, so that the generated assignment can be cached;
3. in one sandboxed child (``sandbox.run_limited`` running ``grader.steps``):
   ``generate_assignment`` (builds the gradebook, hidden tests included; or copies it from
   the cache of ``grader.generated`` and writes this run's token into it) and ``autograde``
   (restores locked and test cells from the gradebook, runs the notebook, saves the
   scores; each finished cell is reported to ``progress``, and the first cell past its
   time limit stops the run); the kernel starts behind ``grader.jail`` (course, cache and
   hidden tests hidden, private user, process and CPU limits, no network), and what was
   enforced is reported in ``isolation``;
4. read the scores nbgrader saved, and per failed test its failure from the autograded
   notebook's error outputs (the assertion message: what was expected and what was found),
   the learner's own line it went through, and the instructor's hint (``grader.hints``).

``grade`` runs it on each device the assignment must pass on and writes the feedback page
(``grader.feedback``). The hidden tests run on the array namespace of ``device``
(``--device cpu|gpu|torch|strict``): the kernel gets ``LAB_DEVICE`` from the jail, and an
exercise's set-up cell picks its namespace with ``reference_impl.backend.get_namespace``.
An assignment lists the devices its tests support in its source notebook's metadata,
``lab.devices`` (default ``["cpu"]``); any other device is refused before grading.

A run stopped by the wall-clock limit still gives a result: every test that did not run
scores 0 with a hint saying why, and ``error`` says where it stopped.
"""
from __future__ import annotations

import json
import re
import secrets
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from .course import (
    Assignment,
    Course,
    InputProblem,
    cell_source,
    load_notebook,
    repo_root,
    scratch_course,
)
from .feedback import write_feedback_page
from .generated import TOKEN_SLOT, cache_dir
from .guard import HIDDEN_TESTS, instrument, strip_guard_lines
from .hints import WrittenHint, site_link, written_hints
from .report import CellError, GradingResult, TestResult
from .sandbox import (
    DEFAULT_MEMORY_MB,
    cgroup_memory_cap,
    child_environment,
    network_isolation_available,
    plan_kernel,
    run_limited,
)
from .tracebacks import defined_names, syntax_errors

STUDENT = "learner"
DEVICE_LIBRARIES = {"cpu": "NumPy", "gpu": "CuPy or PyTorch CUDA", "torch": "PyTorch CPU",
                    "strict": "array_api_strict"}
DEFAULT_TIMEOUT = 120.0  # the budget of a whole check, over all its devices
HINT_LIMIT = 400
BROKEN_CELL = ": fix that cell first (at the top of this report)"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def check_notebook(
    notebook: Path,
    *,
    course: Course,
    timeout: float = DEFAULT_TIMEOUT,
    cell_timeout: int | None = None,
    memory_mb: int = DEFAULT_MEMORY_MB,
    device: str = "cpu",
    assignment_name: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    keep_autograded: Path | None = None,
) -> GradingResult:
    """Grade ``notebook`` with its tests on ``device``; raises ``course.InputProblem`` for input
    that cannot be graded (including a device the assignment or this machine cannot use).

    One run on one device; ``grade`` chooses the devices and writes the feedback page.
    ``assignment_name`` says which assignment the notebook answers when its metadata does
    not. ``progress`` is called with each cell's event (``{"cell", "test", "error",
    "seconds", "run"}``) as soon as the cell has run."""
    content = load_notebook(notebook)
    assignment, nb_name = course.identify(notebook, content, assignment_name)
    _check_cells_belong(notebook, content, course, assignment, nb_name)
    _check_device(device, assignment, nb_name)
    if device == "gpu":
        # CUDA reserves tens of GiB of virtual address space when it starts, so an address-space
        # limit only stops the kernel from using the GPU; the wall-clock and CPU limits remain.
        memory_mb = 0
    stem = Path(nb_name).stem
    result = GradingResult(assignment=assignment.name, notebook=str(notebook))
    planned = _planned_tests(assignment, nb_name)
    unparsable = syntax_errors(content)  # reported first: every test after them fails for this reason

    with scratch_course(course, [assignment]) as root:
        scratch = root.parent
        submitted = root / "submitted" / STUDENT / assignment.name
        submitted.mkdir(parents=True)
        shutil.copyfile(notebook, submitted / nb_name)
        token = secrets.token_hex(16)
        for source in (root / "source" / assignment.name).glob("*.ipynb"):
            # the slot, not the token: the generated assignment is then the same on every run
            # and can be cached; grader.steps puts the token in its place (grader.generated)
            source.write_text(json.dumps(instrument(json.loads(source.read_text(encoding="utf-8")), TOKEN_SLOT)),
                              encoding="utf-8")
        record_file = scratch / "steps.json"
        shown_limit = cell_timeout or course.cell_timeout()  # the limit in force, for the messages
        argv = [
            sys.executable, "-m", "grader.steps", str(root),
            "--assignment", assignment.name, "--student", STUDENT,
            "--steps", "generate,autograde", "--result", str(record_file),
        ]
        if cell_timeout is not None:
            argv += ["--cell-timeout", str(cell_timeout)]
        cpu_s = int(timeout) + 5
        cache = cache_dir()
        hidden = [course.root, repo_root() / ".git", root] + [
            scratch / name for name in ("jupyter-data", "jupyter-runtime", "jupyter-config", "ipython")]
        kernel = plan_kernel(scratch, hidden + ([cache] if cache is not None else []), cpu_s=cpu_s, device=device)
        if cache is not None and (kernel.uid is not None or kernel.bwrap):  # only a walled-in kernel cannot reach it
            argv += ["--cache", str(cache)]
        network_off = network_isolation_available()
        env = child_environment(scratch, kernel)
        env["LAB_GUARD_TOKEN"] = token  # for grader.steps; the jail does not pass it to the kernel
        env["LAB_PROGRESS"] = str(scratch / "progress.jsonl")
        cgroup, memory_cap = cgroup_memory_cap(memory_mb)
        child = run_limited(cgroup + argv, cwd=root, env=env,
                            timeout=timeout, memory_mb=memory_mb, cpu_s=cpu_s, network_off=network_off,
                            kernel_uid=kernel.uid, poll=_follow(Path(env["LAB_PROGRESS"]), progress))
        result.isolation = _isolation(kernel.report, network_off, memory_mb, cpu_s, timeout, shown_limit)
        result.isolation["memory_cap"] = memory_cap
        result.isolation["device"] = f"{device} ({DEVICE_LIBRARIES[device]})"
        record = _read_record(record_file)
        done = set(record.get("completed", []))
        result.steps = {"seconds": record.get("seconds", {}), "generated": record.get("generated")}

        grades = record.get("grades", {}).get(stem)
        autograded = root / "autograded" / STUDENT / assignment.name / nb_name
        outputs = _cell_outputs(autograded) if autograded.is_file() else {}
        seconds = _cell_seconds(autograded) if autograded.is_file() else {}
        if keep_autograded is not None and autograded.is_file():
            _keep_autograded(autograded, keep_autograded)
        if grades is not None:
            guard = record.get("guard", {}).get(stem, {})
            lines = guard.get("lines", {})
            result.tests = _tests_from_grades(grades, planned, outputs, shown_limit, guard)
            for test in result.tests:
                test.seconds = seconds.get(test.id)
                test.line = lines.get(test.id)
            result.cell_errors = _other_cell_errors(autograded, {g["id"] for g in grades}, shown_limit, lines)
            result.threads = guard.get("threads", {})
        else:
            result.tests = [TestResult(t, 0.0, points, False, None) for t, points in planned]

        released = root / "release" / assignment.name / nb_name
        if released.is_file():
            result.tampered = _tampered_cells(content, load_notebook(released))

    if child.timed_out:
        result.timed_out = True
        stage = "while running your notebook" if f"{assignment.name}:generate" in done else "while preparing the assignment"
        result.error = (
            f"stopped after {timeout:g} s, the wall-clock limit (--timeout), {stage}: "
            "a cell ran too long or never finished"
        )
        why = f"not run: grading was stopped at the {timeout:g} s wall-clock limit"
    elif record.get("failed"):
        failed = record["failed"]
        result.error = f"nbgrader {failed['step']} failed: {failed['message']}"
        why = f"not graded: nbgrader {failed['step']} failed"
    elif child.returncode != 0 or f"{assignment.name}:autograde" not in done:
        tail = [line for line in child.stderr.splitlines() if line.strip()]
        result.error = f"the grading process exited with status {child.returncode}: " + (
            tail[-1].strip() if tail else "no message"
        )
        why = "not graded: the grading process failed"
    else:
        why = None
    if why and result.error and not any(t.passed or t.hint for t in result.tests):
        for t in result.tests:
            t.hint = why
    _explain_broken_cells(result, content, unparsable)
    _add_written_hints(result.tests, written_hints(course, assignment.name))
    result.concept_page = _concept_link(assignment, nb_name)
    return result


def grade(notebook: Path, *, course: Course, feedback_dir: Path | None, devices: list[str] | None = None,
          assignment_name: str | None = None, **options: Any) -> GradingResult:
    """Grade ``notebook`` on each of ``devices`` and write its feedback page into ``feedback_dir``.

    By default the devices are ``cpu``, plus ``strict`` for an assignment whose code must be
    array-API code (``strict`` in its source's ``lab.devices``): the notebook says to use only
    the array API standard, and only array_api_strict catches NumPy-only calls, so the grade
    holds the learner to it. A test passes only if it passed on every device; a failure says
    on which. ``timeout`` is the budget of the whole check, over all devices; ``options`` go
    to ``check_notebook`` (limits, ``progress``).
    """
    content = load_notebook(notebook)
    assignment, nb_name = course.identify(notebook, content, assignment_name)
    if not devices:
        devices = ["cpu"] + (["strict"] if "strict" in supported_devices(assignment, nb_name) else [])
    progress = options.get("progress")
    budget = options.pop("timeout", DEFAULT_TIMEOUT)
    keep = options.pop("keep_autograded", None)  # the first device's run is the one kept
    deadline = time.monotonic() + budget
    runs = []
    for device in devices:
        if runs and (not runs[-1].completed or not any(t.passed for t in runs[-1].tests)
                     or any((t.hint or "").startswith("not run") for t in runs[-1].tests)
                     or time.monotonic() >= deadline - 1):
            break  # the budget is spent, a cell stopped the run, or nothing passed: no verdict would change
        if progress is not None and len(devices) > 1:
            progress({"device": f"{device} ({DEVICE_LIBRARIES.get(device, device)})"})
        runs.append(check_notebook(notebook, course=course, device=device, assignment_name=assignment.name,
                                   timeout=max(1.0, deadline - time.monotonic()),
                                   keep_autograded=None if runs else keep, **options))
    devices = devices[:len(runs)]
    result = runs[0] if len(runs) == 1 else _merge(runs, devices)
    if feedback_dir is not None:
        page = feedback_dir / assignment.name / f"{Path(nb_name).stem}.html"
        result.feedback_html = str(write_feedback_page(page, result).resolve())
    return result


def _merge(runs: list[GradingResult], devices: list[str]) -> GradingResult:
    """One result from runs of the same notebook on several devices: a test passes only if it
    passed on all of them; a failure shows the first device it failed on."""
    merged = runs[0]
    merged.isolation["device"] = " and ".join(r.isolation.get("device", d) for r, d in zip(runs, devices))
    for other, device in zip(runs[1:], devices[1:]):
        theirs = {t.id: t for t in other.tests}
        for test in merged.tests:
            twin = theirs.get(test.id)
            if test.passed and twin is not None and not twin.passed:
                test.passed, test.score = False, twin.score
                test.hint = f"on {other.isolation.get('device', device)}: {twin.hint}"
                test.advice, test.read, test.line = twin.advice, twin.read, twin.line
        merged.error = merged.error or other.error
        merged.timed_out = merged.timed_out or other.timed_out
        merged.threads = merged.threads or other.threads
        known = {(e.cell, e.error) for e in merged.cell_errors}
        merged.cell_errors += [e for e in other.cell_errors if (e.cell, e.error) not in known]
    return merged


def _follow(path: Path, progress: Callable[[dict[str, Any]], None] | None) -> Callable[[], None] | None:
    """A poller for ``run_limited``: hands each new complete line of ``path`` to ``progress``."""
    if progress is None:
        return None
    offset = 0

    def poll() -> None:
        nonlocal offset
        try:
            with open(path, encoding="utf-8") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            return
        complete = chunk[: chunk.rfind("\n") + 1]
        offset += len(complete.encode("utf-8"))
        for line in complete.splitlines():
            try:
                progress(json.loads(line))
            except json.JSONDecodeError:
                continue

    return poll


def _explain_broken_cells(result: GradingResult, content: dict[str, Any], unparsable: dict[str, str]) -> None:
    """Put errors in the learner's own cells first, and say which tests failed only because of them.

    A solution cell that does not parse (found before grading) or raised when it ran leaves
    its names undefined; the tests that then fail with ``NameError`` are told which cell to
    fix, instead of each showing the same ``NameError`` with the real error further down.
    """
    known = {e.cell for e in result.cell_errors}
    for cell, message in unparsable.items():
        if cell in known:
            result.cell_errors = [e for e in result.cell_errors if e.cell != cell]
        result.cell_errors.insert(0, CellError(cell, message, None))
    defined = defined_names(content)
    broken = {e.cell: e.error for e in result.cell_errors}
    for test in result.tests:
        match = re.search(r"NameError: name '(\w+)' is not defined", test.hint or "")
        cell = defined.get(match.group(1)) if match else None
        if cell in broken:
            kind = broken[cell].split(":", 1)[0]
            test.hint = f"{match.group(1)} is not defined because cell {cell} failed with {kind}{BROKEN_CELL}"


def _concept_link(assignment: Assignment, nb_name: str) -> str | None:
    """The site address of the assignment's concept page (its source's ``lab.concept_page``)."""
    lab = load_notebook(assignment.source_dir / nb_name).get("metadata", {}).get("lab", {})
    page = lab.get("concept_page") if isinstance(lab, dict) else None
    return site_link(page) if isinstance(page, str) and page else None


def _add_written_hints(tests: list[TestResult], written: dict[str, WrittenHint]) -> None:
    """Give every failed test the instructor's hint for its failure and the link to read."""
    for test in tests:
        hint = written.get(test.id)
        if test.passed or hint is None or (test.hint or "").startswith(("not run", "not graded", "no credit")) or (
                BROKEN_CELL in (test.hint or "")):
            continue  # a test that did not run, or failed for a broken cell, has no mistake of its own
        test.advice = hint.advice(test.hint)
        test.read = site_link(hint.read)


def supported_devices(assignment: Assignment, nb_name: str) -> list[str]:
    """The devices the assignment's hidden tests support: its source's ``lab.devices``, else cpu."""
    lab = load_notebook(assignment.source_dir / nb_name).get("metadata", {}).get("lab", {})
    devices = lab.get("devices", ["cpu"]) if isinstance(lab, dict) else ["cpu"]
    return [str(d) for d in devices] if isinstance(devices, list) else ["cpu"]


def _check_device(device: str, assignment: Assignment, nb_name: str) -> None:
    """Refuse a device the assignment's tests do not support, or that this machine lacks."""
    if device not in DEVICE_LIBRARIES:
        raise InputProblem(f"--device {device}: unknown device, expected one of {', '.join(DEVICE_LIBRARIES)}")
    supported = supported_devices(assignment, nb_name)
    if device not in supported:
        raise InputProblem(
            f"--device {device}: assignment {assignment.name} supports only {', '.join(supported)} "
            f"(its source notebook's lab.devices); grade it with --device {supported[0]}")
    if device == "cpu":  # NumPy: a dependency of the lab, nothing to probe
        return
    from reference_impl.backend import BackendUnavailable, get_namespace

    try:
        get_namespace(device)
    except (BackendUnavailable, ImportError) as exc:
        raise InputProblem(f"--device {device} refused: {exc}") from None


def _grade_ids(content: dict[str, Any]) -> set[str]:
    """Ids of the tests and solution cells (set-up cells share names across assignments)."""
    ids = set()
    for cell in content.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if isinstance(meta, dict) and meta.get("grade_id") and (meta.get("grade") or meta.get("solution")):
            ids.add(str(meta["grade_id"]))
    return ids


def _check_cells_belong(notebook: Path, content: dict[str, Any], course: Course, assignment: Assignment,
                        nb_name: str) -> None:
    """Refuse a notebook whose graded cells all come from another assignment's notebook.

    Its metadata or name says one assignment, its cells say another: grading it would only
    score zero with confusing errors, so the learner is told which notebook it really is.
    """
    mine = _grade_ids(content)
    expected = _grade_ids(load_notebook(assignment.source_dir / nb_name))
    if not mine or mine & expected:
        return
    for other in course.assignments:
        for source in other.notebooks:
            if mine & _grade_ids(load_notebook(source)):
                raise InputProblem(
                    f"{notebook}: this notebook is {other.name} (its graded cells are {other.name}'s, "
                    f"from {source.name}), not {assignment.name}"
                )


def _isolation(report: Path, network_off: bool, memory_mb: int, cpu_s: int, timeout: float,
               cell_timeout: int | None) -> dict[str, str]:
    """What the sandbox enforced on this run, one line per wall (see ``sandbox`` and ``jail``)."""
    jail = _read_record(report)
    facts = {
        "wall_clock": f"{timeout:g} s for the whole run",
        "per_cell": f"{cell_timeout} s" if cell_timeout else "the course's limit (nbgrader_config.py)",
        "memory": f"{memory_mb} MiB address space" if memory_mb > 0 else "not limited (--memory-mb 0)",
        "cpu": f"{cpu_s} s CPU time",
        "network": "off (a network namespace with only loopback)" if network_off
        else "on: not available here (needs root or user namespaces)",
    }
    if jail:
        facts["processes"] = jail.get("processes", "not reported")
        facts["files"] = jail.get("files", "not reported")
        facts["kernel_cwd"] = jail.get("cwd", "not reported")
        facts["sandbox"] = jail.get("sandbox", "root: private mount namespace and private user")
    else:
        facts["processes"] = facts["files"] = "unknown: the kernel did not start"
    return facts


def _planned_tests(assignment: Assignment, nb_name: str) -> list[tuple[str, float]]:
    """(grade id, points) of every test cell in the source notebook, in notebook order."""
    source = json.loads((assignment.source_dir / nb_name).read_text(encoding="utf-8"))
    tests = []
    for cell in source["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            tests.append((meta["grade_id"], float(meta.get("points", 0))))
    return tests


def _read_record(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _keep_autograded(autograded: Path, target: Path) -> None:
    """nbgrader's autograded copy, for the formgrader's manual grading: written to ``target``
    (the class workspace's ``autograded/<student>/<assignment>/``), without the lines the guard
    added to the test cells, so an instructor sees the tests as the course wrote them."""
    content = json.loads(autograded.read_text(encoding="utf-8"))
    for cell in content.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["source"] = strip_guard_lines("".join(cell.get("source", "")))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _cell_outputs(autograded: Path) -> dict[str, list[dict[str, Any]]]:
    """Error outputs of every cell of the autograded notebook, by grade id (or ``#index``)."""
    content = json.loads(autograded.read_text(encoding="utf-8"))
    found = {}
    for index, cell in enumerate(content.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        key = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or f"#{index}"
        found[key] = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return found


def _cell_seconds(autograded: Path) -> dict[str, float]:
    """How long each graded cell ran in the kernel, by grade id.

    Read from the execution timestamps the notebook client records in each cell's metadata
    (the kernel's own clock: input received to reply sent), so a slow test is visible
    without any timing code in the notebook.
    """
    content = json.loads(autograded.read_text(encoding="utf-8"))
    found = {}
    for cell in content.get("cells", []):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        stamps = cell.get("metadata", {}).get("execution", {})
        try:
            start = datetime.fromisoformat(stamps["iopub.execute_input"])
            end = datetime.fromisoformat(stamps["shell.execute_reply"])
        except (KeyError, TypeError, ValueError):
            continue
        if grade_id:
            found[grade_id] = round(max(0.0, (end - start).total_seconds()), 3)
    return found


def describe_error(errors: list[dict[str, Any]], cell_timeout: int | None) -> str | None:
    """One line a learner can act on: the exception and its message (what was expected/found)."""
    if not errors:
        return None
    error = errors[-1]
    name = _ANSI.sub("", str(error.get("ename", "Error")))
    value = _ANSI.sub("", str(error.get("evalue", ""))).strip()
    traceback = [_ANSI.sub("", line) for line in error.get("traceback", [])]
    if name == "CellTimeoutError" or any("CellTimeoutError" in line for line in traceback):
        limit = f"{cell_timeout} s" if cell_timeout else "the per-cell limit"
        return (f"stopped: the cell ran longer than {limit} (an endless loop, or a rank waiting forever?); "
                "the run stopped here")
    if name == "NotImplementedError" and not value:
        return "NotImplementedError: not implemented yet (replace `raise NotImplementedError()` with your code)"
    if name == "NotRun":  # an earlier cell stopped the run (grader.steps)
        return value
    if name == "KeyboardInterrupt":
        return "stopped: the cell was interrupted (it ran past the per-cell time limit)"
    if not value:
        last = [line.strip() for line in "\n".join(traceback).splitlines() if line.strip()]
        value = last[-1] if last else ""
        if value.startswith(name):
            value = value[len(name):].lstrip(": ")
    text = f"{name}: {' '.join(value.split())}" if value else f"{name} (no message)"
    return text if len(text) <= HINT_LIMIT else text[: HINT_LIMIT - 3] + "..."


def _tests_from_grades(
    grades: list[dict[str, Any]],
    planned: list[tuple[str, float]],
    outputs: dict[str, list[dict[str, Any]]],
    cell_timeout: int | None,
    guard: dict[str, Any] | None = None,
) -> list[TestResult]:
    """One result per graded cell; with the guard's verdicts, a test counts only if it finished."""
    order = {test_id: i for i, (test_id, _) in enumerate(planned)}
    finished = (guard or {}).get("finished")
    refused = (guard or {}).get("refused", {})
    tests = []
    for g in sorted(grades, key=lambda g: order.get(g["id"], len(order))):
        passed = g["score"] >= g["max_score"] and (finished is None or finished.get(g["id"], False))
        if g["id"] in refused:
            hint = f"no credit: {refused[g['id']]}"
        elif passed:
            hint = None
        else:
            hint = (describe_error(outputs.get(g["id"], []), cell_timeout)
                    or "no credit: the test did not run to its end, yet showed no error "
                       "(did the notebook change how errors are displayed?)")
        tests.append(TestResult(g["id"], g["score"], g["max_score"], passed, hint))
    return tests


def _other_cell_errors(autograded: Path, test_ids: set[str], cell_timeout: int | None,
                       lines: dict[str, str] | None = None) -> list[CellError]:
    """Errors in cells that are not tests: they explain why the tests after them failed.
    Cells that did not run because an earlier one stopped the run are left out."""
    if not autograded.is_file():
        return []
    return [
        CellError(key, describe_error(errors, cell_timeout) or "error", (lines or {}).get(key))
        for key, errors in _cell_outputs(autograded).items()
        if errors and key not in test_ids and errors[-1].get("ename") != "NotRun"
    ]


def _normalised(source: str) -> str:
    without_hidden = HIDDEN_TESTS.sub("", strip_guard_lines(source))
    return "\n".join(line.rstrip() for line in without_hidden.strip().splitlines())


def _locked_cells(content: dict[str, Any]) -> dict[str, str]:
    cells = {}
    for cell in content.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if isinstance(meta, dict) and meta.get("grade_id") and not meta.get("solution") and (
            meta.get("locked") or meta.get("grade")
        ):
            cells[meta["grade_id"]] = _normalised(cell_source(cell))
    return cells


def _tampered_cells(submitted: dict[str, Any], released: dict[str, Any]) -> list[str]:
    """Locked cells of the release whose text differs in (or is missing from) the submission.

    nbgrader's autograde already grades the original text of these cells; this only tells
    the learner, so that a changed test is never mistaken for a passing one.
    """
    mine = _locked_cells(submitted)
    changed = []
    for grade_id, original in _locked_cells(released).items():
        if grade_id not in mine:
            changed.append(f"{grade_id} (deleted)")
        elif mine[grade_id] != original:
            changed.append(grade_id)
    return changed
