"""What a distributed step costs, and what the master's plan cache saves.

``python -m benchmarks distributed_session`` builds one in-graph-replicated SGD step
(a two-layer MLP, its weights on ``/job:ps/task:0``, a tower per worker on half the batch, the
towers' gradients averaged on the ps) and times, interleaved repeat by repeat in one process:

* ``session``: the step in the single-process ``Session`` (the floor: same kernels, no
  messages);
* ``repeated``: the step in a ``DistributedSession`` on thread ranks (a master and
  ``--workers`` workers plus a ps), whose plan is cached: one ``RunGraph`` per task;
* ``first``: a fresh ``DistributedSession`` running the step once, so every repeat pays
  ``CreateSession``, pruning, placement, partitioning and one ``RegisterGraph`` per task
  (its ``CloseSession`` is not timed).

The three compute the same values (checked before timing).  Thread ranks share one Python
interpreter, so the message costs here are those of in-process queues and thread switches,
not of a network; the ratio ``first / repeated`` is the point: what the cache saves per step.

Every rank's communicator is wrapped in a counter of bytes per (source, destination, tag),
so the document also says where one repeated step's bytes went: worker to worker on the
peer tags (the cut edges' tensors) and to and from the master (requests, feeds, fetches).
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np

from reference_impl.comm import Communicator
from .harness import bench_parser, write_json
from .machine import machine_info



class _ByteCounter(Communicator):
    """A communicator that counts the bytes each (source, destination, tag) sends."""

    def __init__(self, inner: Any, counts: dict) -> None:
        self.inner, self.rank, self.size, self.counts = inner, inner.rank, inner.size, counts

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        key = (self.rank, dest, tag)
        self.counts[key] = self.counts.get(key, 0) + buf.nbytes
        self.inner.send(buf, dest, tag)

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        self.inner.recv(buf, source, tag)

    def barrier(self) -> None:
        self.inner.barrier()
WIDTHS = (32, 64, 10)
BATCH = 64
LR = 0.05


def build(workers: int, seed: int = 0) -> tuple[Any, dict, list, Any, Any]:
    """The replicated step: returns (graph, feeds, fetches, train op, initializer)."""
    import reference_impl.graph as G

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, WIDTHS[0]))
    y = rng.integers(0, WIDTHS[-1], size=BATCH)
    g = G.Graph()
    with g.as_default():
        with g.device("/job:ps/task:0"):
            params = [G.Variable(rng.normal(size=(a, b)) * np.sqrt(2 / a), name=f"w{i}")
                      for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:]))]
        per = BATCH // workers
        feeds, losses, grads = {}, [], []
        for k in range(workers):
            with g.device(f"/job:worker/task:{k}"):
                xk = G.placeholder("float64", [per, WIDTHS[0]], name=f"x{k}")
                yk = G.placeholder("int64", [per], name=f"y{k}")
                h = G.relu(G.matmul(xk, params[0]))
                loss = G.reduce_mean(G.sparse_softmax_cross_entropy(yk, G.matmul(h, params[1])))
                grads.append(G.gradients([loss], params))
                losses.append(loss)
            feeds[xk], feeds[yk] = x[k * per:(k + 1) * per], y[k * per:(k + 1) * per]
        with g.device("/job:ps/task:0"):
            mean_loss = sum(losses[1:], losses[0]) * (1.0 / workers)
            avg = [sum((gr[i] for gr in grads[1:]), grads[0][i]) * (1.0 / workers) for i in range(len(params))]
        train = G.group(*[p.assign_sub(a * LR) for p, a in zip(params, avg)])
        init = G.global_variables_initializer()
    return g, feeds, [mean_loss], train, init


def measure(workers: int, repeats: int) -> dict[str, Any]:
    """Run the three variants on thread ranks; returns times, values and plan counts."""
    import reference_impl.graph as G
    from reference_impl.comm import run_threads
    from reference_impl.runtime import MASTER_RANK, ClusterSpec, DistributedSession, serve_rank
    from reference_impl.runtime.channel import PEER_TAG

    g, feeds, fetches, train, init = build(workers)
    cluster = ClusterSpec({"worker": list(range(1, workers + 1)), "ps": [workers + 1]})
    counts: dict[tuple[int, int, int], int] = {}

    def traffic(step: Any) -> dict[str, int]:
        """Bytes one call of ``step`` moved: worker to worker on the peer tags, and master traffic."""
        before = dict(counts)
        step()
        moved = {k: v - before.get(k, 0) for k, v in counts.items() if v != before.get(k, 0)}
        return {"worker_to_worker_peer_tags": sum(v for (s, d, t), v in moved.items()
                                                  if MASTER_RANK not in (s, d) and t in (PEER_TAG, PEER_TAG + 1)),
                "master_sent": sum(v for (s, d, t), v in moved.items() if s == MASTER_RANK),
                "master_received": sum(v for (s, d, t), v in moved.items() if d == MASTER_RANK),
                "master_peer_tags": sum(v for (s, d, t), v in moved.items()
                                        if MASTER_RANK in (s, d) and t in (PEER_TAG, PEER_TAG + 1))}

    def client(master: Any) -> dict[str, Any]:
        local = G.Session(g)
        local.run(init)
        kept = DistributedSession(master, g)
        kept.run(init)
        # the same values from both before timing (each applies one SGD step)
        a, b = local.run([fetches, train], feeds)[0], kept.run([fetches, train], feeds)[0]
        if not all(np.array_equal(u, v) for u, v in zip(a, b)):
            raise AssertionError(f"distributed loss {b} differs from the Session's {a}")
        fresh_sessions: list = []

        def first() -> Any:
            s = DistributedSession(master, g, container="bench")  # shares the variables of one container
            fresh_sessions.append(s)
            return s.run([fetches, train], feeds)

        seed = DistributedSession(master, g, container="bench")
        seed.run(init)
        seed.close()
        fns = {"session": lambda: local.run([fetches, train], feeds),
               "repeated": lambda: kept.run([fetches, train], feeds),
               "first": first}
        times = {k: [] for k in fns}
        for _ in range(repeats):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
                while fresh_sessions:  # closing is not part of the step
                    fresh_sessions.pop().close()
        moved = traffic(lambda: kept.run([fetches, train], feeds))  # one repeated step, after the timing
        plans = master.sessions[kept.handle].partition_count
        step_key = next(k for k in master.sessions[kept.handle].plans if k[0])  # the one with fetches
        pairs = master.sessions[kept.handle].plans[step_key].send_recv_pairs
        kept.close()
        local.close()
        return {"times": times, "plans_of_repeated_session": plans, "send_recv_pairs": pairs,
                "ops": len(g.operations), "repeated_step_bytes": moved}

    return run_threads(cluster.size, serve_rank, cluster, client, timeout=120,
                       wrap=lambda c: _ByteCounter(c, counts))[MASTER_RANK]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("distributed_session", __doc__)
    parser.add_argument("--repeats", type=int, default=30, help="timed steps per variant")
    parser.add_argument("--workers", type=int, default=2, help="worker tasks (plus one ps task)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or not 1 <= args.workers <= 8 or BATCH % args.workers:
        parser.error(f"need --repeats >= 1 and 1 <= --workers <= 8 dividing the batch ({BATCH})")
    result = measure(args.workers, args.repeats)
    times = result.pop("times")
    med = {k: statistics.median(v) for k, v in times.items()}
    document = {
        "benchmark": "distributed_session",
        "machine": machine_info(mpi_library="not used (thread ranks)"),
        "settings": {"widths": list(WIDTHS), "batch": BATCH, "dtype": "float64", "workers": args.workers,
                     "ps_tasks": 1, "repeats": args.repeats, "transport": "thread ranks (run_threads)"},
        **result,
        "step_seconds": times,
        "step_median_s": med,
        "ratio": {"repeated_vs_session": med["repeated"] / med["session"],
                  "first_vs_repeated": med["first"] / med["repeated"]},
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    for k, v in med.items():
        print(f"{k:>9}: {v * 1e3:8.2f} ms/step")
    print(f"repeated / session = {document['ratio']['repeated_vs_session']:.2f}, "
          f"first / repeated = {document['ratio']['first_vs_repeated']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
