"""Launching the same MPI job on one machine, from a host file, under Slurm, and from a container recipe.

``reference_impl.comm.launch`` builds every launch line. Here: host files and launchers are
read or refused with the file, line or command named; a benchmark runs through a host file
whose "hosts" are loopback addresses reached by a stand-in for ssh, and a host whose login
hangs is named within the probe's deadline instead of hanging the job (no root needed);
as root, the same benchmark runs across a virtual cluster of network namespaces through
``--launcher``/``--hostfile``, and ``srun`` runs a collective benchmark and the sbatch script
on a one-node Slurm started for the test. Without root or without slurm-wlm those tests skip
with the reason; under CI (root) a missing tool is a failure, as .ci/run installs it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.__main__ import BENCHMARKS
from reference_impl.comm.launch import SRUN_MPI, LaunchError, Launcher, read_hostfile, wheel_mpiexec
from reference_impl.comm.mpi import mpiexec_command

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
pytestmark = pytest.mark.timeout(180)


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _login(tmp_path: Path, hang_on: str | None = None) -> Path:
    """A stand-in for ssh as mpiexec calls it (``LOGIN [-x] HOST COMMAND``): logs the host, runs the command here;
    for ``hang_on`` it never answers, as ssh to a host that drops packets."""
    log = tmp_path / "logins"
    hung = shlex.quote(str(tmp_path / "hung.pid"))  # the test ends the hung login, which mpiexec leaves behind
    hang = f'  {hang_on}) echo $$ >> {hung}; exec sleep 600 ;;\n' if hang_on else ""
    return _executable(tmp_path / "login", (
        "#!/bin/sh\n"
        'while [ "${1#-}" != "$1" ]; do shift; done\n'
        f'host="$1"; shift; echo "$host" >> {shlex.quote(str(log))}\n'
        f'case "$host" in\n{hang}  *) ;;\nesac\n'
        'exec sh -c "$*"\n'))


# ----------------------------------------------------------------------------- lines and refusals


def test_host_files_are_read_and_a_bad_one_is_named_with_its_line(tmp_path):
    good = tmp_path / "hosts"
    good.write_text("# the rack\nnode1:8\n\nnode2   # one slot\n10.0.0.7:2\n")
    assert [(h.name, h.slots, h.where) for h in read_hostfile(good)] == [
        ("node1", 8, f"{good}:2"), ("node2", 1, f"{good}:4"), ("10.0.0.7", 2, f"{good}:5")]
    cases = {
        "missing": (None, "does not exist"),
        "empty": ("# nothing here\n\n", "names no host"),
        "space": ("node1\nnode 2\n", ":2: 'node 2' is not a host name"),
        "zero": ("node1:0\n", ":1: the slot count in 'node1:0' must be a positive whole number"),
        "word": ("node1:eight\n", ":1: the slot count"),
        "colon": (":4\n", ":1: ':4' is not a host name"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(LaunchError, match=re.escape(f"{path}") + ".*" + re.escape(message)):
            read_hostfile(path)


def test_launchers_resolve_in_order_and_build_their_lines(tmp_path):
    srun = _executable(tmp_path / "srun", "#!/bin/sh\n")
    hosts = tmp_path / "hosts"
    hosts.write_text("node1:2\nnode2:2\n")
    program = ("prog.py", "--flag")
    tail = [PYTHON, "-m", "mpi4py", *program]

    default = Launcher.resolve(environ={})
    assert default.argv == (wheel_mpiexec(),) and default.is_local_default
    assert default.command(4, *program) == [wheel_mpiexec(), "-n", "4", *tail] == mpiexec_command(4, *program)
    from_env = Launcher.resolve(environ={"MPIEXEC": f"{srun} --partition=gpu"})
    assert from_env.source == "$MPIEXEC"
    assert from_env.command(8, *program) == [str(srun), "--partition=gpu", SRUN_MPI, "-n", "8", *tail]
    chosen = Launcher.resolve(f"{srun} --mpi=pmix", environ={"MPIEXEC": "elsewhere"})  # --launcher wins
    assert chosen.command(2, *program) == [str(srun), "--mpi=pmix", "-n", "2", *tail]
    with_file = Launcher.resolve(f"{wheel_mpiexec()} -iface eth1", hosts)
    assert with_file.command(4, *program) == [wheel_mpiexec(), "-iface", "eth1", "-f", str(hosts), "-n", "4", *tail]
    assert [h.name for h in with_file.hosts] == ["node1", "node2"] and not with_file.is_local_default

    refusals = {
        ("no-such-launcher -n", None): "launcher 'no-such-launcher' (from --launcher 'no-such-launcher -n') is not installed",
        ("mpiexec 'unclosed", None): "is not a command line",
        (str(srun), hosts): "srun places ranks on the nodes of its Slurm allocation; a host file is for mpiexec",
    }
    for (launcher, hostfile), message in refusals.items():
        with pytest.raises(LaunchError, match=re.escape(message)):
            Launcher.resolve(launcher, hostfile, environ={})
    with pytest.raises(LaunchError, match=re.escape("(from $MPIEXEC 'gone-mpiexec') is not installed")):
        Launcher.resolve(environ={"MPIEXEC": "gone-mpiexec"})
    with pytest.raises(ValueError, match="at least one rank"):
        default.command(0)


def test_every_mpi_benchmark_takes_launcher_and_hostfile_and_refuses_a_bad_one(tmp_path, capsys):
    """Each benchmark that starts MPI jobs builds its parser with the launch options (no copies of them)."""
    launching = {name: main for name, main in BENCHMARKS.items()
                 if "mpi_job(" in Path(sys.modules[main.__module__].__file__).read_text()}
    assert {"allreduce", "collectives", "alpha_beta", "overlap", "cluster"} <= set(launching)
    for name, main in launching.items():
        for argv, message in (
            (["--launcher", "no-such-launcher"], "launcher 'no-such-launcher' (from --launcher 'no-such-launcher')"),
            (["--hostfile", str(tmp_path / "absent")], f"host file {tmp_path / 'absent'} does not exist"),
        ):
            with pytest.raises(SystemExit) as stop:
                main(argv)
            assert stop.value.code == 2, name
            assert message in capsys.readouterr().err, name


# ----------------------------------------------------------------------------- a host file, no root


def test_a_benchmark_runs_through_a_host_file_and_an_unreachable_host_is_named(tmp_path):
    """Two "hosts" at loopback addresses (mpiexec treats them as remote and logs in with our stand-in for
    ssh): the allreduce benchmark runs one rank on each; a third host whose login hangs is named by the
    probe at its deadline, and a name that does not resolve is named before anything starts."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2\n127.0.0.3\n")
    login = _login(tmp_path, hang_on="127.0.0.4")
    launcher = f"{wheel_mpiexec()} -launcher ssh -launcher-exec {login}"
    out = tmp_path / "allreduce.json"
    run = subprocess.run([PYTHON, "-m", "benchmarks", "allreduce", "--launcher", launcher, "--hostfile", str(hosts),
                          "--ranks", "2", "--max-bytes", "64", "--warmup", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["results"]
    assert {r["ranks"] for r in rows} == {2} and {r["impl"] for r in rows} == {"ring", "ring_alloc", "library", "mpi"}
    logins = (tmp_path / "logins").read_text().split()
    assert logins.count("127.0.0.2") == logins.count("127.0.0.3") == 2  # the probe, then the job

    hosts.write_text("127.0.0.2\n127.0.0.3\n127.0.0.4\n")
    try:
        with pytest.raises(LaunchError) as err:
            Launcher.resolve(launcher, hosts).check(probe_timeout=2)
    finally:
        for pid in (tmp_path / "hung.pid").read_text().split() if (tmp_path / "hung.pid").exists() else ():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert f"127.0.0.4 ({hosts}:3) did not start within 2 s" in str(err.value)
    assert "127.0.0.2" not in str(err.value)
    hosts.write_text("127.0.0.2\nno-such-host.invalid\n")
    with pytest.raises(LaunchError, match=re.escape(f"do not resolve: no-such-host.invalid ({hosts}:2)")):
        Launcher.resolve(launcher, hosts).check(probe_timeout=4)


# ----------------------------------------------------------------------------- as root: namespaces, Slurm


def test_a_benchmark_runs_across_a_virtual_cluster_through_launcher_and_hostfile(tmp_path):
    from reference_impl.comm.virtual_cluster import ClusterUnavailable, VirtualCluster

    try:
        cluster = VirtualCluster(hosts=2)
    except ClusterUnavailable as exc:
        if os.environ.get("CI") and os.geteuid() == 0:
            raise
        pytest.skip(f"no virtual cluster here: {exc}")
    out = tmp_path / "allreduce.json"
    with cluster:
        launcher = shlex.join(cluster.launch.argv)
        run = subprocess.run([PYTHON, "-m", "benchmarks", "allreduce", "--launcher", launcher,
                              "--hostfile", str(cluster.hostfile), "--ranks", "2", "--max-bytes", "65536",
                              "--warmup", "1", "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        # A host the switch has no cable to: the login refuses it and the probe names it.
        bad = tmp_path / "hosts"
        bad.write_text(cluster.hostfile.read_text() + "10.254.254.254\n")
        with pytest.raises(LaunchError, match=re.escape(f"10.254.254.254 ({bad}:3) did not start")):
            Launcher.resolve(launcher, bad).check(probe_timeout=20)
    rows = json.loads(out.read_text())["results"]
    assert {r["ranks"] for r in rows} == {2} and len(rows) == 4 * 14  # 8 B .. 64 KiB, four implementations


@pytest.fixture(scope="module")
def slurm():
    """A one-node Slurm (munged, slurmctld, slurmd as children of this test), stopped after the module."""
    from reference_impl.comm.slurm_node import SlurmNode, SlurmUnavailable

    try:
        node = SlurmNode(cpus=8)
    except SlurmUnavailable as exc:
        if os.environ.get("CI") and os.geteuid() == 0:
            raise
        pytest.skip(f"no Slurm here: {exc}")
    with node:
        yield node


@pytest.mark.slow
def test_srun_runs_a_collective_benchmark_and_a_wrong_pmi_is_named(slurm, tmp_path, monkeypatch):
    env = {**os.environ, **slurm.environment}
    out = tmp_path / "collectives.json"
    run = subprocess.run([PYTHON, "-m", "benchmarks", "collectives", "--launcher", "srun", "--ranks", "4",
                          "--max-bytes", "1024", "--warmup", "1", "--no-forced", "--out", str(out)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["results"]
    assert {r["ranks"] for r in rows} == {4} and {"ring", "mpi"} <= {r["impl"] for r in rows}
    # The ranks srun started know they share the node (so MPICH uses shared memory between them), as under mpiexec.
    local = "from mpi4py import MPI; w = MPI.COMM_WORLD; print(w.Split_type(MPI.COMM_TYPE_SHARED).size, w.size)"
    shared = subprocess.run(["srun", "--mpi=pmi2", "-n", "2", PYTHON, "-c", local], capture_output=True, text=True,
                            timeout=60, env=env)
    assert shared.stdout.split() == ["2", "2", "2", "2"], shared.stderr
    # Without a PMI the library speaks, every rank starts alone: the probe says so instead of a wrong result.
    monkeypatch.setenv("SLURM_CONF", slurm.environment["SLURM_CONF"])
    with pytest.raises(LaunchError, match=re.escape("each saw a world of [1] rank(s)")):
        Launcher.resolve("srun --mpi=none").check(probe_timeout=60)


@pytest.mark.slow
def test_the_sbatch_script_runs_the_benchmark_as_a_batch_job(slurm, tmp_path):
    env = {**os.environ, **slurm.environment, "MAX_BYTES": "256", "RESULTS": str(tmp_path)}
    submit = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=4", f"--output={tmp_path}/%j.out",
                             "benchmarks/allreduce.sbatch"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    # Poll the job's state (sbatch --wait polls at growing intervals, up to seconds apart).
    deadline = time.monotonic() + 120
    state = "?"
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30, env=env)
        state = re.search(r"JobState=(\S+)", shown.stdout).group(1)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(0.2)
    log = tmp_path / f"{job}.out"
    assert state == "COMPLETED", f"job {job} ended {state}:\n" + (log.read_text() if log.exists() else "")
    rows = json.loads((tmp_path / f"allreduce-{job}.json").read_text())["results"]
    assert {r["ranks"] for r in rows} == {4} and {r["bytes"] for r in rows} == {8, 16, 32, 64, 128, 256}


def test_training_under_srun(slurm):
    """``python -m reference_impl.train ... --engine mpi`` with ``$MPIEXEC=srun`` starts itself as a
    Slurm job step of one process per rank, which trains and prints the result."""
    env = {**os.environ, **slurm.environment, "MPIEXEC": "srun"}

    def jobs() -> int:
        listing = subprocess.run(["scontrol", "-o", "show", "jobs"], capture_output=True, text=True, timeout=30, env=env)
        return listing.stdout.count("JobId=")

    before = jobs()
    run = subprocess.run([PYTHON, "-m", "reference_impl.train", "wide_deep", "--strategy", "allreduce", "--workers", "2",
                          "--engine", "mpi", "--limit", "256", "--batch", "128", "--epochs", "1", "--json"],
                         capture_output=True, text=True, timeout=150, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("{")]  # rank 0 alone prints
    result = json.loads(line)
    assert result["engine"] == "mpi" and result["workers"] == 2 and 0.5 < result["auc"] < 1
    assert jobs() > before, "the training job did not go through Slurm ($MPIEXEC=srun)"


# ----------------------------------------------------------------------------- the container recipe


DOCKERFILE = ROOT / "container" / "Dockerfile"


def test_the_container_recipe_installs_through_the_makefile():
    """The image gets the lab from `make venv` (the pinned constraints), never from a list of its own."""
    text = DOCKERFILE.read_text()
    steps = [line for line in text.splitlines() if line.startswith(("RUN", "FROM", "COPY", "USER"))]
    assert steps[0].startswith("FROM debian:bookworm")  # Debian 12, whose python3 is 3.11
    assert any(re.match(r"RUN make venv\b", s) for s in steps)
    assert "pip install" not in text and "requirements" not in text.replace("requirements/constraints.txt", "")
    assert "USER lab" in steps and steps.index("USER lab") < next(i for i, s in enumerate(steps) if "make venv" in s)
    ignored = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git", "site"} <= set(ignored)
    assert "docker build -f container/Dockerfile" in (ROOT / "README.md").read_text()


@pytest.mark.slow
def test_the_container_builds_and_runs_a_two_rank_allreduce(tmp_path):
    docker = shutil.which("docker")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60) if docker else None
    if info is None or info.returncode != 0:
        pytest.skip("no Docker engine answers here (`docker info` failed): the image cannot be built")
    tag = f"dl-systems-lab-test:{os.getpid()}"
    build = subprocess.run([docker, "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)],
                           capture_output=True, text=True, timeout=3600)
    assert build.returncode == 0, build.stderr[-4000:]
    try:
        run = subprocess.run([docker, "run", "--rm", tag], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-4000:]
        assert "allreduce" in run.stdout and "ring/MPI" in run.stdout and "wrote bench-results/allreduce.json" in run.stdout
    finally:
        subprocess.run([docker, "image", "rm", "-f", tag], capture_output=True, timeout=120)


# ----------------------------------------------------------------------------- the page's figures


def quoted_figures() -> list[str]:
    """Sentences the cluster page must contain, formatted from the committed cluster.json: the ranks srun
    started against those mpiexec started on the same machine, the 1 Gbit/s links' ceiling, ours against the
    library per setting, and how busy the machine was."""
    from benchmarks.allreduce import summarise

    data = json.loads((ROOT / "docs" / "assets" / "bench" / "cluster.json").read_text())
    srun = next(name for name in data["settings"] if name.startswith("launched by srun"))
    busbw = {(r["setting"], r["ranks"], r["bytes"]): r["busbw_GBps"] for r in data["results"] if r["impl"] == "mpi"}
    largest = max(b for _, _, b in busbw)

    def launcher_ratio(ranks: int) -> float:
        return statistics.median(busbw[(srun, ranks, b)] / busbw[("shared memory", ranks, b)]
                                 for s, n, b in busbw if s == srun and n == ranks and b >= 1 << 20)

    ours = {s: summarise([r for r in data["results"] if r["setting"] == s]) for s in data["settings"]}
    capped = {n: busbw[("TCP, 1 Gbit/s", n, largest)] for n in (2, 4)}
    load = data["load_average_1min"]
    spread = statistics.median(r["round_spread"] for r in data["results"]
                               if r["impl"] == "mpi" and r["setting"] in ("shared memory", srun) and r["bytes"] >= 1 << 20)
    return [
        f"the ranks that `{srun.removeprefix('launched by ')}` started reached {launcher_ratio(2):.2f}× (2 ranks) "
        f"and {launcher_ratio(4):.2f}× (4 ranks) the bus bandwidth of the ranks `mpiexec` started",
        f"{capped[2]:.3f} GB/s on 2 hosts and {capped[4]:.3f} GB/s on 4",
        f"from {ours['shared memory'][2]:.2f} over shared memory to {ours['TCP'][2]:.2f} over TCP and "
        f"{ours['TCP, 1 Gbit/s'][2]:.2f} at 1 Gbit/s",
        f"({ours['shared memory'][4]:.2f}, {ours['TCP'][4]:.2f} and {ours['TCP, 1 Gbit/s'][4]:.2f})",
        f"a load average of {load['start']:.1f} when the run began and {load['end']:.1f} when it ended",
        f"the slowest of the three rounds took a median {spread:.2f}× the time of the fastest",
    ]


def test_the_cluster_page_quotes_the_committed_figures():
    from page_tools import assert_pages_quote

    page = ROOT / "docs" / "concepts" / "running-on-a-cluster.md"
    assert_pages_quote((page, sentence) for sentence in quoted_figures())


def test_the_cluster_benchmark_keeps_the_median_round_of_each_point_whole():
    from benchmarks.cluster import median_rounds

    rows = [{"setting": "TCP", "ranks": 2, "bytes": 8, "impl": impl, "time_s": t, "round": k}
            for k, (mpi, ring) in enumerate([(3.0, 1.0), (1.0, 9.0), (2.0, 5.0)]) for impl, t in (("mpi", mpi), ("ring", ring))]
    kept = median_rounds(rows)
    assert {(r["impl"], r["time_s"], r["round"], r["round_spread"]) for r in kept} == {
        ("mpi", 2.0, 2, 3.0), ("ring", 5.0, 2, 3.0)}
