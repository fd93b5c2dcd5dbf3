"""Training at scale, measured: initialisation, warm-up, mixed precision, hyper-parameter search.

``python -m benchmarks training`` runs four experiments and writes one JSON file:

* ``init_depth``: the standard deviation of the activations after each of 50 layers (width
  256, no bias, batch 512 of unit-variance inputs) under each initialiser, for tanh and ReLU;
* ``warmup``: the graph MLP trained on ``synthetic_classification`` for the same number of
  epochs at a small batch with its tuned rate, at a ``k`` times larger batch with the same
  rate, with the linearly scaled rate, and with the scaled rate after a linear warm-up;
* ``mixed_precision``: the underflow demo with and without loss scaling; the classifier in
  float32, in mixed precision with dynamic loss scaling and without any scaling; the peak
  memory (``tracemalloc``, which sees NumPy's buffers) and time of one training step;
* ``search``: grid, random and successive-halving search for AdamW's learning rate and
  weight decay on the same task, repeated over seeds, at equal compute.

BLAS runs single-threaded (the process restarts itself with the thread variables set): the
machine is small and shared, and the figures here are losses, not speeds, except the one
float16/float32 step-time ratio, which is measured in one process, interleaved.
"""
from __future__ import annotations

import statistics
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from .harness import bench_parser, restart_with_blas_threads, write_json
from .machine import machine_info

INITS = {
    "normal(0.05)": ("normal", {"stddev": 0.05}),
    "truncated_normal(0.05)": ("truncated_normal", {"stddev": 0.05}),
    "uniform(±0.05)": ("uniform", {"minval": -0.05, "maxval": 0.05}),
    "glorot_uniform": ("glorot_uniform", {}),
    "glorot_normal": ("glorot_normal", {}),
    "he_uniform": ("he_uniform", {}),
    "he_normal": ("he_normal", {}),
    "orthogonal": ("orthogonal", {}),
}


def init_depth(depth: int, width: int, batch: int, seed: int = 0) -> dict[str, Any]:
    """Per initialiser and activation: the activations' std after each layer."""
    from reference_impl.train.initializers import get_initializer

    x = np.random.default_rng(seed).standard_normal((batch, width))
    out: dict[str, Any] = {}
    for act_name, act in (("tanh", np.tanh), ("relu", lambda h: np.maximum(h, 0))):
        out[act_name] = {}
        for label, (name, kwargs) in INITS.items():
            init = get_initializer(name, seed=seed, **kwargs)
            h, stds = x, []
            for _ in range(depth):
                h = act(h @ init((width, width), "float64"))
                stds.append(float(h.std()))
            out[act_name][label] = stds
    return out


def _task(n: int, seed: int = 1) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Training and validation sets of the classification task every experiment uses."""
    from reference_impl.train.data import synthetic_classification

    x, y = synthetic_classification(n + n // 4, 8, 10, seed=seed)
    return (x[:n], y[:n]), (x[n:], y[n:])


def warmup(n: int, widths: tuple[int, ...], base_batch: int, k: int, base_lr: float, epochs: int,
           warmup_epochs: float) -> dict[str, Any]:
    """Large-batch SGD with and without the linear scaling rule and warm-up, at equal epochs."""
    from reference_impl.train import graph_mlp as gm
    from reference_impl.train import optimizers as opt
    from reference_impl.train import schedules as sch

    train, val = _task(n)
    big = base_batch * k
    scaled = sch.linear_scaling_rule(base_lr, base_batch, big)
    warm_steps = max(1, int(warmup_epochs * n / big))
    runs = {
        f"batch {base_batch}, lr {base_lr:g}": (base_batch, base_lr),
        f"batch {big}, lr {base_lr:g} (not scaled)": (big, base_lr),
        f"batch {big}, lr {scaled:g} (scaled, no warm-up)": (big, scaled),
        f"batch {big}, lr {scaled:g} (scaled, {warm_steps}-step warm-up)": (big, sch.LinearWarmup(scaled, warm_steps)),
    }
    out: dict[str, Any] = {"runs": {}, "warmup_steps": warm_steps, "scaled_lr": scaled}
    for label, (batch, lr) in runs.items():
        steps = epochs * n // batch
        with np.errstate(all="ignore"):  # a diverging run overflows; it is recorded, not hidden
            r = gm.train_classifier(gm.build_classifier(widths, seed=0), gm.train_with(opt.GradientDescent(lr)),
                                    train, steps, batch, eval_data=val)
        epochs_done = [(i + 1) * batch / n for i in range(len(r["losses"]))]
        out["runs"][label] = {"batch": batch, "steps": steps, "epochs": epochs_done, "losses": r["losses"],
                              "val_loss": r["final_loss"], "diverged": r["diverged"]}
        print(f"  warmup: {label}: validation loss {r['final_loss']:.4f}", flush=True)
    return out


def _step_cost(widths: tuple[int, ...], batch: int, dtype: str, repeats: int) -> tuple[int, list[float]]:
    """Peak bytes traced during one training step, and step times, for compute ``dtype``."""
    import reference_impl.graph as g
    from reference_impl.train import graph_mlp as gm
    from reference_impl.train import optimizers as opt

    model = gm.build_classifier(widths, compute_dtype=dtype, seed=0)
    rng = np.random.default_rng(0)
    feed = {model.x: rng.standard_normal((batch, widths[0])).astype(np.float32),
            model.y: rng.integers(0, widths[-1], batch)}
    with model.graph.as_default():
        train = opt.GradientDescent(1e-4).minimize(model.loss)
        init = g.global_variables_initializer()
    sess = g.Session(model.graph)
    sess.run(init)
    sess.run(train, feed)  # compile the plan outside the measurement
    tracemalloc.start()
    sess.run(train, feed)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(train, feed)
        times.append(time.perf_counter() - t0)
    sess.close()
    return peak, times


def mixed_precision(n: int, widths: tuple[int, ...], batch: int, steps: int, mem_batch: int,
                    mem_widths: tuple[int, ...]) -> dict[str, Any]:
    from reference_impl.train import graph_mlp as gm
    from reference_impl.train import mixed_precision as mp
    from reference_impl.train import optimizers as opt

    out: dict[str, Any] = {"underflow": {}}
    for label, scale in (("no loss scaling", 1.0), ("loss scale 2^15", 2.0 ** 15)):
        out["underflow"][label] = mp.underflow_demo(scale, steps=150)
    train, val = _task(n)
    runs: dict[str, Any] = {}
    configs = {"float32": ("float32", None), "mixed, dynamic loss scaling": ("float16", 2.0 ** 15),
               "mixed, no loss scaling": ("float16", 1.0)}
    for label, (dtype, scale) in configs.items():
        model = gm.build_classifier(widths, compute_dtype=dtype, seed=0)
        fetch = {}
        if scale is None:
            make = gm.train_with(opt.Adam(0.003))
        else:
            o = mp.LossScaleOptimizer(opt.Adam(0.003), initial_scale=scale, dynamic=scale > 1, growth_interval=100)
            train_op = o.minimize(model.loss)
            make, fetch = (lambda loss, op=train_op: op), {"loss_scale": o.loss_scale}
        with np.errstate(all="ignore"):  # float16 overflows on purpose while the scale is too large
            r = gm.train_classifier(model, make, train, steps, batch, eval_data=val, fetch=fetch)
        runs[label] = {"losses": r["losses"], "val_loss": r["final_loss"], "loss_scale": r.get("loss_scale")}
        print(f"  mixed precision: {label}: validation loss {r['final_loss']:.4f}", flush=True)
    out["training"] = runs
    cost = {}
    for dtype in ("float32", "float16"):
        peak, times = _step_cost(mem_widths, mem_batch, dtype, 3)
        cost[dtype] = {"peak_bytes": peak, "step_seconds": times}
    out["step_cost"] = cost
    out["memory_ratio"] = cost["float16"]["peak_bytes"] / cost["float32"]["peak_bytes"]
    out["time_ratio"] = statistics.median(cost["float16"]["step_seconds"]) / statistics.median(
        cost["float32"]["step_seconds"])
    print(f"  mixed precision: peak step memory float16/float32 = {out['memory_ratio']:.3f}, "
          f"time ratio {out['time_ratio']:.2f}", flush=True)
    return out


def search(n: int, widths: tuple[int, ...], budget: int, batch: int, seeds: int) -> dict[str, Any]:
    """Grid (3 x 3) vs random (9 trials) vs successive halving at the same total steps."""
    from reference_impl.train import graph_mlp as gm
    from reference_impl.train import hparam_search as hs
    from reference_impl.train import optimizers as opt

    train, val = _task(n)

    def objective(config: dict[str, Any], steps: int) -> float:
        o = opt.AdamW(config["learning_rate"], weight_decay=config["weight_decay"])
        with np.errstate(all="ignore"):
            return gm.train_classifier(gm.build_classifier(widths, seed=0), gm.train_with(o), train, steps, batch,
                                       eval_data=val)["final_loss"]

    lr_range, wd_range = (1e-4, 1.0), (1e-5, 1e-1)
    grid = {"learning_rate": list(np.geomspace(*lr_range, 3)), "weight_decay": list(np.geomspace(*wd_range, 3))}
    space = {"learning_rate": hs.LogUniform(*lr_range), "weight_decay": hs.LogUniform(*wd_range)}
    as_dicts = lambda trials: [{"config": t.config, "budget": t.budget, "loss": t.loss} for t in trials]  # noqa: E731
    grid_trials = hs.grid_search(grid, objective, budget)
    print(f"  search: grid best {hs.best(grid_trials).loss:.4f}", flush=True)
    out: dict[str, Any] = {"budget_per_trial": budget, "grid": as_dicts(grid_trials), "random": [], "halving": []}
    n_configs, eta = 27, 3
    min_budget = max(1, round(9 * budget / (n_configs * 4)))  # 4 rungs of equal cost: 9 full trials in all
    for seed in range(seeds):
        rand = hs.random_search(space, objective, 9, budget, seed=seed)
        halving = hs.successive_halving(space, objective, n_configs, min_budget, eta, seed=seed)
        out["random"].append(as_dicts(rand))
        out["halving"].append(as_dicts(halving))
        print(f"  search seed {seed}: random best {hs.best(rand).loss:.4f}, halving winner "
              f"{halving[-1].loss:.4f} ({hs.total_budget(halving)} steps vs {9 * budget})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("training", __doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test (minutes -> seconds)")
    parser.add_argument("--seeds", type=int, default=8, help="repetitions of random search and halving")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("need --seeds >= 1")
    restart_with_blas_threads("training", argv)  # CPU time measures the work only on one BLAS thread

    q = args.quick
    settings = {
        "init": {"depth": 50, "width": 64 if q else 256, "batch": 64 if q else 512},
        "warmup": {"n": 2048 if q else 16384, "widths": [8, 64, 64, 64, 10], "base_batch": 32, "k": 32,
                   "base_lr": 0.05, "epochs": 1 if q else 4, "warmup_epochs": 1.0},
        "mixed_precision": {"n": 2048 if q else 8192, "widths": [8, 64, 64, 10], "batch": 64,
                            "steps": 40 if q else 600, "mem_batch": 128 if q else 512,
                            "mem_widths": [8, 128, 128, 10] if q else [8, 256, 256, 10]},
        "search": {"n": 2048 if q else 8192, "widths": [8, 64, 64, 10], "budget": 12 if q else 60, "batch": 64,
                   "seeds": 1 if q else args.seeds},
    }
    started = time.time()
    print("init_depth ...", flush=True)
    document: dict[str, Any] = {
        "benchmark": "training",
        "machine": machine_info(mpi_library="not used (single process)"),
        "settings": {**settings, "blas_threads": 1, "quick": q},
        "init_depth": init_depth(**settings["init"]),
    }
    print("warmup ...", flush=True)
    document["warmup"] = warmup(**{**settings["warmup"], "widths": tuple(settings["warmup"]["widths"])})
    print("mixed precision ...", flush=True)
    mp_settings = settings["mixed_precision"]
    document["mixed_precision"] = mixed_precision(
        **{**mp_settings, "widths": tuple(mp_settings["widths"]), "mem_widths": tuple(mp_settings["mem_widths"])})
    print("search ...", flush=True)
    document["search"] = search(**{**settings["search"], "widths": tuple(settings["search"]["widths"])})
    document["seconds"] = time.time() - started
    write_json(args.out, document)
    print(f"wrote {args.out} in {document['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
