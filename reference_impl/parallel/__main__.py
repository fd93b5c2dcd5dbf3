"""``python -m reference_impl.parallel [repeats]``: the memory model's validation table and recomputation's cost.

For every ``memory.VALIDATION_CONFIGS`` entry, with and without recomputation: the predicted
peak of one float32 training step (``memory.step_peak_elements``, gradients + activations +
temporaries) next to the peak ``tracemalloc`` measures (``memory.measure_peak_bytes``), then
recomputation's FLOPs, median step time over ``repeats`` steps (default 9) and peak, against
storing every block's cache. BLAS runs on one thread, so timings are single-core.
"""
import sys

from threadpoolctl import threadpool_limits

from .memory import VALIDATION_CONFIGS, compare, recompute_cost

repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 9
with threadpool_limits(limits=1, user_api="blas"):
    for cfg, b, s in VALIDATION_CONFIGS:
        for rc in (False, True):
            r = compare(cfg, b, s, recompute=rc)
            print(f"L={cfg.n_layer} C={cfg.n_embd} heads={cfg.n_head} B={b} T={s} recompute={rc!s:5}: "
                  f"predicted {r['predicted'] / 2**20:7.3f} MiB, measured {r['measured'] / 2**20:7.3f} MiB, "
                  f"ratio {r['ratio']:.4f} ({r['phase']})")
    for cfg, b, s in VALIDATION_CONFIGS[1:3]:
        r = recompute_cost(cfg, b, s, repeats=repeats)
        print(f"recompute on L={cfg.n_layer} C={cfg.n_embd} B={b} T={s}: FLOPs x{r['flops_ratio']:.3f}, "
              f"median time x{r['time_ratio']:.3f} "
              f"({r['seconds'] * 1e3:.1f} -> {r['seconds_recompute'] * 1e3:.1f} ms), "
              f"peak x{r['peak_ratio']:.3f}")
