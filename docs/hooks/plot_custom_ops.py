"""Figure of ``custom_ops.json`` (``python -m benchmarks custom_ops``).

It produces ``assets/bench/custom_ops-speedup.svg``: for each op and each input size, the
NumPy composition's best CPU time divided by the C kernel's (above 1: C is faster), and
replaces ``<!-- bench:custom_ops:summary -->`` with the table of best and median times and
ratios, the cost of one call on a tiny input, and the machine line.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plotkit import bad, check_rows, figure, human_bytes, human_time, machine_line, size_axis, svg

NAME = "custom_ops"
PEERS = {"sparse_segment_sum": ("numpy_add_at", "numpy_sort_reduceat"), "bias_add_relu": ("numpy",)}
LABELS = {("sparse_segment_sum", "numpy_add_at"): "sparse_segment_sum vs np.add.at",
          ("sparse_segment_sum", "numpy_sort_reduceat"): "sparse_segment_sum vs sort + np.add.reduceat",
          ("bias_add_relu", "numpy"): "bias_add_relu vs np.maximum(x + b, 0)"}
CALLS = ("numpy", "c_kernel", "eager_op")


def _check(path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = check_rows(path, data, {"op": str, "rows": int, "bytes": int, "min_s": dict, "median_s": dict})
    for i, row in enumerate(rows):
        if row["op"] not in PEERS:
            raise bad(path, f"results[{i}].op {row['op']!r} is not one of {sorted(PEERS)}")
        for impl in ("c_kernel", *PEERS[row["op"]]):
            for stat in ("min_s", "median_s"):
                t = row[stat].get(impl)
                if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
                    raise bad(path, f"results[{i}].{stat}.{impl} must be a positive time")
    calls = data.get("call_overhead_us")
    if not isinstance(calls, dict) or not all(isinstance(calls.get(k), (int, float)) for k in CALLS):
        raise bad(path, f"'call_overhead_us' must give numbers for {', '.join(CALLS)}")
    return rows


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    rows = _check(path, data)
    machine = machine_line(path, data)
    s = data.get("settings", {})
    fig, ax = figure(f"Measured on {machine}")
    for number, ((op, peer), label) in enumerate(LABELS.items()):
        mine = sorted((r for r in rows if r["op"] == op), key=lambda r: r["bytes"])
        if mine:
            ax.plot([r["bytes"] for r in mine], [r["min_s"][peer] / r["min_s"]["c_kernel"] for r in mine],
                    marker="o", color=f"C{number}", label=label)
    ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
    size_axis(ax, [r["bytes"] for r in rows])
    ax.set_xlabel("input size (bytes of data or x, log scale)")
    ax.set_yscale("log")
    ax.set_ylabel("NumPy CPU time / C kernel CPU time (log; >1: C faster)")
    ax.set_title(f"Custom C kernels ({s.get('compiler', 'C compiler').split(':')[0].rsplit('/', 1)[-1]} "
                 f"{s.get('flags', '')}) vs NumPy, {s.get('dtype', '')}, best of interleaved repeats")
    ax.legend(fontsize=8)
    speedup = svg(fig)

    lines = ["| op | rows × width | input | NumPy peer | C kernel best (median) | NumPy best (median) "
             "| NumPy / C, best (median) |", "|---|---:|---:|---|---:|---:|---:|"]
    for row in rows:
        for peer in PEERS[row["op"]]:
            c, p = row["min_s"]["c_kernel"], row["min_s"][peer]
            cm, pm = row["median_s"]["c_kernel"], row["median_s"][peer]
            lines.append(f"| {row['op']} | {row['rows']} × {row.get('width', '?')} | {human_bytes(row['bytes'], 3)} | "
                         f"{peer} | {human_time(c)} ({human_time(cm)}) | {human_time(p)} ({human_time(pm)}) | "
                         f"{p / c:.2f}× ({pm / cm:.2f}×) |")
    calls = data["call_overhead_us"]
    lines += ["", f"One call on a 1 × 1 input (median CPU time): the NumPy composition takes "
                  f"{calls['numpy']:.2f} µs, the C kernel "
                  f"behind the op (checks + ctypes) {calls['c_kernel']:.2f} µs, and the op in eager mode "
                  f"{calls['eager_op']:.2f} µs.", "", f"*Machine:* {machine}. *Compiler:* {s.get('compiler', '?')}."]
    lines.insert(0, "Times are CPU time of the calling thread (other work on the machine does not count); "
                    "“best” is the fastest of the interleaved repeats.\n")
    return {"speedup": speedup}, "\n".join(lines) + "\n"
