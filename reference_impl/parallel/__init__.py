"""Training models that do not fit: where a step's memory goes, and the strategies that shrink it.

One concept per module, picotron-style, so each file reads in one sitting:

* ``transformer``: a small GPT-2-style decoder in NumPy with a hand-written backward pass,
  its parameters as a flat dict in nanoGPT's names, the list of layers a sharded trainer
  gathers one at a time, and activation recomputation (``keep="inputs"``);
* ``corpus``: a character-level corpus from the standard library's docstrings (nothing
  downloads), a fixed 96-character vocabulary, and seeded ``(tokens, targets)`` batches;
* ``adam``: Adam in NumPy, in place, the optimiser whose state dominates a model's memory;
* ``memory``: the bytes of parameters, gradients, optimiser state, activations and
  temporaries per rank, for plain data parallelism and ZeRO stages 1-3 (Rajbhandari et al.
  2020), predicted from the transformer's own arrays and checked against ``tracemalloc``.

* ``zero``: ZeRO stages 0-3 as one data-parallel trainer (``ZeroTrainer(comm, config, params,
  stage=...)``) on the communicators of ``reference_impl.comm``: optimiser state, gradients,
  then parameters sharded over the ranks, with padding, exact traffic and memory accounting,
  and sharded checkpoints that restore at another rank count or stage;
* ``fsdp``: stage 3's schedule (gather a layer, run it, free it; prefetch the next gather on
  the communication thread) and what it holds at each phase.

* ``low_precision``: bf16 and float16 training with float32 master weights (real
  ``ml_dtypes`` arrays; float16 with the lab's dynamic loss scaler), and the underflow,
  overflow and bytes of each format;
* ``fp8``: fp8 linear layers with per-tensor delayed scaling from an amax history (E4M3
  forward, E5M2 backward, as Transformer Engine's HYBRID recipe).

* ``tensor_parallel``: Megatron-LM tensor parallelism of the MLP block (Shoeybi et al. 2019):
  column-parallel ``c_fc``, GELU on the shard, row-parallel ``c_proj``, the conjugate ``f``/``g``
  operators; one allreduce of ``B T C`` values forward and one backward;
* ``tensor_parallel_attention``: the same for attention, heads split over the ranks
  (``c_attn`` column-parallel by heads, attention on the local heads, row-parallel ``c_proj``);
* ``vocab_parallel``: the tied ``wte`` split by vocabulary rows (padded to a multiple of the
  rank count): ``VocabParallelEmbedding`` (lookup of the rank's ids, one allreduce of ``B T C``
  forward, none backward) and ``vocab_parallel_cross_entropy`` (the softmax loss without
  gathering the logits: allreduces of the row max, the exp-sum and the target logit, ``B T``
  values each, forward; none backward).
* ``sequence_parallel``: Korthikanti et al. 2022's operators (all-gather / reduce-scatter along
  the sequence) and the activation bytes a layer keeps with and without them;
* ``tensor_parallel_model``: the whole GPT under tensor parallelism, optionally with sequence
  parallelism (``ParallelTransformerLayer``, the vocabulary-parallel embedding and loss,
  ``finalize_model_grads``), equal to one rank.

* ``moe``: a mixture-of-experts layer (top-k gating, capacity, dropped tokens, the Switch
  load-balancing loss) with its backward, and ``routing_sweep``;
* ``expert_parallel``: the same layer with its experts spread over ranks, tokens dispatched and
  combined by ``alltoallv``.

* ``process_grid``: the world split into tensor-, data-, pipeline- and expert-parallel groups in
  Megatron-LM's rank order (``Communicator.split``);
* ``hybrid``: the GPT trained on a ``dp x tp x pp`` grid, equal to single-rank training;
* ``planner``: every layout of a model on a cluster, its memory per device and predicted step
  time, the ones that cannot run dropped with the reason, the rest ranked.
"""
from . import (adam, corpus, expert_parallel, fp8, fsdp, hybrid, low_precision, memory, moe, planner, process_grid,
               sequence_parallel, tensor_parallel, tensor_parallel_attention, tensor_parallel_model, transformer,
               vocab_parallel, zero)
from .adam import Adam
from .expert_parallel import ExpertParallelMoE
from .moe import MoEConfig, MoEStats, moe_backward, moe_forward
from .process_grid import ProcessGrid
from .tensor_parallel_model import ParallelTransformerLayer
from .memory import (MemoryBreakdown, measure_peak_bytes, memory_breakdown, step_peak_elements,
                     zero_paper_memory)
from .tensor_parallel import (ColumnParallelLinear, ParallelMLP, RowParallelLinear, mlp_comm_bytes,
                              parallel_mlp_backward, parallel_mlp_forward, reference_mlp, shard_mlp, unshard_mlp)
from .tensor_parallel_attention import ParallelAttention, reference_attention, shard_attention, unshard_attention
from .transformer import (GPTConfig, Layer, backward, backward_layers, forward, init_params, layers, logits,
                          loss_and_grads, n_params, param_shapes, step_flops)
from .vocab_parallel import (VocabParallelEmbedding, cross_entropy_comm_bytes, embedding_comm_bytes, padded_vocab,
                             shard_vocab, unshard_vocab, vocab_parallel_cross_entropy, vocab_range)
from .zero import (Unit, ZeroTrainer, comm_elements, flat_units, load_sharded, padded_params, save_sharded,
                   zero_memory)

__all__ = [n for n in dir() if not n.startswith("_")]
