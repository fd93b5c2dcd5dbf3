"""Figures of ``ps.json`` (``python -m reference_impl.bench ps``).

* ``assets/bench/ps-consistency.svg``: best test log-loss so far against simulated time
  for each consistency model, one panel per straggler scenario, with the target line;
* ``assets/bench/ps-staleness.svg``: staleness histograms (updates applied between a
  worker's read and its push) for ASP and SSP under the persistent straggler;
* ``assets/bench/ps-collisions.svg`` (when the JSON has ``collisions_by_buckets``): the
  fraction of distinct values sharing a bucket against the bucket count, measured for a
  hash-bucket column, a crossed column and a polynomial cross, with the birthday formula;
* ``assets/bench/ps-traffic.svg``: bytes per step of the parameter server and of the
  mirrored (all-reduce) strategy against the embedding table's size;
* ``assets/bench/ps-wide-deep.svg``: test AUC and log-loss on InstEval of each model
  (logistic regression, wide-only, deep-only, joint) and of the joint model trained on
  parameter servers and on mirrored workers, with the joint model's margins written out.

``<!-- bench:ps:summary -->`` becomes the tables: throughput against the NumPy lower bound,
traffic, time to target, and Wide & Deep quality.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from plotkit import bad, figure, human_bytes, machine_line, svg

NAME = "ps"


def _check(path: Path, data: dict[str, Any]) -> None:
    for key in ("throughput", "traffic", "consistency", "wide_deep"):
        if key not in data:
            raise bad(path, f"missing '{key}'")
    scen = data["consistency"].get("scenarios")
    if not isinstance(scen, dict) or not scen:
        raise bad(path, "'consistency.scenarios' must be a non-empty object")
    for name, rows in scen.items():
        for row in rows:
            if len(row.get("curve_time", [])) != len(row.get("curve_best_logloss", [])):
                raise bad(path, f"consistency {name}/{row.get('model')}: curve lengths differ")
    if not data["wide_deep"].get("insteval", {}).get("rows"):
        raise bad(path, "'wide_deep.insteval.rows' must be a non-empty list")


def _median_time(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < len(values) / 2 or not finite:
        return f"not reached ({len(values) - len(finite)}/{len(values)} runs)"
    return f"{statistics.median([v if math.isfinite(v) else float('inf') for v in values]):.1f}"


def _wide_deep_figure(ins: dict[str, Any], machine: str) -> bytes:
    """Two panels of horizontal bars, one bar per model: test AUC and test log-loss."""
    rows = list(ins["rows"]) + [ins[k] for k in ("parameter_servers", "mirrored") if k in ins]
    names = [r["model"] for r in rows]
    colours = ["C0" if "joint" not in n else ("C3" if n == "wide & deep (joint)" else "C2") for n in names]
    fig, _ = figure(f"InstEval, {ins['train']} train / {ins['test']} test ratings, {ins['epochs']} epochs. "
                    f"Measured on {machine}")
    fig.set_size_inches(9, 3.6)
    fig.clear()  # two panels instead of plotkit's one: redo its grid and caption
    fig.supxlabel(f"InstEval, {ins['train']} train / {ins['test']} test ratings, {ins['epochs']} epochs. "
                  f"Measured on {machine}", fontsize=7, color="0.35")
    ax_auc, ax_loss = fig.subplots(1, 2, sharey=True)
    y = list(range(len(rows)))[::-1]
    for ax, key, label in ((ax_auc, "auc", "test AUC (0.5 = chance; higher is better)"),
                           (ax_loss, "logloss", "test log-loss (lower is better)")):
        values = [r[key] for r in rows]
        ax.barh(y, values, color=colours)
        lo, hi = min(values), max(values)
        pad = (hi - lo) * 0.25
        ax.set_xlim(0.5 if key == "auc" else lo - pad, hi + pad)
        for yi, v in zip(y, values):
            ax.text(v, yi, f" {v:.4f}", va="center", fontsize=7)
        ax.set_xlabel(label)
        ax.grid(True, axis="x", alpha=0.3)
    ax_auc.set_yticks(y, names, fontsize=7)
    by = {r["model"]: r for r in rows}
    joint = by.get("wide & deep (joint)")
    others = [n for n in names[:len(ins["rows"])] if n != "wide & deep (joint)"]
    if joint and others:
        margins = ", ".join(f"{by[n]['model'].split(' (')[0]} {joint['auc'] - by[n]['auc']:+.4f}" for n in others)
        ax_auc.set_title(f"joint AUC minus: {margins}", fontsize=7)
    return svg(fig)


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    con = data["consistency"]
    figs: dict[str, bytes] = {}

    caption = f"Simulated time; real training. Measured on {machine}"
    fig, ax = figure(caption)
    fig.set_size_inches(9, 3.8)
    fig.clear()  # two panels instead of plotkit's one: redo its grid and caption
    axes = fig.subplots(1, len(con["scenarios"]), sharey=True)
    fig.supxlabel(caption, fontsize=7, color="0.35")
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
    for ax, (scenario, rows) in zip(axes, con["scenarios"].items()):
        for row in rows:
            ax.plot(row["curve_time"], row["curve_best_logloss"], label=row["model"])
        ax.axhline(con["target_logloss"], color="grey", linestyle=":", label="target (mean of seeds)")
        ax.set_title(f"{scenario} straggler ({con['slowdown']:g}x slower)")
        ax.set_xlabel("simulated time (normal worker steps)")
    axes[0].set_ylabel("best test log-loss so far")
    axes[-1].legend(fontsize=7)
    figs["consistency"] = svg(fig)

    fig, ax = figure(f"Persistent straggler. Measured on {machine}")
    for row in con["scenarios"]["persistent"]:
        hist = row["staleness_histogram"]
        if row["model"].startswith(("asp", "ssp")) and hist:
            total = sum(hist)
            ax.plot(range(len(hist)), [h / total for h in hist], marker="o", label=row["model"])
    ax.set_xlabel("staleness of an applied gradient (updates between its read and its push)")
    ax.set_ylabel("fraction of gradients")
    ax.legend()
    figs["staleness"] = svg(fig)

    fig, ax = figure(f"2 workers (+2 servers for PS), thread ranks. Measured on {machine}")
    tra = data["traffic"]
    rows_x = [t["vocab_rows"] for t in tra]
    ax.loglog(rows_x, [t["ps_bytes_per_step"] for t in tra], marker="o", label="parameter server (pull+push unique rows)")
    ax.loglog(rows_x, [t["mirrored_bytes_per_step"] for t in tra], marker="s", label="mirrored (all-reduce the dense table gradient)")
    ax.set_xlabel("embedding table rows (vocabulary)")
    ax.set_ylabel("bytes sent per training step (all ranks)")
    ax.legend()
    figs["traffic"] = svg(fig)

    by_m = data.get("collisions_by_buckets")
    if by_m:
        fig, ax = figure(f"{by_m[0]['values']} distinct values per curve. Measured on {machine}")
        ms = [c["buckets"] for c in by_m]
        ax.loglog(ms, [c["birthday_formula"] for c in by_m], color="grey", linestyle=":",
                  label="birthday formula 1 - (1 - 1/m)^(n-1)")
        ax.loglog(ms, [c["hash_bucket_measured"] for c in by_m], marker="o", linestyle="none",
                  label="hash-bucket column, random ids")
        ax.loglog(ms, [c["crossed_pairs_measured"] for c in by_m], marker="x", linestyle="none",
                  label="crossed column, every pair of ids < 100")
        ax.loglog(ms, [c["polynomial_cross_measured"] for c in by_m], marker="s",
                  label="polynomial cross (31 i + j) mod m, same pairs")
        ax.set_xlabel("hash buckets m")
        ax.set_ylabel("fraction of distinct values sharing a bucket")
        ax.legend(fontsize=7)
        figs["collisions"] = svg(fig)

    figs["wide-deep"] = _wide_deep_figure(data["wide_deep"]["insteval"], machine)

    thr_machine = data.get("section_machines", {}).get("throughput")
    lines = ["**Pull + push throughput** (one process, one shard, Zipf ids from a vocabulary of 1M, "
             "dim 16, SGD; CPU time of the measuring thread, median of the repeats"
             + (f"; measured on {machine_line(path, {'machine': thr_machine})}" if thr_machine else "") + "):", "",
             ("| table before | batch | unique ids | new rows / batch | sparse table keys/s | "
             "NumPy lower bound keys/s | time ratio (median) | time ratio (mean) |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for t in data["throughput"]:
        before = t.get("table_rows_before", 0)
        new_rows = (t["table_rows_after"] - before) / (t["repeats"] + 1) if "table_rows_after" in t else float("nan")
        mean = t.get("mean_slowdown_vs_lower_bound")
        lines.append(f"| {'empty' if not before else f'{before} rows'} | {t['batch']} | {t['unique_per_batch']:.0f} | "
                     f"{new_rows:.0f} | {t['keys_per_s']['sparse_table']:.3g} | "
                     f"{t['keys_per_s']['numpy_lower_bound']:.3g} | {t['slowdown_vs_lower_bound']:.2f}× | "
                     + (f"{mean:.2f}× |" if mean is not None else "– |"))
    lines += ["", ("**Traffic per step** (embedding dim "
              f"{tra[0]['dim']}, batch {tra[0]['batch']}):"), "",
              "| table rows | unique ids / step | PS bytes | mirrored bytes | PS s/step | mirrored s/step |",
              "|---:|---:|---:|---:|---:|---:|"]
    for t in tra:
        lines.append(f"| {t['vocab_rows']} | {t['unique_ids_per_step']:.0f} | {human_bytes(t['ps_bytes_per_step'], 3)} | "
                     f"{human_bytes(t['mirrored_bytes_per_step'], 3)} | {t['ps_s_per_step'] * 1e3:.1f} ms | "
                     f"{t['mirrored_s_per_step'] * 1e3:.1f} ms |")
    lines += ["", (f"**Time to target** (per seed, the level straggler-free BSP's test log-loss sits at over 10–20% of "
              f"the {con['horizon']:.0f}-unit horizon; mean {con['target_logloss']:.4f}, Bayes {con['bayes_logloss']:.4f}; median of {con['seeds']} "
              f"seeds, simulated time units):"), "",
              "| model | " + " | ".join(con["scenarios"]) + " |", "|---|" + "---:|" * len(con["scenarios"])]
    names = [r["model"] for r in next(iter(con["scenarios"].values()))]
    for i, name in enumerate(names):
        cells = [_median_time(rows[i]["time_to_target"]) for rows in con["scenarios"].values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    ins = data["wide_deep"]["insteval"]
    lines += ["", (f"**Wide & Deep on InstEval** (label: rating ≥ 4; {ins['train']} train / {ins['test']} test, "
              f"{ins['epochs']} epochs):"), "", "| model | test AUC | test log-loss |", "|---|---:|---:|"]
    for r in ins["rows"]:
        lines.append(f"| {r['model']} | {r['auc']:.4f} | {r['logloss']:.4f} |")
    strategies = [ins[k] for k in ("parameter_servers", "mirrored") if k in ins]
    for st in strategies:
        lines.append(f"| {st['model']} | {st['auc']:.4f} | {st['logloss']:.4f} |")
    if strategies:
        lines += ["", "Test AUC minus the single-process joint model's (same batches; only the order of "
                      "floating-point sums differs): " +
                  ", ".join(f"{st['model'].split(', ')[-1]}: {st['auc_minus_local']:+.1e}" for st in strategies) + "."]
    if data.get("collisions"):
        lines += ["", (f"**Hash-bucket collisions** ({data['collisions'][0]['buckets']} buckets): fraction of distinct "
                      "values that share their bucket with another, measured and by the birthday formula "
                      "1 − (1 − 1/m)^(n−1):"), "", "| distinct values n | measured | formula |", "|---:|---:|---:|"]
        for c in data["collisions"]:
            lines.append(f"| {c['values']} | {c['measured']:.4f} | {c['birthday_formula']:.4f} |")
    if by_m:
        lines += ["", (f"**Collisions against the bucket count** ({by_m[0]['values']} distinct values; fraction "
                      "sharing a bucket):"), "",
                  "| buckets m | hash-bucket column | crossed column (all pairs) | polynomial cross | formula |",
                  "|---:|---:|---:|---:|---:|"]
        for c in by_m:
            lines.append(f"| {c['buckets']} | {c['hash_bucket_measured']:.4f} | {c['crossed_pairs_measured']:.4f} | "
                         f"{c['polynomial_cross_measured']:.4f} | {c['birthday_formula']:.4f} |")
    ck = data["wide_deep"]["click_log"]
    lines += ["", (f"**Synthetic click log**: a wide model reaches test log-loss {ck['logloss']:.4f} "
              f"(AUC {ck['auc']:.4f}) against the true model's {ck['bayes_logloss']:.4f} (AUC {ck['bayes_auc']:.4f})."),
              "", f"*Machine:* {machine}."]
    return figs, "\n".join(lines) + "\n"
