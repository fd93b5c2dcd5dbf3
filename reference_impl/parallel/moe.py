"""Mixture of experts (MoE): a router sends every token to ``k`` of ``E`` expert MLPs.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

**What.** A transformer's MLP is replaced by ``E`` MLPs ("experts") and a router. Token
``x_t`` (a row of ``x``, shape ``(T, C)``) goes to its ``k`` best experts only::

    logits = x @ wg.T                    wg: (E, C), the router ("gate") weight
    p_t    = softmax(logits_t)           probabilities over the E experts
    y_t    = sum_{e in topk(p_t), kept} g_{t,e} * FFN_e(x_t)
    FFN_e(x) = c_proj_e(gelu(c_fc_e(x)))   c_fc_e: (4C, C), c_proj_e: (C, 4C)

and the block adds the residual, ``x_t + y_t``. **Why:** the parameters grow with ``E``, the
FLOPs per token only with ``k`` (Shazeer et al., "Outrageously large neural networks",
arXiv:1701.06538, 2017). This file is the single-process layer with a hand-written backward;
``expert_parallel.py`` spreads the experts over ranks and must route exactly as this does.

**Gates.** ``k = 1`` is the Switch Transformer (Fedus et al., arXiv:2101.03961, sec. 2.1):
``g = p_e``, the chosen expert's probability, so the router learns through the output.
For ``k > 1`` the gates are renormalised over the ``k`` chosen experts,
``g_{t,e} = p_{t,e} / sum_{j in topk} p_{t,j}``, *before* any token is dropped. Megatron-LM
does this (``megatron/core/transformer/moe/moe_utils.py``, ``topk_routing_with_score_function``:
with its default ``moe_router_pre_softmax=False`` it takes the softmax over the ``k`` chosen
logits, which is the same number; it refuses ``k = 1`` without pre-softmax, because a softmax
over one logit is 1 and the router gets no gradient), and so does GShard's
``Top2GatingOnLogits`` (Lepikhin et al., arXiv:2006.16668; lingvo
``lingvo/core/gshard_layers.py``, ``legacy_mtf_behavior=True``). DeepSpeed
(``deepspeed/moe/sharded_moe.py``: ``top2gating``, ``topkgating``) renormalises *after*
dropping, over the experts a token kept.

**Capacity.** An expert takes at most ``capacity = ceil((T k / E) * capacity_factor)``
assignments from a group of ``T`` tokens: Megatron's ``get_capacity(num_tokens * topk, E, cf)``
in ``apply_router_token_dropping`` (this exact expression, float rounding included), DeepSpeed's
``_capacity`` with ``capacity_factor * k`` (``top1gating``; ``top2gating`` passes ``cf * 2``,
``topkgating`` ``cf * k``), the Switch paper's eq. 3, ``(tokens / experts) * cf``, for ``k = 1``.
GShard's ``Top2GatingOnLogits`` takes ``int(S cf / E)`` for a group of ``S`` tokens, with no factor
``k``, rounded up to a multiple of 4. DeepSpeed also has a ``min_capacity`` floor (4 in its ``MoE`` layer);
not modelled here.
``capacity_factor=None`` never drops (Megatron's "dropless", its default).

**Who is dropped.** Over capacity, an expert keeps its assignments in a fixed priority order:

* ``"position"`` (GShard, Switch): all first choices in token order, then all second choices,
  and so on (lingvo's ``position_in_expert_2 = cumsum(mask_2) + count(mask_1)``, DeepSpeed
  ``top2gating``'s ``locations2 += sum(mask1)``). For ``k = 1``: the earliest tokens win.
  Megatron's ``"position"`` is documented as dropping "tokens at the end of each batch", with
  no rank between first and second choices; DeepSpeed's ``top1gating`` by default keeps a
  random subset (``use_rts=True``, random token selection).
* ``"probs"`` (Megatron's default ``moe_token_drop_policy``): each expert keeps the
  ``capacity`` assignments with the largest gates (``torch.topk`` over tokens in
  ``apply_router_token_dropping``); here ties go to the ``"position"`` order.

A dropped assignment adds nothing to ``y_t``; a token whose ``k`` assignments are all dropped
has ``y_t = 0``, so the block passes it on as ``x_t + 0``: it is carried by the residual.
``MoEStats`` counts both, per group and expert; nothing is dropped silently.

**Groups.** GShard's "local group dispatching" splits the ``T`` tokens into groups and routes
each with its own capacity; Megatron routes each rank's own tokens. ``group_sizes`` (contiguous
groups, default one) gives the same here, so the reference routes exactly as the
expert-parallel layer, where a group is a rank's tokens.

**Load-balancing loss** (Switch, eqs. 4-6): ``L_aux = alpha * E * sum_i f_i * P_i``, ``f_i`` the
fraction of the ``T k`` assignments routed to expert ``i`` (top-k before capacity), ``P_i =
mean_t p_{t,i}``. It is ``alpha`` when both are uniform (``1/E``) and grows as routing
concentrates. Megatron's ``switch_load_balancing_loss_func`` (``f_i = tokens_i / (T k)``, from
``compute_routing_scores_for_aux_loss``, top-k before dropping) is this formula; DeepSpeed's
``top1gating`` returns ``E * sum(me * ce)`` and applies ``alpha`` outside; GShard and DeepSpeed's
``top2gating`` count first choices only in ``f`` (DeepSpeed's ``topkgating`` counts all ``k``).
``f`` is piecewise constant, so the gradient flows through ``P`` alone:
``dL_aux/dp_{t,i} = alpha E f_i / T``. Computed per group and averaged over the groups
(Megatron's default ``"aux_loss"``: per micro-batch on each rank).

**Router z-loss** (ST-MoE, Zoph et al., arXiv:2202.08906, eq. 5; Megatron ``z_loss_func``):
``L_z = beta * mean_t (logsumexp_i logits_{t,i})^2``, gradient ``2 beta lse_t softmax_t / T``;
it keeps the logits small. Off by default (``z_loss_coeff=0``).

**Backward**, for ``dy = dL/dy``: an expert's MLP backward runs on ``g * dy`` of its tokens
(``_gelu_backward``/``_weight_grad`` of transformer.py); ``dL/dg_{t,e} = dy_t . FFN_e(x_t)``;
through the renormalisation ``g = s / S`` (``s`` the chosen probabilities, ``S`` their sum),
``ds_i = dg_i / S - sum_j dg_j s_j / S^2``; the auxiliary terms add to ``dp``; the softmax gives
``dlogits = p * (dp - sum(p * dp))``; then ``dwg = dlogits.T @ x`` and ``dx += dlogits @ wg``.
Top-k choice and capacity are piecewise constant: gradients hold for a fixed routing, which
is how the tests check them by finite differences (``fixed=``).

``routing_sweep`` trains a tiny MoE language model and measures load and drops with the
auxiliary loss on and off, for the concept page's figure.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..backend import require_numpy
from .transformer import ACTIVATIONS, _gelu, _gelu_backward, _weight_grad

_MODULE = "reference_impl.parallel.moe"  # NumPy-only: other arrays are refused, naming it

DROP_POLICIES = ("position", "probs")
EXPERT_PARAMS = ("c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias")


@dataclass(frozen=True)
class MoEConfig:
    """One MoE layer: ``n_experts`` experts of width ``4 n_embd``, each token to ``top_k`` of them."""
    n_embd: int
    n_experts: int
    top_k: int = 1
    capacity_factor: float | None = 1.25  # None: no capacity, nothing dropped
    drop_policy: str = "position"
    aux_loss_coeff: float = 1e-2  # Switch's alpha
    z_loss_coeff: float = 0.0  # ST-MoE's beta
    activation: str = "gelu_tanh"

    def __post_init__(self) -> None:
        if self.n_embd < 1 or self.n_experts < 1:
            raise ValueError(f"MoEConfig: need n_embd >= 1 and n_experts >= 1, got {self.n_embd}, {self.n_experts}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"MoEConfig: top_k={self.top_k} must be between 1 and n_experts={self.n_experts}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(f"MoEConfig: capacity_factor must be positive or None, got {self.capacity_factor}")
        if self.drop_policy not in DROP_POLICIES:
            raise ValueError(f"MoEConfig: drop_policy {self.drop_policy!r} is not one of {DROP_POLICIES}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"MoEConfig: activation {self.activation!r} is not one of {ACTIVATIONS}")
        if self.aux_loss_coeff < 0 or self.z_loss_coeff < 0:
            raise ValueError(f"MoEConfig: loss coefficients must be >= 0, got aux_loss_coeff={self.aux_loss_coeff}, "
                             f"z_loss_coeff={self.z_loss_coeff}")


def param_shapes(cfg: MoEConfig) -> dict[str, tuple[int, ...]]:
    """The router ``wg`` (E, C) and the experts' MLP weights stacked along a leading E axis."""
    E, C = cfg.n_experts, cfg.n_embd
    return {"wg": (E, C), "c_fc.weight": (E, 4 * C, C), "c_fc.bias": (E, 4 * C),
            "c_proj.weight": (E, C, 4 * C), "c_proj.bias": (E, C)}


def init_params(cfg: MoEConfig, seed: int = 0, dtype: type = np.float64, std: float = 0.02,
                router_std: float | None = None) -> dict[str, np.ndarray]:
    """N(0, std) weights (the router N(0, router_std), default ``std``), zero biases."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        scale = (router_std if router_std is not None else std) if name == "wg" else std
        value = np.zeros(shape) if name.endswith("bias") else rng.standard_normal(shape) * scale
        params[name] = value.astype(dtype)
    return params


# --8<-- [start:capacity]
def expert_capacity(n_tokens: int, cfg: MoEConfig) -> int | None:
    """Assignments one expert may take from a group of ``n_tokens``: Megatron's ``get_capacity``."""
    if cfg.capacity_factor is None:
        return None
    return math.ceil((n_tokens * cfg.top_k / cfg.n_experts) * cfg.capacity_factor)
# --8<-- [end:capacity]


# ------------------------------------------------------------------ routing
@dataclass
class MoEStats:
    """What the router did, per group ``g`` and expert ``e``: assignments before and after capacity."""
    routed: np.ndarray  # (G, E): top-k assignments of group g's tokens to expert e (the load)
    processed: np.ndarray  # (G, E): those within capacity (what the expert computes)
    capacity: tuple[int | None, ...]  # per group
    tokens: int
    top_k: int
    dropped_tokens: int  # tokens all of whose k assignments were dropped (output = residual only)

    @property
    def tokens_per_expert(self) -> np.ndarray:
        return self.routed.sum(axis=0)

    @property
    def dropped(self) -> int:
        """Assignments over capacity (a token may lose one of its k experts and keep another)."""
        return int(self.routed.sum() - self.processed.sum())

    @property
    def dropped_fraction(self) -> float:
        return self.dropped / max(1, self.tokens * self.top_k)

    @property
    def max_load(self) -> float:
        """Busiest expert's assignments over the mean (1 = perfectly balanced, E = all on one)."""
        load = self.tokens_per_expert
        return float(load.max() / load.mean()) if load.sum() else 1.0


@dataclass
class Routing:
    """The router's decisions for ``T`` tokens, and the auxiliary losses (already weighted)."""
    probs: np.ndarray  # (T, E) softmax of the router logits
    lse: np.ndarray  # (T,) logsumexp of the logits (the z-loss)
    experts: np.ndarray  # (T, k) chosen experts, best first
    gates: np.ndarray  # (T, k) gate weights (Switch gate for k=1, renormalised over top-k else)
    kept: np.ndarray  # (T, k) bool: assignment within its expert's capacity
    group_sizes: tuple[int, ...]
    stats: MoEStats
    aux_losses: np.ndarray  # (G,) alpha E sum_i f_i P_i of each group
    z_losses: np.ndarray  # (G,) beta mean_t lse_t^2 of each group

    @property
    def aux_loss(self) -> float:
        return float(self.aux_losses.mean()) if len(self.aux_losses) else 0.0

    @property
    def z_loss(self) -> float:
        return float(self.z_losses.mean()) if len(self.z_losses) else 0.0


def _check_groups(group_sizes: Sequence[int] | None, T: int) -> tuple[int, ...]:
    sizes = (T,) if group_sizes is None else tuple(int(n) for n in group_sizes)
    if not sizes or any(n < 0 for n in sizes) or sum(sizes) != T:
        raise ValueError(f"MoE: group_sizes {list(sizes)} must be >= 0 and add up to the {T} tokens")
    return sizes


# --8<-- [start:keep]
def keep_within_capacity(experts: np.ndarray, gates: np.ndarray, capacity: int | None,
                         n_experts: int, policy: str) -> np.ndarray:
    """``(T, k)`` bool: which assignments of one group each expert keeps, by ``policy``'s priority."""
    T, k = experts.shape
    if capacity is None:
        return np.ones((T, k), dtype=bool)
    t, j = np.divmod(np.arange(T * k), k)  # flat index t * k + j
    e, w = experts.ravel(), gates.ravel()
    order = np.lexsort((t, j)) if policy == "position" else np.lexsort((t, j, -w))  # last key first
    e_in_order = e[order]
    by_expert = np.argsort(e_in_order, kind="stable")  # each expert's assignments, in priority order
    counts = np.bincount(e_in_order, minlength=n_experts)
    first = np.cumsum(counts) - counts
    rank = np.empty(T * k, dtype=np.int64)
    rank[by_expert] = np.arange(T * k) - first[e_in_order[by_expert]]
    kept = np.empty(T * k, dtype=bool)
    kept[order] = rank < capacity
    return kept.reshape(T, k)
# --8<-- [end:keep]


def route(wg: np.ndarray, x: np.ndarray, cfg: MoEConfig, group_sizes: Sequence[int] | None = None,
          fixed: Routing | None = None) -> Routing:
    """Router forward (``TopKRouter``): probabilities, top-k, gates, capacity, auxiliary losses.

    ``fixed``: reuse its expert choices and capacity decisions (recomputing everything else),
    which makes the layer a smooth function of its inputs for a finite-difference check.
    """
    T, C = x.shape
    E, k = cfg.n_experts, cfg.top_k
    if wg.shape != (E, C):
        raise ValueError(f"MoE router: wg has shape {wg.shape}, expected (n_experts, n_embd) = {(E, C)}")
    sizes = _check_groups(group_sizes, T)
    # --8<-- [start:router]
    logits = x @ wg.T
    m = logits.max(axis=1, keepdims=True)
    probs = np.exp(logits - m)
    z = probs.sum(axis=1, keepdims=True)
    probs /= z
    lse = (m + np.log(z))[:, 0]
    if fixed is not None:
        if fixed.experts.shape != (T, k) or fixed.group_sizes != sizes:
            raise ValueError(f"MoE: fixed routing is for {fixed.experts.shape} and groups {fixed.group_sizes}, "
                             f"not {(T, k)} and {sizes}")
        experts = fixed.experts
    else:  # best first; equal probabilities go to the lower expert index
        experts = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(probs, experts, axis=1)
    gates = chosen if k == 1 else chosen / chosen.sum(axis=1, keepdims=True)
    # --8<-- [end:router]

    G = len(sizes)
    kept = np.empty((T, k), dtype=bool)
    routed, processed = np.zeros((G, E), dtype=np.int64), np.zeros((G, E), dtype=np.int64)
    caps, aux, zl = [], np.zeros(G), np.zeros(G)
    start = 0
    for g, n in enumerate(sizes):
        rows = slice(start, start + n)
        cap = expert_capacity(n, cfg)
        caps.append(cap)
        kept[rows] = fixed.kept[rows] if fixed is not None else \
            keep_within_capacity(experts[rows], gates[rows], cap, E, cfg.drop_policy)
        routed[g] = np.bincount(experts[rows].ravel(), minlength=E)
        processed[g] = np.bincount(experts[rows][kept[rows]], minlength=E)
        if n:
            # --8<-- [start:aux_loss]
            f, P = routed[g] / (n * k), probs[rows].mean(axis=0)
            aux[g] = cfg.aux_loss_coeff * E * float(f @ P)
            # --8<-- [end:aux_loss]
            zl[g] = cfg.z_loss_coeff * float(np.mean(lse[rows] ** 2))
        start += n
    stats = MoEStats(routed, processed, tuple(caps), T, k, int((~kept.any(axis=1)).sum()))
    return Routing(probs, lse, experts, gates, kept, sizes, stats, aux, zl)


def router_backward(routing: Routing, dgates: np.ndarray, x: np.ndarray, wg: np.ndarray, cfg: MoEConfig,
                    aux_weight: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(dwg, dx)`` of the router from ``dgates`` (T, k) plus the auxiliary losses.

    ``aux_weight`` multiplies each group's auxiliary and z-loss (default ``1 / G``: their mean).
    """
    k, E = cfg.top_k, cfg.n_experts
    sizes = routing.group_sizes
    w = 1.0 / len(sizes) if aux_weight is None else aux_weight
    probs = routing.probs
    chosen = np.take_along_axis(probs, routing.experts, axis=1)
    if k == 1:
        dchosen = dgates
    else:  # g = s / S
        S = chosen.sum(axis=1, keepdims=True)
        dchosen = dgates / S - (dgates * chosen).sum(axis=1, keepdims=True) / (S * S)
    dprobs = np.zeros_like(probs)
    np.put_along_axis(dprobs, routing.experts, dchosen, axis=1)
    dlogits_z = np.zeros_like(probs)
    start = 0
    for g, n in enumerate(sizes):
        rows = slice(start, start + n)
        if n and cfg.aux_loss_coeff:  # d/dp_{t,i} of alpha E sum_i f_i mean_t p_{t,i}
            f = routing.stats.routed[g] / (n * k)
            dprobs[rows] += w * cfg.aux_loss_coeff * E * f / n
        if n and cfg.z_loss_coeff:  # d/dlogits of beta mean_t lse_t^2
            dlogits_z[rows] = (w * cfg.z_loss_coeff * 2.0 / n) * routing.lse[rows, None] * probs[rows]
        start += n
    dlogits = probs * (dprobs - (probs * dprobs).sum(axis=1, keepdims=True))
    dlogits += dlogits_z
    return dlogits.T @ x, dlogits @ wg


# ------------------------------------------------------------------ the experts
def expert_weights(params: Mapping[str, np.ndarray], e: int) -> tuple[np.ndarray, ...]:
    """Expert ``e``'s ``(c_fc.weight, c_fc.bias, c_proj.weight, c_proj.bias)``."""
    return tuple(params[name][e] for name in EXPERT_PARAMS)


def expert_forward(w: Sequence[np.ndarray], xe: np.ndarray, activation: str) -> tuple[np.ndarray, tuple]:
    """One expert's MLP on its ``(n, C)`` tokens: ``c_proj(gelu(c_fc(xe)))``; returns (out, cache)."""
    w1, b1, w2, b2 = w
    h = xe @ w1.T + b1
    g = _gelu(h, activation)
    return g @ w2.T + b2, (xe, h, g)


def expert_backward(w: Sequence[np.ndarray], dout: np.ndarray, cache: tuple,
                    activation: str) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """``(dxe, (dc_fc.weight, dc_fc.bias, dc_proj.weight, dc_proj.bias))`` of one expert."""
    w1, _, w2, _ = w
    xe, h, g = cache
    dg = dout @ w2
    dh = _gelu_backward(dg, h, activation)
    return dh @ w1, (_weight_grad(dh, xe), dh.sum(axis=0), _weight_grad(dout, g), dout.sum(axis=0))


def assignments_of(routing: Routing, e: int) -> tuple[np.ndarray, np.ndarray]:
    """``(t, j)``: the kept assignments to expert ``e``, in token order (a token picks e at most once)."""
    return np.nonzero((routing.experts == e) & routing.kept)


# ------------------------------------------------------------------ the layer
@dataclass
class MoECache:
    x: np.ndarray
    routing: Routing
    experts: list  # per expert: (t, j, out, expert cache)


def moe_forward(params: Mapping[str, np.ndarray], x: np.ndarray, cfg: MoEConfig,
                group_sizes: Sequence[int] | None = None, fixed: Routing | None = None) -> tuple[np.ndarray, MoECache]:
    """``y`` (T, C), the MoE output without the residual (zero rows for fully dropped tokens).

    The caller's loss is ``L(x + y) + cache.routing.aux_loss + cache.routing.z_loss``.
    """
    require_numpy(_MODULE, x, *params.values())
    if x.ndim != 2 or x.shape[1] != cfg.n_embd:
        raise ValueError(f"MoE: x must be (tokens, n_embd={cfg.n_embd}), got shape {x.shape}")
    routing = route(params["wg"], x, cfg, group_sizes, fixed)
    y = np.zeros_like(x)
    per_expert = []
    for e in range(cfg.n_experts):
        t, j = assignments_of(routing, e)
        out, cache = expert_forward(expert_weights(params, e), x[t], cfg.activation)
        y[t] += routing.gates[t, j][:, None] * out
        per_expert.append((t, j, out, cache))
    return y, MoECache(x, routing, per_expert)


def moe_backward(params: Mapping[str, np.ndarray], dy: np.ndarray, cache: MoECache,
                 cfg: MoEConfig) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(dx, grads)`` for ``dy = dL/dy``, the auxiliary losses' gradients included."""
    routing, x = cache.routing, cache.x
    dx = np.zeros_like(x)
    dgates = np.zeros_like(routing.gates)
    grads = {name: np.zeros_like(params[name]) for name in EXPERT_PARAMS}
    for e, (t, j, out, ecache) in enumerate(cache.experts):
        dyt = dy[t]
        dgates[t, j] = np.einsum("nc,nc->n", dyt, out)
        dxe, dw = expert_backward(expert_weights(params, e), routing.gates[t, j][:, None] * dyt, ecache,
                                  cfg.activation)
        dx[t] += dxe
        for name, d in zip(EXPERT_PARAMS, dw):
            grads[name][e] = d
    grads["wg"], dx_router = router_backward(routing, dgates, x, params["wg"], cfg)
    dx += dx_router
    return dx, grads


# ------------------------------------------------------------------ measurement
def routing_sweep(capacity_factors: Sequence[float] = (0.5, 1.0, 1.25, 2.0), aux_coeffs: Sequence[float] = (0.0, 1e-2),
                  *, n_experts: int = 8, top_k: int = 1, n_embd: int = 16, steps: int = 500, tokens: int = 256,
                  lr: float = 1e-2, seed: int = 0, tail: int = 50) -> list[dict]:
    """Train a tiny MoE language model per (aux coefficient, capacity factor); measure its routing.

    The model predicts the next character of the corpus (``corpus.py``) from the current one:
    ``h = emb[c] + moe(emb[c])``, logits ``h @ out.T``, mean cross-entropy plus the auxiliary
    loss, Adam on every parameter, ``tokens`` random characters a step (one routing group),
    the same seed and batches for every run. Per run, per step: the loss, the load
    (``max_load``: busiest expert's assignments over the mean) and the dropped fraction of
    assignments; their means over the first and last ``tail`` steps (``*_first``, ``*_last``);
    and the last step's assignments per expert (``tokens_per_expert``). Whatever it measures
    is what it returns: the seed and sizes are the defaults, not picked for an outcome.
    """
    from . import corpus
    from .adam import Adam

    data = corpus.split()[0]
    V = len(corpus.VOCAB)
    rows = []
    for alpha in aux_coeffs:
        for cf in capacity_factors:
            cfg = MoEConfig(n_embd=n_embd, n_experts=n_experts, top_k=top_k, capacity_factor=cf,
                            aux_loss_coeff=alpha)
            rng = np.random.default_rng(seed)
            params = {"emb": rng.standard_normal((V, n_embd)) * 0.5, "out": rng.standard_normal((V, n_embd)) * 0.1,
                      **init_params(cfg, seed=seed + 1, std=0.1, router_std=0.1)}
            opt = Adam(lr)
            batches = np.random.default_rng(seed + 2)
            loads, drops, losses = [], [], []
            start = time.perf_counter()
            for _ in range(steps):
                pos = batches.integers(0, len(data) - 1, size=tokens)
                c, target = data[pos], data[pos + 1]
                x = params["emb"][c]
                y, cache = moe_forward(params, x, cfg)
                h = x + y
                logits = h @ params["out"].T
                logits -= logits.max(axis=1, keepdims=True)
                p = np.exp(logits)
                p /= p.sum(axis=1, keepdims=True)
                losses.append(float(-np.log(p[np.arange(tokens), target]).mean()))
                stats = cache.routing.stats
                loads.append(stats.max_load)
                drops.append(stats.dropped_fraction)
                dlogits = p
                dlogits[np.arange(tokens), target] -= 1.0
                dlogits /= tokens
                dh = dlogits @ params["out"]
                dx, grads = moe_backward(params, dh, cache, cfg)
                dx += dh  # the residual
                grads["out"] = dlogits.T @ h
                grads["emb"] = np.zeros_like(params["emb"])
                np.add.at(grads["emb"], c, dx)
                opt.step(params, grads)
            rows.append(dict(
                aux_loss_coeff=alpha, capacity_factor=cf, n_experts=n_experts, top_k=top_k, steps=steps,
                tokens=tokens, seconds=time.perf_counter() - start,
                max_load_first=float(np.mean(loads[:tail])), max_load_last=float(np.mean(loads[-tail:])),
                dropped_first=float(np.mean(drops[:tail])), dropped_last=float(np.mean(drops[-tail:])),
                loss_first=float(np.mean(losses[:tail])), loss_last=float(np.mean(losses[-tail:])),
                tokens_per_expert=stats.tokens_per_expert.tolist(),
                max_load=loads, dropped=drops, loss=losses))
    return rows
