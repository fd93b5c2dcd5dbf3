"""Figures of ``ps.json`` (``python -m benchmarks ps``).

* ``assets/bench/ps-consistency.svg``: best test log-loss so far against simulated time
  for each consistency model, one panel per straggler scenario, with the target line;
* ``assets/bench/ps-staleness.svg``: staleness histograms (updates applied between a
  worker's read and its push) for ASP and SSP under the persistent straggler;
* ``assets/bench/ps-collisions.svg`` (when the JSON has ``collisions_by_buckets``): the
  fraction of distinct values sharing a bucket against the bucket count, measured for a
  hash-bucket column, a crossed column and a polynomial cross, with the birthday formula;
* ``assets/bench/ps-traffic.svg``: bytes per step of the parameter server and of the
  mirrored (all-reduce) strategy against the embedding table's size;
* ``assets/bench/ps-wide-deep.svg``: test AUC and log-loss on InstEval of each tuned model
  (the scikit-learn logistic-regression peer, wide-only, deep-only, joint) and of the joint
  model trained on parameter servers and on mirrored workers; and, on the synthetic click
  log, each model's test AUC short of the true model's (the gap to Bayes).

``<!-- bench:ps:summary:<part> -->`` becomes one part of the tables: ``throughput`` (against
the NumPy lower bound) and ``traffic`` on Parameter servers, ``consistency`` (time to target)
on Consistency models, ``wide-deep`` on Wide & Deep, ``collisions-by-buckets`` and
``collisions`` on Feature columns.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from plotkit import bad, figure, human_bytes, machine_line, svg

from reference_impl.models.feature_columns import expected_collision_rate

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
    for part in ("insteval", "click_log"):
        rows = data["wide_deep"].get(part, {}).get("rows")
        if not rows:
            raise bad(path, f"'wide_deep.{part}.rows' must be a non-empty list")
        keys = [r.get("key") for r in rows]
        if keys != ["lr_peer", "wide", "deep", "joint"]:
            raise bad(path, f"'wide_deep.{part}.rows' must be the LR peer, wide, deep and joint models, got {keys}")
        for r in rows:
            for k in ("model", "config", "valid_auc", "auc", "logloss"):
                if k not in r:
                    raise bad(path, f"wide_deep.{part} {r['key']}: missing '{k}'")
    if "bayes_auc" not in data["wide_deep"]["click_log"]:
        raise bad(path, "'wide_deep.click_log' needs 'bayes_auc'")


def _median_time(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < len(values) / 2 or not finite:
        return f"not reached ({len(values) - len(finite)}/{len(values)} runs)"
    return f"{statistics.median([v if math.isfinite(v) else float('inf') for v in values]):.1f}"


COLOURS = {"lr_peer": "0.55", "wide": "C0", "deep": "C1", "joint": "C3"}


def _config_text(row: dict[str, Any]) -> str:
    """The chosen hyper-parameters of one model, short."""
    c = row["config"]
    if row["key"] == "lr_peer":
        return f"{c['features']}, C = {c['C']:g}"
    parts = []
    if "ftrl_alpha" in c:
        parts.append(f"FTRL α {c['ftrl_alpha']:g}, L1 {c['ftrl_l1']:g}, L2 {c['ftrl_l2']:g}")
    if "embedding_dim" in c:
        parts.append(f"embeddings {c['embedding_dim']}, Adagrad {c['embedding_lr']:g}, Adam {c['mlp_lr']:g}, "
                     f"embedding L2 {c['embedding_l2']:g}")
    return "; ".join(parts) + f"; {c['epochs']} epoch" + ("s" if c["epochs"] != 1 else "")


def _wide_deep_figure(wd: dict[str, Any], machine: str) -> bytes:
    """Three panels of horizontal bars: InstEval test AUC, InstEval test log-loss (one bar per
    tuned model, then the joint model on parameter servers and on mirrored workers), and
    each model's test AUC short of the Bayes AUC on the synthetic click log."""
    ins, ck = wd["insteval"], wd["click_log"]
    rows = list(ins["rows"]) + [ins[k] for k in ("parameter_servers", "mirrored") if k in ins]
    names = [r["model"] for r in rows]
    colours = [COLOURS.get(r.get("key"), "C2") for r in rows]
    caption = (f"InstEval: {ins['train']} training ratings ({ins['valid']} of them the validation split that "
               f"chose every model's settings), {ins['test']} test. Click log: {ck['train']} training, "
               f"{ck['test']} test examples. Measured on {machine}")
    fig, _ = figure(caption)
    # Three panels stacked (one column reads at phone width): AUC, log-loss, the click log's gap.
    fig.set_size_inches(5.0, 4.6 + 0.45 * (2 * len(rows) + len(ck["rows"]) + 1))
    fig.clear()  # three panels instead of plotkit's one: redo its grid and caption
    fig.supxlabel(caption, fontsize=7, color="0.35")
    grid = fig.add_gridspec(3, 1, height_ratios=[len(rows), len(rows), len(ck["rows"]) + 1])
    ax_auc = fig.add_subplot(grid[0])
    ax_loss = fig.add_subplot(grid[1], sharey=ax_auc)
    ax_gap = fig.add_subplot(grid[2])
    y = list(range(len(rows)))[::-1]
    for ax, key, label in ((ax_auc, "auc", "InstEval test AUC (higher is better; the axis is cut)"),
                           (ax_loss, "logloss", "InstEval test log-loss (lower is better; the axis is cut)")):
        values = [r[key] for r in rows]
        ax.barh(y, values, color=colours)
        lo, hi = min(values), max(values)
        pad = max((hi - lo) * 0.4, 0.002)
        ax.set_xlim(lo - pad, hi + pad)
        for yi, v in zip(y, values):
            ax.text(v, yi, f" {v:.4f}", va="center", fontsize=7)
        ax.set_xlabel(label, fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    ax_auc.set_yticks(y, names, fontsize=7)
    peer = ins["rows"][0]
    ax_auc.axvline(peer["auc"], color="0.4", linestyle=":", linewidth=1)
    ax_auc.set_title("InstEval, every model tuned on the same validation split", fontsize=8)
    gaps = [ck["bayes_auc"] - r["auc"] for r in ck["rows"]]
    yg = list(range(len(gaps)))[::-1]
    ax_gap.barh(yg, gaps, color=[COLOURS[r["key"]] for r in ck["rows"]])
    for yi, v in zip(yg, gaps):
        ax_gap.text(v, yi, f" {v:.4f}", va="center", fontsize=7)
    ax_gap.set_xlim(0, max(gaps) * 1.25)
    ax_gap.set_yticks(yg, [r["model"] for r in ck["rows"]], fontsize=7)
    ax_gap.set_xlabel(f"synthetic click log: Bayes AUC ({ck['bayes_auc']:.4f}) minus test AUC "
                      "(lower is better; 0 = the true model)", fontsize=8)
    ax_gap.grid(True, axis="x", alpha=0.3)
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

    figs["wide-deep"] = _wide_deep_figure(data["wide_deep"], machine)

    return figs, summary(path, data, machine)


def summary(path: Path, data: dict[str, Any], machine: str) -> str:
    """The tables, in parts (``<!-- part:NAME -->``) that each page includes on its own:
    ``throughput`` and ``traffic`` (Parameter servers), ``consistency`` (Consistency models),
    ``wide-deep`` (Wide & Deep), ``collisions-by-buckets`` and ``collisions`` (Feature columns)."""
    con, tra, by_m = data["consistency"], data["traffic"], data.get("collisions_by_buckets")
    thr_machine = data.get("section_machines", {}).get("throughput")
    lines = ["<!-- part:throughput -->",
             "**Pull + push throughput** (one process, one shard, Zipf ids from a vocabulary of 1M, "
             "dim 16, SGD; CPU time of the measuring thread, median of the repeats"
             + (f"; measured on {machine_line(path, {'machine': thr_machine})}" if thr_machine
                else f"; measured on {machine}") + "):", "",
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
    lines += ["", "<!-- part:traffic -->",
              (f"**Traffic per step** (2 workers, and 2 servers for the parameter server; embedding dim "
               f"{tra[0]['dim']}, batch {tra[0]['batch']}; thread ranks; measured on {machine}):"), "",
              "| table rows | unique ids / step | PS bytes | mirrored bytes | PS s/step | mirrored s/step |",
              "|---:|---:|---:|---:|---:|---:|"]
    for t in tra:
        lines.append(f"| {t['vocab_rows']} | {t['unique_ids_per_step']:.0f} | {human_bytes(t['ps_bytes_per_step'], 3)} | "
                     f"{human_bytes(t['mirrored_bytes_per_step'], 3)} | {t['ps_s_per_step'] * 1e3:.1f} ms | "
                     f"{t['mirrored_s_per_step'] * 1e3:.1f} ms |")
    window = "10% and 20%"  # benchmarks/ps.py, consistency(): mean_loss(0.10 * horizon, 0.20 * horizon)
    lines += ["", "<!-- part:consistency -->",
              (f"**Time to target**, in simulated time units (a normal step is one unit), median of "
               f"{con['seeds']} seeds. The target of a seed is the mean test log-loss of straggler-free BSP "
               f"between {window} of the {con['horizon']:.0f}-unit horizon ({con['target_logloss']:.4f} on average "
               f"over the seeds; the Bayes log-loss is {con['bayes_logloss']:.4f}); "
               f"measured on {machine}:"), "",
              "| model | " + " | ".join(f"{name} straggler" for name in con["scenarios"]) + " |",
              "|---|" + "---:|" * len(con["scenarios"])]
    names = [r["model"] for r in next(iter(con["scenarios"].values()))]
    for i, name in enumerate(names):
        cells = [_median_time(rows[i]["time_to_target"]) for rows in con["scenarios"].values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    wd = data["wide_deep"]
    ins, proto = wd["insteval"], wd.get("protocol", {})
    lines += ["", "<!-- part:wide-deep -->",
              (f"**Wide & Deep on InstEval** (label: rating ≥ 4; {ins['train']} training ratings, of which "
              f"{ins['valid']} are the validation split that chose each model's settings, then every model "
              f"retrained on all {ins['train']}; {ins['test']} test ratings"
              + (f"; {proto['trials']} random configurations per W&D model, early stopping on validation AUC "
                 f"with patience {proto['patience']}, at most {proto['max_epochs']} epochs; the peer's C over "
                 f"{', '.join(f'{c:g}' for c in proto['c_grid'])}" if proto else "") + "):"), "",
              "| model | chosen settings | validation AUC | test AUC | test log-loss |", "|---|---|---:|---:|---:|"]
    for r in ins["rows"]:
        lines.append(f"| {r['model']} | {_config_text(r)} | {r['valid_auc']:.4f} | {r['auc']:.4f} | "
                     f"{r['logloss']:.4f} |")
    strategies = [ins[k] for k in ("parameter_servers", "mirrored") if k in ins]
    for st in strategies:
        lines.append(f"| {st['model']} | same as joint | | {st['auc']:.4f} | {st['logloss']:.4f} |")
    if strategies:
        lines += ["", "Test AUC minus the single-process joint model's (same batches; only the order of "
                      "floating-point sums differs): " +
                  ", ".join(f"{st['model'].split(', ')[-1]}: {st['auc_minus_local']:+.1e}" for st in strategies) + "."]
    if ins.get("seen_in_training"):
        lines += ["", "Fraction of InstEval test ratings whose value of a column or cross occurs in the training "
                      "split: " + ", ".join(f"{k.replace(' x ', ' × ')} {v:.1%}"
                                            for k, v in ins["seen_in_training"].items()) + "."]
    ck = wd["click_log"]
    lines += ["", (f"**Synthetic click log** ({ck['train']} training examples, {ck['valid']} of them for "
              f"validation, {ck['test']} test; the true model's test AUC {ck['bayes_auc']:.4f} and log-loss "
              f"{ck['bayes_logloss']:.4f}):"), "",
              "| model | chosen settings | validation AUC | test AUC | Bayes AUC − test AUC | "
              "test log-loss − Bayes |", "|---|---|---:|---:|---:|---:|"]
    for r in ck["rows"]:
        lines.append(f"| {r['model']} | {_config_text(r)} | {r['valid_auc']:.4f} | {r['auc']:.4f} | "
                     f"{ck['bayes_auc'] - r['auc']:.4f} | {r['logloss'] - ck['bayes_logloss']:.4f} |")
    lines += ["", f"*Machine:* {machine}."]
    if by_m:
        lines += ["", "<!-- part:collisions-by-buckets -->",
                  (f"**Collisions against the bucket count** ({by_m[0]['values']} distinct values; fraction "
                   f"sharing a bucket; measured on {machine}):"), "",
                  "| buckets m | hash-bucket column | crossed column (all pairs) | polynomial cross | formula |",
                  "|---:|---:|---:|---:|---:|"]
        for c in by_m:
            lines.append(f"| {c['buckets']} | {c['hash_bucket_measured']:.4f} | {c['crossed_pairs_measured']:.4f} | "
                         f"{c['polynomial_cross_measured']:.4f} | {c['birthday_formula']:.4f} |")
    if data.get("collisions"):
        lines += ["", "<!-- part:collisions -->",
                  (f"**Hash-bucket collisions** ({data['collisions'][0]['buckets']} buckets, one draw of n random "
                   "64-bit ids): the fraction of the n values whose bucket holds another of them, and its "
                   "expectation for a uniform hash, 1 − (1 − 1/m)^(n−1), ± one standard deviation of a single "
                   "draw (`expected_collision_rate` in `reference_impl/models/feature_columns.py`); measured on "
                   f"{machine}:"), "",
                  "| distinct values n | measured | expected ± sd | (measured − expected) / sd |",
                  "|---:|---:|---:|---:|"]
        for c in data["collisions"]:
            mean, sd = expected_collision_rate(c["values"], c["buckets"])
            lines.append(f"| {c['values']} | {c['measured']:.4f} | {c['birthday_formula']:.4f} ± {sd:.4f} | "
                         f"{(c['measured'] - mean) / sd:+.1f} |")
    return "\n".join(lines) + "\n"
