"""The launch line: how the same MPI program is started on one machine, from a host file, or by Slurm.

An MPI program does not change when it moves from a laptop to a cluster; the command that
starts it does. Every launch line in the lab is built here, from one of four sources, the
first that is given winning:

1. ``--launcher "CMD"`` (a benchmark's option, or ``Launcher.resolve(launcher=...)``): any
   launcher that takes ``-n N`` as the MPI standard's ``mpiexec`` does, e.g. ``srun``,
   ``srun --mpi=pmi2`` or ``mpiexec -f hosts``;
2. ``$MPIEXEC`` from the environment, the same kind of command;
3. the ``mpiexec`` of the ``mpich`` wheel installed beside this Python (the default), so the
   interpreter and the MPI library always match;

and, with an ``mpiexec`` launcher, ``--hostfile FILE``: MPICH Hydra's ``-f FILE``, one host a
line as ``name`` or ``name:slots`` (``#`` starts a comment).

The line is ``LAUNCHER [-f FILE] -n N PYTHON -m mpi4py PROGRAM...``: ``-m mpi4py`` turns an
uncaught exception on one rank into ``MPI_Abort`` of the whole job. Under Slurm, ``srun`` must
speak the process-management interface (PMI) the MPI library was built for; the ``mpich``
wheel's MPICH speaks the PMI-1 wire protocol, which Slurm's ``pmi2`` plugin serves, so a bare
``srun`` gets ``--mpi=pmi2`` added (with Slurm's default ``MpiDefault=none`` every rank would
start alone, a world of one).

Nothing here waits without a deadline. A launcher that is not installed, or a host file that
is missing, empty or malformed, is refused at once with the file and line. Before the first
job through any launcher but the local default, ``check`` resolves every host (a bounded
lookup) and runs a *probe*: one rank per host prints where it started, then joins MPI and
prints the size of its world. Within ``probe_timeout`` seconds each host must answer, or the
error names the hosts that did not: not started (the launcher could not reach them), started
but not joined (the hosts cannot reach each other), or joined a world of the wrong size (the
launcher and the MPI library speak different PMIs).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

ENV = "MPIEXEC"
PROBE_TIMEOUT_S = 60.0  # a probe starts one Python per host; an ssh login to each can take seconds
RESOLVE_TIMEOUT_S = 10.0  # a name lookup (DNS) that takes longer counts as failed
TERM_GRACE_S = 3.0  # a job past its deadline gets SIGTERM, then SIGKILL this much later
SRUN_MPI = "--mpi=pmi2"  # the PMI plugin of srun that the mpich wheel's MPICH speaks (PMI-1 wire protocol)


class LaunchError(RuntimeError):
    """The job cannot be launched as asked; the message says what is wrong and where."""


@dataclass(frozen=True)
class Host:
    """One line of a host file: the host's name, how many ranks it takes, and where it was written."""

    name: str
    slots: int
    where: str  # "FILE:LINE"


def read_hostfile(path: str | os.PathLike) -> tuple[Host, ...]:
    """The hosts of an MPICH Hydra host file: ``name`` or ``name:slots`` a line, ``#`` comments.

    Raises ``LaunchError`` naming the file (and the line) if it is missing, unreadable,
    empty, or has a line that is not a host name with an optional positive slot count.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LaunchError(f"host file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LaunchError(f"host file {path} cannot be read: {exc}") from None
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        name, colon, slots = line.partition(":")
        if not name or any(c.isspace() for c in line) or not _is_host_name(name):
            raise LaunchError(f"{where}: {raw.strip()!r} is not a host name, or name:slots "
                              f"(one host a line, e.g. node1:8)")
        if colon and not (slots.isdigit() and int(slots) > 0):
            raise LaunchError(f"{where}: the slot count in {raw.strip()!r} must be a positive whole number")
        hosts.append(Host(name, int(slots) if colon else 1, where))
    if not hosts:
        raise LaunchError(f"host file {path} names no host (one a line, as name or name:slots)")
    return tuple(hosts)


def _is_host_name(name: str) -> bool:
    """Letters, digits, '-', '.' and '_' (a DNS name or an IPv4 address)."""
    return all(c.isalnum() or c in "-._" for c in name)


def wheel_mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the ``mpich`` wheel's), else the first on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        raise LaunchError("mpiexec not found: install the project (make venv does) so the 'mpich' wheel provides it")
    return found


@dataclass
class Launcher:
    """A way to start ranks: the launcher's own words (``argv``), and a host file for ``mpiexec``.

    ``source`` says where the launcher came from, for error messages; ``hosts`` are the host
    file's lines.
    """

    argv: tuple[str, ...]
    hostfile: Path | None = None
    source: str = "the mpich wheel"
    hosts: tuple[Host, ...] = ()
    _checked: bool = field(default=False, repr=False)

    @classmethod
    def resolve(cls, launcher: str | None = None, hostfile: str | os.PathLike | None = None,
                environ: Mapping[str, str] | None = None) -> "Launcher":
        """``launcher`` if given, else ``$MPIEXEC``, else the wheel's ``mpiexec``; plus ``hostfile``.

        Fails at once (``LaunchError``) if the launcher is not installed or the host file is
        bad; nothing is started here.
        """
        environ = os.environ if environ is None else environ
        if launcher is not None and launcher.strip():
            text, source = launcher, "--launcher"
        elif environ.get(ENV, "").strip():
            text, source = environ[ENV], f"${ENV}"
        else:
            text, source = None, "the mpich wheel"
        if text is None:
            argv: tuple[str, ...] = (wheel_mpiexec(),)
        else:
            try:
                argv = tuple(shlex.split(text))
            except ValueError as exc:
                raise LaunchError(f"{source} {text!r} is not a command line: {exc}") from None
            found = shutil.which(argv[0])
            if found is None:
                raise LaunchError(f"launcher {argv[0]!r} (from {source} {text!r}) is not installed: "
                                  f"no such command on PATH")
        made = cls(argv, source=source)
        if hostfile is not None:
            if made.is_srun:
                raise LaunchError(f"--hostfile {hostfile} with {argv[0]}: srun places ranks on the nodes "
                                  f"of its Slurm allocation; a host file is for mpiexec")
            made.hostfile = Path(hostfile)
            made.hosts = read_hostfile(hostfile)
        return made

    @property
    def is_srun(self) -> bool:
        return Path(self.argv[0]).name == "srun"

    @property
    def is_local_default(self) -> bool:
        """The wheel's mpiexec with no host file: ranks on this machine, nothing to probe."""
        return self.source == "the mpich wheel" and self.hostfile is None

    # --8<-- [start:line]
    def prefix(self, n_ranks: int, per_host: int | None = None) -> list[str]:
        """The launcher's part of the line: ``LAUNCHER [-f FILE] [-ppn K] -n N``."""
        if n_ranks < 1:
            raise ValueError(f"a job needs at least one rank, got {n_ranks}")
        words = list(self.argv)
        if self.is_srun:
            if not any(w == "--mpi" or w.startswith("--mpi=") for w in words):
                words.append(SRUN_MPI)
            if per_host is not None:
                words.append(f"--ntasks-per-node={per_host}")
        else:
            if self.hostfile is not None:
                words += ["-f", str(self.hostfile)]
            if per_host is not None:
                words += ["-ppn", str(per_host)]
        return [*words, "-n", str(n_ranks)]

    def command(self, n_ranks: int, *program: str) -> list[str]:
        """The whole line: ``LAUNCHER ... -n N PYTHON -m mpi4py PROGRAM...``."""
        return [*self.prefix(n_ranks), sys.executable, "-m", "mpi4py", *program]
    # --8<-- [end:line]

    def describe(self) -> str:
        """The launcher as a reader would type it (for messages and result files)."""
        words = [Path(self.argv[0]).name if self.source == "the mpich wheel" else self.argv[0], *self.argv[1:]]
        if self.hostfile is not None:
            words += ["-f", str(self.hostfile)]
        return shlex.join(words)

    # ------------------------------------------------------------------ the checks before launch

    def check(self, probe_timeout: float = PROBE_TIMEOUT_S, n_ranks: int = 2) -> None:
        """Resolve every host, then run the probe; once per ``Launcher``. Raises ``LaunchError``.

        With a host file the probe runs one rank per host; otherwise ``min(n_ranks, 2)``
        ranks (enough to see a world of the wrong size). The local default is not probed.
        """
        if self._checked or self.is_local_default:
            return
        resolve_hosts(self.hosts)
        ranks = len(self.hosts) if self.hosts else max(1, min(n_ranks, 2))
        self._probe(ranks, probe_timeout)
        self._checked = True

    def _probe(self, ranks: int, timeout: float) -> None:
        per_host = 1 if self.hosts else None
        cmd = [*self.prefix(ranks, per_host), sys.executable, "-m", "reference_impl.comm.launch", "--probe"]
        started: dict[int, str] = {}
        joined: dict[int, int] = {}

        def on_line(line: str) -> None:
            # The launcher forwards each rank's output in chunks, so two ranks' records may share a
            # line; anything that is not a record (a login banner, say) is passed over.
            for text in re.findall(r"\{[^{}]*\}", line):
                try:
                    record = json.loads(text)
                except ValueError:
                    continue
                if "started" in record:
                    started[record["started"]] = record["host"]
                elif "joined" in record:
                    joined[record["joined"]] = record["size"]

        outcome = run_job(cmd, on_line, timeout)
        where = self.describe()

        def name(rank: int) -> str:
            if self.hosts:
                return f"{self.hosts[rank].name} ({self.hosts[rank].where})"
            return f"rank {rank}"

        missing = [r for r in range(ranks) if r not in started]
        if missing:
            what = (f"did not start within {timeout:g} s" if outcome.timed_out
                    else f"did not start before the launcher exited (status {outcome.returncode})")
            raise LaunchError(
                f"launch probe through {where}: {', '.join(name(r) for r in missing)} {what}: "
                f"the launcher could not reach {'those hosts' if self.hosts else 'its nodes'} (is the name right, "
                f"the host up, the login (ssh) allowed, this Python at {sys.executable} there?)"
                + outcome.stderr_tail()
            )
        late = [r for r in range(ranks) if r not in joined]
        if late:
            when = (f"within {timeout:g} s" if outcome.timed_out
                    else f"before the launcher exited (status {outcome.returncode})")
            raise LaunchError(
                f"launch probe through {where}: every rank started, but MPI_Init did not complete on "
                f"{', '.join(name(r) for r in late)} {when}: the hosts cannot reach each other or "
                f"this one (a firewall, or the wrong network interface: mpiexec -iface)" + outcome.stderr_tail()
            )
        wrong = {r: s for r, s in joined.items() if s != ranks}
        if wrong:
            raise LaunchError(
                f"launch probe through {where}: {ranks} ranks started, but each saw a world of "
                f"{sorted(set(wrong.values()))} rank(s): the launcher and the MPI library do not share a "
                f"process-management interface (under Slurm use srun {SRUN_MPI}; the mpich wheel speaks PMI-1)"
            )


def resolve_hosts(hosts: tuple[Host, ...], timeout: float = RESOLVE_TIMEOUT_S) -> None:
    """Look every host name up (in parallel, ``timeout`` seconds in all); ``LaunchError`` names those
    that do not resolve."""
    if not hosts:
        return
    pool = ThreadPoolExecutor(max_workers=min(16, len(hosts)))
    futures = {h: pool.submit(socket.getaddrinfo, h.name, None) for h in hosts}
    bad = []
    for host, future in futures.items():
        try:
            future.result(timeout=timeout)
        except socket.gaierror as exc:
            bad.append(f"{host.name} ({host.where}): {exc.strerror}")
        except TimeoutError:
            bad.append(f"{host.name} ({host.where}): no answer from the name service within {timeout:g} s")
    pool.shutdown(wait=False, cancel_futures=True)  # a lookup still hanging is left to finish alone
    if bad:
        raise LaunchError("host names that do not resolve: " + "; ".join(bad))


# ---------------------------------------------------------------------- running a job with a deadline


@dataclass
class JobOutcome:
    """How a job ended: its exit status, whether the deadline killed it, and its last stderr lines."""

    returncode: int
    timed_out: bool
    stderr: list[str]

    def stderr_tail(self, lines: int = 8) -> str:
        tail = [s.rstrip() for s in self.stderr[-lines:] if s.strip()]
        return ("\n  launcher said: " + "\n  ".join(tail)) if tail else ""


def run_job(cmd: list[str], on_line: Callable[[str], None], timeout: float,
            env: Mapping[str, str] | None = None, stderr_to_terminal: bool = False) -> JobOutcome:
    """Run ``cmd`` in its own process group, calling ``on_line`` per stdout line as it arrives.

    A watchdog kills the whole group at ``timeout`` seconds, even if the job prints nothing,
    so no launch waits forever. Stderr is kept (its last lines go into error messages) and,
    with ``stderr_to_terminal``, also passed on as it arrives.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=None if env is None else {**os.environ, **env})
    fired = threading.Event()

    def kill() -> None:
        # SIGTERM first: mpiexec (Hydra) then ends what it started on other hosts, such as a login
        # (ssh) that hangs in a session of its own; SIGKILL whatever is left of the job's group.
        fired.set()
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=grace) if grace else None
                if proc.poll() is not None:
                    return
            except subprocess.TimeoutExpired:
                pass

    errors: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            errors.append(line)
            del errors[:-200]
            if stderr_to_terminal:
                sys.stderr.write(line)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    watchdog = threading.Timer(timeout, kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line)
        proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            kill()
            proc.wait()
        reader.join(timeout=5)
    return JobOutcome(proc.returncode, fired.is_set(), errors)


def probe_rank() -> None:
    """What each probe rank runs: say where it started (before MPI), then join MPI and say the world's size."""
    rank = next((int(os.environ[v]) for v in ("PMI_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
                 if os.environ.get(v, "").isdigit()), -1)
    print(json.dumps({"started": rank, "host": socket.gethostname()}), flush=True)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if rank < 0:
        rank = world.Get_rank()
    # keyed by the launcher's rank: ranks that each started alone all have MPI rank 0
    print(json.dumps({"joined": rank, "size": world.Get_size()}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--probe"]:
        probe_rank()
    else:
        print("usage: python -m reference_impl.comm.launch --probe   (run by Launcher.check on every host)",
              file=sys.stderr)
        sys.exit(2)
