"""A cluster of "hosts" on one machine: network namespaces joined by a shaped virtual switch.

Moving an MPI program from one machine to a cluster changes how it is *launched* and which
*transport* carries its messages, not the program. ``VirtualCluster`` lets you see that on
a laptop. Each host is a Linux network namespace with its own IP address and a virtual
Ethernet cable (veth) into a bridge (the switch); the switch side of every cable can be
rate-limited with a token-bucket filter (``tc ... tbf``) to play a slower network. Then:

* ``mpiexec -f HOSTFILE`` starts ranks on the hosts, exactly as on a real cluster; its
  ``ssh`` launcher is replaced by a script that "logs in" with ``ip netns exec``;
* MPICH is told to treat every peer as remote (``MPIR_CVAR_NOLOCAL=1``) and UCX to use
  TCP (``UCX_TLS=tcp``), so every message crosses a veth cable and the switch, as it
  would cross a NIC and a real switch, instead of shared memory.

Creating namespaces needs root (CAP_NET_ADMIN). Traffic stays on addresses this object
made, inside namespaces it made, and everything is removed on exit.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .launch import Host, Launcher, wheel_mpiexec


class ClusterUnavailable(RuntimeError):
    """This machine or user cannot create network namespaces (not root, or no ``ip``)."""


def _ip(*args: str) -> None:
    run = subprocess.run(["ip", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise ClusterUnavailable(f"'ip {' '.join(args)}' failed: {run.stderr.strip()}")


class VirtualCluster:
    """``hosts`` namespaces on a bridge; ``rate`` (e.g. "1gbit") caps each host's incoming link.

    Use as a context manager; ``launch`` is its ``Launcher`` (what ``mpi_job`` and a
    benchmark's ``--launcher``/``--hostfile`` use) and ``mpiexec(n, program...)`` the launch
    command for ``n`` ranks spread round-robin over the hosts (``slots`` ranks per host line).
    """

    def __init__(self, hosts: int = 2, rate: str | None = None, slots: int = 1):
        if os.geteuid() != 0:
            raise ClusterUnavailable("a virtual cluster needs root to create network namespaces")
        if shutil.which("ip") is None:
            raise ClusterUnavailable("the 'ip' command (Debian package iproute2) is missing")
        if rate is not None and shutil.which("tc") is None:
            raise ClusterUnavailable("the 'tc' command (Debian package iproute2) is missing")
        if not 1 <= hosts <= 200:
            raise ValueError(f"hosts must be between 1 and 200, got {hosts}")
        self.hosts, self.rate, self.slots = hosts, rate, slots
        tag = os.getpid() % 10000
        self.bridge = f"lab{tag}br"
        self.namespaces = [f"lab{tag}h{i}" for i in range(hosts)]
        self._veths = [f"lab{tag}v{i}" for i in range(hosts)]
        subnet = 100 + tag % 100  # 10.<subnet>.0.0/24: one subnet per concurrent cluster
        self.gateway = f"10.{subnet}.0.1"
        self.addresses = [f"10.{subnet}.0.{10 + i}" for i in range(hosts)]
        self._dir = Path(tempfile.mkdtemp(prefix="lab-cluster-"))
        self.hostfile = self._dir / "hosts"
        self.launcher = self._dir / "netns-login"
        # The launch: the single-machine mpiexec plus a host file, a login command (the ssh
        # launcher's stand-in), the interface to use and the environment of a remote peer.
        env = [arg for k, v in self.environment.items() for arg in ("-genv", k, v)]
        self.launch = Launcher(
            (wheel_mpiexec(), "-launcher", "ssh", "-launcher-exec", str(self.launcher), "-iface", self.bridge, *env),
            hostfile=self.hostfile, source="a virtual cluster",
            hosts=tuple(Host(a, slots, f"{self.hostfile}:{i + 1}") for i, a in enumerate(self.addresses)))

    def __enter__(self) -> "VirtualCluster":
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --8<-- [start:create]
    def _create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, veth, addr in zip(self.namespaces, self._veths, self.addresses):
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if self.rate is not None:  # the switch port towards this host: its download link
                run = subprocess.run(
                    ["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", self.rate,
                     "burst", "256kb", "latency", "50ms"], capture_output=True, text=True)
                if run.returncode != 0:
                    raise ClusterUnavailable(f"cannot shape {veth} to {self.rate}: {run.stderr.strip()}")
        self.hostfile.write_text("".join(f"{a}:{self.slots}\n" for a in self.addresses))
        cases = "".join(f"  {a}) ns={ns} ;;\n" for a, ns in zip(self.addresses, self.namespaces))
        # mpiexec's ssh launcher runs: LAUNCHER [-x ...] HOST COMMAND; we "log in" with netns.
        self.launcher.write_text(
            "#!/bin/sh\n"
            'while [ "${1#-}" != "$1" ]; do shift; done\n'
            'host="$1"; shift\n'
            'case "$host" in\n' + cases +
            '  *) echo "netns-login: unknown host $host" >&2; exit 1 ;;\n'
            "esac\n"
            'exec ip netns exec "$ns" sh -c "$*"\n'
        )
        self.launcher.chmod(0o755)

    def close(self) -> None:
        """Remove every namespace, cable and the bridge this cluster made (safe to repeat)."""
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for veth in self._veths:
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self._dir, ignore_errors=True)
    # --8<-- [end:create]

    @property
    def environment(self) -> dict[str, str]:
        """What changes for the program: every peer is remote, and messages go over TCP."""
        return {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp"}

    def mpiexec(self, n_ranks: int, *program: str) -> list[str]:
        """The launch command for ``n_ranks`` ranks over the hosts (see ``launch``)."""
        return self.launch.command(n_ranks, *program)


def main() -> int:
    """``python -m reference_impl.comm.virtual_cluster HOSTS RANKS PROGRAM...``: run a program on one."""
    if len(sys.argv) < 4:
        print("usage: python -m reference_impl.comm.virtual_cluster HOSTS RANKS PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    hosts, ranks = int(sys.argv[1]), int(sys.argv[2])
    with VirtualCluster(hosts) as cluster:
        cmd = cluster.mpiexec(ranks, *sys.argv[3:])
        print(" ".join(cmd), file=sys.stderr)
        return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
