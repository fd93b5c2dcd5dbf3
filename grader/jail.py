"""The learner's kernel behind walls: what runs between nbgrader starting a kernel and the kernel.

nbgrader starts the Jupyter kernel that executes the learner's cells from the kernel spec
the sandbox writes (``sandbox.child_environment``). That spec does not start ``ipykernel``
directly but ``python -m grader.jail --plan PLAN.json -- python -m ipykernel_launcher -f
CONNECTION_FILE``, and this module, before it replaces itself with the kernel:

* as root, hides the course from the kernel: a private mount namespace in which an empty,
  read-only ``tmpfs`` lies over the repository's ``exercises/`` and ``.git/`` (the source
  notebooks hold the hidden tests) and over the scratch course (its gradebook holds them
  too); then it becomes a user of its own (a uid no one else uses, chosen per grading run),
  so the kernel cannot write to the repository or any file the grader owns;
* caps the number of processes (``RLIMIT_NPROC``): the limit counts the processes of the
  kernel's user, and because that user is private to this run, it bounds a fork bomb
  without touching anyone else's processes. Without root (no private user) the limit would
  count all of the learner's own processes, so it is not set, and the report says so;
* caps CPU time (``RLIMIT_CPU``) on top of the wall-clock and per-cell limits;
* cleans the environment (only what Python, the kernel and CUDA need, plus ``LAB_DEVICE``,
  the plan's device, which the exercises' set-up cells read) and starts the kernel in a
  folder of its own, not next to the grader's files;
* writes what it did enforce to the plan's ``report`` file, which ``check`` shows.

Network isolation is not done here: the kernel talks to nbgrader over loopback TCP, so the
whole grading child gets a network namespace of its own (``sandbox.run_limited``).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

CLONE_NEWNS = 0x00020000
MNT_DETACH = 2
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 0x1000, 0x4000, 1 << 18

KEPT_ENV = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "MPLBACKEND", "PYTHONDONTWRITEBYTECODE",
            "PYDEVD_DISABLE_FILE_VALIDATION", "SYSTEMROOT",
            "CUDA_VISIBLE_DEVICES", "CUDA_PATH", "LD_LIBRARY_PATH")  # the last three: a --device gpu run


class JailError(RuntimeError):
    """A wall the plan asked for could not be put up (the kernel is then not started)."""


def libc_call(name: str, *args: Any) -> None:
    """Call ``name`` from the C library; raise ``OSError`` with errno when it returns -1."""
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


def hide_paths(paths: list[str]) -> list[str]:
    """In a new mount namespace, lay an empty read-only tmpfs over each existing path."""
    libc_call("unshare", CLONE_NEWNS)
    libc_call("mount", None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None)
    hidden = []
    for path in paths:
        if not os.path.isdir(path):
            continue
        libc_call("mount", b"tmpfs", path.encode(), b"tmpfs",
                  ctypes.c_ulong(MS_RDONLY | MS_NOSUID | MS_NODEV), b"size=16k,mode=0555")
        hidden.append(path)
    return hidden


def _blocking_ancestor(path: Path) -> Path | None:
    """The topmost folder above ``path`` that other users may not enter (mode without o+x)."""
    for ancestor in reversed(path.parents):
        if ancestor != path and not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def expose_paths(paths: list[Path]) -> list[str]:
    """Make ``paths`` reachable by an unprivileged user when a private folder lies above them.

    The interpreter may live under a folder only root may enter (``/root/.pyenv/...``). In
    the kernel's mount namespace that folder is replaced by an empty tmpfs holding just the
    chain of folders down to each path, and the path itself is bind-mounted back: the kernel
    can run Python, and sees nothing else of the private folder.
    """
    blocked: dict[Path, list[Path]] = {}
    for path in {p.resolve() for p in paths}:
        ancestor = _blocking_ancestor(path)
        if ancestor is not None:
            blocked.setdefault(ancestor, []).append(path)
    exposed: list[str] = []
    if not blocked:
        return exposed
    stash = Path(tempfile.mkdtemp(prefix="lab-jail-", dir="/tmp"))  # outside every hidden folder
    for number, (ancestor, inside) in enumerate(blocked.items()):
        saved = []
        for index, path in enumerate(sorted(inside)):
            holder = stash / f"{number}-{index}"
            holder.mkdir(parents=True)
            libc_call("mount", str(path).encode(), str(holder).encode(), None,
                      ctypes.c_ulong(MS_BIND | MS_REC), None)
            saved.append((path, holder))
        libc_call("mount", b"tmpfs", str(ancestor).encode(), b"tmpfs",
                  ctypes.c_ulong(MS_NOSUID | MS_NODEV), b"size=64k,mode=0755")
        for path, holder in saved:
            path.mkdir(parents=True, exist_ok=True)
            libc_call("mount", str(holder).encode(), str(path).encode(), None,
                      ctypes.c_ulong(MS_BIND | MS_REC), None)
            libc_call("umount2", str(holder).encode(), MNT_DETACH)
            holder.rmdir()
            exposed.append(str(path))
    stash.rmdir()
    return exposed


def main(argv: list[str]) -> None:
    if "--" not in argv or argv[:1] != ["--plan"]:
        raise SystemExit("usage: python -m grader.jail --plan PLAN.json -- KERNEL ARGV...")
    plan = json.loads(Path(argv[1]).read_text())
    kernel = argv[argv.index("--") + 1:]
    home = Path(plan["home"])
    report: dict[str, Any] = {}
    report_file = open(plan["report"], "w")  # noqa: SIM115 - opened now: the mounts below may hide its folder
    import resource

    uid = plan.get("uid")
    if uid is not None:  # root: hide the course, then become the run's private user
        # The connection file (ports and signing key) is the grader's; the kernel gets a copy
        # (taken before its folder is hidden).
        index = kernel.index("-f") + 1
        copy = home / "connection.json"
        shutil.copyfile(kernel[index], copy)
        os.chown(copy, uid, uid)
        kernel[index] = str(copy)
        report["hidden"] = hide_paths(plan["hide"])
        report["exposed"] = expose_paths(
            [Path(sys.base_prefix), Path(sys.prefix), Path(kernel[0]).parent, home, *map(Path, plan["expose"])],
        )
        resource.setrlimit(resource.RLIMIT_NPROC, (plan["nproc"], plan["nproc"]))
        report["processes"] = f"at most {plan['nproc']} (user {uid}, private to this run)"
        report["files"] = "kernel runs as an unprivileged user; course, hidden tests and gradebook hidden"
    else:
        report["processes"] = "not limited (needs root to give the kernel a user of its own)"
        report["files"] = "not isolated beyond the scratch copy (needs root)"
    if plan.get("cpu_s"):
        resource.setrlimit(resource.RLIMIT_CPU, (plan["cpu_s"], plan["cpu_s"] + 5))
        report["cpu_s"] = plan["cpu_s"]

    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    env.update(HOME=str(home), IPYTHONDIR=str(home / "ipython"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_PLATFORM_DIRS="1", TMPDIR=str(home / "tmp"),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               LAB_DEVICE=str(plan.get("device", "cpu")))  # which array namespace the tests use
    work = home / "work"
    report["cwd"] = str(work)
    with report_file:
        report_file.write(json.dumps(report))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.chdir(work)
    os.execve(kernel[0], kernel, env)


if __name__ == "__main__":
    main(sys.argv[1:])
