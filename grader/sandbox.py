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
  installed elsewhere, with the repository on ``PYTHONPATH`` so ``reference_impl`` imports;
* a **CPU-time limit** (``RLIMIT_CPU``) on the child and on the kernel;
* the kernel started through ``grader.jail`` (see there): as root, in a private mount
  namespace that hides the course and hidden tests, as a user private to the run with a
  process-count limit, in a cleaned environment and a folder of its own;
* **no network** where the OS allows it: the child (nbgrader and the kernel) runs in a network
  namespace of its own that has only a loopback interface; as root directly, as any other
  user inside a user namespace of its own (``CLONE_NEWUSER``, the user mapped to itself);
* the kernel behind **bubblewrap** (``bwrap``, unprivileged user namespaces; see
  ``grader.jail``) wherever it is installed and allowed: without root it is the kernel's
  wall, as root it is added on top of the private user (``LAB_SANDBOX_BWRAP=off`` leaves it
  out): a mount namespace in which only the kernel's own folder is writable and the
  repository (but ``reference_impl`` and ``grader``, read-only), the user's home, the
  gradebook and the hidden tests do not exist, and a pid namespace of its own;
* memory is capped by a cgroup (``MemoryMax``, through ``systemd-run --scope``) where a systemd
  manager is reachable, and by ``RLIMIT_AS`` per process everywhere; the report says which
  (``cgroup_memory_cap``).

Where neither root nor user namespaces are available, ``sandbox_problem`` says why, and the
commands that run learners' code refuse to unless the instructor passes ``--trusted``.

What was and was not enforced is returned as ``Isolation`` and shown in the report.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .course import repo_root

DEFAULT_MEMORY_MB = 8192
DEFAULT_NPROC = 128  # the kernel's processes and threads; a fork bomb stops here
PRIVATE_UID_BASE = 200_000  # kernel users are 200000..299999: no login account uses them
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
POLL_S = 0.25


@dataclass
class ChildResult:
    """What a limited child run produced."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


@dataclass
class KernelPlan:
    """What ``grader.jail`` does to the kernel of one grading run (written as JSON for it)."""

    home: Path  # the kernel's own folder (cwd, IPython profile, temp files)
    report: Path  # where the jail writes what it enforced
    uid: int | None  # the run's private user (None: not root, the kernel keeps our user)
    hide: list[str]  # folders the kernel must not see (course, hidden tests, gradebook)
    nproc: int
    cpu_s: int | None
    expose: list[str]  # folders the kernel needs (the repository, for reference_impl)
    device: str = "cpu"  # the array namespace the tests use, passed to the kernel as LAB_DEVICE
    bwrap: str | None = None  # not root: bubblewrap, which puts the kernel in namespaces of its own


def private_uid() -> int:
    """A uid for this run's kernel that no other grading run alive now uses (keyed on our pid)."""
    return PRIVATE_UID_BASE + os.getpid() % 100_000


def plan_kernel(scratch: Path, hide: list[Path], *, cpu_s: int | None = None,
                nproc: int = DEFAULT_NPROC, device: str = "cpu") -> KernelPlan:
    """Make the kernel's home under ``scratch`` and decide its walls (a private user only as root).

    The scratch folder becomes traversable by the kernel's user (mode 0711: no listing), its
    home is that user's, and everything else under ``scratch`` stays private to us.
    """
    uid = private_uid() if os.geteuid() == 0 else None
    bwrap = None if bwrap_problem() else shutil.which("bwrap")  # as root too: walls on top of the private user
    home = scratch / "kernel-home"
    for sub in ("", "work", "ipython", "runtime", "config", "tmp"):
        (home / sub).mkdir(parents=True, exist_ok=True)
        if uid is not None:
            os.chown(home / sub, uid, uid)
            os.chmod(home / sub, 0o700)
    if uid is not None:
        os.chmod(scratch, 0o711)
    return KernelPlan(home, scratch / "kernel-isolation.json", uid,
                      [str(p) for p in hide], nproc, cpu_s, [str(repo_root())], device, bwrap)


_BWRAP_PROBE: str | None = None


def sandbox_problem() -> str | None:
    """None when learners' code can be walled in here (root, or bubblewrap with user namespaces);
    else why not, in a sentence."""
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return "the sandbox needs Linux"
    return None if os.geteuid() == 0 else bwrap_problem()


def bwrap_problem() -> str | None:
    """None when bubblewrap can put a kernel in user, pid and mount namespaces of its own here;
    else why not, in a sentence (tried once per process)."""
    global _BWRAP_PROBE
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return "bubblewrap needs Linux"
    if os.environ.get("LAB_SANDBOX_BWRAP") == "off":  # as root: only the private user and mounts
        return "bubblewrap is turned off (LAB_SANDBOX_BWRAP=off)"
    if _BWRAP_PROBE is None:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            _BWRAP_PROBE = ("bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: "
                            "apt-get install bubblewrap) or grade as root")
        else:
            try:
                # as root, tried as a kernel's user would run it: without privileges (AppArmor may
                # refuse user namespaces to unprivileged processes only)
                who = {"user": private_uid(), "group": private_uid(), "extra_groups": []} if os.geteuid() == 0 else {}
                probe = subprocess.run(
                    [bwrap, "--unshare-user", "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/",
                     "--dev", "/dev", "--proc", "/proc", "true"], capture_output=True, text=True, timeout=30,
                    cwd="/", **who)
                failed = probe.returncode != 0 and (probe.stderr.strip().splitlines() or ["no message"])[-1]
            except (OSError, subprocess.TimeoutExpired) as exc:
                failed = str(exc)
            if failed:
                _BWRAP_PROBE = (f"user namespaces are not available to this user ({failed}): "
                                "see kernel.unprivileged_userns_clone / user.max_user_namespaces, or grade as root")
            elif not network_isolation_available():
                _BWRAP_PROBE = "this user may not create a user namespace with a network namespace of its own"
            else:
                _BWRAP_PROBE = ""
    return _BWRAP_PROBE or None


def child_environment(scratch: Path, kernel: KernelPlan | None = None) -> dict[str, str]:
    """Environment for the child: this interpreter's tools first, private Jupyter dirs.

    With a ``kernel`` plan, the kernel spec starts the kernel through ``grader.jail``.
    """
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
    jail: list[str] = []
    if kernel is not None:
        plan_file = scratch / "kernel-plan.json"
        plan = {k: str(v) if isinstance(v, Path) else v for k, v in kernel.__dict__.items()}
        plan_file.write_text(json.dumps(plan))
        jail = [sys.executable, "-m", "grader.jail", "--plan", str(plan_file), "--"]
    (kernel_dir / "kernel.json").write_text(
        json.dumps(
            {
                # no input history database: the kernel's IPython profile is new on every run,
                # so creating (and fsyncing) that database would only add to every check
                "argv": jail + [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                                "--HistoryManager.enabled=False"],
                "display_name": "Python 3 (grader)",
                "language": "python",
                "metadata": {"debugger": False},
            }
        )
    )
    if kernel is not None and kernel.uid is not None:  # only the kernel's home is open to it
        for entry in scratch.iterdir():
            if entry != kernel.home:
                os.chmod(entry, 0o700)
    env["JUPYTER_PATH"] = str(jupyter_data)  # searched before the user's and system kernels
    env["JUPYTER_RUNTIME_DIR"] = str(scratch / "jupyter-runtime")
    env["JUPYTER_CONFIG_DIR"] = str(scratch / "jupyter-config")
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["IPYTHONDIR"] = str(scratch / "ipython")
    env["MPLBACKEND"] = "Agg"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _loopback_up() -> None:
    """Bring up ``lo`` in a fresh network namespace (nbgrader talks to the kernel over it)."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _unshare_network() -> bool:
    """Move this process into a network namespace with only loopback; False if not permitted.

    Not root: first into a user namespace of its own, in which our uid and gid map to
    themselves (files keep their owner; its capabilities hold only in that namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() == 0:
        if libc.unshare(CLONE_NEWNET) != 0:
            return False
    else:
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            return False
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
    _loopback_up()
    return True


_NETWORK_PROBE: bool | None = None


_CGROUP_PROBE: tuple[list[str], str] | None = None


def cgroup_memory_cap(memory_mb: int) -> tuple[list[str], str]:
    """(argv prefix, what the report says) for a cgroup memory limit on the grading child.

    ``RLIMIT_AS`` caps each process's address space, not what the kernel and its children use
    together, and counts mappings that use no memory. A cgroup's ``MemoryMax`` caps the real
    memory of the whole tree. Where a systemd manager is reachable (the user's own, ``--user``,
    for an ordinary user; the system's for root), ``systemd-run --scope -p MemoryMax=`` runs the
    grading child in a scope of its own; the rlimits stay as a second wall. Probed once (a
    ``systemd-run ... true``); elsewhere the prefix is empty and the report says why."""
    global _CGROUP_PROBE
    if memory_mb <= 0:
        return [], "none"
    if _CGROUP_PROBE is None:
        runner = shutil.which("systemd-run")
        scope = [runner, *([] if os.geteuid() == 0 else ["--user"]), "--scope", "--quiet"] if runner else []
        why = "systemd-run is not installed"
        if runner:
            try:
                probe = subprocess.run([*scope, "-p", "MemoryMax=64M", "true"], capture_output=True, text=True,
                                       timeout=10, check=False)
                why = "" if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["it failed"])[-1]
            except (OSError, subprocess.TimeoutExpired) as exc:
                why = str(exc)
        _CGROUP_PROBE = (scope, "") if not why else ([], f"no systemd manager to ask for a cgroup ({why})")
    scope, why = _CGROUP_PROBE
    if not scope:
        return [], f"RLIMIT_AS (address space) only: {why}"
    who = "the user's" if "--user" in scope else "the system's"
    return ([*scope, "-p", f"MemoryMax={memory_mb}M", "-p", "MemorySwapMax=0", "--"],
            f"cgroup MemoryMax={memory_mb}M for the whole grading run ({who} systemd, a scope of its own), "
            f"and RLIMIT_AS per process")


def network_isolation_available() -> bool:
    """Whether this process may give a child a network namespace of its own (tried once, in a fork)."""
    global _NETWORK_PROBE
    if _NETWORK_PROBE is None:
        if os.name != "posix" or not sys.platform.startswith("linux"):
            _NETWORK_PROBE = False
        else:
            pid = os.fork()
            if pid == 0:
                try:
                    os._exit(0 if _unshare_network() else 1)
                except BaseException:  # noqa: BLE001 - any failure means "not available"
                    os._exit(1)
            _NETWORK_PROBE = os.waitpid(pid, 0)[1] == 0
    return _NETWORK_PROBE


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGKILL when the thread that started it ends.

    An instructor's class run grades each submission in a worker process; if that worker is
    killed, nothing would stop its grading child, which runs in a session of its own. Set last
    before exec (a change of credentials clears it), and checked against ``parent``: a parent
    that already died before the call would never send the signal."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _limit_resources(memory_mb: int, cpu_s: int | None = None, network_off: bool = False,
                     parent: int | None = None) -> None:
    """In the child, before exec: cap its address space and CPU time (kernels inherit the caps),
    if asked, move it into a network namespace of its own, and die with ``parent``."""
    import resource

    if network_off and not _unshare_network():
        raise OSError("could not unshare the network namespace")
    if parent is not None:
        die_with_parent(parent)
    if cpu_s:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    if memory_mb <= 0:
        return

    limit = memory_mb * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
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


def kill_user(uid: int) -> int:
    """SIGKILL every process of ``uid`` (a kernel user private to one run); returns how many.

    A kernel's children may leave its process tree (double fork, ``setsid``), but they cannot
    leave its user: killing by user is how nothing of a run outlives it.
    """
    killed = 0
    for _ in range(20):  # a forking process may add children while we kill: repeat until none
        found = []
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                continue
        time.sleep(0.05)
    return killed


def run_limited(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    memory_mb: int = DEFAULT_MEMORY_MB,
    cpu_s: int | None = None,
    network_off: bool = False,
    kernel_uid: int | None = None,
    poll: Callable[[], None] | None = None,
) -> ChildResult:
    """Run ``argv`` in a new session with the limits above; never hangs past ``timeout`` (+ a few s).

    Output goes to files, not pipes, so a process that escaped the tree and still holds them
    cannot keep us waiting. Afterwards, however the child ended, its process groups and every
    process of ``kernel_uid`` are killed. ``poll``, if given, is called every ``POLL_S`` while
    the child runs, and once more when it has ended.
    """
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,  # its own process group, killed as a whole on timeout
            # rlimits and the network namespace must be set between fork and exec; the grading
            # process starts no threads of its own before this (the noted fork-safety concern)
            preexec_fn=(  # noqa: PLW1509
                (lambda parent=os.getpid(): _limit_resources(memory_mb, cpu_s, network_off, parent))
                if os.name == "posix" else None),
        )
        try:
            if poll is None:
                proc.wait(timeout=timeout)
            else:  # wake up a few times a second for ``poll`` (progress shown as the run goes on)
                deadline = start + timeout
                while True:
                    try:
                        proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
                        break
                    except subprocess.TimeoutExpired:
                        poll()
                        if time.monotonic() >= deadline:
                            raise
                poll()
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            timed_out = True
        except BaseException:  # interrupted or terminated ourselves: take the child down with us
            kill_tree(proc)
            if kernel_uid is not None:
                kill_user(kernel_uid)
            raise
        try:  # whatever is left in the child's own process group (its session's leader was it)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if kernel_uid is not None:
            kill_user(kernel_uid)
        out.seek(0)
        err.seek(0)
        return ChildResult(proc.returncode, out.read(), err.read(), timed_out, time.monotonic() - start)
