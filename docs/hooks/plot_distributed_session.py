"""Figure of ``distributed_session.json`` (``python -m benchmarks distributed_session``).

It produces ``assets/bench/distributed_session-step.svg``: the time of one replicated SGD
step in the single-process Session, in a DistributedSession whose plan is cached, and as the
first step of a fresh DistributedSession (box plots of every timed repeat), and replaces
``<!-- bench:distributed_session:summary -->`` with the table of medians and ratios.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from plotkit import bad, figure, machine_line, svg

NAME = "distributed_session"
VARIANTS = ("session", "repeated", "first")
LABELS = {"session": "Session (one process)", "repeated": "DistributedSession,\nrepeated step (cached plan)",
          "first": "DistributedSession,\nfirst step (plan + register)"}


def _check(path: Path, data: dict[str, Any]) -> None:
    steps = data.get("step_seconds")
    if not isinstance(steps, dict) or any(
            not isinstance(steps.get(v), list) or not steps[v] or not all(
                isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in steps[v]) for v in VARIANTS):
        raise bad(path, "'step_seconds' must give a non-empty list of positive times for session, repeated, first")
    if not isinstance(data.get("plans_of_repeated_session"), int):
        raise bad(path, "'plans_of_repeated_session' must be an integer")


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    s = data.get("settings", {})
    steps = data["step_seconds"]
    fig, ax = figure(f"Measured on {machine}")
    ax.boxplot([[t * 1e3 for t in steps[v]] for v in VARIANTS])
    ax.set_xticks([1, 2, 3], [LABELS[v] for v in VARIANTS])
    ax.set_ylabel("milliseconds per step")
    ax.set_ylim(bottom=0)
    ax.set_title(f"One replicated SGD step: MLP {s.get('widths', '')}, batch {s.get('batch', '?')}\n"
                 f"{s.get('workers', '?')} workers + 1 ps on thread ranks, "
                 f"{len(steps['session'])} interleaved repeats each")
    step = svg(fig)

    med = {v: statistics.median(steps[v]) for v in VARIANTS}
    lines = ["| variant | median step | vs Session | vs repeated step |", "|---|---:|---:|---:|"]
    for v in VARIANTS:
        label = LABELS[v].replace("\n", " ")
        lines.append(f"| {label} | {med[v] * 1e3:.2f} ms | {med[v] / med['session']:.1f}× | "
                     f"{med[v] / med['repeated']:.2f}× |")
    lines += ["", f"The graph has {data.get('ops', '?')} ops; its step cuts {data.get('send_recv_pairs', '?')} "
              f"edges into Send/Recv pairs. The repeated session partitioned "
              f"{data['plans_of_repeated_session']} times in all (the initialiser's signature and the "
              f"step's), however many steps it ran."]
    moved = data.get("repeated_step_bytes")
    if isinstance(moved, dict):
        lines += ["", f"Counted on the communicators during one repeated step: the workers sent each other "
                      f"{moved['worker_to_worker_peer_tags']:,} bytes of cut-edge tensors directly; the master "
                      f"sent {moved['master_sent']:,} bytes (RunGraph requests with the fed batch) and received "
                      f"{moved['master_received']:,} (the answers with the fetched loss), and "
                      f"{moved['master_peer_tags']:,} bytes of cut-edge tensors passed through it."]
    lines += ["", f"*Machine:* {machine}."]
    return {"step": step}, "\n".join(lines) + "\n"
