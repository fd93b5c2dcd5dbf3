"""Expert parallelism: the ``E`` experts of a MoE layer spread over ``ep`` ranks, tokens moved by all-to-all.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

**Layout** (GShard, Lepikhin et al., arXiv:2006.16668, sec. 2.2-3; Megatron-LM
``megatron/core/transformer/moe/moe_layer.py``, ``MoELayer``): rank ``r`` of the expert-parallel
group holds experts ``[r E/ep, (r+1) E/ep)`` (``E % ep == 0``: Megatron asserts
``num_moe_experts % ep_size == 0``) and its own tokens, as in data parallelism. The router
``wg`` is replicated. Each rank routes its own tokens (``moe.route``, Megatron's ``TopKRouter``)
with the capacity of its own group, ``ceil((T_r k / E) * cf)`` per expert: GShard's capacity
per expert *per group*, with a group = one rank's tokens (Megatron too computes the capacity
from the local tokens in ``apply_router_token_dropping``). The single-process reference
``moe.moe_forward(..., group_sizes=[T_0, ..., T_{ep-1}])`` therefore makes the very same
decisions, and the two agree to rounding (the tests: 1e-6 in float64).

**One step**, as Megatron's ``MoEAlltoAllTokenDispatcher`` (``token_dispatcher.py``) names it:

1. ``dispatch_preprocess`` (Megatron's ``permute``): list this rank's kept assignments
   expert by expert, ``0..E-1``; the experts of rank ``d`` are contiguous, so the list is
   already one block per destination rank, ``n[r, d]`` rows.
2. ``token_dispatch``: an ``alltoall`` of the per-expert counts (``E/ep`` int64 to each rank;
   Megatron all-gathers the whole ``E``-vector instead, ``gather_from_sequence_parallel_region``),
   then ``alltoallv`` of the token vectors with those counts as ``recv_counts``. Blocks may be
   empty: a rank may send nothing to another.
3. ``dispatch_postprocess`` (Megatron's ``sort_chunks_by_idxs``): what arrived is source-major
   (rank ``s``'s tokens for local experts ``0, 1, ...``); regroup it expert-major, so each
   local expert gets one matrix.
4. the experts' MLPs (``moe.expert_forward``; Megatron's ``TEGroupedMLP`` / ``SequentialMLP``).
5. ``combine_preprocess``: expert-major back to source-major; ``token_combine``: ``alltoallv``
   back, the exact reverse of step 2; ``combine_postprocess`` (``unpermute``): every token
   adds ``gate x expert output`` of its kept assignments. Megatron sends the gates along
   with the tokens and applies them inside the expert; here they stay home and are applied
   after the combine, as GShard's combine tensor and DeepSpeed's ``_sparse_decode`` do.

Backward is the reverse: ``g x dy`` of every kept assignment goes to its expert's rank (the
dispatch layout), the experts' backward gives their weight gradients (complete: every token of
an expert is on its rank) and the input gradients, which come home by the combine layout.
The router's gradient is computed locally and summed over the ranks with one allreduce: the
data-parallel gradient sync that Megatron's DDP does for every replicated parameter.

**Bytes** rank ``r`` sends per step, ``n[r, d]`` its kept assignments to rank ``d``'s experts,
``C`` the width, ``b`` bytes per element (``comm_bytes`` computes it)::

    forward  = 8 (ep-1) E/ep                            (counts)
             + C b (sum_{d != r} n[r, d]                (dispatch: own tokens out)
                    + sum_{s != r} n[s, r])             (combine: others' results back)
    backward = C b (sum_{d != r} n[r, d] + sum_{s != r} n[s, r])
             + 2 (ep-1)/ep E C b                        (router gradient, ring allreduce)

With ``T`` tokens per rank, nothing dropped and routing uniform over experts,
``n[r, d] = k T / ep`` and each all-to-all moves ``k T C b (ep-1)/ep`` out of every rank: the
dispatch + combine cost ``2 k T C b (ep-1)/ep`` each way, independent of ``E``, linear in ``k``.
DeepSpeed's ``MOELayer`` sends fixed ``(E, capacity, C)`` buffers (``alltoall``, padded; so
does Megatron with ``moe_pad_expert_input_to_capacity``): ``2 E cap C b (ep-1)/ep``, whatever
the routing.

**Failure.** The all-to-alls are pairwise exchanges over the communicator, so a rank that dies
mid-step leaves its peers blocked in a receive: on thread ranks they are woken at once with a
``CommError`` naming the failed rank; on MPI processes each gives up after the communicator's
timeout (``LAB_COMM_TIMEOUT``) with a ``CommError`` naming the peer it waited for.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..backend import require_numpy
from ..comm import Communicator, allreduce, alltoall, alltoallv
from . import moe
from .moe import EXPERT_PARAMS, MoEConfig

_MODULE = "reference_impl.parallel.expert_parallel"  # NumPy-only: other arrays are refused, naming it


def check_divisible(n_experts: int, ep: int) -> int:
    """Experts per rank, or a clear error when ``E`` cannot be split evenly over ``ep`` ranks."""
    if ep < 1 or n_experts % ep:
        raise ValueError(f"expert parallelism: {n_experts} experts cannot be split evenly over {ep} ranks "
                         f"(n_experts % ep = {n_experts % ep if ep > 0 else 'undefined'}; Megatron asserts "
                         f"num_moe_experts % expert_model_parallel_size == 0)")
    return n_experts // ep


def shard_experts(params: Mapping[str, np.ndarray], rank: int, ep: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s parameters: the router (replicated) and its ``E/ep`` experts (copies)."""
    require_numpy(_MODULE, *params.values())
    E = params["wg"].shape[0]
    n = check_divisible(E, ep)
    if not 0 <= rank < ep:
        raise ValueError(f"shard_experts: rank {rank} is outside 0..{ep - 1}")
    local = {name: params[name][rank * n:(rank + 1) * n].copy() for name in EXPERT_PARAMS}
    return {"wg": params["wg"].copy(), **local}


def unshard_experts(shards: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Every rank's expert parameters (or gradients), by rank, back into one dict; ``wg`` from rank 0."""
    full = {name: np.concatenate([s[name] for s in shards], axis=0) for name in EXPERT_PARAMS}
    full["wg"] = shards[0]["wg"]
    for r, s in enumerate(shards[1:], 1):
        if not np.allclose(s["wg"], full["wg"], rtol=1e-12, atol=1e-12):
            raise ValueError(f"unshard_experts: the replicated wg of rank {r} differs from rank 0's")
    return full


def comm_bytes(processed: np.ndarray, n_embd: int, itemsize: int) -> dict[str, list[int]]:
    """Bytes each rank sends in ``forward`` and ``backward`` (the closed form of the module docstring).

    ``processed`` is ``(ep, E)``: kept assignments from rank ``r``'s tokens to expert ``e``
    (``MoEStats.processed`` of the reference routed with one group per rank).
    """
    ep, E = processed.shape
    n_local = check_divisible(E, ep)
    n = processed.reshape(ep, ep, n_local).sum(axis=2)  # n[r, d]
    fwd, bwd = [], []
    for r in range(ep):
        moved = int(n[r].sum() - n[r, r] + n[:, r].sum() - n[r, r]) * n_embd * itemsize
        fwd.append(8 * (ep - 1) * n_local + moved)
        bwd.append(moved + (2 * (ep - 1) * E * n_embd * itemsize // ep if ep > 1 else 0))
    return {"forward": fwd, "backward": bwd}


class ExpertParallelMoE:
    """One rank's part of a MoE layer (Megatron's ``MoELayer`` with ``MoEAlltoAllTokenDispatcher``).

    ``forward(x)`` takes this rank's tokens ``(T_r, C)`` and returns their MoE output (no residual);
    ``routing``/``stats``/``aux_loss`` then describe this rank's group (the layer's auxiliary loss
    is the mean over ranks). ``backward(dy)`` returns ``dx`` for this rank's tokens and gradients:
    ``wg`` summed over the ranks (the same on every rank), the local experts' under the names of
    ``moe.param_shapes`` with a leading ``E/ep`` axis.
    """

    def __init__(self, comm: Communicator, params: Mapping[str, np.ndarray], cfg: MoEConfig):
        self.comm, self.params, self.cfg = comm, params, cfg
        self.n_local = check_divisible(cfg.n_experts, comm.size)
        if params["c_fc.weight"].shape[0] != self.n_local:
            raise ValueError(f"ExpertParallelMoE on rank {comm.rank}: got {params['c_fc.weight'].shape[0]} experts, "
                             f"expected E/ep = {cfg.n_experts}/{comm.size} = {self.n_local} (use shard_experts)")
        self.first = comm.rank * self.n_local

    # -------------------------------------------------------------- forward
    # --8<-- [start:forward]
    def forward(self, x: np.ndarray) -> np.ndarray:
        require_numpy(_MODULE, x)
        cfg, ep, C = self.cfg, self.comm.size, self.cfg.n_embd
        if x.ndim != 2 or x.shape[1] != C:
            raise ValueError(f"ExpertParallelMoE on rank {self.comm.rank}: x must be (tokens, {C}), got {x.shape}")
        self.x = x
        self.routing = moe.route(self.params["wg"], x, cfg)
        # 1. dispatch_preprocess: kept assignments expert by expert = one block per destination rank
        per_expert = [moe.assignments_of(self.routing, e) for e in range(cfg.n_experts)]
        self.t = np.concatenate([t for t, _ in per_expert])
        self.j = np.concatenate([j for _, j in per_expert])
        counts = np.array([len(t) for t, _ in per_expert], dtype=np.int64).reshape(ep, self.n_local)
        # 2. token_dispatch: counts first, then the tokens (alltoallv with known receive counts)
        self.recv_counts = alltoall(self.comm, counts) if ep > 1 else counts  # [s, i]: from s to local i
        self.send_rows = counts.sum(axis=1)
        received = self._exchange(x[self.t], self.send_rows, self.recv_counts.sum(axis=1))
        # 3. dispatch_postprocess: source-major -> expert-major; 4. the local experts
        self.expert_caches = []
        outs = []
        for i, xe in enumerate(self._by_expert(received)):
            out, cache = moe.expert_forward(moe.expert_weights(self.params, i), xe, cfg.activation)
            outs.append(out)
            self.expert_caches.append(cache)
        # 5. combine_preprocess, token_combine, combine_postprocess (unpermute)
        self.out = self._exchange(self._by_source(outs), self.recv_counts.sum(axis=1), self.send_rows)
        y = np.zeros_like(x)
        np.add.at(y, self.t, self.routing.gates[self.t, self.j][:, None] * self.out)
        return y
    # --8<-- [end:forward]

    @property
    def stats(self) -> moe.MoEStats:
        return self.routing.stats

    @property
    def aux_loss(self) -> float:
        """This rank's load-balancing loss; the layer's is the mean of the ranks' (likewise ``z_loss``)."""
        return self.routing.aux_loss

    @property
    def z_loss(self) -> float:
        return self.routing.z_loss

    # -------------------------------------------------------------- backward
    def backward(self, dy: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        cfg, t, j = self.cfg, self.t, self.j
        dyt = dy[t]
        dgates = np.zeros_like(self.routing.gates)
        dgates[t, j] = np.einsum("nc,nc->n", dyt, self.out)
        # g * dy to the experts (dispatch layout), their backward, dx home (combine layout)
        douts = self._by_expert(self._exchange(self.routing.gates[t, j][:, None] * dyt, self.send_rows,
                                               self.recv_counts.sum(axis=1)))
        grads = {name: np.zeros_like(self.params[name]) for name in EXPERT_PARAMS}
        dxs = []
        for i, (dout, cache) in enumerate(zip(douts, self.expert_caches)):
            dxe, dw = moe.expert_backward(moe.expert_weights(self.params, i), dout, cache, cfg.activation)
            dxs.append(dxe)
            for name, d in zip(EXPERT_PARAMS, dw):
                grads[name][i] = d
        dx = np.zeros_like(self.x)
        np.add.at(dx, t, self._exchange(self._by_source(dxs), self.recv_counts.sum(axis=1), self.send_rows))
        dwg, dx_router = moe.router_backward(self.routing, dgates, self.x, self.params["wg"], cfg,
                                             aux_weight=1.0 / self.comm.size)
        dx += dx_router
        grads["wg"] = dwg if self.comm.size == 1 else \
            allreduce(self.comm, np.ascontiguousarray(dwg), algorithm="ring")
        return dx, grads

    # -------------------------------------------------------------- data movement
    def _exchange(self, rows: np.ndarray, send_rows: np.ndarray, recv_rows: np.ndarray) -> np.ndarray:
        """``alltoallv`` of ``(n, C)`` rows: ``send_rows[d]`` consecutive rows to rank ``d``, in rank order;
        returns the ``(sum recv_rows, C)`` rows received, source by source."""
        C = self.cfg.n_embd
        bounds = np.concatenate([[0], np.cumsum(send_rows)])
        blocks = [np.ascontiguousarray(rows[bounds[d]:bounds[d + 1]]).reshape(-1) for d in range(len(send_rows))]
        got = alltoallv(self.comm, blocks, recv_counts=[int(n) * C for n in recv_rows])
        return np.concatenate(got).reshape(-1, C)

    def _by_expert(self, rows: np.ndarray) -> list[np.ndarray]:
        """Source-major rows (for each source, its rows for local experts 0, 1, ...) -> one matrix per expert."""
        flat = self.recv_counts.reshape(-1)  # [s * n_local + i]
        bounds = np.concatenate([[0], np.cumsum(flat)])
        ep = self.comm.size
        return [np.concatenate([rows[bounds[s * self.n_local + i]:bounds[s * self.n_local + i + 1]]
                                for s in range(ep)]) for i in range(self.n_local)]

    def _by_source(self, per_expert: Sequence[np.ndarray]) -> np.ndarray:
        """The inverse of ``_by_expert``: expert matrices -> source-major rows."""
        ep = self.comm.size
        starts = [np.concatenate([[0], np.cumsum(self.recv_counts[:, i])]) for i in range(self.n_local)]
        return np.concatenate([per_expert[i][starts[i][s]:starts[i][s + 1]]
                               for s in range(ep) for i in range(self.n_local)]).reshape(-1, self.cfg.n_embd)
