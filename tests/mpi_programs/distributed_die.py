"""A worker process that dies in the middle of a step, on real MPI processes.

Run as ``mpiexec -disable-auto-cleanup -n 3 python -m mpi4py distributed_die.py`` (a master
and two workers; the flag keeps MPICH from killing the whole job when one process exits
early, so that the survivors can see and report the death).  Worker task 1 (rank 2) runs
an op whose kernel ends its process at once, without a word to anyone, while worker
task 0 (rank 1) waits for that op's output.  The client must get a ``StepError`` naming
the dead worker within about the communicator's timeout (``LAB_COMM_TIMEOUT``), and a
second step that needs the dead worker must fail at once.

``MPI_Finalize`` is not defined when a peer has died (MPICH waits for it), so the two
surviving ranks leave with ``os._exit`` once they have reported.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

import reference_impl.graph as G
from reference_impl.comm import MPICommunicator
from reference_impl.runtime import ClusterSpec, DistributedSession, StepError, serve_rank

DEAD_EXIT_CODE = 3


def _die(xs: list, attrs: dict, state: dict) -> Any:
    os._exit(DEAD_EXIT_CODE)  # a crash: no reply, no cleanup, no goodbye to the peers


if "_MpiDie" not in G.REGISTRY:
    G.register("_MpiDie", infer=G.like_input(), kernel=_die)


def client(master: Any) -> str:
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [2], name="x")
        with g.device("/job:worker/task:0"):
            a = G.exp(x, name="a")
        with g.device("/job:worker/task:1"):
            b = G.neg(a, name="b")
            dead = G.apply_op("_MpiDie", [a], name="dead")
        with g.device("/job:worker/task:0"):
            out = G.add(a, dead, name="out")  # task 0 waits for the dying task's tensor
    sess = DistributedSession(master, g)
    np.testing.assert_array_equal(sess.run(b, {x: [0.0, 1.0]}), -np.exp([0.0, 1.0]))  # both alive
    start = time.monotonic()
    try:
        sess.run(out, {x: [0.0, 1.0]})
    except StepError as e:
        message, seconds = str(e), time.monotonic() - start
    else:
        raise AssertionError("the step whose worker died did not fail")
    start = time.monotonic()
    try:
        sess.run(b, {x: [0.0, 1.0]})
    except StepError as e:
        again, second = str(e), time.monotonic() - start
    else:
        raise AssertionError("a step on the dead worker did not fail")
    return f"{seconds:.3f} {second:.3f}\n{message}\n{again}"


def main() -> None:
    comm = MPICommunicator()
    report = serve_rank(comm, ClusterSpec.workers(comm.size - 1), client)
    if comm.rank == 0:
        print("REPORT", report)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
