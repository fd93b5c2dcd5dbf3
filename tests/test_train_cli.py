"""``python -m reference_impl.train wide_deep``: help with every default and the exit codes; the
human-readable output says how many late gradients the servers dropped."""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from reference_impl.models.insteval import JOINT_CONFIG
from reference_impl.train.__main__ import build_parser

ROOT = Path(__file__).resolve().parent.parent


def train(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "reference_impl.train", "wide_deep", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env)


def options() -> list[argparse.Action]:
    return [a for a in build_parser()._actions if a.dest != "help"]


def test_every_option_has_help():
    acts = options()
    assert {"--strategy", "--workers", "--epochs", "--batch"} <= {s for a in acts for s in a.option_strings}
    for action in acts:
        assert action.help and action.help.strip() and action.help != argparse.SUPPRESS, action.dest


def test_help_shows_every_default_and_ends_with_the_exit_codes():
    run = train(["--help"])
    assert run.returncode == 0, run.stderr
    flat = " ".join(run.stdout.split())
    for action in options():
        if action.default is not None:
            assert f"(default: {action.default})" in flat, action.dest
    for needle in ("(default: local)", "(default: 2)", f"(default: {JOINT_CONFIG.epochs})", "(default: 256)",
                   f"(default: {JOINT_CONFIG.ftrl_alpha})", f"(default: {JOINT_CONFIG.embedding_dim})"):
        assert needle in flat
    head, sep, epilog = run.stdout.partition("exit codes:")
    assert sep and "--json" in head
    assert not re.search(r"^\s+--\w", epilog, flags=re.M)  # no option after them: the help ends with the codes
    assert re.findall(r"^\s+(\d+)\s+\S", epilog, flags=re.M) == ["0", "1", "2"]
    assert "bad command line" in epilog and "training failed" in epilog


def test_ps_run_prints_late_gradients_dropped():
    run = train(["--strategy", "ps", "--workers", "2", "--servers", "1", "--epochs", "1", "--batch", "64",
                 "--limit", "64"])
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("ps: test AUC ")
    assert "late gradients dropped: 0" in lines


def test_bad_command_line_exits_2():
    run = train(["--strategy", "allreduce", "--consistency", "asp"])
    assert run.returncode == 2 and "needs --strategy ps" in run.stderr


def test_bad_hyper_parameter_exits_2():
    run = train(["--embedding-dim", "0"])
    assert run.returncode == 2 and "--embedding-dim" in run.stderr
