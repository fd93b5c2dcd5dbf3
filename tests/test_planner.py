"""The parallel layout planner (reference_impl/parallel/planner.py), against independent counts.

* parameters and FLOPs: the planner's ``Model`` counts exactly what ``transformer.n_params`` and
  ``transformer.step_flops`` count for the reference GPT, Narayanan et al.'s formula for the FLOPs
  with full recomputation, and Table 1's parameter counts (1.7B ... 1008.0B);
* activation memory: Korthikanti et al.'s Table 2 rebuilt tensor by tensor from their section 4.1
  list, and the first stage's total as Megatron-LM's ``theoretical_memory_usage.py`` computes it;
* model states: ``memory.zero_paper_memory`` (the ZeRO paper's 120 / 31.4 / 16.6 / 1.9 GB);
* tensor- and expert-parallel traffic: the bytes the lab's ``ParallelAttention`` + ``ParallelMLP``
  and ``alltoall`` really send on thread ranks (``CountingCommunicator``), against the planner's
  time on a link of one second per byte;
* the pipeline term: a 1F1B schedule simulated micro-batch by micro-batch;
* a data-parallel step on a ``SimulatedNetwork``: the virtual clock ends at ``predict_step``'s time;
* invalid layouts and bad inputs name what is wrong; ``plan`` ranks and drops with reasons;
* the Megatron-LM check (Table 1 on DGX A100) and the 70B-on-1024-H100 question.
"""
from __future__ import annotations


import numpy as np
import pytest

from reference_impl.comm import CountingCommunicator, run_threads
from reference_impl.comm.alltoall import alltoall
from reference_impl.comm.cost_model import (LinkParams, ring_allgather_time, ring_allreduce_time,
                                            ring_reduce_scatter_time)
from reference_impl.comm.ring import ring_allreduce
from reference_impl.comm.simnet import INTERCONNECTS, SimulatedNetwork
from reference_impl.parallel import memory as pmem
from reference_impl.parallel import planner as P
from reference_impl.parallel import tensor_parallel as tp
from reference_impl.parallel import tensor_parallel_attention as tpa
from reference_impl.parallel import transformer as tf

pytestmark = pytest.mark.timeout(120)

FREE = LinkParams(0.0, 0.0, 0.0)  # communication costs nothing
PER_BYTE = LinkParams(0.0, 1.0, 0.0)  # one second per byte: seconds read as bytes


def test_model_counts_what_the_reference_transformer_counts() -> None:
    for cfg, batch in ((tf.GPTConfig(96, 64, 2, 4, 64), 8), (tf.GPTConfig(50257, 1024, 12, 12, 768), 4),
                       (tf.GPTConfig(96, 32, 3, 2, 128), 16)):
        model = P.Model.from_config(cfg)
        assert model.parameters == tf.n_params(cfg)
        for recompute, ref in (("none", False), ("full", True)):
            assert P.step_flops(model, batch, recompute) == tf.step_flops(cfg, batch, cfg.block_size,
                                                                          recompute=ref)["total"]
        selective = P.step_flops(model, batch, "selective") - P.step_flops(model, batch, "none")
        assert selective == cfg.n_layer * 4 * batch * cfg.block_size ** 2 * cfg.n_embd  # the attention core, again


def test_flops_and_parameters_are_narayanans() -> None:
    """Narayanan et al.'s FLOPs per step, 96 B s l h^2 (1 + s/6h + V/16lh) (with full recomputation),
    and Table 1's parameter counts."""
    for name, billions, heads, h, layers, *_ in P.NARAYANAN_TABLE_1:
        model = P.Model(layers, h, heads, 2048, 51200)
        B, s, V, l = 1536, 2048, 51200, layers
        eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        assert P.step_flops(model, B, "full") == pytest.approx(eq3, rel=1e-12), name
        megatron = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))  # their parameter count
        assert model.parameters == pytest.approx(megatron + 2 * h, rel=1e-12)  # + the final LayerNorm
        assert round(model.parameters / 1e9, 1) == billions, name


def _korthikanti_tensors(s: int, b: int, h: int, a: int, t: int, sp: bool) -> float:
    """Section 4.1 of Korthikanti et al., tensor by tensor (bytes, 16-bit values, 1-byte masks)."""
    attention = {  # (bytes, split by tensor parallelism?)
        "QKV input": (2 * s * b * h, False), "Q and K": (4 * s * b * h, True),
        "softmax output": (2 * a * s * s * b, True), "softmax dropout mask": (a * s * s * b, True),
        "dropout output": (2 * a * s * s * b, True), "V": (2 * s * b * h, True),
        "projection input": (2 * s * b * h, True), "attention dropout mask": (s * b * h, False)}
    mlp = {"first linear input": (2 * s * b * h, False), "GELU input": (8 * s * b * h, True),
           "second linear input": (8 * s * b * h, True), "dropout mask": (s * b * h, False)}
    norms = {"two LayerNorm inputs": (4 * s * b * h, False)}
    return sum(n / t if split or sp else n for n, split in {**attention, **mlp, **norms}.values())


@pytest.mark.parametrize("t", [1, 2, 8])
def test_activations_per_layer_are_korthikanti_table_2(t: int) -> None:
    model = P.Model(96, 12288, 96, 2048, 51200)  # GPT-3: 5as/h = 80
    s, b, h, a = 2048, 1, 12288, 96
    assert 5 * a * s / h == 80
    for sp in ((False, True) if t > 1 else (False,)):
        assert P.activation_bytes_per_layer(model, b, t, sp, "none") == pytest.approx(
            _korthikanti_tensors(s, b, h, a, t, sp), rel=1e-12)
    assert P.activation_bytes_per_layer(model, b, t, False, "none") == pytest.approx(s * b * h * (10 + 24 / t + 80 / t))
    assert P.activation_bytes_per_layer(model, b, t, False, "selective") == pytest.approx(s * b * h * (10 + 24 / t))
    assert P.activation_bytes_per_layer(model, b, t, True, "selective") == pytest.approx(s * b * h * 34 / t)
    assert P.activation_bytes_per_layer(model, b, t, False, "full") == 2 * s * b * h
    assert P.activation_bytes_per_layer(model, b, t, True, "full") == pytest.approx(2 * s * b * h / t)
    moe = P.Model(96, 12288, 96, 2048, 51200, experts=8, top_k=2)  # the MLP's 19 bytes twice
    assert P.activation_bytes_per_layer(moe, b, 1, False, "none") == pytest.approx(s * b * h * (15 + 2 * 19 + 80))


@pytest.mark.parametrize("pp, batch", [(1, 8), (4, 64), (8, 32)])
def test_first_stage_activations_are_megatrons_theoretical_memory(pp: int, batch: int) -> None:
    """``compute_activation_memory`` of megatron/training/theoretical_memory_usage.py (SP, selective)."""
    model = P.Model(32, 4096, 32, 4096, 32000)
    s, b, h, t, L, V = 4096, 1, 4096, 4, 32, 32000
    layout = P.Layout(t, pp, 8, 1, 1, b, True, "selective")
    m = batch // (8 * b)
    megatron = s * b * h * (18 + 4 * (4 * h / h)) * L
    megatron += 8 * s * b * pp + s * b * h * pp
    if pp > 1:
        megatron *= min(1, m / pp)
    else:
        megatron += s * b * h * 4 * (1 + V / h)
    assert P.memory_per_gpu(model, layout, batch)["activations"] == pytest.approx(megatron / t, rel=1e-12)


def test_model_states_are_the_zero_papers() -> None:
    paper = pmem.zero_paper_memory(7.5e9, 64)
    for stage, key in enumerate(paper):
        assert sum(P.model_state_bytes(7.5e9, 64, stage, "bf16")) == pytest.approx(paper[key], rel=1e-12)
    assert [round(sum(P.model_state_bytes(7.5e9, 64, z, "bf16")) / 1e9, 1) for z in range(4)] == [120, 31.4, 16.6, 1.9]
    # per GPU: the stage's tp-split parameters, sharded over dp; experts over dp / ep
    model = P.Model(8, 1024, 16, 1024, 32000, experts=8, top_k=2)
    layout = P.Layout(2, 2, 8, 4, 1, 1, True, "none")
    dense, expert, _ = P.stage_parameters(model, layout)
    assert expert == 4 * (8 / 4) * (8 * 1024 ** 2 + 5 * 1024) / 2
    mem = P.memory_per_gpu(model, layout, 64)
    want = [a + e for a, e in zip(P.model_state_bytes(dense, 8, 1, "bf16"), P.model_state_bytes(expert, 2, 1, "bf16"))]
    assert [mem["parameters"], mem["gradients"], mem["optimizer_state"]] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("t", [2, 4])
def test_tensor_parallel_time_is_the_reference_blocks_traffic(t: int) -> None:
    """Four allreduces of s b h values per layer and micro-batch: what ParallelAttention + ParallelMLP send."""
    cfg = tf.GPTConfig(vocab_size=96, block_size=8, n_layer=3, n_head=4, n_embd=16)
    b, s, C = 2, 8, 16
    params = tf.init_params(cfg, seed=1)  # float32, as Model.from_config's precision
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, s, C)).astype(np.float32)

    def one_block(comm):
        attn = tpa.ParallelAttention(comm, tpa.shard_attention(params, 0, comm.rank, comm.size, 4), 0, 4 // comm.size,
                                     cfg.head_dim)
        mlp = tp.ParallelMLP(comm, tp.shard_mlp(params, 0, comm.rank, comm.size), 0)
        y = mlp.forward(attn.forward(x))
        attn.backward(mlp.backward(np.ones_like(y))[0])
        return comm.bytes_sent

    sent = run_threads(t, one_block, wrap=CountingCommunicator)
    model = P.Model.from_config(cfg)
    cluster = P.local_cluster(1e9, PER_BYTE, t)
    predicted = P.step_time(model, P.Layout(t, 1, 1, 1, 0, b), cluster, b)["tp"]
    assert set(sent) == {predicted / cfg.n_layer}  # bytes per rank, per layer
    with_sp = P.step_time(model, P.Layout(t, 1, 1, 1, 0, b, True), cluster, b)["tp"]
    assert with_sp == predicted
    for link in (PER_BYTE, LinkParams(2e-6, 1e-9, 3e-10)):  # SP's reduce-scatter + all-gather = the allreduce
        n = 4 * b * s * C
        assert ring_reduce_scatter_time(n, t, link) + ring_allgather_time(n, t, link) == pytest.approx(
            ring_allreduce_time(n, t, link), rel=1e-12)


def test_expert_parallel_time_is_the_alltoalls_traffic() -> None:
    model = P.Model(2, 32, 4, 8, 96, experts=4, top_k=2, precision="fp32")
    b, ep, h, s, k = 2, 4, 32, 8, 2
    send = np.ones((ep, b * s * k * h // ep), dtype=np.float32)  # a rank's tokens, k copies, to ep ranks

    def dispatch(comm):
        alltoall(comm, send)
        return comm.bytes_sent

    sent = run_threads(ep, dispatch, wrap=CountingCommunicator)
    cluster = P.local_cluster(1e9, PER_BYTE, ep)
    time = P.step_time(model, P.Layout(1, 1, ep, ep, 0, b), cluster, ep * b)["ep"]
    assert set(sent) == {time / (4 * model.layers)}  # 4 all-to-alls per MoE layer and micro-batch


def _one_f_one_b(p: int, m: int, tf_: float, tb: float, c: float) -> float:
    """Makespan of Megatron's 1F1B schedule (warm-up forwards, steady one-forward-one-backward,
    cool-down backwards), each hop between stages taking ``c``, simulated op by op."""
    order = []
    for i in range(p):
        warm = min(p - i - 1, m)
        ops = [("F", j) for j in range(warm)]
        f = b = 0
        f = warm
        while f < m:
            ops += [("F", f), ("B", b)]
            f, b = f + 1, b + 1
        ops += [("B", j) for j in range(b, m)]
        order.append(ops)
    done: dict = {}
    free, nxt = [0.0] * p, [0] * p
    while any(nxt[i] < len(order[i]) for i in range(p)):
        moved = False
        for i in range(p):
            while nxt[i] < len(order[i]):
                kind, j = order[i][nxt[i]]
                if kind == "F":
                    ready = 0.0 if i == 0 else done.get(("F", i - 1, j), None)
                    ready = None if ready is None else ready + (c if i > 0 else 0.0)
                else:
                    ready = done.get(("F", i, j)) if i == p - 1 else done.get(("B", i + 1, j))
                    ready = None if ready is None else ready + (c if i < p - 1 else 0.0)
                if ready is None:
                    break
                free[i] = max(free[i], ready) + (tf_ if kind == "F" else tb)
                done[(kind, i, j)] = free[i]
                nxt[i] += 1
                moved = True
        assert moved, "the schedule deadlocked"
    return max(free)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 3), (8, 32)])
def test_pipeline_time_is_the_1f1b_schedule(p: int, m: int) -> None:
    """(m + p - 1) slots: exact without communication; with p2p the planner's 2 hops per slot
    bound the simulated schedule from above, within 3 %."""
    model = P.Model(8 * p, 256, 4, 128, 1000)
    c = P.local_cluster(1e12, FREE, p * 2)
    layout = P.Layout(1, p, 2, 1, 0, 1, False, "none")
    t = P.step_time(model, layout, c, 2 * m)
    slot = t["compute"] / m
    assert t["compute"] + t["bubble"] == pytest.approx(_one_f_one_b(p, m, slot / 3, 2 * slot / 3, 0.0), rel=1e-12)
    assert _one_f_one_b(p, m, slot / 2, slot / 2, 0.0) == pytest.approx((m + p - 1) * slot, rel=1e-12)
    hop = LinkParams(1e-5, 1e-12)
    t = P.step_time(model, layout, P.local_cluster(1e12, hop, p * 2), 2 * m)
    c_hop = hop.alpha + 128 * 256 * 2 * hop.beta
    assert t["p2p"] == pytest.approx(m * 2 * c_hop)
    simulated = _one_f_one_b(p, m, t["compute"] / m / 3, 2 * t["compute"] / m / 3, c_hop)
    planned = t["total"] - t["dp"]
    assert simulated <= planned <= simulated * 1.03


def test_groups_use_nvlink_inside_a_node_and_nics_across() -> None:
    c = P.dgx_h100(16)
    assert P.group_link(c, 1, 8) == (c.intra, "NVLink")
    assert P.group_link(c, 2, 4) == (c.intra, "NVLink")
    link, where = P.group_link(c, 1, 16)  # tp = 16: 8 members in each of 2 nodes, 8 NICs each
    assert where == "network x8" and link.alpha == c.inter.alpha and link.beta == c.inter.beta / 8
    link, where = P.group_link(c, 8, 16)  # dp across nodes after tp = 8: one member, one NIC per node
    assert where == "network x1" and link.beta == c.inter.beta
    fast = P.Cluster("fast NICs", 2, 8, 80e9, 1e15, LinkParams(1e-6, 1 / 100e9), LinkParams(1e-6, 1 / 50e9), 0.5)
    assert P.group_link(fast, 1, 16)[0].beta == fast.intra.beta  # never faster than NVLink
    assert c.inter == INTERCONNECTS["IB-NDR"].link and P.dgx_a100().inter == INTERCONNECTS["IB-HDR"].link
    assert P.dgx_a100().intra.beta == 1 / 300e9 and c.intra.beta == 1 / 450e9  # one direction of NVLink


def test_a_data_parallel_step_on_a_simulated_network_ends_at_the_prediction() -> None:
    """This machine's cluster: the step is compute, then a ring allreduce of every gradient."""
    cfg = tf.GPTConfig(vocab_size=96, block_size=16, n_layer=2, n_head=2, n_embd=32)
    link = LinkParams(alpha=5e-6, beta=2e-10, gamma=0.0)
    rate = P.measure_flops_per_second(cfg, 4, repeats=1)
    assert rate > 1e6
    cluster = P.local_cluster(rate, link, 2)
    model = P.Model.from_config(cfg)
    est = P.predict_step(P.Layout(1, 1, 2, 1, 0, 4), model, cluster, 8)
    assert est.fits and est.time["compute"] == pytest.approx(tf.step_flops(cfg, 4, 16)["total"] / rate, rel=1e-12)

    def rank(comm):
        net = SimulatedNetwork(comm, link)
        params = tf.init_params(cfg, seed=0)
        rng = np.random.default_rng(comm.rank)
        tokens = rng.integers(0, 96, (4, 16))
        _, grads = tf.loss_and_grads(params, tokens, tokens, cfg)
        flat = np.concatenate([g.ravel() for g in grads.values()])
        net.advance(est.time["compute"])
        out = np.empty_like(flat)
        ring_allreduce(net, flat, out)
        return net.now(), flat.size

    results = run_threads(2, rank)
    assert {n for _, n in results} == {model.parameters}
    assert max(t for t, _ in results) == pytest.approx(est.step_s, rel=1e-9)


@pytest.mark.parametrize("layout, kind, words", [
    (P.Layout(3, 1, 2, 1), "gpus", "dp x tp x pp = 2 x 3 x 1 = 6, not the cluster's 8 GPUs"),
    (P.Layout(8, 1, 1), "tp_heads", "tp=8 does not divide the 12 attention heads"),
    (P.Layout(1, 8, 1), "pp_layers", "pp=8 does not divide the 6 layers"),
    (P.Layout(1, 1, 8, 8), "ep_experts", "ep=8 does not divide the 4 experts"),
    (P.Layout(2, 2, 2, 4), "ep_dp", "ep=4 does not divide dp=2"),
    (P.Layout(1, 1, 8, 1, 0, 5), "batch", "global batch 48 is not divisible by dp x micro-batch = 8 x 5"),
    (P.Layout(2, 2, 2, 1, 2), "zero_pp", "ZeRO-2"),
])
def test_an_invalid_layout_says_why(layout, kind, words) -> None:
    model = P.Model(6, 768, 12, 256, 1000, experts=4, top_k=1)
    est = P.predict_step(layout, model, P.dgx_a100(1), 48)
    assert (est.fits, est.kind) == (False, kind) and words in est.reason and not est.time
    assert "invalid" in P.explain(layout, model, P.dgx_a100(1), 48)


def test_bad_inputs_and_memory_name_the_problem() -> None:
    for kwargs, words in ((dict(hidden=100, heads=3), "not divisible by 3 heads"), (dict(layers=0), "layers"),
                          (dict(top_k=3), "top_k 3 is more than the 1 experts"), (dict(precision="fp8"), "precision")):
        with pytest.raises(ValueError, match=words):
            P.Model(**{**dict(layers=2, hidden=64, heads=4, seq=16, vocab=100), **kwargs})
    model = P.Model(2, 64, 4, 16, 100)
    for layout, words in ((P.Layout(1, 1, 1, zero=4), "zero"), (P.Layout(1, 1, 1, recompute="some"), "recompute"),
                          (P.Layout(0, 1, 1), "tp")):
        with pytest.raises(ValueError, match=words):
            P.predict_step(layout, model, P.dgx_a100(), 8)
    with pytest.raises(ValueError, match="efficiency"):
        P.Cluster("x", 1, 8, 80e9, 1e15, FREE, FREE, 1.5)
    est = P.predict_step(P.Layout(1, 1, 8), P.LLAMA2_70B_LIKE, P.dgx_h100(1), 8)  # 70B on one node, no sharding
    assert est.kind == "memory" and "GB per GPU, more than the 72.0 GB usable" in est.reason
    assert est.time["total"] > 0 and "does not fit" in P.explain(P.Layout(1, 1, 8), P.LLAMA2_70B_LIKE, P.dgx_h100(1), 8)


def test_plan_ranks_every_layout_that_fits_and_drops_the_rest_with_a_reason() -> None:
    model = P.Model(12, 2048, 16, 2048, 50257, experts=4, top_k=2)
    cluster = P.dgx_h100(2)
    result = P.plan(model, cluster, 64)
    every = list(P.layouts(model, cluster))
    assert len(result.ranked) + len(result.dropped) == len(every) == len(set(every))
    assert result.ranked and all(e.fits and e.memory["total"] <= cluster.usable_bytes for e in result.ranked)
    times = [e.step_s for e in result.ranked]
    assert times == sorted(times)
    assert all(e.reason and e.kind in P.REASONS for e in result.dropped)
    assert sum(result.reasons().values()) == len(result.dropped)
    assert result.reasons()["ep_dp"] > 0 and result.reasons()["zero_pp"] > 0
    best = result.ranked[0].layout
    assert result.rank_of(tp=best.tp, pp=best.pp, dp=best.dp, ep=best.ep) == 1
    assert all(not (L.sequence_parallel and L.tp == 1) and not (L.zero and L.dp == 1) for L in every)
    assert best.label() in P.explain(best, model, cluster, 64)


PAPER_FEATURES = dict(zero_stages=(0,), recompute=("full",), sequence_parallel=(False,))


def test_megatron_table_1_on_dgx_a100() -> None:
    """Narayanan et al. 2021, Table 1, run through the planner on the paper's cluster.

    Agreement asserted:
    * every published layout runs and fits in 72 of the A100's 80 GB;
    * restricted to what the paper used (ZeRO off, full recomputation, no SP), the published
      (tp, pp, dp) ranks within the top 10 of every row (ranks 1, 5, 8, 9, 9, 1, 2, 2, 2, 1 from
      1.7B to 1T), and for 1T the planner's first choice is exactly the paper's layout (tp 8,
      pp 64, dp 6, micro-batch 1); the planner's top layout keeps tensor parallelism inside a
      node (tp <= 8) in every row, with or without the restriction, and from 76B up it picks
      tp = 8, the paper's choice;
    * wherever tp > 8 is possible, the fastest such layout is slower than the top one: 3 % (1T)
      to 101 % (3.6B) slower, the paper's finding that tensor parallelism should stay in a node
      and pipeline parallelism should cross nodes;
    * the predicted throughput of the published layout (the paper's metric, their FLOPs per
      second per GPU) is within 10 % of the published one from 145B up. The efficiency was fitted
      to the 1T row alone (163 TFLOP/s), so that row only checks the fit (within 1 %).

    Where it differs, and why:
    * below 145B the planner predicts 9-39 % more throughput than measured: it gives every
      matrix multiply the same efficiency, and the small models' GEMMs (hidden 2304-10240) reach
      less of the peak than the large ones';
    * the planner prefers micro-batch 1 and a smaller tp for the small models (tp = 1-4 where
      the paper used 2-8): with one efficiency, a larger micro-batch only adds bubble and
      memory, and data parallelism over the NICs costs little next to a 1.7B-39B model's compute;
    * "all top-10 layouts keep tp <= 8" holds for 1.7B-39B and 530B only: for 76B and 1T only
      13 layouts fit at all, and for 145B and 310B tp = 12 or 16 comes 8th and 9th, 9 % behind;
    * 145B and 310B prefer more pipeline stages than the paper (16 and 24 for 8 and 16), 530B
      fewer (21 for 35, a tie within 0.1 %): the model charges the data-parallel allreduce in
      full (Megatron-LM overlaps part of it), and the paper ran the interleaved schedule from
      76B to 530B, whose bubble is smaller than the 1F1B bubble modelled here.
    """
    for run in P.narayanan_table_1():
        L = run.layout
        est = P.predict_step(L, run.model, run.cluster, run.global_batch)
        assert est.fits, f"{run.name}: the published layout does not fit: {est.reason}"
        paper = P.plan(run.model, run.cluster, run.global_batch, **PAPER_FEATURES)
        rank = paper.rank_of(tp=L.tp, pp=L.pp, dp=L.dp)
        assert rank is not None and rank <= 10, f"{run.name}: published layout ranks {rank}"
        everything = P.plan(run.model, run.cluster, run.global_batch)
        for result in (paper, everything):
            assert result.ranked[0].layout.tp <= run.cluster.gpus_per_node, run.name
        if run.model.parameters > 70e9:
            assert paper.ranked[0].layout.tp == 8 == L.tp, run.name
        over = [e for e in paper.ranked if e.layout.tp > 8]
        if over:
            assert over[0].step_s > 1.02 * paper.ranked[0].step_s, run.name
        predicted = P.paper_tflops(run.model, run.global_batch, est.step_s, run.cluster.gpus)
        if run.model.parameters > 140e9:
            assert predicted == pytest.approx(run.tflops_per_gpu, rel=0.10), run.name
        else:
            assert run.tflops_per_gpu < predicted < 1.45 * run.tflops_per_gpu, run.name
    one_t = P.narayanan_table_1()[-1]
    best = P.plan(one_t.model, one_t.cluster, one_t.global_batch, **PAPER_FEATURES).ranked[0]
    assert best.layout == one_t.layout  # (8, 64, 6), micro-batch 1: the paper's own layout
    est = P.predict_step(one_t.layout, one_t.model, one_t.cluster, one_t.global_batch)
    assert P.paper_tflops(one_t.model, one_t.global_batch, est.step_s, 3072) == pytest.approx(163, rel=0.01)


def test_gpt3_175b_on_1024_a100s_is_megatrons_example() -> None:
    """examples/pretrain_gpt3_175B.sh of Megatron-LM: tp 8, pp 16, micro-batch 1, batch 1536, 128 nodes."""
    model = P.Model(96, 12288, 96, 2048, 51200, precision="fp16")
    result = P.plan(model, P.dgx_a100(128), 1536, **PAPER_FEATURES)
    assert result.ranked[0].layout == P.Layout(8, 16, 8, 1, 0, 1, False, "full")


def test_train_a_70b_model_on_1024_h100s() -> None:
    """The syllabus question: a Llama-2-70B-like shape on 128 DGX H100 nodes, 4M tokens a step."""
    cluster = P.dgx_h100(128)
    result = P.plan(P.LLAMA2_70B_LIKE, cluster, P.LLAMA2_BATCH)
    best = result.ranked[0]
    L = best.layout
    assert L.gpus == 1024 and L.tp <= 8 and P.group_link(cluster, 1, L.tp)[1] == "NVLink"
    assert L.pp > 1 and L.zero == 1 and L.sequence_parallel and L.recompute == "selective"
    assert best.memory["total"] <= cluster.usable_bytes
    mfu = P.step_flops(P.LLAMA2_70B_LIKE, P.LLAMA2_BATCH) / best.step_s / 1024 / cluster.peak_flops
    assert 0.35 < mfu < cluster.efficiency
    # plain data parallelism cannot hold it; FSDP (ZeRO-3, tp = pp = 1) can, with full recomputation,
    # and three gathers or scatters of the whole model per step: about a fifth slower
    assert P.predict_step(P.Layout(1, 1, 1024), P.LLAMA2_70B_LIKE, cluster, 1024).kind == "memory"
    fsdp = [e for e in result.ranked if e.layout.tp == e.layout.pp == 1]
    assert fsdp and fsdp[0].layout.zero == 3 and fsdp[0].layout.recompute == "full"
    assert 1.1 * best.step_s < fsdp[0].step_s < 1.5 * best.step_s
    assert all(e.layout.tp <= 8 for e in result.ranked[:10])


def test_sequence_parallelism_and_selective_recomputation_on_530b() -> None:
    """Korthikanti et al., abstract: the 530B model on 2240 A100s reaches 54.2 % MFU with SP and
    selective recomputation, 42.1 % with full recomputation, 29 % faster. Their batch is not in
    the abstract (the ratio moves by 0.3 % between 1120 and 4480 sequences); the layout is Table 1's
    tp 8, pp 35, here with dp 8. The planner: 51.7 % and 38.9 %, 33 % faster."""
    model = P.Model(105, 20480, 128, 2048, 51200, precision="fp16")
    cluster = P.dgx_a100(280)
    full = P.predict_step(P.Layout(8, 35, 8, 1, 0, 1, False, "full"), model, cluster, 2240)
    sp = P.predict_step(P.Layout(8, 35, 8, 1, 0, 1, True, "selective"), model, cluster, 2240)
    assert full.fits and sp.fits
    mfu = [P.step_flops(model, 2240) / e.step_s / 2240 / cluster.peak_flops for e in (full, sp)]
    assert mfu == pytest.approx([0.421, 0.542], rel=0.10)
    assert full.step_s / sp.step_s == pytest.approx(1.29, rel=0.05)
