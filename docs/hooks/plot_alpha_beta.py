"""Figures of ``alpha_beta.json`` (``python -m benchmarks alpha_beta``).

It produces

* ``assets/bench/alpha_beta-pingpong.svg``: measured one-way time against message size
  (log-log) with the fitted line ``α + m·β`` and the half-performance size ``n½ = α/β``;
* ``assets/bench/alpha_beta-residuals.svg``: how far each ping-pong point lies from the line;
* ``assets/bench/alpha_beta-allreduce.svg``: ring allreduce, measured against predicted
  from the fitted α, β, γ, per rank count;

and replaces ``<!-- bench:alpha_beta:summary -->`` with the fitted parameters and the
predicted-against-measured table, followed by the machine line.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plotkit import bad, color, figure, human_bytes, human_time, machine_line, size_axis, svg

NAME = "alpha_beta"
FIT_KEYS = ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte", "n_half_bytes", "r_squared",
            "max_relative_error", "bandwidth_GBps", "reduction_GBps")


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _check(path: Path, data: dict[str, Any]) -> None:
    fit = data.get("fit")
    if not isinstance(fit, dict) or any(not isinstance(fit.get(k), (int, float)) for k in FIT_KEYS):
        raise bad(path, f"'fit' must be an object with numbers {', '.join(FIT_KEYS)}")
    for key in ("pingpong", "reduction"):
        rows = data.get(key)
        if not isinstance(rows, list) or len(rows) < 2:
            raise bad(path, f"'{key}' must be a list of at least two measurements")
        for i, row in enumerate(rows):
            if not (isinstance(row, dict) and _positive(row.get("bytes")) and _positive(row.get("time_s"))):
                raise bad(path, f"{key}[{i}] needs a positive 'bytes' and 'time_s'")
    residuals = fit.get("relative_residuals")
    if not isinstance(residuals, list) or len(residuals) != len(data["pingpong"]):
        raise bad(path, "'fit.relative_residuals' must have one value per ping-pong point")
    rows = data.get("results")
    if not isinstance(rows, list) or not rows:
        raise bad(path, "'results' (the allreduce check) must be a non-empty list")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not all(
            _positive(row.get(k)) for k in ("ranks", "bytes", "measured_s", "predicted_s")
        ):
            raise bad(path, f"results[{i}] needs positive 'ranks', 'bytes', 'measured_s', 'predicted_s'")


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    fit, pp, rows = data["fit"], data["pingpong"], data["results"]
    alpha, beta, gamma = fit["alpha_s"], fit["beta_s_per_byte"], fit["gamma_s_per_byte"]
    n_half = fit["n_half_bytes"]
    caption = f"Measured on {machine_line(path, data)}"
    xs = [r["bytes"] for r in pp]

    # Ping-pong with the fitted line.
    fig, ax = figure(caption)
    ax.plot(xs, [r["time_s"] for r in pp], "o", color="C0", markersize=4,
            label="measured: half the median round trip (2 MPI ranks)")
    line_x = [min(xs) * 2 ** (k / 4) for k in range(int(4 * math.log2(max(xs) / min(xs))) + 1)]
    ax.plot(line_x, [alpha + m * beta for m in line_x], "-", color="C1", linewidth=1.6,
            label=f"fit α + m·β: α = {human_time(alpha)}, β = {beta * 1e9:.3g} ns/B "
                  f"({fit['bandwidth_GBps']:.2f} GB/s)")
    ax.axhline(alpha, color="C1", linestyle=":", linewidth=1.0, label="latency α alone")
    ax.axvline(n_half, color="0.4", linestyle="--", linewidth=1.0,
               label=f"n½ = α/β = {human_bytes(n_half, digits=3)}: half the time is latency")
    ax.set_yscale("log")
    size_axis(ax, xs)
    ax.set_xlabel("message size (bytes, log scale)")
    ax.set_ylabel("one-way time (seconds, log scale)")
    ax.set_title("Ping-pong: one message costs a latency plus its size over the bandwidth")
    ax.legend(loc="upper left", fontsize=8)
    pingpong_svg = svg(fig)

    # Residuals: where the straight line is only an approximation.
    fig, ax = figure(caption)
    ax.axhline(0, color="0.5", linewidth=1.5, alpha=0.6)
    ax.plot(xs, [100 * r for r in fit["relative_residuals"]], "o-", color="C0", markersize=4,
            linewidth=1.2, label="(measured − fitted) / fitted")
    size_axis(ax, xs)
    ax.set_xlabel("message size (bytes, log scale)")
    ax.set_ylabel("distance from the fitted line (%)")
    ax.set_title(f"How well one line fits: R² = {fit['r_squared']:.4f}, "
                 f"worst point {fit['max_relative_error']:.0%} off")
    ax.legend(loc="best", fontsize=8)
    residuals_svg = svg(fig)

    # Allreduce: predicted from the fit against measured.
    fig, ax = figure(caption)
    all_ranks = sorted({r["ranks"] for r in rows})
    for ranks in all_ranks:
        mine = sorted((r for r in rows if r["ranks"] == ranks), key=lambda r: r["bytes"])
        b = [r["bytes"] for r in mine]
        ax.plot(b, [r["measured_s"] for r in mine], "o-", color=color(ranks, all_ranks), markersize=4,
                linewidth=1.4, label=f"measured, {ranks} ranks")
        ax.plot(b, [r["predicted_s"] for r in mine], "s--", color=color(ranks, all_ranks), markersize=3,
                linewidth=1.2, label=f"predicted from α, β, γ, {ranks} ranks")
    ax.set_yscale("log")
    size_axis(ax, sorted({r["bytes"] for r in rows}))
    ax.set_ylabel("ring allreduce time (seconds, log scale)")
    ax.set_title("Ring allreduce: the fitted model's prediction against the measurement")
    ax.legend(loc="upper left", fontsize=8)
    allreduce_svg = svg(fig)

    lines = [
        "| parameter | fitted value | meaning |",
        "|---|---:|---|",
        f"| α | {human_time(alpha)} | one-way latency of a message (Python + mpi4py + MPI shared memory) |",
        f"| β | {beta * 1e9:.4g} ns/byte | {fit['bandwidth_GBps']:.2f} GB/s for large messages |",
        f"| n½ = α/β | {human_bytes(n_half, digits=3)} | below this size, latency is more than half the time |",
        f"| γ | {gamma * 1e9:.4g} ns/byte | {fit['reduction_GBps']:.2f} GB/s of float32 `a += b` |",
        f"| fit quality | R² = {fit['r_squared']:.4f} | worst ping-pong point {fit['max_relative_error']:.0%} off the line |",
        "",
        "| ranks | size | measured | predicted (α, β, γ) | measured / predicted |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["ranks"], r["bytes"])):
        lines.append(f"| {r['ranks']} | {human_bytes(r['bytes'])} | {human_time(r['measured_s'])} | "
                     f"{human_time(r['predicted_s'])} | {r['measured_s'] / r['predicted_s']:.2f} |")
    per_step = []
    for ranks in sorted({r["ranks"] for r in rows}):
        smallest = min((r for r in rows if r["ranks"] == ranks), key=lambda r: r["bytes"])
        per_step.append(f"{human_time(smallest['measured_s'] / (2 * (ranks - 1)))} on {ranks} ranks")
    lines += ["", f"*Per ring step at the smallest size* (measured time / 2(p−1)): {', '.join(per_step)}; "
              f"the ping-pong α is {human_time(alpha)}."]
    m = data["machine"]
    extras = ", ".join(f"{k} {m[k]}" for k in ("platform", "python", "numpy", "mpi4py") if m.get(k))
    lines += ["", f"*Machine:* {machine_line(path, data)}" + (f" ({extras})." if extras else ".")]
    return ({"pingpong": pingpong_svg, "residuals": residuals_svg, "allreduce": allreduce_svg},
            "\n".join(lines) + "\n")
