"""torch.distributed as a second engine: the lab's programs under ``torchrun``, the "library" allreduce
on both engines, and the training command launched by ``mpiexec`` and ``torchrun``.

Each launch is a subprocess with a timeout, so a hang fails the test instead of the suite; one
launch per rank count runs several programs (tests/mpi_programs/run_programs.py) to keep the
suite short.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import allreduce, run_threads
from reference_impl.comm.engines import detect_engine, engine_of
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.comm.torch_dist import torchrun_command

ROOT = Path(__file__).resolve().parent.parent
DRIVER = str(ROOT / "tests" / "mpi_programs" / "run_programs.py")

pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.timeout(240)


def _run(command: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAB_COMM_TIMEOUT": "60", "OMP_NUM_THREADS": "1"}
    env.pop("LAB_ENGINE", None)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def _ok(run: subprocess.CompletedProcess, *lines: str) -> None:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    for line in lines:
        assert line in run.stdout, f"{line!r} not in:\n{run.stdout}"


ENGINE_CHECKS = ("OK library allreduce: 90 on the world, 90 on a split of {half} ({engine})",
                 "OK split ordered by key on {n} ranks", "OK recv_any heard ranks {heard}")
TORCH_ONLY = ("OK mismatched dtype and size fail at once", "OK tensors, strided buffers, device check",
              "OK timeout named rank 1 after 0.5 s")


def _engine_lines(engine: str, n: int) -> list[str]:
    lines = [s.format(half=n // 2, engine=engine, n=n, heard=list(range(1, n))) for s in ENGINE_CHECKS]
    return lines + list(TORCH_ONLY if engine == "torch" else ())


def test_collectives_and_data_parallel_training_under_torchrun_with_two_processes():
    """Every collective equals torch.distributed's own; data-parallel training (communication
    thread) matches the library's averaged gradient, and replicas agree."""
    run = _run(torchrun_command(2, DRIVER, "collectives_vs_mpi.py", "dp_train.py", "engine_checks.py"))
    _ok(run, "OK 1500 comparisons on 2 ranks", "thread_level torch early", "late 12/12", "DIGEST ",
        *_engine_lines("torch", 2))
    early = int(run.stdout.split("thread_level torch early ")[1].split("/")[0])
    assert early >= 9, run.stdout  # the overlap mode started most allreduces before backward ended


def test_parameter_servers_and_session_under_torchrun_with_four_processes():
    """BSP servers match one process for every optimiser; SSP, ASP and backup workers behave;
    the distributed session (a master, three workers) matches Session and reports a failing worker."""
    run = _run(torchrun_command(4, DRIVER, "ps_train.py", "ps_consistency.py", "distributed_dags.py",
                                "engine_checks.py"))
    _ok(run, "OK 24 comparisons on 4 ranks", "OK ssp bound, asp lead, backup drops on 4 ranks",
        "OK 10 random DAGs bit-identical on 3 torch.distributed workers",
        "OK a failing worker was reported and the next step ran", *_engine_lines("torch", 4))


def test_library_allreduce_and_split_under_mpiexec():
    run = _run(mpiexec_command(4, DRIVER, "engine_checks.py"))
    _ok(run, *_engine_lines("mpi", 4))


def test_library_allreduce_needs_a_library():
    def body(comm):
        return allreduce(comm, np.ones(3), algorithm="library")

    with pytest.raises(NotImplementedError, match="ThreadCommunicator has no library collective"):
        run_threads(2, body)
    with pytest.raises(ValueError, match="unknown algorithm 'nccl'.*'library'"):
        run_threads(1, lambda comm: allreduce(comm, np.ones(3), algorithm="nccl"))
    assert run_threads(1, lambda comm: engine_of(comm)) == ["threads"]


def test_a_world_that_cannot_start_says_why(monkeypatch):
    from reference_impl.comm.engines import world_communicator
    from reference_impl.comm.torch_dist import TorchCommunicator

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set; start the program "
                                          "with torchrun"):
        TorchCommunicator.world()
    with pytest.raises(ValueError, match="backend must be 'gloo' or 'nccl', got 'mpi'"):
        TorchCommunicator.world(backend="mpi")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="backend 'nccl' needs a CUDA GPU"):
            TorchCommunicator.world(backend="nccl")
    with pytest.raises(ValueError, match="unknown engine 'gloo'"):
        world_communicator("gloo")


def test_the_engine_is_read_from_the_launchers_environment():
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "localhost",
                "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
    assert detect_engine(torchrun) == "torch"
    assert detect_engine({"PMI_RANK": "0", "PMI_SIZE": "2", "PMI_FD": "5"}) == "mpi"
    assert detect_engine({**torchrun, "PMI_RANK": "0"}) == "torch"
    assert detect_engine({"RANK": "0", "WORLD_SIZE": "2"}) == "mpi"  # no rendezvous: not torchrun's
    assert detect_engine({**torchrun, "LAB_ENGINE": "mpi"}) == "mpi"
    with pytest.raises(ValueError, match="LAB_ENGINE='nccl': expected one of"):
        detect_engine({"LAB_ENGINE": "nccl"})
    command = torchrun_command(3, "-m", "reference_impl.train")
    assert Path(command[0]) == Path(sys.executable).parent / "torchrun"
    assert command[1:] == ["--standalone", "--nproc-per-node", "3", "-m", "reference_impl.train"]


TRAIN = ["-m", "reference_impl.train", "wide_deep", "--limit", "512", "--batch", "128", "--epochs", "1", "--json"]


def _train(prefix: list[str], *options: str) -> dict:
    run = _run([*prefix, *TRAIN, *options])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("{")]  # rank 0 alone prints
    return json.loads(line)


def _in_process(capsys, *options: str) -> dict:
    from reference_impl.train.__main__ import main

    capsys.readouterr()
    assert main([*TRAIN[2:], *options]) == 0
    return json.loads(capsys.readouterr().out)


def test_training_command_under_mpiexec_and_torchrun_matches_thread_ranks(capsys):
    """BSP parameter servers and the mirrored (allreduce) strategy are deterministic: the launched
    runs must reach the thread ranks' AUC and send the same bytes. The mirrored runs are started
    without a launcher: the command starts itself under mpiexec and torchrun."""
    ps = ("--strategy", "ps", "--servers", "1", "--workers", "2")
    mirrored = ("--strategy", "allreduce", "--workers", "2")
    threads = {name: _in_process(capsys, *opts) for name, opts in (("ps", ps), ("allreduce", mirrored))}
    launched = {
        ("ps", "mpi"): _train(mpiexec_command(3), *ps, "--engine", "mpi"),
        ("ps", "torch"): _train(torchrun_command(3), *ps, "--engine", "torch"),
        ("allreduce", "mpi"): _train([sys.executable], *mirrored, "--engine", "mpi"),
        ("allreduce", "torch"): _train([sys.executable], *mirrored, "--engine", "torch"),
    }
    for (strategy, engine), got in launched.items():
        want = threads[strategy]
        assert got["engine"] == engine and got["strategy"] == strategy
        assert got["auc"] == pytest.approx(want["auc"], abs=1e-9), (strategy, engine)
        assert got["logloss"] == pytest.approx(want["logloss"], abs=1e-9), (strategy, engine)
        assert got["bytes_sent"] == want["bytes_sent"] > 0, (strategy, engine)
        assert set(got) == set(want)
    assert launched[("ps", "torch")]["steps_per_worker"] == threads["ps"]["steps_per_worker"] == [4, 4]


def test_training_command_refuses_a_job_of_the_wrong_size():
    run = _run([*mpiexec_command(2), *TRAIN, "--strategy", "ps", "--servers", "2", "--workers", "2",
                "--engine", "mpi"], timeout=120)
    assert run.returncode != 0
    assert "--engine mpi runs one rank per process: this job has 2 processes, but the options ask for 4" \
        in run.stderr, run.stderr[-3000:]
    run = _run([sys.executable, *TRAIN, "--engine", "torch"], timeout=60)
    assert run.returncode == 2 and "--engine torch needs --strategy ps or allreduce" in run.stderr, run.stderr
    run = _run([sys.executable, *TRAIN, "--strategy", "allreduce", "--engine", "mpi", "--launcher", "no-such-srun"],
               timeout=60)
    assert run.returncode == 2 and "launcher 'no-such-srun'" in run.stderr and "not installed" in run.stderr, run.stderr
    run = _run([sys.executable, *TRAIN, "--strategy", "allreduce", "--engine", "torch", "--launcher", "srun"],
               timeout=60)
    assert run.returncode == 2 and "need --engine mpi" in run.stderr, run.stderr
