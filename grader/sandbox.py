"""Running untrusted notebook code in a child process that cannot outlive its limits.

A learner's notebook may loop forever, eat memory, or start processes of its own. The
grader therefore runs nbgrader (which starts the Jupyter kernel that executes the learner's
cells) as a child process with:

* a **wall-clock limit**: past it, the child's whole process tree is killed (its process
  group, and the Jupyter kernel, which jupyter_client starts in a session of its own);
* a **memory limit** (``RLIMIT_AS``, inherited by the kernel), so runaway allocation fails
  inside the child instead of taking the machine down;
* a **scratch working folder** and a private Jupyter/IPython environment (kernel spec,
  runtime and profile directories under the scratch folder), so the run neither reads the
  user's IPython start-up files nor writes outside the temporary course;
* the kernel pinned to this interpreter (``sys.executable``), whatever kernels are
  installed elsewhere, with the repository on ``PYTHONPATH`` so ``reference_impl`` imports.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .course import repo_root

DEFAULT_MEMORY_MB = 8192


@dataclass
class ChildResult:
    """What a limited child run produced."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


def child_environment(scratch: Path) -> dict[str, str]:
    """Environment for the child: this interpreter's tools first, private Jupyter dirs."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    # nbgrader shells out to ``alembic`` (installed next to this interpreter) for its gradebook.
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")]).rstrip(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(repo_root()), env.get("PYTHONPATH", "")) if p
    )
    jupyter_data = scratch / "jupyter-data"
    kernel_dir = jupyter_data / "kernels" / "python3"
    kernel_dir.mkdir(parents=True, exist_ok=True)
    (kernel_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (grader)",
                "language": "python",
                "metadata": {"debugger": False},
            }
        )
    )
    env["JUPYTER_PATH"] = str(jupyter_data)  # searched before the user's and system kernels
    env["JUPYTER_RUNTIME_DIR"] = str(scratch / "jupyter-runtime")
    env["JUPYTER_CONFIG_DIR"] = str(scratch / "jupyter-config")
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["IPYTHONDIR"] = str(scratch / "ipython")
    env["MPLBACKEND"] = "Agg"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _limit_resources(memory_mb: int) -> None:
    """In the child, before exec: cap its address space (kernels inherit the cap)."""
    if memory_mb <= 0:
        return
    import resource

    limit = memory_mb * 1024 * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren...), as far as we can see."""
    try:
        import psutil
    except ImportError:  # fall back to reading /proc
        return _descendants_from_proc(pid)
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _descendants_from_proc(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill ``proc``, its process group, and every process group below it (the kernel's)."""
    groups = set()
    for pid in [proc.pid, *_descendants(proc.pid)]:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    groups.discard(os.getpgid(0))  # never our own group
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def run_limited(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> ChildResult:
    """Run ``argv`` in a new session with the limits above; never hangs past ``timeout`` (+ a few s)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, killed as a whole on timeout
        preexec_fn=(lambda: _limit_resources(memory_mb)) if os.name == "posix" else None,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # pipes held open by something we could not kill
            proc.kill()
            out, err = "", ""
        timed_out = True
    return ChildResult(proc.returncode, out or "", err or "", timed_out, time.monotonic() - start)
