"""One world communicator for a program, whatever launched it: ``mpiexec`` or ``torchrun``.

A distributed program in the lab is written against ``Communicator`` only, so the same file
runs on MPI processes (``MPICommunicator``) and on ``torch.distributed`` processes
(``TorchCommunicator``). What differs is how the processes were started, and each launcher
leaves its mark in the environment of the processes it starts:

* ``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``
  and ``TORCHELASTIC_RUN_ID`` (its rendezvous id);
* MPICH's ``mpiexec`` (Hydra) sets ``PMI_RANK``, ``PMI_SIZE`` and ``PMI_FD``; Open MPI's sets
  ``OMPI_COMM_WORLD_RANK``; a PMIx launcher (Slurm's ``srun --mpi=pmix``) sets ``PMIX_RANK``.

``world_communicator()`` reads those marks (or ``engine=``, or ``$LAB_ENGINE``) and returns
the one world communicator of this process, made once and then reused, because each
library initialises once per process. A program started by neither (plain ``python
program.py``) gets a one-rank MPI world: MPI's singleton start, which mpi4py supports.
"""
from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from typing import Any

from .communicator import Communicator

ENGINES = ("mpi", "torch")
ENGINE_ENV = "LAB_ENGINE"
TORCHRUN_MARKS = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR")
MPI_MARKS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")

_world: dict[str, Communicator] = {}


def detect_engine(environ: Mapping[str, str] | None = None) -> str:
    """``"torch"`` or ``"mpi"``: ``$LAB_ENGINE`` if set, else which launcher started this process.

    ``torchrun`` wins when both left marks (an ``mpiexec`` that starts ``torchrun`` agents
    on several hosts passes its own variables down to every process the agents start).
    """
    env = os.environ if environ is None else environ
    forced = env.get(ENGINE_ENV, "").strip()
    if forced:
        if forced not in ENGINES:
            raise ValueError(f"{ENGINE_ENV}={forced!r}: expected one of {ENGINES}")
        return forced
    if all(k in env for k in ("RANK", "WORLD_SIZE")) and any(k in env for k in TORCHRUN_MARKS):
        return "torch"
    return "mpi"


def started_by_launcher(engine: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a launcher of ``engine`` started this process (its marks are in the environment):
    ``torchrun`` for ``"torch"``; ``mpiexec``, ``srun --mpi=pmi2`` or another PMI launcher for ``"mpi"``."""
    env = os.environ if environ is None else environ
    if engine == "torch":
        return all(k in env for k in ("RANK", "WORLD_SIZE")) and any(k in env for k in TORCHRUN_MARKS)
    return any(k in env for k in MPI_MARKS)


def world_communicator(engine: str | None = None, timeout: float | None = None) -> Communicator:
    """This process's communicator over every process of the job, made on the first call.

    ``engine`` is ``"mpi"`` or ``"torch"`` (default: ``detect_engine()``); ``timeout`` bounds
    every blocking call (default ``$LAB_COMM_TIMEOUT``, else 60 s). A later call with another
    engine fails: one process runs one engine. A later call with another ``timeout`` gets
    the same world with that timeout.
    """
    engine = detect_engine() if engine is None else engine
    if engine not in ENGINES:
        raise ValueError(f"world_communicator: unknown engine {engine!r}; expected one of {ENGINES}")
    other = [e for e in _world if e != engine]
    if other:
        raise RuntimeError(f"world_communicator: this process already runs the {other[0]!r} engine; "
                           f"it cannot also start {engine!r}")
    comm = _world.get(engine)
    if comm is None:
        if engine == "torch":
            from .torch_dist import TorchCommunicator

            comm = TorchCommunicator.world(timeout=timeout)
        else:
            from .mpi import MPICommunicator

            comm = MPICommunicator(timeout=timeout)
        _world[engine] = comm
    elif timeout is not None:
        comm.timeout = timeout
    return comm


def engine_of(comm: Communicator) -> str:
    """``"mpi"``, ``"torch"`` or ``"threads"``: the engine under ``comm`` (through wrappers)."""
    while isinstance(getattr(comm, "inner", None), Communicator):
        comm = comm.inner
    name = type(comm).__name__
    return {"MPICommunicator": "mpi", "TorchCommunicator": "torch"}.get(name, "threads")


def gather_objects(comm: Communicator, value: Any, root: int = 0) -> list[Any] | None:
    """Every rank's ``value`` (any picklable object) on ``root``, in rank order; ``None`` elsewhere.

    Carried by ``comm``'s own send/recv (a length, then the pickled bytes), so it works on
    every engine; for reporting results from a program, not for data on a training step's path.
    """
    import numpy as np

    tag = 1000
    if comm.rank != root:
        data = np.frombuffer(pickle.dumps(value), dtype=np.uint8)
        comm.send(np.array([data.size], dtype=np.int64), root, tag)
        comm.send(data, root, tag)
        return None
    values = []
    for source in range(comm.size):
        if source == root:
            values.append(value)
            continue
        size = np.empty(1, dtype=np.int64)
        comm.recv(size, source, tag)
        data = np.empty(int(size[0]), dtype=np.uint8)
        comm.recv(data, source, tag)
        values.append(pickle.loads(data.tobytes()))
    return values
