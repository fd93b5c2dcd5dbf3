"""Run several of the programs beside this file in one job, one after the other: ``run_programs.py A.py B.py``.

Each program runs as ``__main__`` in this process with the same world communicator
(``world_communicator`` makes it once), with a barrier between programs (none after the last), so one launch of
``mpiexec`` or ``torchrun`` checks them all. A program that fails ends the job, as alone.
"""
import runpy
import sys
import time
from pathlib import Path

from reference_impl.comm.engines import world_communicator

HERE = Path(__file__).resolve().parent

names = sys.argv[1:]
for i, name in enumerate(names):
    start = time.perf_counter()
    runpy.run_path(str(HERE / name), run_name="__main__")
    if i < len(names) - 1:  # not after the last: it may leave connections closed (engine_checks.py)
        world_communicator().barrier()
    if world_communicator().rank == 0:
        print(f"DONE {name} in {time.perf_counter() - start:.1f} s", flush=True)
