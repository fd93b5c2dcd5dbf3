"""A one-node Slurm cluster in a temporary folder: ``srun`` for real, on this machine.

On a cluster a job does not pick its hosts; the scheduler does. Slurm's controller
(``slurmctld``) keeps the queue and hands out nodes, a daemon on every node (``slurmd``)
starts the job's tasks, and ``srun`` asks for an allocation and starts its tasks through
those daemons, which also tell every task its rank and how to reach the others (PMI).
Every message between them is signed by MUNGE with a key all hosts share.

``SlurmNode`` starts all three on this machine, as root: a fresh MUNGE key and ``munged``
socket, a ``slurm.conf`` naming this host as the controller and the only node (one
partition, ``cpus`` CPUs, no accounting, no cgroups), and its two daemons in the foreground
as child processes. ``environment`` (``SLURM_CONF``) points ``srun``, ``sinfo`` and
``sbatch`` at it. Everything stops and the folder goes on exit; nothing under ``/etc`` is
touched, and its ports are free ones chosen at start.

``python -m reference_impl.comm.slurm_node COMMAND...`` runs a command inside one, e.g.
``... slurm_node python -m benchmarks cluster --launcher srun``.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 30.0  # the node must be up (sinfo says idle) within this


class SlurmUnavailable(RuntimeError):
    """This machine cannot run Slurm here: not root, or slurm-wlm / munge not installed."""


def _tool(name: str) -> str:
    """The path of a Slurm or MUNGE program (daemons live in /usr/sbin, often off PATH)."""
    found = shutil.which(name) or next((str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name)
                                        if p.exists()), None)
    if found is None:
        raise SlurmUnavailable(f"'{name}' is not installed (Debian packages slurm-wlm and munge)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmNode:
    """This machine as a one-node Slurm cluster with ``cpus`` CPUs; a context manager."""

    def __init__(self, cpus: int = 8):
        if os.geteuid() != 0:
            raise SlurmUnavailable("a Slurm node needs root (slurmd starts tasks as their user)")
        self.tools = {name: _tool(name) for name in ("munged", "slurmctld", "slurmd", "srun", "sinfo")}
        self.cpus = cpus
        self.node = socket.gethostname().split(".")[0]
        self.dir = Path(tempfile.mkdtemp(prefix="lab-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self._procs: list[subprocess.Popen] = []

    @property
    def environment(self) -> dict[str, str]:
        """What ``srun``, ``sinfo`` and ``sbatch`` need to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def __enter__(self) -> "SlurmNode":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        d = self.dir
        (d / "state").mkdir()
        (d / "spool").mkdir()
        key = d / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        sock = d / "munge.sock"
        # --force: munged refuses to run as root, or beside a world-writable /tmp, without it
        self._spawn("munged", "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
                    f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}",
                    f"--log-file={d / 'munged.log'}")
        self._wait_for(lambda: sock.exists(), "munged did not create its socket", d / "munged.log")
        ctl_port, node_port = _free_port(), _free_port()
        self.conf.write_text(f"""\
ClusterName=lab
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmdPort={node_port}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", self.node)
        self._wait_for(self._idle, f"the node did not come up (sinfo never said idle) within {START_TIMEOUT_S:g} s",
                       d / "slurmctld.log", d / "slurmd.log")

    def _spawn(self, tool: str, *args: str) -> None:
        self._procs.append(subprocess.Popen([self.tools[tool], *args], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, env={**os.environ, **self.environment}))

    def _idle(self) -> bool:
        run = subprocess.run([self.tools["sinfo"], "-h", "-o", "%T"], capture_output=True, text=True,
                             timeout=10, env={**os.environ, **self.environment})
        return run.stdout.strip() == "idle"

    def _wait_for(self, ready, what: str, *logs: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [p for p in self._procs if p.poll() is not None]
            if dead:
                break
            if ready():
                return
            time.sleep(0.1)
        tails = "".join(f"\n--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-10:])
                        for log in logs if log.exists())
        raise SlurmUnavailable(f"{what}{' (a daemon exited)' if dead else ''}{tails}")

    def close(self) -> None:
        """Stop the daemons (slurmd, slurmctld, munged: the reverse of their start) and remove the folder."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> int:
    """``python -m reference_impl.comm.slurm_node COMMAND...``: run COMMAND with a one-node Slurm up."""
    if len(sys.argv) < 2:
        print("usage: python -m reference_impl.comm.slurm_node COMMAND [ARGS...]   (as root)", file=sys.stderr)
        return 2
    try:
        node = SlurmNode()
    except SlurmUnavailable as exc:
        print(f"no Slurm here: {exc}", file=sys.stderr)
        return 2
    with node:
        return subprocess.run(sys.argv[1:], env={**os.environ, **node.environment}).returncode


if __name__ == "__main__":
    sys.exit(main())
