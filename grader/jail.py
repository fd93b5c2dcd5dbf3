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

When the plan names bubblewrap (``bwrap``: always without root, and as root on top of the
private user when it is installed), the kernel starts inside it (``bwrap_argv``): user, pid, IPC
and UTS namespaces of its own (it sees no process
of the grader, so it can neither read their ``/proc/<pid>/environ`` nor signal or trace
them), dying with its parent; a mount namespace built from an allow-list: the system
(``/usr``, ``/etc``) and the interpreter read-only, ``reference_impl`` and ``grader`` (the
test cells import them) read-only at their place in an otherwise empty repository, a
private ``/tmp``, and the kernel's own folder, its only writable place. The user's home
(caches, ``~/.ipython``, ``~/.jupyter``...), the rest of the repository (the source
notebooks), the scratch course (gradebook, other submissions) and the generated-assignment
cache do not exist there; the new root is read-only, and the kernel's folder, ``/tmp``,
``/var/tmp`` and ``/dev/shm`` are tmpfs of 256 MiB each. Processes are capped with
``RLIMIT_NPROC``, which in a user namespace of its own counts that namespace's processes
only. As root without bubblewrap, the jail itself lays such tmpfs over ``/tmp``,
``/var/tmp``, ``/dev/shm`` and the kernel's folder (``private_scratch``).

Network isolation is not done here: the kernel talks to nbgrader over loopback TCP, so the
whole grading child gets a network namespace of its own (``sandbox.run_limited``).
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

CLONE_NEWNS = 0x00020000
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


def cover_keeping(folder: Path, options: bytes, flags: int, keep: list[Path]) -> list[str]:
    """Lay a tmpfs (mount ``options``) over ``folder``, keeping each of ``keep`` that lies inside
    it visible at its place: a descriptor opened on it before the cover is bind-mounted back
    (through ``/proc/self/fd``) onto a folder made in the new tmpfs. A checkout under ``/tmp``
    keeps its interpreter and ``reference_impl`` when ``/tmp`` becomes private; an interpreter
    under ``/root`` stays reachable when ``/root`` is replaced. Returns the paths bound back."""
    inside = sorted({p for p in keep if p != folder and folder in p.parents}, key=lambda p: len(p.parts))
    outermost = [p for p in inside if not any(q in p.parents for q in inside)]  # a bound folder brings its insides
    handles = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in outermost if path.is_dir()]
    try:
        libc_call("mount", b"tmpfs", str(folder).encode(), b"tmpfs", ctypes.c_ulong(flags), options)
        for path, fd in handles:
            path.mkdir(parents=True, exist_ok=True)
            libc_call("mount", f"/proc/self/fd/{fd}".encode(), str(path).encode(), None,
                      ctypes.c_ulong(MS_BIND | MS_REC), None)
    finally:
        for _, fd in handles:
            os.close(fd)
    return [str(path) for path, _ in handles]


def private_scratch(home: Path, uid: int, connection: bytes, keep: list[Path]) -> list[str]:
    """As root, in the kernel's mount namespace: a small tmpfs over ``/tmp``, ``/var/tmp`` and
    ``/dev/shm`` (filling them fills no disk, and the grader's files and sockets there are gone)
    and over the kernel's folder, owned by ``uid``, with the connection file and the usual
    sub-folders in it. What the kernel needs under those folders (``keep``: the interpreter,
    ``reference_impl`` and ``grader`` of a checkout in ``/tmp``) stays. Returns the folders
    so covered."""
    covered = []
    flags = MS_NOSUID | MS_NODEV
    for folder in SCRATCH_DIRS:
        if os.path.isdir(folder) and not os.path.islink(folder):
            cover_keeping(Path(folder), f"size={SCRATCH_BYTES},mode=1777".encode(), flags, keep)
            covered.append(folder)
    home.mkdir(parents=True, exist_ok=True)
    libc_call("mount", b"tmpfs", str(home).encode(), b"tmpfs", ctypes.c_ulong(flags),
              f"size={SCRATCH_BYTES},mode=0700,uid={uid},gid={uid}".encode())
    covered.append(str(home))
    for sub in ("work", "ipython", "runtime", "config", "tmp"):
        (home / sub).mkdir()
        os.chown(home / sub, uid, uid)
    (home / "connection.json").write_bytes(connection)
    os.chown(home / "connection.json", uid, uid)
    return covered


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
    chain of folders down to each path, and the path itself is bound back (``cover_keeping``):
    the kernel can run Python, and sees nothing else of the private folder.
    """
    blocked: dict[Path, list[Path]] = {}
    for path in {p.resolve() for p in paths}:
        ancestor = _blocking_ancestor(path)
        if ancestor is not None:
            blocked.setdefault(ancestor, []).append(path)
    exposed: list[str] = []
    for ancestor, inside in blocked.items():
        exposed += cover_keeping(ancestor, b"size=64k,mode=0755", MS_NOSUID | MS_NODEV, inside)
    return exposed


SCRATCH_BYTES = 256 * 1024 * 1024  # each writable tmpfs of a kernel (its folder, /tmp, /var/tmp, /dev/shm)
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # the kernel's own tmpfs, in place of the machine's
SYSTEM_DIRS = ("/usr", "/etc", "/opt", "/sys")  # read-only; /bin, /lib... are links into /usr or bound too


def _under(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def bwrap_argv(bwrap: str, plan: dict[str, Any], home: Path, env: dict[str, str]) -> list[str]:
    """The ``bwrap`` options that wall in the kernel (see the module docstring)."""
    import site

    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--clearenv"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", *SYSTEM_DIRS):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"]
    if plan.get("device") == "gpu":  # CUDA's device files (untested here: no GPU in the suite's runs)
        for device in sorted(glob.glob("/dev/nvidia*")):
            argv += ["--dev-bind", device, device]
    for scratch in SCRATCH_DIRS:  # private, and small: filling them fills no one's disk
        argv += ["--size", str(SCRATCH_BYTES), "--tmpfs", scratch]
    exposed: list[str] = []
    candidates = [sys.base_prefix, sys.prefix, os.path.dirname(sys.executable), *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    candidates += [os.path.join(repo, name) for repo in plan["expose"] for name in ("reference_impl", "grader")]
    for path in candidates:
        real = os.path.realpath(path)
        for one in dict.fromkeys((path, real)):  # the path as named (a venv's link) and where it leads
            if os.path.isdir(one) and not _under(one, ["/usr", "/etc"]) and one not in exposed:
                exposed.append(one)
    # What lies inside a scratch tmpfs (a checkout under /tmp) gets a read-only tmpfs of its own
    # around it, so the kernel cannot write beside its interpreter, even into its private /tmp
    sealed = sorted({os.path.join(scratch, os.path.relpath(path, scratch).split(os.sep)[0])
                     for path in exposed for scratch in SCRATCH_DIRS if _under(path, [scratch]) and path != scratch})
    for top in sealed:
        argv += ["--tmpfs", top]
    for path in sorted(exposed, key=len):
        argv += ["--ro-bind", path, path]
    # a folder to hide that lies inside an exposed one (a cache under the venv, say) is covered
    for path in plan["hide"]:
        if os.path.isdir(path) and _under(path, exposed + list(SYSTEM_DIRS)):
            argv += ["--tmpfs", path, "--remount-ro", path]
    # its folder: a small tmpfs of its own (not the disk), holding a read-only copy of the connection file
    argv += ["--size", str(SCRATCH_BYTES), "--perms", "0700", "--tmpfs", str(home)]
    argv += [arg for sub in ("work", "ipython", "runtime", "config", "tmp") for arg in ("--dir", str(home / sub))]
    argv += ["--ro-bind", str(home / "connection.json"), str(home / "connection.json"), "--chdir", str(home / "work")]
    argv += [arg for top in sealed for arg in ("--remount-ro", top)]
    argv += ["--remount-ro", "/"]  # the new root's own tmpfs: no writing beside the mounts above
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


def main(argv: list[str]) -> None:
    if "--" not in argv or argv[:1] != ["--plan"]:
        raise SystemExit("usage: python -m grader.jail --plan PLAN.json -- KERNEL ARGV...")
    parent = os.getppid()  # nbgrader's process: the kernel must not outlive it
    plan = json.loads(Path(argv[1]).read_text())
    kernel = argv[argv.index("--") + 1:]
    home = Path(plan["home"])
    report: dict[str, Any] = {}
    report_file = open(plan["report"], "w")  # noqa: SIM115 - opened now: the mounts below may hide its folder
    import resource

    uid = plan.get("uid")
    if uid is not None:  # root: hide the course, then become the run's private user
        # The connection file (ports and signing key) is the grader's; the kernel gets a copy
        # (read before its folder is hidden, written into the kernel's own tmpfs).
        index = kernel.index("-f") + 1
        connection = Path(kernel[index]).read_bytes()
        report["hidden"] = hide_paths(plan["hide"])
        needed = [Path(sys.base_prefix), Path(sys.prefix), Path(kernel[0]).parent,
                  *(Path(repo) / name for repo in plan["expose"] for name in ("reference_impl", "grader"))]
        report["scratch"] = private_scratch(home, uid, connection, [p.resolve() for p in needed])
        kernel[index] = str(home / "connection.json")
        report["exposed"] = expose_paths([*needed, home, *map(Path, plan["expose"])])
        resource.setrlimit(resource.RLIMIT_NPROC, (plan["nproc"], plan["nproc"]))
        report["processes"] = f"at most {plan['nproc']} (user {uid}, private to this run)"
        report["files"] = ("kernel runs as an unprivileged user; course, hidden tests and gradebook hidden; "
                           "/tmp, /var/tmp, /dev/shm and its folder are small tmpfs of its own")
        if plan.get("bwrap"):
            report["files"] += "; behind bubblewrap, only the system, interpreter, reference_impl and grader are there"
            report["processes"] += "; a pid namespace of its own: it sees no process of the grader"
            report["sandbox"] = "root: private user and mount namespace, plus bubblewrap (user, pid, mount namespaces)"
        else:
            report["sandbox"] = "root: private user and mount namespace (bubblewrap not available)"
    elif plan.get("bwrap"):  # not root: the kernel behind bubblewrap, in namespaces of its own
        index = kernel.index("-f") + 1
        copy = home / "connection.json"
        shutil.copyfile(kernel[index], copy)
        kernel[index] = str(copy)
        resource.setrlimit(resource.RLIMIT_NPROC, (plan["nproc"], plan["nproc"]))
        report["processes"] = (f"at most {plan['nproc']} (a user namespace of its own); "
                               "a pid namespace of its own: it sees no process of the grader")
        report["files"] = ("bubblewrap: only its own folder writable; system, interpreter, reference_impl "
                           "and grader read-only; home, repository, course, hidden tests and gradebook absent")
        report["sandbox"] = "bubblewrap (unprivileged user namespaces)"
    else:
        report["processes"] = "not limited (needs root or bubblewrap to give the kernel namespaces of its own)"
        report["files"] = "NOT isolated: the kernel runs as the grader's user and may read what it can read"
        report["sandbox"] = "none (trusted run)"
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
    if plan.get("bwrap"):
        kernel = bwrap_argv(plan["bwrap"], plan, home, env) + kernel
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # bwrap's own; the kernel gets --setenv's
    os.chdir(work)
    from .sandbox import die_with_parent

    die_with_parent(parent)  # after setuid, which clears it; exits now if that process has already gone
    os.execve(kernel[0], kernel, env)


if __name__ == "__main__":
    main(sys.argv[1:])
