"""Memory accounting of reference_impl/parallel/memory.py against the arrays that really exist.

* the ZeRO paper's published per-device numbers (Ψ = 7.5B, N_d = 64, K = 12);
* the activation count equals the bytes of the cache ``transformer.forward`` returns;
* the predicted peak of a float32 training step (forward, backward, Adam) is within 10% of
  the peak ``tracemalloc`` measures, for configurations varying layers, width, heads, batch
  and sequence, with and without recomputation (parameters and Adam state are allocated
  before tracing starts, so both sides count gradients, activations and temporaries)."""
import numpy as np
import pytest

from reference_impl.parallel import memory as mm
from reference_impl.parallel import transformer as tf


def test_zero_paper_figure_1_numbers():
    gb = {k: round(v / 1e9, 1) for k, v in mm.zero_paper_memory(7.5e9, 64, k=12).items()}
    assert gb == {"baseline": 120.0, "P_os": 31.4, "P_os+g": 16.6, "P_os+g+p": 1.9}
    assert mm.optimizer_k("adam", "fp16") == mm.optimizer_k("adam", "bf16") == 12


def test_breakdown_model_states_follow_the_zero_stages():
    config = tf.GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=64)
    psi = tf.n_params(config)
    parts = [mm.memory_breakdown(config, "adam", "bf16", 8, 64, stage=s, ranks=8) for s in range(4)]
    states = [(b.parameters, b.gradients, b.optimizer_state) for b in parts]
    assert states == [(2 * psi, 2 * psi, 12 * psi), (2 * psi, 2 * psi, 12 * psi / 8),
                      (2 * psi, 2 * psi / 8, 12 * psi / 8), (2 * psi / 8, 2 * psi / 8, 12 * psi / 8)]
    assert len({b.activations for b in parts}) == 1  # ZeRO-DP does not shard activations
    assert parts[0].peak > parts[1].peak and parts[1].peak <= parts[1].total
    fp32 = mm.memory_breakdown(config, "adam", "fp32", 8, 64)
    assert (fp32.parameters, fp32.gradients, fp32.optimizer_state) == (4 * psi, 4 * psi, 8 * psi)
    rc = mm.memory_breakdown(config, "adam", "fp32", 8, 64, recompute=True)
    assert rc.activations < fp32.activations / 3


@pytest.mark.parametrize("keep", tf.KEEP)
def test_activation_count_is_the_cache_forward_keeps(keep):
    config = tf.GPTConfig(vocab_size=96, block_size=32, n_layer=3, n_head=4, n_embd=32)
    params = tf.init_params(config, dtype=np.float32)
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 96, (2, 24)), rng.integers(0, 96, (2, 24))
    _, cache = tf.forward(params, tokens, targets, config, keep=keep)
    blocks = [sum(a.nbytes for a in b.values()) if keep == "all" else b.nbytes for b in cache["blocks"]]
    head = sum(a.nbytes for k, a in cache["head"].items() if k != "targets")
    if keep == "all":
        assert blocks == [4 * mm.block_cache_elements(config, 2, 24)] * 3
    assert sum(blocks) + head == 4 * mm.activation_elements(config, 2, 24, recompute=keep == "inputs")


@pytest.mark.parametrize("recompute", [False, True], ids=["stored", "recomputed"])
@pytest.mark.parametrize("case", range(len(mm.VALIDATION_CONFIGS)))
def test_predicted_step_peak_within_10_percent_of_tracemalloc(case, recompute):
    config, batch, seq = mm.VALIDATION_CONFIGS[case]
    r = mm.compare(config, batch, seq, recompute=recompute)
    assert 0.9 < r["ratio"] < 1.1, r
    persistent = 4 * tf.n_params(config) * 3  # parameters, m, v in float32
    assert r["persistent"] == persistent
    bd = mm.memory_breakdown(config, "adam", "fp32", batch, seq, recompute=recompute)
    assert bd.peak == pytest.approx(persistent + r["predicted"])


def test_recomputation_lowers_the_measured_peak():
    config, batch, seq = mm.VALIDATION_CONFIGS[1]
    stored = mm.measure_peak_bytes(config, batch, seq)["peak"]
    recomputed = mm.measure_peak_bytes(config, batch, seq, recompute=True)["peak"]
    assert recomputed < 0.5 * stored
