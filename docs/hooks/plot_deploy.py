"""Figures of ``deploy.json`` (``python -m benchmarks deploy``).

* ``assets/bench/deploy-sweep-b1.svg``, ``deploy-sweep-b64.svg``: time of ``x @ W`` (1024×1024)
  against density for dense BLAS, the generic CSR kernels and the JIT's kernels, with the
  roofline floors from this machine's measured read bandwidth and GEMM rate;
* ``deploy-mlp.svg``: batch-1 MLP inference time per implementation;
* ``deploy-compile.svg``: compiler CPU time and library size against the number of non-zeros;
* ``deploy-accuracy.svg``: digits test accuracy against sparsity per pruning method.

``<!-- bench:deploy:summary -->`` becomes the tables of speed-ups, crossovers, accuracy and int8.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from plotkit import bad, figure, human_bytes, human_time, machine_line, svg

NAME = "deploy"
LABELS = {
    "dense_blas": "dense BLAS (NumPy @)",
    "csr_scipy": "SciPy CSR",
    "csr_numpy": "our NumPy CSR",
    "bsr_numpy": "our NumPy BSR, 4×4 blocks (block-pruned W)",
    "jit_csr": "JIT: CSR, arrays inlined",
    "jit_bitmask": "JIT: 16-bit masks + packed weights (AVX-512 expand)",
    "jit_dense": "JIT: dense C loop",
    "interpreter": "graph interpreter",
    "jit_c_kernel_only": "JIT → C, the library call alone",
    "numpy": "hand-written NumPy",
    "jit_numpy": "JIT → NumPy source",
    "jit_c": "JIT → C, weights inlined (C entry point)",
    "jit_c_ctypes": "JIT → C, called through ctypes",
    "int8_numpy": "int8, NumPy",
    "int8_c": "int8, C (vpdpbusd with AVX-512 VNNI)",
    "int8_c_portable": "int8, C, portable loops",
    "read_weights_only": "floor: a C loop that only reads the float32 weights",
}
STYLE = {"dense_blas": ("C0", "-"), "csr_scipy": ("C1", "--"), "csr_numpy": ("C2", ":"), "bsr_numpy": ("C8", ":"), "jit_csr": ("C3", "-"),
         "jit_dense": ("C4", "-."), "jit_bitmask": ("C5", "-")}


def _check(path: Path, data: dict[str, Any]) -> None:
    for key in ("mlp", "sweep", "roofline", "accuracy"):
        if not isinstance(data.get(key), dict):
            raise bad(path, f"'{key}' must be an object")
    sw = data["sweep"]
    if not isinstance(sw.get("densities"), list) or not isinstance(sw.get("seconds"), dict):
        raise bad(path, "'sweep' needs 'densities' and 'seconds'")
    for b, series in sw["seconds"].items():
        if "dense_blas" not in series or any(len(v) != len(sw["densities"]) for v in series.values()):
            raise bad(path, f"sweep batch {b}: every series needs one time per density, dense_blas included")
    if not isinstance(data["mlp"].get("seconds"), dict) or "interpreter" not in data["mlp"]["seconds"]:
        raise bad(path, "'mlp.seconds' must give the interpreter's time and the others'")
    rounds = data["mlp"].get("rounds", [])
    if not isinstance(rounds, list) or any(not isinstance(r, dict) or set(r.get("seconds", {})) != set(data["mlp"]["seconds"])
                                           for r in rounds):
        raise bad(path, "'mlp.rounds' must be a list of rounds, each with a time for every implementation")


def _sweep_figure(data: dict[str, Any], batch: str, machine: str) -> bytes:
    sw, roof = data["sweep"], data["roofline"]
    dens = sw["densities"]
    k, n = sw["shape"]
    b = int(batch)
    fig, ax = figure(f"Measured on {machine}")
    for name, times in sw["seconds"][batch].items():
        pts = [(d * 100, t * 1e6) for d, t in zip(dens, times) if t is not None]
        if pts:
            c, ls = STYLE.get(name, ("C5", "-"))
            ax.plot(*zip(*pts), marker="o", ms=3, color=c, ls=ls, label=LABELS.get(name, name))
    unrolled = sw.get("unrolled_seconds", {}).get(batch, {})
    if unrolled:
        pts = sorted((int(nnz) / (k * n) * 100, t * 1e6) for nnz, t in unrolled.items())
        ax.plot(*zip(*pts), marker="*", ms=8, color="C6", ls="-", label="JIT: unrolled, weights as literals")
    bw, peak = roof["read_gb_s"] * 1e9, roof["gemm_gflop_s"] * 1e9
    ax.axhline(4 * k * n / bw * 1e6, color="0.4", lw=0.8, ls="--",
               label="read dense W from DRAM at measured bandwidth (a 4 MiB W may stay in cache)")
    floor = [max(d * k * n * 6 / bw, 2 * d * k * n * b / peak) * 1e6 for d in dens]
    ax.plot([d * 100 for d in dens], floor, color="0.6", lw=0.8, ls=":",
            label="floor: read non-zeros (4 B value + 2 B index), or their FLOPs at GEMM rate")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("density of W (% non-zero, log scale)")
    ax.set_ylabel("µs per x @ W (log scale)")
    ax.set_title(f"x ({b}×{k}) @ W ({k}×{n}), float32, one thread")
    ax.legend(fontsize=7)
    return svg(fig)


def _mlp_label(name: str, m: dict[str, Any]) -> str:
    """The MLP row's label; the int8 C row says whether this CPU ran its VNNI kernel."""
    if name == "int8_c" and m.get("uses_vnni") is False:
        return "int8, C (no AVX-512 VNNI on this CPU: portable loops)"
    return LABELS.get(name, name)


def _mlp_figure(data: dict[str, Any], machine: str) -> bytes:
    m = data["mlp"]
    names = list(m["seconds"])
    fig, ax = figure(f"Measured on {machine}")
    fig.set_size_inches(fig.get_size_inches()[0], 1.6 + 0.42 * len(names))
    ax.barh(range(len(names)), [m["seconds"][k] * 1e6 for k in names], height=0.45,
            color=[f"C{i % 10}" for i in range(len(names))])
    rounds = m.get("rounds", [])
    for r in rounds:
        ax.plot([r["seconds"][k] * 1e6 for k in names], range(len(names)), "k|", ms=7, alpha=0.6)
    # Each bar's name above it, from the left edge: long names need the whole width on a phone.
    ax.set_yticks([])
    for i, k in enumerate(names):
        ax.text(0.005, i - 0.27, _mlp_label(k, m), transform=ax.get_yaxis_transform(), va="bottom", ha="left")
    ax.set_ylim(len(names) - 0.5, -0.9)
    ax.axvline(m["seconds"]["interpreter"] * 1e6 / 10, color="0.3", ls="--", lw=0.8,
               label="10× faster than the interpreter")
    ax.legend()
    ax.set_xscale("log")  # from the int8 NumPy row (hundreds of µs) to the int8 kernel (a few)
    ax.set_xlabel(f"µs per inference, log scale (bars: the median of {len(rounds)} rounds; ticks: every round)"
                  if rounds else "µs per inference, log scale (best of the repeats)")
    ax.set_title(f"MLP {'-'.join(map(str, m['widths']))}, batch {m['batch']}")
    return svg(fig)


FORM_MARKERS = {"unrolled": "o", "csr": "s", "dense": "^", "bitmask": "D"}


def _compile_figure(data: dict[str, Any], machine: str) -> bytes:
    rows = data["sweep"]["compile"]
    fig, ax = figure(f"Measured on {machine}")
    for i, form in enumerate(FORM_MARKERS):
        pts = sorted((r["nnz"], r.get("compiler_cpu_s", r["seconds"])) for r in rows if r["form"] == form)
        if pts:
            ax.plot(*zip(*pts), marker=FORM_MARKERS[form], ls="-", color=f"C{i}", label=f"{form}: compiler CPU time")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("non-zero weights (log scale)")
    ax.set_ylabel("compiler CPU time, s (solid, log scale)")
    ax2 = ax.twinx()
    for i, form in enumerate(FORM_MARKERS):
        pts = sorted((r["nnz"], r["so_bytes"] / 1024) for r in rows if r["form"] == form)
        if pts:
            ax2.plot(*zip(*pts), marker=FORM_MARKERS[form], ls="--", color=f"C{i}", mfc="none",
                     label=f"{form}: library size")
    ax2.set_yscale("log")
    ax2.set_ylabel("shared library size, KiB (dashed, hollow)")
    ax.legend()
    ax2.legend()
    ax.set_title("Cost of generating and compiling a 1024×1024 layer")
    return svg(fig)


def _accuracy_figure(data: dict[str, Any], machine: str) -> bytes:
    a = data["accuracy"]
    s = [x * 100 for x in a["sparsities"]]
    fig, ax = figure(f"Measured on {machine}")
    for i, (method, accs) in enumerate(a["gradual"].items()):
        ax.plot(s, [x * 100 for x in accs], marker="o", color=f"C{i}", label=f"gradual pruning, {method}")
    ax.plot(s, [x * 100 for x in a["one_shot_layer"]], marker="x", color="0.4", ls=":",
            label="one-shot pruning, no retraining")
    ax.axhline(a["dense_accuracy"] * 100, color="k", lw=0.8, label="dense model")
    ax.set_xlabel("sparsity (% of weights zero)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(a.get("task", "digits"), fontsize=9)
    ax.legend(fontsize=7)
    return svg(fig)


def _pct(d: float | None) -> str:
    if d is None:
        return "never (slower at every density)"
    return "at every density measured" if d >= 1.0 else f"{d * 100:.1f} %"


def plot(path: Path, data: dict[str, Any]) -> tuple[dict[str, bytes], str]:
    _check(path, data)
    machine = machine_line(path, data)
    figs = {f"sweep-b{b}": _sweep_figure(data, b, machine) for b in data["sweep"]["seconds"]}
    figs.update(mlp=_mlp_figure(data, machine), compile=_compile_figure(data, machine),
                accuracy=_accuracy_figure(data, machine))
    m, sw, roof, acc = data["mlp"], data["sweep"], data["roofline"], data["accuracy"]
    rounds = m.get("rounds", [])
    title = "**Batch-1 MLP** " + "-".join(map(str, m["widths"]))
    if rounds:
        title += (f", the median of {len(rounds)} rounds (each the best of {data['settings'].get('mlp_repeats')} "
                  "repeats), with the range of the speed-ups over all rounds")
    lines = [title + ":", "",
             "| implementation | time | speed-up over the interpreter |" + (" range over rounds |" if rounds else ""),
             "|---|---:|---:|" + ("---:|" if rounds else "")]
    for k, t in m["seconds"].items():
        spread = [r["speedup_vs_interpreter"][k] for r in rounds]
        lines.append(f"| {_mlp_label(k, m)} | {human_time(t)} | {m['seconds']['interpreter'] / t:.1f}× |"
                     + (f" {min(spread):.1f}–{max(spread):.1f}× |" if rounds else ""))
    if "int8_c" in m["seconds"] and "read_weights_only" in m["seconds"]:
        floor, q8 = m["seconds"]["read_weights_only"], m["seconds"]["int8_c"]
        lines += ["", (f"int8 in C against the float32 floor (reading the {human_bytes(m['weight_bytes'], 3)} of "
                       f"float32 weights once): {floor / q8:.2f}× {'faster' if q8 < floor else 'slower'}; against the "
                       f"JIT's float32 C: {m['seconds']['jit_c'] / q8:.2f}×.")]
    if m.get("report"):
        lines += ["", "Op counts through the JIT's passes for this MLP: " + ", ".join(
            f"{name} {before}→{after}" for name, before, after in m["report"]) + "."]
    lines += ["", "**Where each sparse kernel stops beating dense BLAS** (1024×1024, density at which the "
              "time ratio crosses 1, interpolated between measured densities):", "",
              "| kernel | " + " | ".join(f"batch {b}" for b in sw["crossover_density"]) + " |",
              "|---|" + "---:|" * len(sw["crossover_density"])]
    kernels = sorted({k for v in sw["crossover_density"].values() for k in v})
    for k in kernels:
        lines.append(f"| {LABELS.get(k, k)} | " + " | ".join(_pct(sw["crossover_density"][b].get(k))
                                                             for b in sw["crossover_density"]) + " |")
    unr = sw.get("unrolled_time_ratio_to_dense", {})
    if unr:
        lines += ["", "Unrolled kernels (weights as literals), time as a fraction of dense BLAS: " + "; ".join(
            f"batch {b}: " + ", ".join(f"{nnz} non-zeros {r:.2f}×" for nnz, r in v.items()) for b, v in unr.items())
            + "."]
    lines += ["", f"Roofline of this machine: read bandwidth {roof['read_gb_s']:.1f} GB/s, "
              f"GEMM {roof['gemm_gflop_s']:.1f} GFLOP/s (BLAS threads: {data['settings'].get('blas_threads')}).",
              "", f"**Accuracy vs sparsity** ({acc.get('task', '')}, {acc.get('epochs')} epochs): dense "
              f"{acc['dense_accuracy'] * 100:.1f} %.", "",
              "| sparsity | " + " | ".join(f"gradual, {k}" for k in acc["gradual"]) + " | one-shot, no retraining |",
              "|---:|" + "---:|" * (len(acc["gradual"]) + 1)]
    for i, s in enumerate(acc["sparsities"]):
        lines.append(f"| {s * 100:.0f} % | " + " | ".join(f"{v[i] * 100:.1f} %" for v in acc["gradual"].values())
                     + f" | {acc['one_shot_layer'][i] * 100:.1f} % |")
    q = acc["quantisation"]
    lines += ["", f"**int8 post-training quantisation** (per-channel weights, activations calibrated on "
              f"{q['calibration_samples']} training images): accuracy {q['float32_accuracy'] * 100:.1f} % → "
              f"{q['int8_accuracy'] * 100:.1f} %; weights {human_bytes(q['float32_weight_bytes'], 3)} → "
              f"{human_bytes(q['int8_weight_bytes'], 3)}. Batch-1 speed: see the MLP table (int8 rows).",
              "", f"*Machine:* {machine}. Whole benchmark: {data.get('total_seconds', 0):.0f} s."]
    return figs, "\n".join(lines) + "\n"
