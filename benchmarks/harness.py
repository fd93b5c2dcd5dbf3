"""What every MPI benchmark shares: size sweeps, fair timing, the mpiexec job, the JSON file.

A benchmark module has a driver (runs here, launches ``mpiexec``, writes the JSON) and a
worker (runs on every rank, prints one JSON line per result from rank 0). The pieces:

* ``time_interleaved``: implementations timed repeat by repeat in turn, so both see the
  same machine state; a repeat is a barrier then the call, and its time is the slowest
  rank's (a collective is done when the last rank is done);
* ``mpi_job``: one MPI job, started by the run's launcher (``--launcher``, ``--hostfile``,
  ``$MPIEXEC`` or the local ``mpiexec``: ``reference_impl.comm.launch``), its lines streamed
  to a callback (progress bars), killed whole by a watchdog at the deadline, so a hung job
  never hangs the driver;
* ``write_json``: the result file, written atomically (temporary file + rename);
* ``bench_parser``: the command line every benchmark starts from: ``--out`` and ``--publish``
  (a run writes ``bench-results/NAME.json`` in the current directory unless told otherwise;
  only ``--publish`` writes the site's ``docs/assets/bench/NAME.json``);
* ``restart_with_blas_threads``: single-process benchmarks that time CPU work pin BLAS to a
  known thread count, which BLAS reads only when NumPy is imported, so they start again.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

from reference_impl.comm.launch import SRUN_MPI, LaunchError, Launcher, run_job


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from ``min_bytes`` to ``max_bytes`` inclusive."""
    out, b = [], min_bytes
    while b <= max_bytes:
        out.append(b)
        b *= 2
    return out


def repeats_for(n_bytes: int) -> int:
    """More repeats for small messages, whose times are short and noisy."""
    if n_bytes <= 64 << 10:
        return 40
    if n_bytes <= 4 << 20:
        return 15
    return 7


def bandwidths(n_bytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second), as nccl-tests defines them for allreduce."""
    algbw = n_bytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


def emit(record: dict[str, Any]) -> None:
    """Worker side: one result as a JSON line on stdout, flushed at once (the driver streams it)."""
    print(json.dumps(record), flush=True)


def warm_up_and_check(impls: dict[str, Callable[[], Any]], out: Any, warmup: int, expected: float, where: str) -> None:
    """Run each allreduce implementation ``warmup`` times into ``out`` (zeroed first), then check
    every element is ``expected``: a benchmark never times a wrong answer."""
    import numpy as np

    for name, fn in impls.items():
        out[...] = 0
        for _ in range(warmup):
            fn()
        if out.size and not np.all(out == expected):
            raise AssertionError(f"{where}: {name} gave a wrong allreduce")


def time_interleaved(world: Any, impls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds per implementation; each repeat times every implementation once, in turn.

    ``world`` is an mpi4py communicator: a barrier before each call, and the slowest rank's
    time (an MPI ``MAX`` reduction outside the timed region) is the repeat's time.
    """
    from mpi4py import MPI

    times: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(repeats):
        for name, fn in impls.items():
            world.Barrier()
            t0 = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - t0
            times[name].append(world.allreduce(elapsed, op=MPI.MAX))
    return {name: statistics.median(ts) for name, ts in times.items()}


def time_interleaved_torch(group: Any, impls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """``time_interleaved`` for a torch.distributed job: ``group``'s barrier before each call, and the
    slowest rank's time (an ``all_reduce`` with ``MAX``, outside the timed region) per repeat."""
    import torch
    import torch.distributed as dist

    times: dict[str, list[float]] = {name: [] for name in impls}
    slowest = torch.zeros(1, dtype=torch.float64)
    for _ in range(repeats):
        for name, fn in impls.items():
            dist.barrier(group)
            t0 = time.perf_counter()
            fn()
            slowest[0] = time.perf_counter() - t0
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
            times[name].append(float(slowest[0]))
    return {name: statistics.median(ts) for name, ts in times.items()}


# The launcher of this process's MPI jobs: what the benchmark's --launcher / --hostfile (or
# $MPIEXEC) said when its parser ran, else resolved on first use. One benchmark run, one launcher.
_launcher: Launcher | None = None


def use_launcher(launcher: Launcher | None) -> None:
    """Make ``launcher`` the one every later ``mpi_job`` of this process starts through (None: resolve anew)."""
    global _launcher
    _launcher = launcher


def current_launcher() -> Launcher:
    """The launcher ``mpi_job`` uses: the parsed options', else ``$MPIEXEC``, else the mpich wheel's mpiexec."""
    global _launcher
    if _launcher is None:
        _launcher = Launcher.resolve()
    return _launcher


def mpi_job(
    ranks: int,
    argv: list[str],
    on_record: Callable[[dict[str, Any]], None],
    timeout: float,
    env: dict[str, str] | None = None,
    launcher: Launcher | None = None,
    command: Callable[..., list[str]] | None = None,
) -> None:
    """Run ``python -m mpi4py ARGV`` on ``ranks`` processes; call ``on_record`` per JSON line.

    ``launcher`` starts the ranks (default ``current_launcher()``: the benchmark's
    ``--launcher``/``--hostfile``, else one machine; a ``VirtualCluster``'s ``launch`` spreads
    them over its hosts). Before the first job a launcher other than the local default is
    checked (``Launcher.check``: names resolve, every host answers a probe). ``command(ranks,
    *argv)``, if given, builds the launch line instead (``torchrun_command`` runs ``ARGV`` under
    ``torchrun``). Raises ``TimeoutError`` if the job runs past ``timeout`` seconds (it is
    killed whole), ``RuntimeError`` if it fails, and ``LaunchError`` if it cannot be launched.
    """
    if command is not None:
        cmd = command(ranks, *argv)
    else:
        launcher = launcher or current_launcher()
        launcher.check(n_ranks=ranks)
        cmd = launcher.command(ranks, *argv)
    outcome = run_job(cmd, lambda line: on_record(json.loads(line)), timeout, env=env, stderr_to_terminal=True)
    if outcome.timed_out:
        raise TimeoutError(f"benchmark job on {ranks} ranks ran past {timeout:g} s and was killed: {' '.join(cmd)}")
    if outcome.returncode != 0:
        raise RuntimeError(f"benchmark job failed (exit {outcome.returncode}): {' '.join(cmd)}")


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` atomically: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def restart_with_blas_threads(benchmark: str, argv: list[str], threads: int = 1) -> None:
    """Re-run ``python -m benchmarks BENCHMARK ARGV`` with BLAS on ``threads`` threads.

    Returns at once if the environment already says so (the restarted process, or a test
    that sets the variables to run ``main`` in-process); otherwise replaces this process.
    """
    want = str(threads)
    if all(os.environ.get(v) == want for v in BLAS_THREAD_VARS):
        return
    env = {**os.environ, **{v: want for v in BLAS_THREAD_VARS}}
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks", benchmark, *argv], env)


# The checkout this package lives in (benchmarks/harness.py -> the repository root):
# --publish writes the site's data there, wherever the command is run from.
CHECKOUT = Path(__file__).resolve().parents[1]  # benchmarks/ -> the repository
SITE_BENCH_DIR = CHECKOUT / "docs" / "assets" / "bench"
# A plain run writes here, relative to the current directory, so it never replaces the site's data.
RESULTS_DIR = Path("bench-results")


def results_json(name: str) -> Path:
    """Where a run without ``--out`` or ``--publish`` writes: ``bench-results/NAME.json`` in the cwd."""
    return RESULTS_DIR / f"{name}.json"


def site_json(name: str) -> Path:
    """Where ``--publish`` writes: the checkout's ``docs/assets/bench/NAME.json``, which the site plots."""
    return SITE_BENCH_DIR / f"{name}.json"


class _PathFriendlyFormatter(argparse.HelpFormatter):
    """argparse's help layout, but lines never break inside a path (``bench-results/...``)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False, break_long_words=False)


class BenchParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose parsed ``out`` is always set: ``--out PATH`` if given, else
    the site's file under ``--publish``, else ``bench-results/NAME.json``."""

    def __init__(self, name: str, mpi: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bench_name = name
        self.mpi = mpi

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if self.mpi:
            try:
                ns.launch = Launcher.resolve(ns.launcher, ns.hostfile)
            except LaunchError as exc:
                self.error(str(exc))
            use_launcher(ns.launch)
        if ns.out is None:
            if ns.publish:
                if not (CHECKOUT / "docs").is_dir():
                    self.error(f"--publish writes the checkout's docs/assets/bench/, and there is no docs/ in "
                               f"{CHECKOUT} (the package is not run from a checkout); use --out PATH")
                ns.out = site_json(self.bench_name)
            else:
                ns.out = results_json(self.bench_name)
        return ns, extras


def bench_parser(name: str, doc: str, mpi: bool = False) -> argparse.ArgumentParser:
    """``python -m benchmarks NAME``'s parser: its docstring's first line as the
    description, ``--out PATH`` and ``--publish`` (mutually exclusive). The parsed ``out`` is
    ``--out`` if given, ``docs/assets/bench/NAME.json`` of this checkout (where the site reads
    it) under ``--publish``, and otherwise ``bench-results/NAME.json`` in the current directory,
    so a quick run never replaces the site's data.

    An MPI benchmark (``mpi=True``) also takes ``--launcher CMD`` and ``--hostfile FILE``
    (``reference_impl.comm.launch``; ``$MPIEXEC`` when no ``--launcher``): the parsed
    ``launch`` is checked at once (a launcher that is not installed, a bad host file: a usage
    error) and becomes the launcher of every ``mpi_job`` of the run."""
    results, site = results_json(name), site_json(name)
    parser = BenchParser(
        name, mpi=mpi, prog=f"python -m benchmarks {name}", description=doc.splitlines()[0],
        formatter_class=_PathFriendlyFormatter,
        epilog=f"Results go to {results} (relative to the current directory) unless --out or --publish "
               f"says otherwise; only --publish (as `make bench` runs it) replaces the site's data, {site}.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None, metavar="PATH",
                       help=f"write the JSON to PATH (default: {results} in the current directory; "
                            f"the site's file with --publish)")
    where.add_argument("--publish", action="store_true",
                       help=f"write the site's data, {site}, which the site plots (default: off; "
                            f"cannot be combined with --out)")
    if mpi:
        launch = parser.add_argument_group("where the MPI ranks run")
        launch.add_argument("--launcher", metavar="CMD",
                            help="start the ranks with CMD, which must take -n N like mpiexec: e.g. 'srun' (Slurm; "
                                 f"{SRUN_MPI} is added unless CMD names --mpi) or 'mpiexec -f hosts' (default: "
                                 "$MPIEXEC if set, else the mpich wheel's mpiexec, every rank on this machine)")
        launch.add_argument("--hostfile", metavar="FILE", type=Path,
                            help="MPICH Hydra host file for mpiexec (-f): one host a line, name or name:slots")
    return parser


# ----------------------------------------------------------------- benchmarks in sections


def add_sections_argument(parser: argparse.ArgumentParser, sections: tuple[str, ...]) -> None:
    """``--only SECTION`` (repeatable): run only those parts of a benchmark with several."""
    parser.add_argument("--only", choices=sections, action="append",
                        help="run only this part (repeatable) and replace it in the existing output file "
                             "(--out, --publish or the default), keeping the other parts; its machine goes "
                             "under 'section_machines'")


def sections_to_run(parser: argparse.ArgumentParser, args: argparse.Namespace, sections: tuple[str, ...]) -> set[str]:
    """The parts this run measures; ``--only`` needs the file whose parts it replaces.

    A ``"torch"`` part runs under ``torchrun`` on this machine, whatever ``--launcher`` says; a
    run started through another launcher (``srun``, a host file) measures that launcher's ranks,
    so it leaves the torch part out unless ``--only torch`` asks for it."""
    if args.only and not args.out.exists():
        parser.error(f"--only replaces parts of an existing file, and {args.out} does not exist")
    chosen = set(args.only or sections)
    if not args.only and "torch" in chosen and not current_launcher().is_local_default:
        chosen.discard("torch")
    return chosen


def sectioned_document(args: argparse.Namespace, benchmark: str, parts: dict[str, Any], machine: dict[str, Any],
                       settings: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: a whole new one, or with ``--only`` the existing file with ``parts``
    replaced and the machine they ran on recorded under ``section_machines``."""
    if not args.only:
        return {"benchmark": benchmark, "machine": machine, "settings": settings, **parts}
    document = json.loads(args.out.read_text(encoding="utf-8"))
    document.update(parts)
    document.setdefault("section_machines", {}).update({k: machine for k in parts})
    return document

