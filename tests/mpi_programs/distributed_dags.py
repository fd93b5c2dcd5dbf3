"""Random DAGs with ops on random devices, for the partitioning and distributed-session tests.

Importable (``random_dag``, ``check_against_session``) by tests/test_graph_partition.py and
tests/test_distributed_session.py; run under ``mpiexec -n 3`` (or ``torchrun``) it checks ``N_MPI`` random
DAGs on a master and two MPI workers against the single-process ``Session``, then that a
worker whose kernel raises mid-step is reported to the client and the next step still runs.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

import reference_impl.graph as G

UNARY = [G.neg, G.tanh, G.sigmoid, G.relu, G.square, G.identity, G.exp]
BINARY = [G.add, G.sub, G.mul, G.maximum, G.matmul]
N_MPI = 10


@dataclass
class Dag:
    graph: G.Graph
    feeds: dict
    fetches: list  # tensors
    targets: list  # ops (a group with control inputs)
    init: Any
    updates: Any  # an op that assign_adds every variable
    variables: list


def random_dag(rng: np.random.Generator, devices: list[str], n_ops: int = 10) -> Dag:
    """Placeholders, constants and variables, then ``n_ops`` random ops, each on a random
    device of ``devices`` or (one time in four) left for the placer."""
    g = G.Graph()

    def scope() -> Any:
        return g.device(devices[rng.integers(len(devices))] if rng.random() < 0.75 else "")

    with g.as_default():
        pool, feeds, variables = [], {}, []
        for i in range(2):
            with scope():
                x = G.placeholder("float64", [3, 3], name=f"x{i}")
            feeds[x] = rng.normal(size=(3, 3))
            pool.append(x)
            with scope():
                pool.append(G.constant(rng.normal(size=(3, 3)), name=f"c{i}"))
            with scope():
                v = G.Variable(rng.normal(size=(3, 3)), name=f"v{i}")
            variables.append(v)
            pool.append(v.value())
        for _ in range(n_ops):
            with scope():
                if rng.random() < 0.4:
                    y = UNARY[rng.integers(len(UNARY))](pool[rng.integers(len(pool))])
                elif rng.random() < 0.15:
                    y = G.reduce_sum(pool[rng.integers(len(pool))], axis=int(rng.integers(2)), keepdims=True) \
                        + pool[rng.integers(len(pool))]
                else:
                    a, b = pool[rng.integers(len(pool))], pool[rng.integers(len(pool))]
                    y = BINARY[rng.integers(len(BINARY))](G.tanh(a) if rng.random() < 0.3 else a, b)
            pool.append(y)
        picks = rng.choice(np.arange(6, len(pool)), size=min(3, len(pool) - 6), replace=False)
        fetches = [pool[i] for i in picks]
        with scope():
            target = G.group(*[pool[i] for i in rng.choice(np.arange(6, len(pool)), size=2)])
        updates = G.group(*[v.assign_add(G.tanh(pool[rng.integers(6, len(pool))])) for v in variables])
        init = G.global_variables_initializer()
    return Dag(g, feeds, fetches, [target], init, updates, variables)


def run_steps(sess: Any, dag: Dag) -> list:
    """The step sequence both sessions run: initialise, fetch, update, fetch again."""
    sess.run(dag.init)
    first = sess.run([dag.fetches, dag.targets], dag.feeds)[0]
    sess.run(dag.updates, dag.feeds)
    second = sess.run([*dag.fetches, *[v.value() for v in dag.variables]], dag.feeds)
    return [*first, *second]


def check_against_session(make_session: Any, dag: Dag) -> None:
    """Run the steps on ``make_session(graph)`` and on ``Session``; every value bit-identical."""
    with G.Session(dag.graph, optimize=False) as s:
        want = run_steps(s, dag)
    sess = make_session(dag.graph)
    try:
        got = run_steps(sess, dag)
    finally:
        sess.close()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b, strict=True)


def _failing_kernel(xs: list, attrs: dict, state: dict) -> Any:
    raise ValueError("injected failure")


if "_MpiFail" not in G.REGISTRY:  # at import, so that every rank (every worker) knows the op
    G.register("_MpiFail", infer=G.like_input(), kernel=_failing_kernel)


def check_failure_is_reported(master: Any) -> str:
    """A worker's kernel raises mid-step: the client gets StepError naming the worker and the op,
    while the other worker, waiting for that worker's tensor, is aborted; the next step works."""
    from reference_impl.runtime import DistributedSession, StepError

    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float64", [2], name="x")
        with g.device("/job:worker/task:0"):
            a = G.exp(x, name="a")
        with g.device("/job:worker/task:1"):
            bad = G.apply_op("_MpiFail", [a], name="bad")
        with g.device("/job:worker/task:0"):
            out = G.add(a, bad, name="out")
    sess = DistributedSession(master, g)
    try:
        sess.run(out, {x: [0.0, 1.0]})
    except StepError as e:
        message = str(e)
    else:
        raise AssertionError("a failing kernel on worker 1 did not fail the step")
    assert "task:1/device:CPU:0 (rank 2) failed" in message and "'bad' failed: injected failure" in message, message
    np.testing.assert_array_equal(sess.run(a, {x: [0.0, 0.0]}), [1.0, 1.0])
    sess.close()
    return message


def main() -> None:
    from reference_impl.comm.engines import engine_of, world_communicator
    from reference_impl.runtime import ClusterSpec, DistributedSession, serve_rank

    comm = world_communicator()
    cluster = ClusterSpec.workers(comm.size - 1)

    def client(master: Any) -> int:
        rng = np.random.default_rng(2026)
        for _ in range(N_MPI):
            dag = random_dag(rng, cluster.devices, n_ops=int(rng.integers(6, 14)))
            check_against_session(lambda g: DistributedSession(master, g), dag)
        check_failure_is_reported(master)
        return N_MPI

    n = serve_rank(comm, cluster, client)
    if comm.rank == 0:
        engine = {"mpi": "MPI", "torch": "torch.distributed"}[engine_of(comm)]
        print(f"OK {n} random DAGs bit-identical on {comm.size - 1} {engine} workers")
        print("OK a failing worker was reported and the next step ran")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
