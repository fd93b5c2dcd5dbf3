"""The parallel layout planner: which (dp, tp, pp, ep, ZeRO, micro-batch, SP, recompute) to train with.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

**The question.** "Train a 70B model on 1024 GPUs: how do you lay it out?" Every answer is a
*layout*: tensor parallelism ``tp`` (Megatron-LM's split of each layer's matrices), pipeline
parallelism ``pp`` (consecutive layers on consecutive stages, the 1F1B schedule), data
parallelism ``dp = GPUs / (tp pp)``, optionally expert parallelism ``ep`` (a mixture of
experts' experts spread over ``ep`` of the data-parallel ranks) and a ZeRO stage over the
data-parallel ranks, plus the micro-batch size ``b`` (so ``m = B / (dp b)`` micro-batches per
step), sequence parallelism (SP) and activation recomputation. ``plan`` enumerates them all,
drops those that are invalid or do not fit in memory (with the reason), and ranks the rest by
predicted step time; ``explain`` prints one layout's breakdown; ``predict_step`` estimates one
layout on any ``Cluster``: the DGX A100 and H100 presets, or ``local_cluster``, built from this
machine's measured FLOP/s and the α–β that ``comm/calibrate.py`` fits, so that a measured step
of the reference GPT can be set against its prediction.

**Memory per GPU** (the first pipeline stage, the fullest one, as Megatron-LM's
``megatron/training/theoretical_memory_usage.py`` counts it):

* model states of the stage's parameters ``Ψ_local`` (its ``L/pp`` layers split ``tp`` ways,
  the word embedding split ``tp`` ways, LayerNorms and position embeddings replicated):
  ``(2 + 2 + K) Ψ_local`` bytes in bf16 with Adam (``K = 12``), sharded over ``dp`` by the
  ZeRO stage, the formulas of ``memory.zero_paper_memory`` (Rajbhandari et al., SC'20);
  expert weights are split ``ep`` ways and sharded over their own ``dp / ep`` ranks;
* activations, per layer and micro-batch (Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models", MLSys 2023, arXiv:2205.05198, Table 2), with
  ``s`` the sequence, ``b`` the micro-batch, ``h`` the hidden size, ``a`` the heads, ``t = tp``::

      no parallelism           s b h (34 + 5 a s / h)
      tensor parallel          s b h (10 + 24 / t + 5 a s / (h t))
      tensor + sequence par.   s b h (34 / t + 5 a s / (h t))
      selective recompute      the 5 a s / h term goes (the attention scores are recomputed)
      full recompute           2 s b h per layer (its input; / t with SP), plus one layer's
                               full set while it is recomputed

  (34 = 11 attention + 19 MLP + 4 LayerNorm bytes per token per hidden unit; a top-k mixture
  of experts stores its MLP's 19 k times, ``moe_activation_terms``). Under 1F1B the first
  stage holds ``min(pp, m)`` micro-batches of its ``L/pp`` layers, i.e. ``L`` layers' worth;
  plus the embedding's input and dropout mask, and the output layer when ``pp = 1``.

**Step time** (no overlap of communication with computation, so an upper bound on each term):

* compute: the step's FLOPs over ``GPUs x peak x efficiency``. Per token, a layer's forward
  is ``24 h^2 + 4 s h`` and the logits' ``2 h V``, the backward twice the forward: ``6 Ψ`` per
  token plus attention, "6 x params x tokens" (``transformer.step_flops`` counts the same;
  Megatron-LM's ``num_floating_point_operations`` in ``megatron/training/training.py`` too).
  Selective recomputation adds the attention core's forward, full recomputation every layer's
  forward: Narayanan et al.'s ``96 B s l h^2 (1 + s/6h + V/16lh)`` per step;
* tensor parallelism: per layer and micro-batch, 4 allreduces of ``s b h`` values (2 forward,
  2 backward; 6 with full recomputation) in a ring (``cost_model.ring_allreduce_time``; with
  SP a reduce-scatter plus an all-gather, the same bytes), on NVLink when the ``tp`` group
  lies in one node;
* pipeline: ``m + pp - 1`` slots of one micro-batch's forward and backward, the bubble being
  the ``pp - 1`` extra ones, ``(pp - 1)/m`` of the work; each slot also sends one activation
  forward and one gradient back, ``s b h / tp`` values (Megatron's scatter-gather). Exact for
  1F1B without communication; with it, an upper bound within 3 % of a simulated schedule;
* data parallelism: one ring allreduce of the stage's bf16 gradients (ZeRO-1: reduce-scatter
  plus all-gather of parameters, the same bytes); ZeRO-2 keeps 1/dp of the gradients so it
  reduce-scatters after every micro-batch (DeepSpeed's ``stage_1_and_2.py``,
  ``reduce_ready_partitions_and_remove_grads``), ZeRO-3 also all-gathers the parameters before
  each micro-batch's forward and backward; DeepSpeed refuses ZeRO-2/3 with pipeline
  parallelism (``runtime/pipe/engine.py``), and so does the planner;
* expert parallelism: 4 all-to-alls per MoE layer and micro-batch (dispatch and combine,
  forward and backward) of ``s b k h`` values (``cost_model.pairwise_alltoall_time``).

**Where the ranks sit.** Megatron-LM orders ranks tp fastest, then dp, then pp
(``megatron/core/parallel_state.py``, ``order="tp-cp-ep-dp-pp"``). A group of ``size`` ranks
``stride`` apart lies in one node when ``stride x size`` divides the GPUs per node, and then
uses NVLink; otherwise the network, where a group with ``k`` members per node is given ``k``
NICs' bandwidth (an assumption: one NIC per GPU, and the collective spreads its traffic over the
members' NICs, as NCCL's several rings do), never more than NVLink.

**Checked against** Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC'21, arXiv:2104.04473, Table 1 (``NARAYANAN_TABLE_1``):
``tests/test_planner.py`` runs it on the paper's DGX A100 cluster.

Left out, and why the numbers are estimates: overlap of communication with computation,
the interleaved pipeline schedule (Table 1 uses it from 76B to 530B), a kernel efficiency that
changes with the matrix sizes (one efficiency for all, so the model favours small micro-batches,
which shrink the bubble and cost nothing here, and overestimates small models), the optimiser
step, the last stage's logits, uneven expert load, FlashAttention (which stores no
``5 a s / h`` term at all), the CUDA context and allocator fragmentation
(``Cluster.usable_fraction`` keeps a margin for them).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..comm.cost_model import (LinkParams, pairwise_alltoall_time, ring_allgather_time, ring_allreduce_time,
                               ring_reduce_scatter_time)
from ..comm.simnet import INTERCONNECTS
from . import memory as pmem
from . import transformer as tf

RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
MICRO_BATCHES = (1, 2, 4, 8, 16)
REASONS = ("tp_heads", "pp_layers", "ep_experts", "ep_dp", "batch", "zero_pp", "gpus", "memory")


def _count(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


# ------------------------------------------------------------------ the model
@dataclass(frozen=True)
class Model:
    """A GPT-2-shaped decoder (``transformer.py``'s layout): ``layers`` blocks of width ``hidden``.

    ``experts > 1`` makes every block's MLP a mixture of ``experts`` MLPs of which each token
    uses ``top_k`` (Switch Transformer: ``top_k = 1``; GShard: 2). ``precision``: ``bf16``/
    ``fp16`` (2-byte values, float32 master weights and Adam state) or ``fp32``.
    """

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    experts: int = 1
    top_k: int = 1
    precision: str = "bf16"
    name: str = ""

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "seq", "vocab", "experts", "top_k"):
            _count(f"Model.{f}", getattr(self, f))
        if self.hidden % self.heads:
            raise ValueError(f"Model: hidden size {self.hidden} is not divisible by {self.heads} heads")
        if self.top_k > self.experts:
            raise ValueError(f"Model: top_k {self.top_k} is more than the {self.experts} experts")
        if self.precision not in pmem.PRECISIONS:
            raise ValueError(f"Model: precision must be one of {tuple(pmem.PRECISIONS)}, got {self.precision!r}")

    @classmethod
    def from_config(cls, config: tf.GPTConfig, seq: int | None = None, precision: str = "fp32") -> "Model":
        """The reference transformer's shape (``transformer.GPTConfig``), trained in float32 by default."""
        return cls(config.n_layer, config.n_embd, config.n_head, seq or config.block_size, config.vocab_size,
                   precision=precision, name="transformer.GPTConfig")

    @property
    def value_bytes(self) -> int:
        """Bytes of one parameter, gradient or activation value in the compute precision."""
        return pmem.PRECISIONS[self.precision][0]

    @property
    def moe(self) -> bool:
        return self.experts > 1

    # parameters of one block, split by how tensor/expert parallelism holds them
    def attention_params(self) -> int:
        """``c_attn`` (3h x h + 3h) and ``attn.c_proj`` (h x h + h): split tp ways."""
        return 4 * self.hidden ** 2 + 4 * self.hidden

    def expert_params(self) -> int:
        """One MLP: ``c_fc`` (4h x h + 4h) and ``c_proj`` (h x 4h + h)."""
        return 8 * self.hidden ** 2 + 5 * self.hidden

    def replicated_params(self) -> int:
        """Per block, held whole by every tensor-parallel rank: two LayerNorms, and the router."""
        return 4 * self.hidden + (self.hidden * self.experts if self.moe else 0)

    def block_params(self) -> int:
        return self.attention_params() + self.experts * self.expert_params() + self.replicated_params()

    @property
    def parameters(self) -> int:
        """Ψ: blocks, word and position embeddings (the output layer tied), final LayerNorm."""
        return self.layers * self.block_params() + (self.vocab + self.seq) * self.hidden + 2 * self.hidden

    @property
    def active_parameters(self) -> int:
        """Parameters one token uses: ``top_k`` of the experts."""
        return self.parameters - self.layers * (self.experts - self.top_k) * self.expert_params()


def step_flops(model: Model, global_batch: int, recompute: str = "none") -> float:
    """Matrix-multiply FLOPs of one step over all GPUs (2 per multiply-add), as ``transformer.step_flops``.

    Per token and layer, forward: ``8 h^2`` (attention's projections) + ``16 k h^2`` (the MLP,
    ``k`` experts) + ``4 s h`` (scores, and probabilities times values); the logits ``2 h V``.
    Backward is twice the forward. ``selective`` recomputes the attention core, ``full``
    every layer's forward.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    h, s = model.hidden, model.seq
    linear = 8 * h * h + 16 * model.top_k * h * h
    core = 4 * s * h
    layer = linear + core
    extra = {"none": 0, "selective": core, "full": layer}[recompute]
    per_token = model.layers * (3 * layer + extra) + 6 * h * model.vocab
    return float(global_batch) * s * per_token


# ------------------------------------------------------------------ the cluster
@dataclass(frozen=True)
class Cluster:
    """Nodes of ``gpus_per_node`` GPUs: NVLink (``intra``) inside a node, one NIC per GPU (``inter``) between.

    ``peak_flops``: dense bf16 FLOP/s per GPU; ``efficiency``: the share of it a transformer
    layer's matrix multiplies reach; ``usable_fraction``: the share of ``memory_bytes`` the
    planner lets a layout fill (the rest: CUDA context, NCCL buffers, fragmentation).
    """

    name: str
    nodes: int
    gpus_per_node: int
    memory_bytes: float
    peak_flops: float
    intra: LinkParams
    inter: LinkParams
    efficiency: float
    usable_fraction: float = 0.9

    def __post_init__(self) -> None:
        _count("Cluster.nodes", self.nodes)
        _count("Cluster.gpus_per_node", self.gpus_per_node)
        for f in ("memory_bytes", "peak_flops"):
            if not getattr(self, f) > 0:
                raise ValueError(f"Cluster.{f} must be > 0, got {getattr(self, f)!r}")
        if not (0 < self.efficiency <= 1 and 0 < self.usable_fraction <= 1):
            raise ValueError(f"Cluster: efficiency and usable_fraction must be in (0, 1], got "
                             f"{self.efficiency} and {self.usable_fraction}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def usable_bytes(self) -> float:
        return self.memory_bytes * self.usable_fraction


# NVLink: the nominal bandwidth per GPU is both directions together (A100: 12 links x 50 GB/s =
# 600 GB/s; H100: 18 x 50 = 900 GB/s); the α–β model's β is one direction, half of it.
# α = 0.6 µs, NCCL's per-step hardware latency of its low-latency protocol on NVLink
# (src/graph/tuning.cc, hwLatencies[NVLINK][Ring][LL]); α only matters for small messages.
NVLINK_ALPHA_S = 0.6e-6
NVLINK3_A100 = LinkParams.from_bandwidth(NVLINK_ALPHA_S, 300e9)
NVLINK4_H100 = LinkParams.from_bandwidth(NVLINK_ALPHA_S, 450e9)

# The share of peak reached by the layers' matrix multiplies: fitted once, to the 1T row of
# Narayanan et al.'s Table 1 (163 TFLOP/s per GPU, 52 % of peak, end to end): with 0.62 the
# planner predicts 163.5 for that row's layout; tests/test_planner.py checks the other rows
# against their published throughput. H100 is given the same share (an assumption).
MATMUL_EFFICIENCY = 0.62


def dgx_a100(nodes: int = 1) -> Cluster:
    """DGX A100 80GB: 8 A100-SXM4-80GB, 312 TFLOP/s dense bf16 each (NVIDIA A100 datasheet),
    NVLink 3 + NVSwitch (600 GB/s per GPU), one 200 Gb/s HDR InfiniBand NIC per GPU
    (``simnet.INTERCONNECTS["IB-HDR"]``): the Selene nodes of Narayanan et al. 2021."""
    return Cluster("DGX A100 (8x A100 80GB, NVLink 600 GB/s, 8x HDR 200 Gb/s)", nodes, 8, 80e9, 312e12,
                   NVLINK3_A100, INTERCONNECTS["IB-HDR"].link, MATMUL_EFFICIENCY)


def dgx_h100(nodes: int = 1) -> Cluster:
    """DGX H100: 8 H100-SXM5-80GB, 989 TFLOP/s dense bf16 each (NVIDIA H100 datasheet: 1,979 with
    2:4 sparsity), NVLink 4 (900 GB/s per GPU), one 400 Gb/s NDR ConnectX-7 per GPU
    (``simnet.INTERCONNECTS["IB-NDR"]``)."""
    return Cluster("DGX H100 (8x H100 80GB, NVLink 900 GB/s, 8x NDR 400 Gb/s)", nodes, 8, 80e9, 989e12,
                   NVLINK4_H100, INTERCONNECTS["IB-NDR"].link, MATMUL_EFFICIENCY)


PRESETS = {"H100": dgx_h100, "A100": dgx_a100}


def local_cluster(flops_per_s: float, link: LinkParams, ranks: int, memory_bytes: float = 8e9,
                  name: str = "this machine") -> Cluster:
    """This machine: ``ranks`` processes on one host, from measured numbers.

    ``flops_per_s``: what one rank's training step achieves (``measure_flops_per_second``),
    so the efficiency is 1; ``link``: α, β (and γ) fitted by ``comm.calibrate.calibrate``
    between two of its ranks, used for every group (one node, one link kind).
    """
    return Cluster(name, 1, _count("ranks", ranks), memory_bytes, flops_per_s, link, link, 1.0, 1.0)


def measure_flops_per_second(config: tf.GPTConfig, batch: int, seq: int | None = None, repeats: int = 3,
                             seed: int = 0) -> float:
    """FLOP/s of the reference transformer's training step on this machine (float32, one process):
    ``transformer.step_flops`` over the median time of ``repeats`` forward+backward passes."""
    import numpy as np

    seq = seq or config.block_size
    params = tf.init_params(config, seed=seed)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, (batch, seq))
    targets = rng.integers(0, config.vocab_size, (batch, seq))
    tf.loss_and_grads(params, tokens, targets, config)  # warm
    times = []
    for _ in range(_count("repeats", repeats)):
        t0 = time.perf_counter()
        tf.loss_and_grads(params, tokens, targets, config)
        times.append(time.perf_counter() - t0)
    return tf.step_flops(config, batch, seq)["total"] / sorted(times)[len(times) // 2]


# ------------------------------------------------------------------ a layout
@dataclass(frozen=True)
class Layout:
    """One way to lay a model out: ``tp x pp x dp`` GPUs (``ep`` of the ``dp`` ranks share the experts)."""

    tp: int
    pp: int
    dp: int
    ep: int = 1
    zero: int = 0
    micro_batch: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        sp = " SP" if self.sequence_parallel else ""
        ep = f" ep={self.ep}" if self.ep > 1 else ""
        return (f"tp={self.tp} pp={self.pp} dp={self.dp}{ep} ZeRO-{self.zero} b={self.micro_batch}{sp} "
                f"recompute={self.recompute}")


# --8<-- [start:group_link]
def group_link(cluster: Cluster, stride: int, size: int) -> tuple[LinkParams, str]:
    """The link a group of ``size`` ranks ``stride`` apart uses, and where it runs.

    In one node (``stride x size`` divides the GPUs per node): NVLink. Otherwise the network:
    the NICs' latency, and ``k`` NICs' bandwidth for ``k`` members per node (capped by NVLink).
    """
    g = cluster.gpus_per_node
    if size <= 1 or (stride * size <= g and g % (stride * size) == 0):
        return cluster.intra, "NVLink"
    members = max(1, min(size, g // stride)) if stride < g else 1
    beta = max(cluster.inter.beta / members, cluster.intra.beta)
    return LinkParams(cluster.inter.alpha, beta, cluster.inter.gamma), f"network x{members}"
# --8<-- [end:group_link]


# ------------------------------------------------------------------ memory
def moe_activation_terms(model: Model) -> tuple[int, int]:
    """Korthikanti's per-token bytes per hidden unit: (replicated under TP, split by TP).

    Replicated: the QKV input 2, attention dropout mask 1, two LayerNorm inputs 4, the MLP
    input 2 and its dropout mask 1 (the MLP's ``3 k`` for top-k experts): ``7 + 3 k``. Split:
    Q and K 4, V 2, the output projection's input 2, GELU's input and output 16 k: ``8 + 16 k``.
    Dense (``k = 1``): 10 and 24, the paper's ``10 + 24 / t``.
    """
    k = model.top_k
    return 7 + 3 * k, 8 + 16 * k


def activation_bytes_per_layer(model: Model, micro_batch: int, tp: int, sequence_parallel: bool,
                               recompute: str) -> float:
    """Bytes one layer keeps for backward for one micro-batch (Korthikanti et al., Table 2)."""
    s, b, h, a = model.seq, micro_batch, model.hidden, model.heads
    sbh = s * b * h
    rep, par = moe_activation_terms(model)
    scores = 5 * a * s / h
    scale = model.value_bytes / 2  # the paper's counts are for 2-byte values
    if recompute == "full":
        return scale * 2 * sbh / (tp if sequence_parallel else 1)
    keep = 0.0 if recompute == "selective" else scores
    if sequence_parallel:
        return scale * sbh * (rep + par + keep) / tp
    return scale * sbh * (rep + (par + keep) / tp)


def stage_parameters(model: Model, layout: Layout) -> tuple[float, float, float]:
    """Parameters on one GPU of the first stage: (dense, expert, one layer's), after TP and EP splits."""
    t, h = layout.tp, model.hidden
    per_layer = (model.attention_params() + (0 if model.moe else model.expert_params())) / t \
        + model.replicated_params()
    expert_layer = (model.experts / layout.ep) * model.expert_params() / t if model.moe else 0.0
    layers = model.layers / layout.pp
    dense = layers * per_layer + model.vocab * h / t + model.seq * h + (2 * h if layout.pp == 1 else 0)
    return dense, layers * expert_layer, per_layer + expert_layer


def model_state_bytes(psi: float, ranks: int, stage: int, precision: str) -> tuple[float, float, float]:
    """(parameters, gradients, optimiser state) bytes of ``psi`` parameters on one of ``ranks``
    data-parallel ranks under ZeRO ``stage``: ``memory.zero_paper_memory``'s accounting, whose
    bytes per value come from ``memory.PRECISIONS`` and ``memory.optimizer_k``."""
    p_bytes, g_bytes, _ = pmem.PRECISIONS[precision]
    k = pmem.optimizer_k("adam", precision)
    return (p_bytes * psi / (ranks if stage >= 3 else 1), g_bytes * psi / (ranks if stage >= 2 else 1),
            k * psi / (ranks if stage >= 1 else 1))


def memory_per_gpu(model: Model, layout: Layout, global_batch: int) -> dict[str, float]:
    """Bytes on one GPU of the first pipeline stage: model states, ZeRO's buffers, activations."""
    d, t, p, b = layout.dp, layout.tp, layout.pp, layout.micro_batch
    m = global_batch // (d * b)
    dense, expert, layer = stage_parameters(model, layout)
    parts = [model_state_bytes(dense, d, layout.zero, model.precision)]
    if model.moe:
        parts.append(model_state_bytes(expert, d // layout.ep, layout.zero, model.precision))
    params, grads, state = (sum(x[i] for x in parts) for i in range(3))
    vb = model.value_bytes
    buffers = (vb * layer if layout.zero >= 2 else 0.0) + (vb * layer if layout.zero >= 3 else 0.0)
    in_flight = min(p, m) if p > 1 else 1
    stored = activation_bytes_per_layer(model, b, t, layout.sequence_parallel, layout.recompute)
    acts = in_flight * (model.layers / p) * stored
    if layout.recompute == "full":  # one layer's whole set while it is recomputed
        acts += activation_bytes_per_layer(model, b, t, layout.sequence_parallel, "none")
    s, h = model.seq, model.hidden
    split = t if layout.sequence_parallel else 1
    embedding = (8 * s * b + s * b * h) * in_flight / split  # token ids, dropout mask
    output = 0.0
    if p == 1:  # the first stage is also the last: final LayerNorm, logits, cross-entropy
        output = (4 * s * b * h * (1 + model.vocab / h) / t if layout.sequence_parallel
                  else 2 * (s * b * model.vocab / t + s * b * h))
    acts += (embedding + output) * vb / 2
    total = params + grads + state + buffers + acts
    return {"parameters": params, "gradients": grads, "optimizer_state": state, "zero_buffers": buffers,
            "activations": acts, "total": total}


# ------------------------------------------------------------------ time
def step_time(model: Model, layout: Layout, cluster: Cluster, global_batch: int) -> dict[str, float]:
    """Seconds of one step, by part: compute, tp, ep, p2p, zero (per micro-batch), bubble, dp; and total."""
    t, p, d, b, e = layout.tp, layout.pp, layout.dp, layout.micro_batch, layout.ep
    m = global_batch // (d * b)
    s, h, vb = model.seq, model.hidden, model.value_bytes
    layers = model.layers // p
    full = layout.recompute == "full"

    compute = step_flops(model, global_batch, layout.recompute) / layout.gpus / (cluster.peak_flops * cluster.efficiency)

    tp_link, _ = group_link(cluster, 1, t)
    activation = s * b * h * vb  # one s b h tensor
    # with SP each allreduce becomes a reduce-scatter and an all-gather: in the ring model exactly
    # the allreduce's time, so one formula serves both (tests/test_planner.py checks the identity)
    tp = m * layers * (6 if full else 4) * ring_allreduce_time(activation, t, tp_link) if t > 1 else 0.0

    ep = 0.0
    if model.moe and e > 1:
        ep_link, _ = group_link(cluster, t, e)
        sent = s * b * model.top_k * h * vb / (t if layout.sequence_parallel else 1)
        ep = m * layers * (6 if full else 4) * pairwise_alltoall_time(sent, e, ep_link)

    p2p = 0.0
    if p > 1:
        pp_link, _ = group_link(cluster, t * d, p)
        p2p = m * 2 * (pp_link.alpha + activation / t * pp_link.beta)

    dense, expert, _ = stage_parameters(model, layout)
    groups = [(dense * vb, d, group_link(cluster, t, d)[0])]
    if model.moe:
        groups.append((expert * vb, d // e, group_link(cluster, t * e, d // e)[0]))
    per_micro, per_step = 0.0, 0.0
    for n_bytes, ranks, link in groups:
        if ranks <= 1:
            continue
        rs, ag = ring_reduce_scatter_time(n_bytes, ranks, link), ring_allgather_time(n_bytes, ranks, link)
        if layout.zero <= 1:  # ZeRO-1's reduce-scatter + all-gather costs the allreduce, as with SP
            per_step += ring_allreduce_time(n_bytes, ranks, link)
        elif layout.zero == 2:
            per_micro += m * rs
            per_step += ag
        else:
            per_micro += m * (2 * ag + rs)

    work = compute + tp + ep + p2p + per_micro
    bubble = (p - 1) / m * work
    total = work + bubble + per_step
    return {"compute": compute, "tp": tp, "ep": ep, "p2p": p2p, "zero_per_microbatch": per_micro,
            "bubble": bubble, "dp": per_step, "total": total}


# ------------------------------------------------------------------ validity, one layout
@dataclass
class Estimate:
    """A layout's verdict: ``reason`` (None when it fits), memory and time parts (empty if invalid)."""

    layout: Layout
    reason: str | None = None
    kind: str | None = None
    memory: dict[str, float] = field(default_factory=dict)
    time: dict[str, float] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.reason is None

    @property
    def step_s(self) -> float:
        return self.time.get("total", math.inf)

    def sort_key(self) -> tuple:
        """Fastest first; among equal times the one with more memory to spare, then the simpler."""
        L = self.layout
        return (self.step_s, self.memory.get("total", math.inf), L.tp, L.pp, L.ep, L.zero,
                RECOMPUTE.index(L.recompute), L.sequence_parallel, L.micro_batch)


# --8<-- [start:check]
def check(layout: Layout, model: Model, cluster: Cluster, global_batch: int) -> tuple[str, str] | None:
    """Why ``layout`` cannot run at all (``(kind, reason)``), or None. Memory is not checked here."""
    L = layout
    if L.gpus != cluster.gpus:
        return "gpus", f"dp x tp x pp = {L.dp} x {L.tp} x {L.pp} = {L.gpus}, not the cluster's {cluster.gpus} GPUs"
    if model.heads % L.tp:
        return "tp_heads", f"tp={L.tp} does not divide the {model.heads} attention heads"
    if model.layers % L.pp:
        return "pp_layers", f"pp={L.pp} does not divide the {model.layers} layers"
    if model.experts % L.ep:
        return "ep_experts", f"ep={L.ep} does not divide the {model.experts} experts"
    if L.dp % L.ep:
        return "ep_dp", f"ep={L.ep} does not divide dp={L.dp} (expert-parallel groups are made of data-parallel ranks)"
    if global_batch % (L.dp * L.micro_batch):
        return "batch", (f"global batch {global_batch} is not divisible by dp x micro-batch = "
                         f"{L.dp} x {L.micro_batch}")
    if L.zero >= 2 and L.pp > 1:
        return "zero_pp", (f"ZeRO-{L.zero} shards the gradients that pipeline parallelism accumulates over "
                           "micro-batches (DeepSpeed refuses ZeRO-2/3 with pp > 1)")
    return None
# --8<-- [end:check]


def _validate_layout(layout: Layout) -> None:
    for f in ("tp", "pp", "dp", "ep", "micro_batch"):
        _count(f"Layout.{f}", getattr(layout, f))
    if layout.zero not in ZERO_STAGES:
        raise ValueError(f"Layout.zero must be one of {ZERO_STAGES}, got {layout.zero!r}")
    if layout.recompute not in RECOMPUTE:
        raise ValueError(f"Layout.recompute must be one of {RECOMPUTE}, got {layout.recompute!r}")


def predict_step(layout: Layout, model: Model, cluster: Cluster, global_batch: int) -> Estimate:
    """Memory per GPU and step time of ``layout``, or the reason it cannot run or does not fit.

    The public entry for any cluster, including ``local_cluster`` built from this machine's
    measured FLOP/s and α–β, so a benchmark can compare predicted and measured step times.
    """
    _validate_layout(layout)
    global_batch = _count("global_batch", global_batch)
    bad = check(layout, model, cluster, global_batch)
    if bad is not None:
        return Estimate(layout, bad[1], bad[0])
    mem = memory_per_gpu(model, layout, global_batch)
    est = Estimate(layout, memory=mem, time=step_time(model, layout, cluster, global_batch))
    if mem["total"] > cluster.usable_bytes:
        est.kind = "memory"
        est.reason = (f"needs {mem['total'] / 1e9:.1f} GB per GPU, more than the {cluster.usable_bytes / 1e9:.1f} GB "
                      f"usable ({cluster.usable_fraction:.0%} of {cluster.memory_bytes / 1e9:.0f} GB)")
    return est


# ------------------------------------------------------------------ all layouts
def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def layouts(model: Model, cluster: Cluster, *, zero_stages: Sequence[int] = ZERO_STAGES,
            recompute: Sequence[str] = RECOMPUTE, sequence_parallel: Sequence[bool] = (False, True),
            micro_batches: Sequence[int] = MICRO_BATCHES) -> Iterable[Layout]:
    """Every layout of ``cluster.gpus`` GPUs: tp and pp over the divisors, ep over the experts'.

    Duplicates are left out: SP only with tp > 1, ZeRO stages above 0 only with dp > 1.
    """
    n = cluster.gpus
    for t in divisors(n):
        for p in divisors(n // t):
            d = n // (t * p)
            for e in divisors(model.experts):
                for b in micro_batches:
                    for z in zero_stages:
                        if z > 0 and d == 1:
                            continue
                        for sp in sequence_parallel:
                            if sp and t == 1:
                                continue
                            for rc in recompute:
                                yield Layout(t, p, d, e, z, b, sp, rc)


@dataclass
class Plan:
    """``ranked``: the layouts that fit, fastest first; ``dropped``: the others, each with its reason."""

    model: Model
    cluster: Cluster
    global_batch: int
    ranked: list[Estimate]
    dropped: list[Estimate]

    def reasons(self) -> dict[str, int]:
        """How many layouts were dropped for each kind of reason (``REASONS``)."""
        counts = {k: 0 for k in REASONS}
        for est in self.dropped:
            counts[est.kind] += 1
        return counts

    def rank_of(self, **fields: object) -> int | None:
        """1-based rank of the fastest ranked layout whose fields equal ``fields``, or None."""
        for i, est in enumerate(self.ranked, 1):
            if all(getattr(est.layout, k) == v for k, v in fields.items()):
                return i
        return None


def plan(model: Model, cluster: Cluster, global_batch: int, **choices: Sequence) -> Plan:
    """Enumerate ``layouts(model, cluster, **choices)``, keep those that run and fit, fastest first.

    ``choices`` narrows the enumeration: ``zero_stages``, ``recompute``, ``sequence_parallel``,
    ``micro_batches``. Equal times (SP on or off, ZeRO-0 or 1, a micro-batch size that changes
    nothing: the model charges them the same) go to the layout with less memory, then the
    smaller tp, pp, ep, ZeRO stage, the cheaper recomputation, SP off, the smaller micro-batch.
    Layouts dropped for memory come last in ``dropped``, fastest first.
    """
    ranked, dropped = [], []
    for layout in layouts(model, cluster, **choices):
        est = predict_step(layout, model, cluster, global_batch)
        (ranked if est.fits else dropped).append(est)
    ranked.sort(key=Estimate.sort_key)
    memory = sorted((e for e in dropped if e.kind == "memory"), key=Estimate.sort_key)
    return Plan(model, cluster, global_batch, ranked, [e for e in dropped if e.kind != "memory"] + memory)


def explain(layout: Layout, model: Model, cluster: Cluster, global_batch: int) -> str:
    """A readable breakdown of one layout: memory parts, time parts, and which link each group uses."""
    est = predict_step(layout, model, cluster, global_batch)
    lines = [f"{layout.label()} on {cluster.gpus} GPUs ({cluster.name}), global batch {global_batch}"]
    if est.kind not in (None, "memory"):
        return "\n".join(lines + [f"invalid: {est.reason}"])
    m = global_batch // (layout.dp * layout.micro_batch)
    lines.append(f"  {m} micro-batches per step; model {model.parameters / 1e9:.2f}B parameters "
                 f"({model.active_parameters / 1e9:.2f}B active)")
    mem = est.memory
    lines.append("  memory per GPU (first stage): " + ", ".join(
        f"{k.replace('_', ' ')} {v / 1e9:.2f} GB" for k, v in mem.items()) +
        f" of {cluster.usable_bytes / 1e9:.1f} GB usable")
    lines.append("  step: " + ", ".join(f"{k.replace('_', ' ')} {v:.4g} s" for k, v in est.time.items()))
    flops = step_flops(model, global_batch, layout.recompute)
    lines.append(f"  {flops / est.step_s / cluster.gpus / 1e12:.1f} TFLOP/s per GPU counted with this "
                 f"recomputation ({flops / est.step_s / cluster.gpus / cluster.peak_flops:.0%} of peak)")
    where = {"tp": group_link(cluster, 1, layout.tp)[1], "dp": group_link(cluster, layout.tp, layout.dp)[1],
             "pp": group_link(cluster, layout.tp * layout.dp, layout.pp)[1]}
    if model.moe:
        where["ep"] = group_link(cluster, layout.tp, layout.ep)[1]
    lines.append("  links: " + ", ".join(f"{k} on {v}" for k, v in where.items()))
    if est.reason:
        lines.append(f"  does not fit: {est.reason}")
    return "\n".join(lines)


# ------------------------------------------------------------------ published configurations
# Narayanan et al., SC'21 (arXiv:2104.04473), Table 1, as the Megatron-LM README of April 2021
# shows it (images/cases_april2021.png, commit 50a4b5f) with the tp/pp split, heads and
# micro-batch of the authors' script examples/sc21/run_table_1.sh (commit db6892a): GPT models,
# vocabulary 51,200, sequence 2048, fp16, full recomputation ("--activations-checkpoint-method
# uniform"), on DGX A100 nodes (Selene). Fields: billions of parameters, heads, hidden, layers,
# tp, pp, GPUs, global batch, micro-batch, achieved TFLOP/s per GPU, % of peak.
NARAYANAN_TABLE_1 = (
    ("1.7B", 1.7, 24, 2304, 24, 1, 1, 32, 512, 16, 137, 44),
    ("3.6B", 3.6, 32, 3072, 30, 2, 1, 64, 512, 16, 138, 44),
    ("7.5B", 7.5, 32, 4096, 36, 4, 1, 128, 512, 16, 142, 46),
    ("18B", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 8, 135, 43),
    ("39B", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 4, 138, 44),
    ("76B", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 2, 140, 45),
    ("145B", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 2, 148, 47),
    ("310B", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 1, 155, 50),
    ("530B", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 1, 163, 52),
    ("1T", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 1, 163, 52),
)


@dataclass(frozen=True)
class PublishedRun:
    name: str
    model: Model
    cluster: Cluster
    global_batch: int
    layout: Layout
    tflops_per_gpu: float


def narayanan_table_1() -> list[PublishedRun]:
    """Table 1's rows as planner inputs: the model, the DGX A100 cluster, the paper's layout."""
    runs = []
    for name, _, heads, hidden, layers, t, p, gpus, batch, mb, tflops, _ in NARAYANAN_TABLE_1:
        model = Model(layers, hidden, heads, 2048, 51200, precision="fp16", name=f"GPT {name}")
        layout = Layout(t, p, gpus // (t * p), 1, 0, mb, False, "full")
        runs.append(PublishedRun(name, model, dgx_a100(gpus // 8), batch, layout, tflops))
    return runs


def paper_tflops(model: Model, global_batch: int, seconds: float, gpus: int) -> float:
    """Narayanan et al.'s throughput metric: their FLOPs per step (full recomputation counted) per GPU per second."""
    return step_flops(model, global_batch, "full") / seconds / gpus / 1e12


# "Train a 70B model on 1024 GPUs": a Llama-2-70B-like shape in the GPT-2 layout (Llama 2 itself
# has grouped-query attention and a SwiGLU MLP of 28672, 69B parameters; this shape has 65B),
# on 128 DGX H100 nodes, with Llama 2's batch of 4M tokens (1024 sequences of 4096).
LLAMA2_70B_LIKE = Model(80, 8192, 64, 4096, 32000, name="Llama-2-70B-like (GPT-2 layout)")
LLAMA2_BATCH = 1024


def browser_constants() -> dict:
    """What the calculator page (docs/calculators/parallel-layout.md) needs from here."""
    def link(c: LinkParams) -> dict:
        return {"alpha": c.alpha, "beta": c.beta, "gamma": c.gamma}

    clusters = {}
    for key, make in PRESETS.items():
        c = make(1)
        clusters[key] = {"name": c.name, "gpus_per_node": c.gpus_per_node, "memory_bytes": c.memory_bytes,
                         "peak_flops": c.peak_flops, "efficiency": c.efficiency,
                         "usable_fraction": c.usable_fraction, "intra": link(c.intra), "inter": link(c.inter)}
    bytes_, _, _ = pmem.PRECISIONS["bf16"]
    return {"clusters": clusters, "micro_batches": list(MICRO_BATCHES), "zero_stages": list(ZERO_STAGES),
            "recompute": list(RECOMPUTE), "reasons": list(REASONS), "value_bytes": bytes_,
            "optimizer_k": pmem.optimizer_k("adam", "bf16"), "grad_bytes": pmem.PRECISIONS["bf16"][1]}
