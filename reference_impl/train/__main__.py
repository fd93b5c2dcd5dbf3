"""``python -m reference_impl.train wide_deep``: train Wide & Deep on InstEval with a strategy.

    python -m reference_impl.train wide_deep --strategy local
    python -m reference_impl.train wide_deep --strategy ps --servers 2 --workers 2 --consistency bsp
    python -m reference_impl.train wide_deep --strategy allreduce --workers 2 --json
    python -m reference_impl.train wide_deep --strategy ps --workers 4 --consistency ssp --staleness 4 --slowdown 3
    python -m reference_impl.train wide_deep --strategy ps --engine mpi --launcher srun
    mpiexec -n 4 python -m mpi4py -m reference_impl.train wide_deep --strategy ps --engine mpi
    torchrun --standalone --nproc-per-node 2 -m reference_impl.train wide_deep --strategy allreduce --engine torch

``local`` trains in this process; ``ps`` puts every variable (the sparse tables and the
MLP) on ``--servers`` server ranks, trained by ``--workers`` workers under the rule
``--consistency`` (``models.strategies.rule_rank``): ``bsp``, ``asp``, ``ssp`` (``--staleness``),
``backup`` (``--backups`` of the workers are not waited for) or ``easgd`` (``--tau``,
``--alpha``); ``--slowdown K`` makes worker 0 a straggler that takes ``K`` times its own
compute per step. ``allreduce`` is the mirrored strategy (full replicas, sparse
gradients all-gathered, dense all-reduced). ``--engine`` says what the ranks are: ``threads``
of this process (the default), or the processes of the launcher that started this command,
``mpi`` (``mpiexec``, ``MPICommunicator``) or ``torch`` (``torchrun``, ``TorchCommunicator``), one
rank per process: the job must then have ``--servers + --workers`` processes (``ps``) or
``--workers`` (``allreduce``), and rank 0 prints the result. Run with ``--engine mpi`` or
``torch`` but not under a launcher, the command starts itself under one with that many
processes: ``--launcher``/``--hostfile`` (else ``$MPIEXEC``, else the mpich wheel's
``mpiexec``; ``comm.launch``) for ``mpi``, ``torchrun`` for ``torch``. The model's
hyper-parameters (``--ftrl-alpha`` ... ``--embedding-l2``, ``--epochs``) default to
``models.insteval.JOINT_CONFIG``, the configuration ``python -m benchmarks ps``
chose on a validation split, so the defaults train the model whose test AUC the site quotes.
It prints
test AUC and log-loss, training throughput, and the bytes the ranks sent (counted by
``CountingCommunicator``), and for ``ps`` how many late gradients the servers dropped (only
``backup`` drops any); ``--json`` prints one JSON object instead. ``--help`` lists every option's
default and the exit codes.
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from typing import Any

from ..comm import CountingCommunicator, run_threads
from ..comm.engines import gather_objects, started_by_launcher, world_communicator
from ..models.insteval import JOINT_CONFIG, insteval_model, load_insteval, train_test_split
from ..models.strategies import mirrored_rank, rule_rank
from ..models.wide_deep import WideDeep, WideDeepConfig, fit
from ..ps import ClusterSpec, Consistency
from ..ps.cluster import RULES
from ..ps.training import Pace

STRATEGIES = ("local", "ps", "allreduce")
ENGINES = ("threads", "mpi", "torch")


def _summary(result: Any) -> dict[str, Any]:
    """What rank 0 needs from one rank's result: a server's count of dropped gradients, or a
    worker's metrics and step counts (small and picklable, to travel in ``gather_objects``)."""
    if isinstance(result, dict):
        return {k: v for k, v in result.items() if k != "history"}
    return {"dropped": len(result.dropped)}


def _ranks(engine: str, size: int, fn: Any, *args: Any) -> tuple[list[Any] | None, int]:
    """``(every rank's result of fn(comm, *args) by rank, bytes all ranks sent)`` on rank 0;
    ``(None, 0)`` on the others.

    ``threads``: ``size`` thread ranks of this process. ``mpi``/``torch``: this process is one
    rank of a job its launcher started, which must have ``size`` processes. Each rank's
    communicator is wrapped in a ``CountingCommunicator``; the results travel to rank 0 with
    ``gather_objects`` (not counted: it is reporting, not training)."""
    counters: list[CountingCommunicator] = []

    def wrap(c: Any) -> CountingCommunicator:
        counters.append(CountingCommunicator(c))
        return counters[-1]

    if engine == "threads":
        results = run_threads(size, fn, *args, timeout=600, wrap=wrap)
        return [_summary(r) for r in results], sum(c.bytes_sent for c in counters)
    comm = world_communicator(engine, timeout=600)
    if comm.size != size:
        raise SystemExit(f"--engine {engine} runs one rank per process: this job has {comm.size} processes, "
                         f"but the options ask for {size}")
    mine = _summary(fn(wrap(comm), *args))
    gathered = gather_objects(comm, (mine, counters[0].bytes_sent))
    if gathered is None:
        return None, 0
    return [m for m, _ in gathered], sum(b for _, b in gathered)


def run(strategy: str, workers: int, servers: int, consistency: str | Consistency, epochs: int, batch: int,
        limit: int | None, show_progress: bool, slowdown: float = 1.0,
        config: WideDeepConfig = JOINT_CONFIG, engine: str = "threads") -> dict[str, Any] | None:
    """Train and evaluate once (``config``'s hyper-parameters, ``epochs`` epochs); returns the
    numbers the command prints (on rank 0 of a launched job; ``None`` on its other ranks)."""
    rule = consistency if isinstance(consistency, Consistency) else Consistency(consistency)
    tr, ytr, te, yte = train_test_split(load_insteval())
    if limit is not None:
        tr, ytr = {k: v[:limit] for k, v in tr.items()}, ytr[:limit]
    config = config.with_epochs(epochs)

    def build(**kw: Any) -> WideDeep:
        return insteval_model("joint", config, **kw)

    from tqdm import tqdm

    steps = epochs * -(-len(ytr) // batch)
    bar = tqdm(total=steps, desc=f"wide_deep {strategy}", unit="step", disable=not show_progress, file=sys.stderr)
    bytes_sent = 0

    if engine != "threads":
        world_communicator(engine, timeout=600)  # start the library before the clock: not training time
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    examples = epochs * len(ytr)
    if strategy == "local":
        model = build()
        fit(model, tr, ytr, epochs=epochs, batch=batch, progress=bar.update)
        metrics = model.evaluate(te, yte)
    elif strategy == "ps":
        pace = Pace(straggler=0 if slowdown != 1.0 else None, slowdown=slowdown)
        ranks, bytes_sent = _ranks(engine, servers + workers, rule_rank, ClusterSpec(servers, workers), build, tr,
                                   ytr, te, yte, rule, epochs, batch, 0, pace, bar.update)
        if ranks is None:
            return None
        metrics = ranks[servers]
        examples = sum(r["examples_computed"] for r in ranks[servers:])
        extra = {"staleness": rule.staleness if rule.rule == "ssp" else None,
                 "backups": rule.backups if rule.rule == "backup" else None,
                 "tau": rule.tau if rule.rule == "easgd" else None,
                 "alpha": rule.alpha if rule.rule == "easgd" else None,
                 "slowdown_worker0": slowdown, "steps_per_worker": [r["steps_done"] for r in ranks[servers:]],
                 "dropped_gradients": ranks[0]["dropped"]}
    else:
        ranks, bytes_sent = _ranks(engine, workers, mirrored_rank, build, tr, ytr, te, yte, epochs, batch, 0,
                                   bar.update)
        if ranks is None:
            return None
        metrics = ranks[0]
    seconds = time.perf_counter() - t0
    bar.close()
    return {"strategy": strategy, "engine": engine, "workers": 1 if strategy == "local" else workers,
            "servers": servers if strategy == "ps" else 0,
            "consistency": rule.rule if strategy == "ps" else "bsp", "epochs": epochs, "batch": batch,
            "config": config.as_dict(),
            "train_examples": len(ytr), "test_examples": len(yte), "auc": metrics["auc"],
            "logloss": metrics["logloss"], "seconds": seconds, "examples_per_s": examples / seconds,
            "bytes_sent": bytes_sent, **extra}


EXIT_CODES = """exit codes:
  0  trained and evaluated; the results were printed
  1  training failed: a rank raised an error, or a rank waited past the 600 s limit
     (the traceback is on stderr)
  2  bad command line (unknown option or value, or options that do not go together,
     e.g. --consistency asp without --strategy ps)"""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default in its help; the epilog's exit-code table kept as written."""


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m reference_impl.train``."""
    parser = argparse.ArgumentParser(prog="python -m reference_impl.train",
                                     description=textwrap.fill(__doc__.splitlines()[0], 79),
                                     epilog=EXIT_CODES, formatter_class=_HelpFormatter)
    parser.add_argument("model", choices=["wide_deep"], help="the model to train (Wide & Deep on InstEval)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="local",
                        help="local: one process; ps: parameter servers; allreduce: mirrored replicas")
    parser.add_argument("--engine", choices=ENGINES, default="threads",
                        help="threads: ranks are threads of this process; mpi / torch: this command was started "
                             "by mpiexec / torchrun, one rank per process (ps: servers + workers processes, "
                             "allreduce: workers)")
    parser.add_argument("--launcher", metavar="CMD", default=None,
                        help="--engine mpi, not started by a launcher: start the job with CMD, which takes -n N like "
                             "mpiexec, e.g. 'srun' or 'mpiexec -f hosts' (None: $MPIEXEC if set, else the mpich "
                             "wheel's mpiexec)")
    parser.add_argument("--hostfile", metavar="FILE", default=None,
                        help="--engine mpi, not started by a launcher: MPICH Hydra host file for mpiexec (-f)")
    parser.add_argument("--workers", type=int, default=2, help="worker ranks (ps and allreduce; local uses 1)")
    parser.add_argument("--servers", type=int, default=2, help="server ranks (ps only)")
    parser.add_argument("--consistency", choices=RULES, default="bsp", help="the servers' rule (ps only)")
    parser.add_argument("--staleness", type=int, default=4, help="SSP bound s (ssp only)")
    parser.add_argument("--backups", type=int, default=1, help="workers not waited for in each step (backup only)")
    parser.add_argument("--tau", type=int, default=4, help="EASGD: steps between exchanges with the centre")
    parser.add_argument("--alpha", type=float, default=0.25, help="EASGD: elastic coefficient")
    parser.add_argument("--slowdown", type=float, default=1.0,
                        help="ps only: worker 0 takes this many times its compute per step (1 = no straggler)")
    parser.add_argument("--epochs", type=int, default=JOINT_CONFIG.epochs,
                        help="passes over the training examples; the default is the tuned configuration's")
    parser.add_argument("--ftrl-alpha", type=float, default=JOINT_CONFIG.ftrl_alpha,
                        help="wide part: FTRL-Proximal learning rate alpha (beta is 1)")
    parser.add_argument("--ftrl-l1", type=float, default=JOINT_CONFIG.ftrl_l1, help="wide part: FTRL L1 strength")
    parser.add_argument("--ftrl-l2", type=float, default=JOINT_CONFIG.ftrl_l2, help="wide part: FTRL L2 strength")
    parser.add_argument("--embedding-dim", type=int, default=JOINT_CONFIG.embedding_dim,
                        help="deep part: width of the student and lecturer embeddings")
    parser.add_argument("--embedding-lr", type=float, default=JOINT_CONFIG.embedding_lr,
                        help="deep part: Adagrad learning rate of the embedding tables")
    parser.add_argument("--mlp-lr", type=float, default=JOINT_CONFIG.mlp_lr,
                        help="deep part: Adam learning rate of the MLP and the bias")
    parser.add_argument("--embedding-l2", type=float, default=JOINT_CONFIG.embedding_l2,
                        help="deep part: L2 penalty per example on each embedding row it looks up")
    parser.add_argument("--batch", type=int, default=256,
                        help="global batch: examples per step over all workers (at least --workers)")
    parser.add_argument("--limit", type=int, default=None,
                        help="train on the first N training examples only (None: all of them; at least --batch)")
    parser.add_argument("--json", action="store_true", help="print one JSON object, no progress bar")
    return parser


def default_config(args: argparse.Namespace) -> WideDeepConfig:
    """The model configuration the parsed command line asks for."""
    return WideDeepConfig(ftrl_alpha=args.ftrl_alpha, ftrl_l1=args.ftrl_l1, ftrl_l2=args.ftrl_l2,
                          embedding_dim=args.embedding_dim, embedding_lr=args.embedding_lr, mlp_lr=args.mlp_lr,
                          embedding_l2=args.embedding_l2, hidden=JOINT_CONFIG.hidden, epochs=args.epochs)


def launch_myself(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    """Run this same command line as a job of one process per rank, under the launcher of
    ``--engine`` (``comm.launch.Launcher`` for mpi, ``torchrun`` for torch), and return its exit
    code. The processes it starts see their launcher's marks and train (``started_by_launcher``)."""
    import subprocess

    from ..comm.launch import LaunchError, Launcher
    from ..comm.torch_dist import torchrun_command

    ranks = args.servers + args.workers if args.strategy == "ps" else args.workers
    program = ["-m", "reference_impl.train", *argv]
    try:
        if args.engine == "torch":
            cmd = torchrun_command(ranks, *program)
        else:
            launcher = Launcher.resolve(args.launcher, args.hostfile)
            launcher.check(n_ranks=ranks)
            cmd = launcher.command(ranks, *program)
    except (LaunchError, FileNotFoundError) as exc:
        parser.error(str(exc))
    return subprocess.run(cmd, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.workers < 1 or args.servers < 1 or args.epochs < 1 or args.batch < args.workers:
        parser.error("need --workers >= 1, --servers >= 1, --epochs >= 1 and --batch >= --workers")
    if args.limit is not None and args.limit < args.batch:
        parser.error("--limit must be at least --batch")
    if args.consistency != "bsp" and args.strategy != "ps":
        parser.error(f"--consistency {args.consistency} needs --strategy ps ({args.strategy} is always synchronous)")
    if args.slowdown != 1.0 and args.strategy != "ps":
        parser.error("--slowdown needs --strategy ps")
    if args.slowdown < 1.0:
        parser.error("--slowdown must be >= 1")
    if args.engine != "threads" and args.strategy == "local":
        parser.error(f"--engine {args.engine} needs --strategy ps or allreduce (local trains in one process)")
    try:
        rule = Consistency(args.consistency, staleness=args.staleness, backups=args.backups, tau=args.tau,
                           alpha=args.alpha)
        rule.dropped_per_step(args.workers)
    except ValueError as exc:
        parser.error(str(exc))
    if min(args.ftrl_alpha, args.embedding_dim, args.embedding_lr, args.mlp_lr) <= 0 or \
            min(args.ftrl_l1, args.ftrl_l2, args.embedding_l2) < 0:
        parser.error("need --ftrl-alpha, --embedding-dim, --embedding-lr, --mlp-lr > 0 and "
                     "--ftrl-l1, --ftrl-l2, --embedding-l2 >= 0")
    if (args.launcher or args.hostfile) and args.engine != "mpi":
        parser.error("--launcher and --hostfile start MPI jobs: they need --engine mpi (torch jobs start under torchrun)")
    if args.engine != "threads" and not started_by_launcher(args.engine):
        return launch_myself(parser, args, argv)
    config = default_config(args)
    launched = args.engine != "threads"
    try:
        result = run(args.strategy, args.workers, args.servers, rule, args.epochs, args.batch, args.limit,
                     show_progress=not args.json and not launched, slowdown=args.slowdown, config=config,
                     engine=args.engine)
    except SystemExit as exc:
        if isinstance(exc.code, str):  # the job has the wrong number of processes: a command-line error
            parser.error(exc.code)
        raise
    if result is None:  # a rank other than 0 of a launched job: rank 0 prints
        return 0
    if args.json:
        print(json.dumps(result))
        return 0
    rule_text = result["consistency"]
    if args.strategy == "ps":
        knobs = {"ssp": f" s={args.staleness}", "backup": f" b={args.backups}",
                 "easgd": f" tau={args.tau} alpha={args.alpha:g}"}
        rule_text += knobs.get(rule_text, "")
        if args.slowdown != 1.0:
            rule_text += f", worker 0 {args.slowdown:g}x slower"
    print(f"{result['strategy']}: test AUC {result['auc']:.4f}, log-loss {result['logloss']:.4f}, "
          f"{result['examples_per_s']:.0f} examples/s, {result['bytes_sent'] / 2**20:.1f} MiB sent "
          f"({result['workers']} workers, {result['servers']} servers, {rule_text})")
    if args.strategy == "ps":
        # Gradients the servers discarded because they arrived too late (backup workers); 0 under the others.
        print(f"late gradients dropped: {result['dropped_gradients']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
