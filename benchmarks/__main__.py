"""``python -m benchmarks NAME [options]``: run one benchmark (``--help`` per benchmark)."""
from __future__ import annotations

import sys

from . import (allreduce, alpha_beta, autodiff, cluster, collectives, custom_ops, deploy, determinism,
               distributed_session, grading, graph, interconnects, model_parallel, optimizers, overlap, passes, pipeline,
               ps, ps_cluster, sharded, training, training_loop)

BENCHMARKS = {
    "allreduce": allreduce.main,
    "alpha_beta": alpha_beta.main,
    "collectives": collectives.main,
    "interconnects": interconnects.main,
    "overlap": overlap.main,
    "determinism": determinism.main,
    "graph": graph.main,
    "distributed_session": distributed_session.main,
    "pipeline": pipeline.main,
    "custom_ops": custom_ops.main,
    "training": training.main,
    "ps": ps.main,
    "ps_cluster": ps_cluster.main,
    "sharded": sharded.main,
    "model_parallel": model_parallel.main,
    "deploy": deploy.main,
    "autodiff": autodiff.main,
    "passes": passes.main,
    "optimizers": optimizers.main,
    "training_loop": training_loop.main,
    "grading": grading.main,
    "cluster": cluster.main,  # needs root: it builds a virtual cluster of network namespaces
}


# What `make bench` (``--all``) runs: every benchmark but those that need root.
NEEDS_ROOT = ("cluster",)
USAGE = (f"usage: python -m benchmarks NAME [options]   (NAME: {', '.join(BENCHMARKS)}; NAME --help for its options)\n"
         "       python -m benchmarks --all [options]   (every benchmark but the root-only "
         f"{', '.join(NEEDS_ROOT)}, in turn, each with the options given)\n"
         "       python -m benchmarks --list            (the names --all runs, one a line)")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark ``argv[0]`` with the rest of ``argv``, or ``--all`` of them in turn."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if argv[:1] == ["--list"]:
        print("\n".join(name for name in BENCHMARKS if name not in NEEDS_ROOT))
        return 0
    if argv[:1] == ["--all"]:
        for name in BENCHMARKS:
            if name not in NEEDS_ROOT:
                print(f"== {name}", flush=True)
                status = BENCHMARKS[name](argv[1:])
                if status:
                    print(f"benchmark {name} failed (exit status {status}); the rest were not run", file=sys.stderr)
                    return status
        return 0
    if not argv or argv[0] not in BENCHMARKS:
        given = f"unknown benchmark {argv[0]!r}\n" if argv else ""
        print(given + USAGE, file=sys.stderr)
        return 2
    return BENCHMARKS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
