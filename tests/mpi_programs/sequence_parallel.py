"""Run under mpiexec: the whole tensor-parallel GPT, without and with sequence parallelism, one process per rank.

Every rank builds the same float64 model (non-zero biases and LayerNorm parameters) and data,
runs ``tensor_parallel_model.loss_and_grads`` over ``MPICommunicator`` (counted) with
``sequence_parallel`` off and on, gathers the shard gradients, and compares the loss and every
gradient with the single-rank ``transformer.loss_and_grads``. It also runs one layer alone and
checks the bytes it sends forward and backward against ``layer_comm_bytes``. Rank 0 prints, per
mode, ``SP mode=M ranks=N maxdiff=D layer_fwd=F layer_bwd=K expected_fwd=EF expected_bwd=EB``.
"""
import numpy as np
from mpi4py import MPI

from reference_impl.comm import CountingCommunicator, MPICommunicator
from reference_impl.parallel import sequence_parallel as sp
from reference_impl.parallel import tensor_parallel_model as tpm
from reference_impl.parallel import transformer as tf

CFG = tf.GPTConfig(vocab_size=37, block_size=8, n_layer=2, n_head=4, n_embd=16)
B, T = 2, 8  # T divisible by 1, 2, 4

world = MPI.COMM_WORLD
comm = CountingCommunicator(MPICommunicator(world))

rng = np.random.default_rng(5)
params = tf.init_params(CFG, seed=2, dtype=np.float64)
for name in params:  # non-zero biases, LayerNorm away from (1, 0): a bias added twice would show
    if "bias" in name or "ln" in name:
        params[name] = params[name] + 0.1 * rng.standard_normal(params[name].shape)
tokens = rng.integers(0, CFG.vocab_size, (B, T))
targets = rng.integers(0, CFG.vocab_size, (B, T))
x = rng.standard_normal((B, T, CFG.n_embd))
dout = rng.standard_normal((B, T, CFG.n_embd))
ref_loss, ref_grads = tf.loss_and_grads(params, tokens, targets, CFG)
shards = tpm.shard_model(params, CFG, comm.rank, comm.size)

for mode, sequence_parallel, keep in (("tp", False, False), ("tp+sp", True, False), ("tp+sp-keep", True, True)):
    loss, grads = tpm.loss_and_grads(comm, shards, tokens, targets, CFG, sequence_parallel, keep)
    full = tpm.unshard_model(world.allgather(grads), CFG)
    diff = max([abs(loss - ref_loss)] + [float(np.abs(full[k] - ref_grads[k]).max()) for k in ref_grads])
    # one layer alone: the bytes it sends
    layer = tpm.ParallelTransformerLayer(comm, shards, 1, CFG, sequence_parallel, keep)
    x_in = sp.split_sequence(comm, x) if sequence_parallel else x
    d_in = sp.split_sequence(comm, dout) if sequence_parallel else dout
    start = comm.bytes_sent
    layer.forward(x_in)
    fwd = comm.bytes_sent - start
    layer.backward(d_in)
    bwd = comm.bytes_sent - start - fwd
    expected = tpm.layer_comm_bytes(B, T, CFG.n_embd, comm.size, 8, sequence_parallel, keep)
    if diff > 1e-6 or fwd != expected["forward"] or bwd != expected["backward"]:
        raise AssertionError(f"rank {comm.rank}, {mode}: differs by {diff}, or sent {fwd}/{bwd} bytes, "
                             f"not {expected['forward']}/{expected['backward']}")
    diffs, sent = world.gather(diff), world.gather((fwd, bwd))
    if comm.rank == 0:
        print(f"SP mode={mode} ranks={comm.size} maxdiff={max(diffs):.3g} layer_fwd={max(s[0] for s in sent)} "
              f"layer_bwd={max(s[1] for s in sent)} expected_fwd={expected['forward']} "
              f"expected_bwd={expected['backward']}", flush=True)
