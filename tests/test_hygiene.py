"""What contributors expect of the repository itself: ruff finds nothing, every option of
every command says what it does, `make help` lists every target, one list of benchmarks,
and the pytest markers that `make test-fast` deselects are the registered ones."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_ruff_finds_nothing():
    """`ruff check` with the configuration of pyproject.toml; RUF100 is on, so a `# noqa`
    naming a rule that is not enabled, or that no longer fires there, is itself a finding."""
    assert "RUF100" in PYPROJECT["tool"]["ruff"]["lint"]["select"]
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"ruff check found problems:\n{proc.stdout}{proc.stderr}"


class _Parsed(Exception):
    """Raised instead of parsing, carrying the parser a command built."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


def _parser_of(main, monkeypatch) -> argparse.ArgumentParser:
    """The parser ``main([])`` builds, caught at its first parse (so nothing runs)."""
    def caught(self, *_args, **_kwargs):
        raise _Parsed(self)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_known_args", caught)
        with pytest.raises(_Parsed) as info:
            main([])
    return info.value.parser


def _actions_without_help(parser: argparse.ArgumentParser, where: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if not (choice.help or "").strip():
                    missing.append(f"{where} {choice.dest}")
            for name, sub in action.choices.items():
                missing += _actions_without_help(sub, f"{where} {name}")
        elif action.help == argparse.SUPPRESS:
            continue  # an internal flag the benchmark passes to its own mpiexec ranks, never typed
        elif not (action.help or "").strip():
            missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")
    return missing


def _commands(monkeypatch) -> dict[str, argparse.ArgumentParser]:
    from benchmarks.__main__ import BENCHMARKS
    from grader.cli import build_parser as grader_parser
    from reference_impl.train.__main__ import build_parser as train_parser

    parsers = {"python -m grader": grader_parser(), "python -m reference_impl.train": train_parser()}
    for name, main in BENCHMARKS.items():
        parsers[f"python -m benchmarks {name}"] = _parser_of(main, monkeypatch)
    return parsers


def test_every_option_of_every_command_has_help(monkeypatch):
    parsers = _commands(monkeypatch)
    assert len(parsers) > 20
    missing = [line for where, parser in parsers.items() for line in _actions_without_help(parser, where)]
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_the_walk_finds_an_option_without_help():
    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--quiet", action="store_true")
    sub = parser.add_subparsers(dest="cmd").add_parser("go", help="go somewhere")
    sub.add_argument("where")
    assert _actions_without_help(parser, "demo") == ["demo --quiet", "demo go where"]


def _make(*args: str) -> str:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True).stdout


def test_make_help_lists_every_target():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE))
    assert {"help", "venv", "serve", "test", "test-fast", "lock", "bench"} <= targets
    listed = set(re.findall(r"^  make (\S+)", _make("-s", "help"), re.MULTILINE))
    assert listed == targets, f"targets without a ## comment: {sorted(targets - listed)}"


def test_make_bench_runs_the_one_list_of_benchmarks():
    from benchmarks.__main__ import BENCHMARKS, NEEDS_ROOT

    assert "BENCHMARKS" not in (ROOT / "Makefile").read_text(encoding="utf-8")  # kept once, in Python
    assert "-m benchmarks --all --publish" in _make("-n", "-W", "pyproject.toml", "bench") or \
        "-m benchmarks --all --publish" in _make("-n", "bench")
    listed = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, check=True).stdout.split()
    assert listed == [name for name in BENCHMARKS if name not in NEEDS_ROOT]
    assert set(NEEDS_ROOT) < set(BENCHMARKS)


def test_test_fast_deselects_exactly_the_registered_markers():
    registered = {line.split(":")[0] for line in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]}
    assert registered == {"mpi", "browser", "grader", "slow"}
    assert "--strict-markers" in PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"]
    recipe = re.search(r'^test-fast:.*\n\t.*-m "([^"]+)"', (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None
    assert set(re.findall(r"not (\w+)", recipe.group(1))) == registered


@pytest.mark.parametrize("marker, marked, unmarked", [
    ("mpi", "tests/test_comm_mpi.py::test_ring_allreduce_equals_mpi_allreduce", "tests/test_cost_model.py"),
    ("browser", "tests/test_accessibility.py::test_every_page_passes_axe", "tests/test_cost_model.py"),
    ("grader", "tests/test_grader_cli.py::test_verbose_shows_the_sandbox", "tests/test_cost_model.py"),
    ("slow", "tests/test_hostile.py::", "tests/test_cost_model.py"),
])
def test_markers_land_where_the_work_is(marker, marked, unmarked):
    """conftest applies the markers from what a test does: a test that does it is selected by
    ``-m MARKER``, and none of a module of pure computations is."""
    files = sorted({marked.split("::")[0], unmarked})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marker, *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert marked in proc.stdout, proc.stdout[-2000:]
    assert f"{unmarked}::" not in proc.stdout, proc.stdout[-2000:]


def test_every_path_contributing_names_exists():
    """CONTRIBUTING.md's checklists point at real example files; a rename must update them."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    named = {p for p in re.findall(r"`([\w./-]+/[\w.-]+\.(?:py|md|ipynb|c|h|json))`", text) if "<" not in p}
    assert len(named) > 20
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"CONTRIBUTING.md names files that do not exist: {missing}"
