"""Run under mpiexec: Megatron-style tensor parallelism on MPI processes, one per rank.

Every rank builds the same float64 model and data, runs its shard of block 1's MLP (columns of
c_fc, rows of c_proj) and of its attention (n_head = 4, heads split, non-zero biases) forward and
backward over ``MPICommunicator`` (counted), gathers the shard gradients, and compares output,
input gradient and parameter gradients with the single-rank ``reference_mlp`` /
``reference_attention``. Rank 0 prints, for each sublayer,
``TP <name> ranks=N maxdiff=D bytes_fwd=F bytes_bwd=K expected=E``.
"""
import numpy as np
from mpi4py import MPI

from reference_impl.comm import CountingCommunicator, MPICommunicator
from reference_impl.parallel import tensor_parallel as tp
from reference_impl.parallel import tensor_parallel_attention as tpa
from reference_impl.parallel import transformer as tf

CFG = tf.GPTConfig(vocab_size=96, block_size=4, n_layer=2, n_head=4, n_embd=8)
B, T, C, LAYER = 2, 4, 8, 1

world = MPI.COMM_WORLD
comm = CountingCommunicator(MPICommunicator(world))


def check(name, layer, unshard, reference, x, dout):
    """Run ``layer`` forward and backward, compare with ``reference`` and the closed-form bytes."""
    ref_out, ref_dx, ref_grads = reference
    start = comm.bytes_sent
    out = layer.forward(x)
    fwd = comm.bytes_sent - start
    dx, grads = layer.backward(dout)
    bwd = comm.bytes_sent - start - fwd
    full = unshard(world.allgather(grads), LAYER)
    diff = max([float(np.abs(out - ref_out).max()), float(np.abs(dx - ref_dx).max())]
               + [float(np.abs(full[k] - ref_grads[k]).max()) for k in ref_grads])
    expected = tp.mlp_comm_bytes(B, T, C, comm.size, 8)["forward"]  # one allreduce of B*T*C each way
    if diff > 1e-6 or fwd != expected or bwd != expected:
        raise AssertionError(f"rank {comm.rank}, {name}: differs by {diff}, or sent {fwd}/{bwd} bytes, "
                             f"not {expected}")
    diffs, sent = world.gather(diff), world.gather((fwd, bwd))
    if comm.rank == 0:
        print(f"TP {name} ranks={comm.size} maxdiff={max(diffs):.3g} bytes_fwd={max(s[0] for s in sent)} "
              f"bytes_bwd={max(s[1] for s in sent)} expected={expected}", flush=True)


params = tf.init_params(CFG, seed=3, dtype=np.float64)
rng = np.random.default_rng(11)
for name in ("attn.c_attn.bias", "attn.c_proj.bias"):  # non-zero: a bias added twice would show
    params[f"h.{LAYER}.{name}"] = 0.1 * rng.standard_normal(params[f"h.{LAYER}.{name}"].shape)
x = rng.standard_normal((B, T, C))
dout = rng.standard_normal((B, T, C))

check("mlp", tp.ParallelMLP(comm, tp.shard_mlp(params, LAYER, comm.rank, comm.size), LAYER),
      tp.unshard_mlp, tp.reference_mlp(params, LAYER, x, dout), x, dout)
check("attention", tpa.ParallelAttention(comm, tpa.shard_attention(params, LAYER, comm.rank, comm.size, CFG.n_head),
                                         LAYER, CFG.n_head // comm.size, CFG.head_dim),
      tpa.unshard_attention, tpa.reference_attention(params, LAYER, x, dout, CFG), x, dout)
