"""Around the model: the input pipeline and the Estimator, measured: ``python -m benchmarks training_loop``.

Two experiments, one JSON file (``bench-results/training_loop.json``; with ``--publish``, the
site's ``docs/assets/bench/training_loop.json``):

* ``input``: a training loop whose input stage takes ``X`` per batch and whose step takes
  ``Y`` (both timed inside the serial loop), fed by ``reference_impl.train.dataset``
  pipelines: serial (``map`` only), with ``prefetch``, and with a parallel map (``workers``
  shards, each mapped and prefetched on its own thread, read round-robin: how
  ``map(num_parallel_calls=k)`` works, built from the Dataset's own ``shard``, ``map`` and
  ``prefetch``) plus ``prefetch``. Steps per second are compared with the ideals computed
  from ``X`` and ``Y`` measured in the same run: ``1/(X+Y)`` serial, ``1/max(X,Y)`` with
  one producer, ``1/max(X/k,Y)`` with ``k``.
  The *wait* sweep models both stages as waits that release the GIL (``time.sleep``: a
  file read, a step on an accelerator) over several ratios ``X/Y``; the *parse* case makes
  the input stage real Python work that holds the GIL (``RecordParser`` on JSON lines).
* ``estimator``: the digits MLP with Adam trained for the same steps by a hand-written
  ``Session`` loop and by ``Estimator`` with a checkpoint every step, every 10 steps or
  only at the end, and in the ``train_and_evaluate`` pattern (``train(steps=k)`` then
  ``evaluate()``, repeated); and resumption: a run split in two ``train`` calls by separate
  Estimators, compared variable by variable with an uninterrupted run, with and without
  the input fast-forwarded to the resumed step.

Timings are wall-clock seconds on a machine that may be shared: the ratios are against a
peer measured in the same run, the configurations interleaved repeat by repeat, and each
reports the median of its repeats (the input pipelines, compared with ideals from median
stage times) or its best repeat (the Estimator's runs, as ``timeit`` does: other processes
only ever slow a run down).
"""
from __future__ import annotations

import gc
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .harness import bench_parser, write_json
from .machine import machine_info

_DONE = object()


# ------------------------------------------------------------------ the input pipeline

def parallel_map(ds: Any, fn: Callable[[Any], Any], workers: int, buffer: int = 2) -> Any:
    """``ds.map(fn)`` with ``workers`` calls of ``fn`` in flight, in the original order.

    Worker ``i`` maps the record-level shard ``i`` of ``ds`` on its own prefetch thread; the
    result reads the workers round-robin, which restores the order (shard ``i`` holds
    elements ``i, i + workers, ...``).
    """
    from reference_impl.train.dataset import Dataset

    def interleaved() -> Iterator[Any]:
        shards = [iter(ds.shard(workers, i).map(fn).prefetch(buffer)) for i in range(workers)]
        try:
            for it in itertools.cycle(shards):
                e = next(it, _DONE)
                if e is _DONE:
                    return  # the shard after the last element is the first to run dry
                yield e
        finally:
            for it in shards:
                it.close()  # stops that shard's prefetch thread

    return Dataset(interleaved)


def pipelines(source: Any, load: Callable[[Any], Any]) -> dict[str, Any]:
    """The four input pipelines compared, each a ``Dataset`` of loaded batches."""
    return {
        "serial": source.map(load),
        "prefetch": source.map(load).prefetch(2),
        "parallel map ×2 + prefetch": parallel_map(source, load, 2).prefetch(2),
        "parallel map ×4 + prefetch": parallel_map(source, load, 4).prefetch(2),
    }


WORKERS = {"serial": 0, "prefetch": 1, "parallel map ×2 + prefetch": 2, "parallel map ×4 + prefetch": 4}


def ideal_rate(workers: int, x: float, y: float) -> float:
    """Steps per second with no overhead: stages in series, or overlapped with ``workers`` producers."""
    return 1 / (x + y) if workers == 0 else 1 / max(x / workers, y)


def steps_per_second(ds: Any, step: Callable[[Any], None], steps: int) -> float:
    """Steady-state rate of a loop over ``ds``: the first step (pipeline start-up) is not counted.

    Returns only when the pipeline's threads have ended, so that none of them still holds
    the GIL while the next pipeline is measured.
    """
    threads_before = threading.active_count()
    it = iter(ds)
    try:
        step(next(it))
        t0 = time.perf_counter()
        done = 0
        for batch in itertools.islice(it, steps - 1):
            step(batch)
            done += 1
        elapsed = time.perf_counter() - t0
    finally:
        it.close()  # a generator: asks the pipeline's threads to stop
        deadline = time.perf_counter() + 30
        while threading.active_count() > threads_before and time.perf_counter() < deadline:
            gc.collect()  # a shard's generator, dropped by its stopped reader, closes when collected
            time.sleep(0.005)
    if done != steps - 1:
        raise RuntimeError(f"input pipeline ran dry after {done + 1} of {steps} steps")
    return done / elapsed


def _min_time(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls: the time without interference from other processes."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _timed(fn: Callable[[Any], Any], log: list[float]) -> Callable[[Any], Any]:
    """``fn`` that appends the seconds of every call to ``log``."""
    def timed(arg: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(arg)
        log.append(time.perf_counter() - t0)
        return out
    return timed


def _measure(load: Callable[[Any], Any], compute: Callable[[Any], None], steps: int, repeats: int) -> dict[str, Any]:
    """Each pipeline's steady-state steps/s, and X and Y: medians over interleaved repeats.

    X and Y are the times of the input stage and of the step *inside the serial loop*,
    where nothing else runs, in the same repeats as the other pipelines (the machine may be
    shared, so a separate calibration could see a different machine).
    """
    from reference_impl.train.dataset import Dataset

    xs: list[float] = []
    ys: list[float] = []
    rates: dict[str, list[float]] = {name: [] for name in WORKERS}
    source = Dataset.from_arrays(np.arange(steps))
    for _ in range(repeats):
        for name in WORKERS:
            serial = name == "serial"
            ds = pipelines(source, _timed(load, xs) if serial else load)[name]
            rates[name].append(steps_per_second(ds, _timed(compute, ys) if serial else compute, steps))
    x, y = statistics.median(xs), statistics.median(ys)
    return {"input_s": x, "step_s": y,
            "pipelines": {name: {"workers": WORKERS[name], "steps_per_s": statistics.median(r), "runs": r,
                                 "ideal_steps_per_s": ideal_rate(WORKERS[name], x, y)}
                          for name, r in rates.items()}}


def _json_lines(n: int, seed: int = 0) -> list[str]:
    """``n`` JSON-lines records of mixed types, as the input-pipelines page parses."""
    rng = np.random.default_rng(seed)
    return [json.dumps({"id": int(i), "price": float(rng.normal()), "active": bool(i % 2), "name": f"item{i}",
                        "scores": [float(v) for v in rng.normal(size=8)]}) for i in range(n)]


def input_experiment(step_ms: float, ratios: list[float], steps: int, repeats: int, parse_ratio: float,
                     parse_repeats: int) -> dict[str, Any]:
    from reference_impl.train.records import Field, RecordParser

    y = step_ms / 1e3
    def compute(batch: Any) -> None:
        time.sleep(y)  # the accelerator's step: the CPU waits

    out: dict[str, Any] = {"wait": []}
    for ratio in ratios:
        x = ratio * y
        row = _measure(lambda i, x=x: (time.sleep(x), i)[1], compute, steps, repeats)
        out["wait"].append({"ratio": ratio, **row})
        print(f"  wait X/Y={ratio:g}: " + ", ".join(f"{k} {v['steps_per_s']:.1f}/s (ideal {v['ideal_steps_per_s']:.1f})"
                                                    for k, v in row["pipelines"].items()), flush=True)
    schema = [Field("id", "int"), Field("price", "float"), Field("active", "bool"), Field("name", "str"),
              Field("scores", "floats")]
    with tempfile.TemporaryDirectory() as tmp:
        parser = RecordParser(schema, Path(tmp) / "rejects.jsonl")
        lines = _json_lines(200)
        for _ in range(3):  # scale the batch until parsing it takes about parse_ratio * Y, uncontended
            took = _min_time(lambda lines=lines: [parser.parse_line(t, "jsonl") for t in lines], 5)
            lines = _json_lines(max(1, round(len(lines) * parse_ratio * y / took)))

        def parse(i: Any) -> dict[str, np.ndarray]:
            records = [parser.parse_line(t, "jsonl") for t in lines]
            return {"price": np.array([r["price"] for r in records], np.float32),
                    "scores": np.array([r["scores"] for r in records], np.float32)}

        row = _measure(parse, compute, steps, parse_repeats)  # CPU-bound: more repeats against noise
    out["parse"] = {"lines_per_batch": len(lines), **row}
    print(f"  parse ({len(lines)} lines, X={row['input_s'] * 1e3:.1f} ms): " + ", ".join(
        f"{k} {v['steps_per_s']:.1f}/s (ideal {v['ideal_steps_per_s']:.1f})" for k, v in row["pipelines"].items()),
        flush=True)
    return out


# ------------------------------------------------------------------ the Estimator

def _model_fn(widths: tuple[int, ...], learning_rate: float) -> Callable:
    import reference_impl.graph as g
    from reference_impl.train.estimator import PREDICT, EstimatorSpec
    from reference_impl.train.initializers import Zeros, get_initializer, variable
    from reference_impl.train.optimizers import Adam

    def model_fn(features: dict, labels: Any, mode: str, params: dict) -> EstimatorSpec:
        init = get_initializer("he_normal", seed=0)  # same draws on every rebuild
        h = features["x"]
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
            h = g.matmul(h, variable(init, (fan_in, fan_out), name=f"dense{i}/kernel")) + variable(
                Zeros(), (fan_out,), name=f"dense{i}/bias")
            if i < len(widths) - 2:
                h = g.relu(h)
        if mode == PREDICT:
            return EstimatorSpec(predictions={"logits": h})
        loss = g.reduce_mean(g.sparse_softmax_cross_entropy(labels, h))
        return EstimatorSpec(loss=loss, optimizer=Adam(learning_rate))

    return model_fn


def _input_fn(x: np.ndarray, y: np.ndarray, batch: int, fast_forward: bool = True) -> Callable:
    from reference_impl.train.dataset import Dataset

    def input_fn(ctx: Any) -> Any:
        ds = (Dataset.from_arrays(x, y).shuffle(256, seed=0).repeat().shard(ctx.num_workers, ctx.worker_index)
              .batch(batch).map(lambda b: ({"x": b[0]}, b[1])))
        return ds.skip(ctx.start_step) if fast_forward else ds

    return input_fn


def _hand_written(model_fn: Callable, input_fn: Callable, steps: int) -> float:
    """Seconds for ``steps`` steps of the same model, optimiser and input in one Session, built included."""
    import reference_impl.graph as g
    from reference_impl.train.estimator import TRAIN, InputContext

    t0 = time.perf_counter()
    graph = g.Graph()
    with graph.as_default():
        xs = g.placeholder("float32", [None, 64], name="x")
        ys = g.placeholder("int64", [None], name="y")
        spec = model_fn({"x": xs}, ys, TRAIN, {})
        train_op = spec.optimizer.minimize(spec.loss)
        init = g.global_variables_initializer()
    with g.Session(graph) as sess:
        sess.run(init)
        for features, labels in itertools.islice(input_fn(InputContext()), steps):
            sess.run([spec.loss, train_op], {xs: features["x"], ys: labels})
    return time.perf_counter() - t0


def estimator_experiment(steps: int, batch: int, save_every: list[int], eval_every: list[int], repeats: int
                         ) -> dict[str, Any]:
    from reference_impl.train.checkpoint import load_checkpoint
    from reference_impl.train.estimator import Estimator

    from .optimizers import digits_splits

    data = digits_splits()
    model_fn = _model_fn((64, 64, 10), 0.003)
    train_fn, val_fn = _input_fn(*data["train"], batch), _input_fn(*data["val"], batch)

    def finite_val(ctx: Any) -> Any:
        return itertools.islice(val_fn(ctx), len(data["val"][0]) // batch)

    def estimator(save: int, eval_k: int | None) -> Callable[[], float]:
        def run() -> float:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                est = Estimator(model_fn, tmp, save_checkpoints_steps=save, progress=False)
                if eval_k is None:
                    est.train(train_fn, max_steps=steps)
                else:
                    for done in range(eval_k, steps + 1, eval_k):
                        est.train(train_fn, max_steps=done)
                        est.evaluate(finite_val)
                return time.perf_counter() - t0
        return run

    configs: dict[str, Callable[[], float]] = {"hand-written Session loop": lambda: _hand_written(model_fn, train_fn,
                                                                                                  steps)}
    for k in save_every:
        every = "one checkpoint at the end" if k >= steps else "checkpoint every step" if k == 1 else \
            f"checkpoint every {k} steps"
        configs[f"Estimator, {every}"] = estimator(k, None)
    for k in eval_every:
        configs[f"train_and_evaluate, evaluate every {k} steps"] = estimator(steps, k)
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(repeats):  # interleaved, so every configuration sees the same machine
        for name, run in configs.items():
            seconds[name].append(run())
    base = min(seconds["hand-written Session loop"])
    timing = {name: {"seconds": s, "steps_per_s": steps / min(s), "time_vs_hand_written": min(s) / base}
              for name, s in seconds.items()}
    for name, row in timing.items():
        print(f"  {name}: {row['steps_per_s']:.0f} steps/s, {row['time_vs_hand_written']:.2f}x", flush=True)

    resume: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        Estimator(model_fn, f"{tmp}/whole", save_checkpoints_steps=steps, progress=False).train(train_fn,
                                                                                                max_steps=steps)
        whole, _ = load_checkpoint(f"{tmp}/whole")
        for label, fast_forward in (("input fast-forwarded", True), ("input restarted", False)):
            fn = _input_fn(*data["train"], batch, fast_forward)
            Estimator(model_fn, f"{tmp}/{label}", save_checkpoints_steps=steps, progress=False).train(
                fn, max_steps=steps // 2)
            Estimator(model_fn, f"{tmp}/{label}", save_checkpoints_steps=steps, progress=False).train(
                fn, max_steps=steps)
            split, step = load_checkpoint(f"{tmp}/{label}")
            weights = [k for k in whole if "Adam" not in k]  # not the optimiser's slots and step counter
            resume[label] = {"step": step, "variables": len(whole),
                             "bit_identical": all(np.array_equal(split[k], whole[k]) for k in whole),
                             "max_abs_diff": max(float(np.max(np.abs(split[k].astype(np.float64) - whole[k])))
                                                 for k in weights),
                             "max_weight": max(float(np.max(np.abs(whole[k]))) for k in weights)}
            print(f"  resume at step {steps // 2}, {label}: bit-identical {resume[label]['bit_identical']}, "
                  f"max |weight diff| {resume[label]['max_abs_diff']:.3g} (largest weight "
                  f"{resume[label]['max_weight']:.3g})", flush=True)
    return {"timing": timing, "resume": resume}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = bench_parser("training_loop", __doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test (seconds)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="interleaved repeats of the CPU-bound cases (parsing, Estimator); the waits use 3")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    q = args.quick
    settings = {
        "input": {"step_ms": 4.0 if q else 10.0, "ratios": [0.5, 2.0] if q else [0.5, 1.0, 2.0, 4.0],
                  "steps": 8 if q else 40, "repeats": 1 if q else 3, "parse_ratio": 3.0,
                  "parse_repeats": 1 if q else args.repeats},
        "estimator": {"steps": 20 if q else 200, "batch": 32, "save_every": [10] if q else [200, 10, 1],
                      "eval_every": [10] if q else [50, 10], "repeats": 1 if q else args.repeats},
        "quick": q,
    }
    started = time.time()
    print("input pipeline ...", flush=True)
    document: dict[str, Any] = {
        "benchmark": "training_loop",
        "machine": machine_info(mpi_library="not used (single process)"),
        "settings": settings,
        "input": input_experiment(**settings["input"]),
    }
    print("estimator ...", flush=True)
    document["estimator"] = estimator_experiment(**settings["estimator"])
    document["seconds"] = time.time() - started
    write_json(args.out, document)
    print(f"wrote {args.out} in {document['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
