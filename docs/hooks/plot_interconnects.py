"""Figures of ``interconnects.json`` (``python -m benchmarks interconnects``).

It produces

* ``assets/bench/interconnects-time.svg``: ring allreduce time against size on 64 ranks,
  one line per interconnect profile (log-log): flat where latency rules, rising where
  bandwidth does;
* ``assets/bench/interconnects-speedup.svg``: each profile's speed-up over 10 Gb Ethernet
  against size, which shows that a faster link helps only above the crossover size;
* ``assets/bench/interconnects-split.svg``: the time to allreduce one 100 MiB gradient sent
  as k separate tensors, against k (the cost that bucketing removes);

and replaces ``<!-- bench:interconnects:summary -->`` with a table per profile and the
check that simulated runs on thread ranks matched the closed form.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from plotkit import bad, date_text, figure, human_bytes, human_time, size_axis, svg

NAME = "interconnects"
RANKS = 64  # the rank count the figures show (one of the benchmark's MODEL_RANKS)
BASELINE = "10GbE"
STYLES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1))]


def _check(path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    profiles = data.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise bad(path, "'profiles' must be a non-empty object")
    rows = data.get("results")
    if not isinstance(rows, list) or not rows:
        raise bad(path, "'results' must be a non-empty list")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or row.get("kind") not in ("model", "simulated", "split"):
            raise bad(path, f"results[{i}] needs a 'kind' of model, simulated or split")
        if row.get("profile") not in profiles:
            raise bad(path, f"results[{i}].profile {row.get('profile')!r} is not in 'profiles'")
        t = row.get("time_s")
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise bad(path, f"results[{i}].time_s must be a positive number")
    if not any(r["kind"] == "model" and r["ranks"] == RANKS for r in rows):
        raise bad(path, f"no closed-form rows for {RANKS} ranks")
    if not isinstance(data.get("max_relative_error"), (int, float)):
        raise bad(path, "'max_relative_error' (simulated vs closed form) is missing")
    return rows


def _series(rows: list[dict[str, Any]], profile: str) -> dict[int, float]:
    return {r["bytes"]: r["time_s"] for r in rows
            if r["kind"] == "model" and r["profile"] == profile and r["ranks"] == RANKS}


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    rows = _check(path, data)
    profiles = list(data["profiles"])
    machine = data.get("machine", {})
    caption = (f"Simulated (α–β model, γ = 0) with reference_impl/comm/simnet.py profiles; "
               f"computed {date_text(machine.get('date', '?'))}")
    sizes = sorted(_series(rows, profiles[0]))

    # Time against size, one line per profile.
    fig, ax = figure(caption)
    for i, name in enumerate(profiles):
        s = _series(rows, name)
        p = data["profiles"][name]
        ax.plot(sorted(s), [s[b] for b in sorted(s)], color=f"C{i}", linestyle=STYLES[i % len(STYLES)],
                linewidth=1.6, label=f"{name}: {p['link_gbps']:g} Gb/s, α = {human_time(p['latency_s'])}")
    ax.set_yscale("log")
    size_axis(ax, sizes)
    ax.set_xlabel("gradient size per rank (bytes, log scale)")
    ax.set_ylabel("ring allreduce time (seconds, log scale)")
    ax.set_title(f"Ring allreduce on {RANKS} ranks: flat = latency-bound, rising = bandwidth-bound")
    ax.legend(loc="upper left", fontsize=8)
    time_svg = svg(fig)

    # Speed-up over the baseline.
    fig, ax = figure(caption)
    base = _series(rows, BASELINE) if BASELINE in profiles else _series(rows, profiles[0])
    base_name = BASELINE if BASELINE in profiles else profiles[0]
    top = 1.0
    for i, name in enumerate(profiles):
        if name == base_name:
            continue
        s = _series(rows, name)
        xs = sorted(b for b in s if b in base)
        ratio = [base[b] / s[b] for b in xs]
        top = max(top, *ratio)
        ax.plot(xs, ratio, color=f"C{i}", linestyle=STYLES[i % len(STYLES)], linewidth=1.6,
                label=f"{name} ({data['profiles'][name]['link_gbps'] / data['profiles'][base_name]['link_gbps']:g}× "
                      "the link rate)")
    ax.axhline(1.0, color="0.5", linewidth=2.0, alpha=0.5, label=f"{base_name} itself")
    ax.set_yscale("log")
    ticks = [v for v in (1, 2, 5, 10, 20, 50, 100) if v <= top * 1.5]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}×"))
    size_axis(ax, sizes)
    ax.set_xlabel("gradient size per rank (bytes, log scale)")
    ax.set_ylabel(f"speed-up over {base_name} (log scale)")
    ax.set_title(f"Speed-up over {base_name}, {RANKS} ranks")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    speedup_svg = svg(fig)

    # One gradient as k tensors.
    fig, ax = figure(caption)
    split = [r for r in rows if r["kind"] == "split"]
    if not split:
        raise bad(path, "no 'split' rows (one gradient sent as k tensors)")
    total = split[0]["bytes"]
    for i, name in enumerate(profiles):
        mine = sorted((r for r in split if r["profile"] == name), key=lambda r: r["tensors"])
        ax.plot([r["tensors"] for r in mine], [r["time_s"] for r in mine], "o", color=f"C{i}",
                linestyle=STYLES[i % len(STYLES)], markersize=3, linewidth=1.6, label=name)
    ks = sorted({r["tensors"] for r in split})
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(ks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.set_yscale("log")
    ax.set_xlabel(f"number of separate allreduces the {human_bytes(total)} gradient is cut into (log scale)")
    ax.set_ylabel("total allreduce time (seconds, log scale)")
    ax.set_title(f"One {human_bytes(total)} gradient on {split[0]['ranks']} ranks: each extra message pays the latency again")
    ax.legend(loc="upper left", fontsize=8)
    split_svg = svg(fig)

    # Summary table.
    show = [b for b in (4 << 10, 1 << 30) if b in base]
    lines = [
        f"Ring allreduce on {RANKS} ranks, closed form; \"× {base_name}\" is the speed-up over {base_name}.",
        "",
        f"| profile | link rate | α | n½ = α/β | crossover, {RANKS}·α/β | "
        + " | ".join(f"time, {human_bytes(b)}" for b in show) + " | "
        + " | ".join(f"× {base_name}, {human_bytes(b)}" for b in show) + " |",
        "|---|---:|---:|---:|---:|" + "---:|" * (2 * len(show)),
    ]
    for name in profiles:
        p = data["profiles"][name]
        s = _series(rows, name)
        n_half = p["latency_s"] * p["link_gbps"] * 1e9 / 8
        times = " | ".join(human_time(s[b]) for b in show)
        ups = " | ".join(f"{base[b] / s[b]:.1f}×" for b in show)
        lines.append(f"| {name} | {p['link_gbps']:g} Gb/s | {human_time(p['latency_s'])} | "
                     f"{human_bytes(n_half, digits=3)} | {human_bytes(RANKS * n_half, digits=3)} | {times} | {ups} |")
    sim = [r for r in rows if r["kind"] == "simulated"]
    if sim:
        sim_ranks = sorted({r["ranks"] for r in sim})
        lines += ["", f"*Check:* {len(sim)} ring allreduces run on "
                  f"{', '.join(map(str, sim_ranks))} thread ranks through `SimulatedNetwork` "
                  f"({human_bytes(min(r['bytes'] for r in sim))} to {human_bytes(max(r['bytes'] for r in sim))}) "
                  f"took the closed form's time to a relative {data['max_relative_error']:.1e} at worst."]
    return {"time": time_svg, "speedup": speedup_svg, "split": split_svg}, "\n".join(lines) + "\n"
