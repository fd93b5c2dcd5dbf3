"""Run under mpiexec: the Megatron-style vocabulary-parallel embedding and cross-entropy on MPI processes.

Every rank builds the same float64 table, tokens and activations, runs its vocabulary shard
of the embedding (forward and backward) and of the tied head's cross-entropy over
``MPICommunicator`` (counted), gathers the shard gradients, and compares the embedding, the
loss and the ``wte`` gradients with the single-rank ``transformer`` functions.
Rank 0 prints ``VP ranks=N maxdiff=D bytes_emb=E bytes_ce=L bytes_bwd=K``.
"""
import numpy as np
from mpi4py import MPI

from reference_impl.comm import CountingCommunicator, MPICommunicator
from reference_impl.parallel import transformer as tf
from reference_impl.parallel import vocab_parallel as vp

CFG = tf.GPTConfig(vocab_size=96, block_size=4, n_layer=2, n_head=2, n_embd=8)
B, T, C = 2, 4, 8
V = CFG.vocab_size

world = MPI.COMM_WORLD
comm = CountingCommunicator(MPICommunicator(world))
params = tf.init_params(CFG, seed=3, dtype=np.float64)
rng = np.random.default_rng(7)
tokens = rng.integers(0, V, size=(B, T))
targets = rng.integers(0, V, size=(B, T))
x = rng.standard_normal((B, T, C))
dout = rng.standard_normal((B, T, C))
ref_loss, head = tf.head_forward(params, x, targets)
_, ref_head = tf.head_backward(params, head)
ref_emb = tf.embed_backward({**params, "wpe.weight": np.zeros((T, C))}, tokens, dout)["wte.weight"]
a, _, _ = tf._layer_norm(x, params["ln_f.weight"], params["ln_f.bias"])

start, _ = vp.vocab_range(V, comm.rank, comm.size)
shard = vp.shard_vocab(params["wte.weight"], comm.rank, comm.size)
emb = vp.VocabParallelEmbedding(comm, shard, start)
out = emb.forward(tokens)
e_fwd = comm.bytes_sent
d_emb = emb.backward(dout)["weight"]
loss, backward = vp.vocab_parallel_cross_entropy(comm, a @ shard.T, targets, start, V)
l_fwd = comm.bytes_sent - e_fwd
d_head = backward().reshape(B * T, -1).T @ a.reshape(B * T, C)
bwd = comm.bytes_sent - e_fwd - l_fwd
full_emb = vp.unshard_vocab(world.allgather(d_emb), V)
full_head = vp.unshard_vocab(world.allgather(d_head), V)
diff = max(float(np.abs(out - params["wte.weight"][tokens]).max()), abs(loss - ref_loss),
           float(np.abs(full_emb - ref_emb).max()), float(np.abs(full_head - ref_head["wte.weight"]).max()))
if diff > 1e-9 or e_fwd != vp.embedding_comm_bytes(B, T, C, comm.size, 8)["forward"] \
        or l_fwd != vp.cross_entropy_comm_bytes(B, T, comm.size, 8)["forward"] or bwd:
    raise AssertionError(f"rank {comm.rank}: differs by {diff}, or sent {e_fwd}/{l_fwd}/{bwd} bytes")
diffs = world.gather(diff)
sent = world.gather((e_fwd, l_fwd, bwd))
if comm.rank == 0:
    print(f"VP ranks={comm.size} maxdiff={max(diffs):.3g} bytes_emb={max(s[0] for s in sent)} "
          f"bytes_ce={max(s[1] for s in sent)} bytes_bwd={max(s[2] for s in sent)}", flush=True)
