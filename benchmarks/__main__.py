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


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m benchmarks {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    return BENCHMARKS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
