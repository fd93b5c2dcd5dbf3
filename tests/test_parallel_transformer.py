"""The NumPy GPT of reference_impl/parallel/transformer.py, its corpus and its Adam.

Gradients against central finite differences (float64, every parameter, sampled entries),
causality, recomputation giving bit-identical gradients, the per-layer structure a ZeRO-3
trainer relies on, float32, and a few Adam steps lowering the loss on the docstring corpus."""
import numpy as np
import pytest

from reference_impl.parallel import corpus
from reference_impl.parallel import transformer as tf
from reference_impl.parallel.adam import Adam

TINY = tf.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)


def _perturbed_params(config, seed=1, dtype=np.float64):
    """Initial parameters plus noise, so LayerNorm gains and biases are not all 1 and 0."""
    params = tf.init_params(config, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    return {k: (v + 0.1 * rng.standard_normal(v.shape)).astype(dtype) for k, v in params.items()}


def _batch(config, B, T, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, config.vocab_size, (B, T)), rng.integers(0, config.vocab_size, (B, T))


@pytest.mark.parametrize("activation", tf.ACTIVATIONS)
def test_gradients_match_finite_differences(activation):
    config = tf.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, activation=activation)
    params = _perturbed_params(config)
    tokens, targets = _batch(config, 2, 6)
    tokens[0, :3] = tokens[1, :3] = 4  # a repeated token: wte's gradient sums over occurrences
    _, grads = tf.loss_and_grads(params, tokens, targets, config)
    assert set(grads) == set(params) == set(tf.param_shapes(config))
    rng = np.random.default_rng(7)
    h = 1e-5
    for name, p in params.items():
        assert grads[name].shape == p.shape and grads[name].dtype == np.float64, name
        entries = {tuple(int(rng.integers(0, s)) for s in p.shape) for _ in range(4)}
        if name == "wte.weight":
            entries.add((4, 0))  # a row that is both an input token and an output class
        for idx in entries:
            old = p[idx]
            p[idx] = old + h
            up, _ = tf.forward(params, tokens, targets, config)
            p[idx] = old - h
            down, _ = tf.forward(params, tokens, targets, config)
            p[idx] = old
            numeric = (up - down) / (2 * h)
            assert grads[name][idx] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (name, idx)


def test_causal_mask_future_tokens_do_not_change_earlier_logits():
    config = tf.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)
    params = _perturbed_params(config)
    tokens, _ = _batch(config, 2, 8)
    before = tf.logits(params, tokens, config)
    t = 5
    changed = tokens.copy()
    changed[:, t] = (changed[:, t] + 3) % config.vocab_size
    after = tf.logits(params, changed, config)
    np.testing.assert_allclose(after[:, :t], before[:, :t], rtol=0, atol=1e-12)
    assert np.abs(after[:, t:] - before[:, t:]).max() > 1e-3


def test_recomputation_gives_identical_gradients_and_keeps_only_block_inputs():
    params = _perturbed_params(TINY)
    tokens, targets = _batch(TINY, 3, 7)
    loss, grads = tf.loss_and_grads(params, tokens, targets, TINY)
    loss_rc, cache = tf.forward(params, tokens, targets, TINY, keep="inputs")
    assert all(isinstance(x, np.ndarray) and x.shape == (3, 7, TINY.n_embd) for x in cache["blocks"])
    grads_rc = tf.backward(params, cache, TINY)
    assert loss_rc == loss
    for name in grads:
        assert np.array_equal(grads_rc[name], grads[name]), name


def test_recomputation_costs_one_more_forward_of_every_block():
    config = tf.GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=64)
    plain = tf.step_flops(config, 8, 64)
    rc = tf.step_flops(config, 8, 64, recompute=True)
    block = 24 * 512 * 64 * 64 + 4 * 8 * 64 * 64 * 64
    assert plain["forward"] == 4 * block + 2 * 512 * 64 * 96
    assert plain["total"] == 3 * plain["forward"] and plain["recompute"] == 0
    assert rc["total"] - plain["total"] == rc["recompute"] == 4 * block
    assert 1.3 < rc["total"] / plain["total"] < 1.34


def test_layers_own_every_parameter_once_and_backward_yields_them_complete():
    config = tf.GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=8)
    layers = tf.layers(config)
    assert [l.name for l in layers] == ["embed", "h.0", "h.1", "h.2", "head"]
    owned = [n for l in layers for n in l.owns]
    assert sorted(owned) == sorted(tf.param_shapes(config)) and len(owned) == len(set(owned))
    assert "wte.weight" in layers[-1].uses and "wte.weight" not in layers[-1].owns
    assert tf.n_params(config) == sum(p.size for p in tf.init_params(config).values())
    params = _perturbed_params(config)
    tokens, targets = _batch(config, 2, 5)
    _, reference = tf.loss_and_grads(params, tokens, targets, config)
    _, cache = tf.forward(params, tokens, targets, config)
    order = []
    by_name = {l.name: l for l in layers}
    for name, grads in tf.backward_layers(params, cache, config):
        order.append(name)
        assert set(grads) == set(by_name[name].owns)
        for k, g in grads.items():
            assert np.array_equal(g, reference[k])
    assert order == ["head", "h.2", "h.1", "h.0", "embed"]
    assert cache["blocks"] == []  # consumed as it went


def test_block_functions_need_only_their_layers_parameters():
    """What ZeRO-3 relies on: a block runs on a dict holding just that block's gathered parameters."""
    params = _perturbed_params(TINY)
    x = np.random.default_rng(0).standard_normal((2, 5, TINY.n_embd))
    layer = tf.layers(TINY)[2]
    only = {n: params[n] for n in layer.uses}
    out_full, _ = tf.block_forward(params, 1, x, TINY)
    out_only, cache = tf.block_forward(only, 1, x, TINY)
    assert np.array_equal(out_full, out_only)
    _, grads = tf.block_backward(only, 1, np.ones_like(x), cache, TINY)
    assert set(grads) == set(layer.owns)


def test_float32_keeps_its_dtype():
    params = tf.init_params(TINY, seed=0, dtype=np.float32)
    tokens, targets = _batch(TINY, 2, 8)
    loss, grads = tf.loss_and_grads(params, tokens, targets, TINY)
    assert np.isfinite(loss) and abs(loss - np.log(TINY.vocab_size)) < 0.1  # small init: near uniform
    assert all(g.dtype == np.float32 for g in grads.values())
    _, cache = tf.forward(params, tokens, targets, TINY)
    assert all(a.dtype == np.float32 for blk in cache["blocks"] for a in blk.values())
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    loss64, grads64 = tf.loss_and_grads(p64, tokens, targets, TINY)
    assert loss == pytest.approx(loss64, rel=1e-5)
    for k in grads:
        np.testing.assert_allclose(grads[k], grads64[k], rtol=1e-3, atol=1e-6)


def test_config_and_input_checks():
    with pytest.raises(ValueError, match="divisible"):
        tf.GPTConfig(n_embd=10, n_head=4)
    with pytest.raises(ValueError, match="activation"):
        tf.GPTConfig(activation="relu")
    params = tf.init_params(TINY)
    tokens, targets = _batch(TINY, 1, 9)
    with pytest.raises(ValueError, match="block_size"):
        tf.forward(params, tokens, targets, TINY)
    with pytest.raises(ValueError, match="keep"):
        tf.forward(params, tokens[:, :4], targets[:, :4], TINY, keep="some")


# ------------------------------------------------------------------ corpus
def test_corpus_is_deterministic_and_covered_by_the_vocabulary():
    text = corpus.text()
    assert len(text) > 100_000
    assert set(text) <= set(corpus.VOCAB) and len(corpus.VOCAB) == 96
    assert corpus.decode(corpus.encode(text[:5000])) == text[:5000]
    corpus.text.cache_clear()
    assert corpus.text() == text  # rebuilt from the modules: the same bytes
    a = corpus.get_batch(corpus.data(), 4, 32, np.random.default_rng(3))
    b = corpus.get_batch(corpus.data(), 4, 32, np.random.default_rng(3))
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    x, y = a
    assert x.shape == y.shape == (4, 32) and np.array_equal(x[:, 1:], y[:, :-1])
    train, val = corpus.split()
    assert len(train) + len(val) == len(corpus.data())


def test_the_corpus_does_not_depend_on_what_else_is_imported():
    """Importing PyTorch replaces ``inspect.getfile``; the corpus (and every loss measured on it)
    is the same in a process that imported PyTorch first and in one that imported nothing else."""
    import subprocess
    import sys

    program = "{}\nfrom reference_impl.parallel import corpus\nprint(corpus.corpus_digest())"
    digests = [subprocess.run([sys.executable, "-c", program.format(first)], capture_output=True, text=True,
                              timeout=120, check=True).stdout.strip() for first in ("", "import torch")]
    assert digests[0] == digests[1] == corpus.corpus_digest(), digests


def test_a_few_adam_steps_lower_the_loss_on_the_corpus():
    config = tf.GPTConfig(vocab_size=len(corpus.VOCAB), block_size=32, n_layer=2, n_head=4, n_embd=32)
    params = tf.init_params(config, seed=0, dtype=np.float32)
    train, val = corpus.split()
    held_out = corpus.get_batch(val, 16, 32, np.random.default_rng(1))
    start, _ = tf.forward(params, *held_out, config)
    opt = Adam(lr=3e-3)
    rng = np.random.default_rng(0)
    for _ in range(40):
        _, grads = tf.loss_and_grads(params, *corpus.get_batch(train, 16, 32, rng), config)
        opt.step(params, grads)
    end, _ = tf.forward(params, *held_out, config)
    assert opt.t == 40 and all(p.dtype == np.float32 for p in params.values())
    assert end < start - 0.5, (start, end)  # log(96) = 4.56 at the start
