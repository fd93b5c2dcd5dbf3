"""The parameter servers' update rules and the tensor-parallel MLP are array-API code: on
``array_api_strict`` and on PyTorch CPU tensors (through array-api-compat) they give the
NumPy results; the modules that stay NumPy-only refuse other arrays, naming themselves.

Tolerances: ``strict`` computes with NumPy underneath, so its results are bit-identical
(the same operations in the same order); PyTorch's float64 kernels (sqrt, tanh, matmul)
may differ from NumPy's in the last bits, and its ring allreduce adds in the same order, so
there ``rtol=1e-12`` on float64 data.
"""
from __future__ import annotations

import numpy as np
import pytest

from reference_impl import backend
from reference_impl.comm import run_threads
from reference_impl.parallel import tensor_parallel as tp
from reference_impl.parallel import transformer as tf
from reference_impl.ps import optimizers

TOLERANCE = {"strict": {"rtol": 0, "atol": 0}, "torch": {"rtol": 1e-12, "atol": 1e-14}}
DEVICES = ["strict", "torch"]


def on(xp, value):
    return xp.asarray(value) if isinstance(value, np.ndarray) else value


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(optimizers.OPTIMIZERS))
def test_server_update_rules_match_numpy(device, name):
    """Three steps of each rule on rows with per-row step counts (as a sparse table passes them)."""
    xp = backend.get_namespace(device)
    opt = optimizers.OPTIMIZERS[name](**({"l1": 1.0} if name == "ftrl" else {}))
    rng = np.random.default_rng(1)
    w = rng.normal(size=(5, 3))
    slots = {k: np.abs(v) + 0.1 for k, v in opt.init_slots((5, 3)).items()}
    steps = np.asarray([1, 4, 2, 7, 1])
    dev_w, dev_slots = on(xp, w.copy()), {k: on(xp, v.copy()) for k, v in slots.items()}
    for k in range(3):
        g = rng.normal(size=(5, 3))
        opt.apply(w, g, slots, steps + k)                      # NumPy, in place
        opt.apply(dev_w, on(xp, g), dev_slots, steps + k)      # the same rule on the device's arrays
    assert backend.namespace_of(dev_w) is xp
    np.testing.assert_allclose(backend.to_numpy(dev_w), w, **TOLERANCE[device])
    for k in slots:
        np.testing.assert_allclose(backend.to_numpy(dev_slots[k]), slots[k], **TOLERANCE[device])
    if name == "ftrl":
        assert np.any(w == 0) and np.any(w != 0)  # both branches of the L1 threshold ran


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_parallel_mlp_on_two_ranks_matches_numpy_single_rank(device):
    """Forward and backward of the Megatron MLP on 2 thread ranks with the device's arrays
    (shards, activations and the ring allreduces), against the single-rank NumPy reference."""
    xp = backend.get_namespace(device)
    cfg = tf.GPTConfig(vocab_size=96, block_size=4, n_layer=2, n_head=2, n_embd=8)
    params = tf.init_params(cfg, seed=3, dtype=np.float64)
    rng = np.random.default_rng(7)
    x, dout = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    ref_out, ref_dx, ref_grads = tp.reference_mlp(params, 1, x, dout)
    dev_params = {k: on(xp, v) for k, v in params.items()}

    def body(comm):
        shards = tp.shard_mlp(dev_params, 1, comm.rank, comm.size)
        out, mlp = tp.parallel_mlp_forward(comm, shards, 1, on(xp, x))
        dx, grads = tp.parallel_mlp_backward(mlp, on(xp, dout))
        return out, dx, grads

    results = run_threads(2, body, timeout=30)
    for out, dx, grads in results:
        assert all(backend.namespace_of(v) is xp for v in (out, dx, *grads.values()))
        np.testing.assert_allclose(backend.to_numpy(out), ref_out, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(backend.to_numpy(dx), ref_dx, rtol=1e-12, atol=1e-14)
    whole = tp.unshard_mlp([grads for _, _, grads in results], 1)
    for k, expected in ref_grads.items():
        np.testing.assert_allclose(backend.to_numpy(whole[k]), expected, rtol=1e-12, atol=1e-14, err_msg=k)


def test_numpy_only_modules_refuse_other_arrays_by_name():
    import torch

    from reference_impl.ps import SparseTable

    table = SparseTable(dim=2)
    with pytest.raises(TypeError, match=r"^reference_impl\.ps \(the parameter-server tables, kept in host "
                                        r"memory\) is NumPy-only: it got a torch\.Tensor"):
        table.pull(torch.tensor([1, 2]))
    table.pull(np.asarray([1, 2]))
    with pytest.raises(TypeError, match=r"^reference_impl\.ps .* is NumPy-only: it got a torch\.Tensor"):
        table.push(np.asarray([1, 2]), torch.zeros(2, 2, dtype=torch.float64))
    h = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^reference_impl\.parallel\.transformer \(exact GELU: erf\) is NumPy-only"):
        tf._gelu(h, "gelu")


def test_a_custom_op_in_a_torch_session_is_refused_naming_the_module():
    """A graph on the ``torch`` device runs its built-in ops there; a custom op's C kernel reads
    host memory, so it refuses the tensors, naming itself, instead of misreading them."""
    from reference_impl import graph as g
    from reference_impl.custom_ops.bias_relu import bias_add_relu

    graph = g.Graph()
    with graph.as_default():
        x = g.placeholder("float32", [2, 3])
        y = bias_add_relu(x, g.constant(np.ones(3, np.float32)))
    with pytest.raises(g.GraphError, match=r"reference_impl\.custom_ops \(custom op 'BiasAddRelu': a C kernel on "
                                           r"host memory\) is NumPy-only: it got a torch\.Tensor"):
        g.Session(graph, device="torch").run(y, {x: np.ones((2, 3), np.float32)})


def test_unported_parallel_modules_refuse_pytorch_tensors_by_name():
    import torch

    from reference_impl.parallel import adam, fp8, low_precision, sequence_parallel, vocab_parallel

    t = torch.zeros(2, 4, 3, dtype=torch.float64)
    calls = {
        "sequence_parallel": lambda: sequence_parallel.split_sequence(None, t),
        "vocab_parallel": lambda: vocab_parallel.shard_vocab(t, 0, 1),
        "fp8": lambda: fp8.quantize(t, 1.0, np.float32),
        "low_precision": lambda: low_precision.as_low(t, np.float16),
        "adam": lambda: adam.Adam().step({"w": t}, {"w": t}),
        "transformer": lambda: tf.block_forward({}, 0, t, tf.GPTConfig(vocab_size=8, block_size=4, n_layer=1,
                                                                      n_head=1, n_embd=3)),
    }
    for module, call in calls.items():
        with pytest.raises(TypeError, match=rf"^reference_impl\.parallel\.{module} is NumPy-only: it got a torch\.Tensor"):
            call()
