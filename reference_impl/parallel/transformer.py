"""A small GPT in NumPy with a hand-written backward pass, one layer at a time.

NumPy-only, except the tanh GELU, its gradient and ``_weight_grad`` (array-API code).

Every memory-saving strategy of this room (activation recomputation, ZeRO, FSDP, low
precision) is a statement about *which arrays a training step holds, and when*. To see those
arrays, the model is written out by hand: a GPT-2-style decoder whose forward keeps an
explicit cache and whose backward consumes it, layer by layer, freeing each block's cache
as soon as its gradients are computed (as PyTorch frees saved tensors when
``retain_graph=False``).

The model (Radford et al. 2019, as Karpathy's nanoGPT writes it)::

    x    = wte[tokens] + wpe[:T]                                  # (B, T, C)
    for each block i:                                             # pre-LayerNorm blocks
        x = x + attn.c_proj(causal_self_attention(attn.c_attn(ln_1(x))))
        x = x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))
    logits = ln_f(x) @ wte.T                                      # tied output layer
    loss   = mean over the B*T tokens of cross_entropy(logits, targets)

* LayerNorm: biased variance over the last axis, ``eps = 1e-5``, affine weight and bias
  (``torch.nn.LayerNorm(C)``).
* Attention: ``c_attn`` maps C -> 3C, split as [q | k | v], each cut into ``n_head`` heads
  of ``head_dim = C / n_head``; scores ``q k^T / sqrt(head_dim)``, the future masked to
  -inf, softmax over keys; ``c_proj`` maps C -> C. All projections have biases.
* MLP: C -> 4C -> C. GELU is GPT-2's tanh approximation by default
  (``activation="gelu_tanh"``, ``torch.nn.GELU(approximate="tanh")``, HF's ``gelu_new``);
  ``activation="gelu"`` is the exact erf form (``torch.nn.GELU()``, nanoGPT's choice).
* No dropout (it would only add masks to the cache).

**Parameter names and layouts** are nanoGPT's ``model.transformer.state_dict()`` names
(without the ``transformer.`` prefix), with PyTorch ``nn.Linear`` layouts, weight of shape
``(out_features, in_features)`` and ``y = x @ W.T + b``: ``wte.weight`` (V, C),
``wpe.weight`` (block_size, C), ``h.{i}.ln_1.weight``/``.bias``,
``h.{i}.attn.c_attn.weight`` (3C, C)/``.bias``, ``h.{i}.attn.c_proj.weight`` (C, C)/``.bias``,
``h.{i}.ln_2.*``, ``h.{i}.mlp.c_fc.weight`` (4C, C)/``.bias``,
``h.{i}.mlp.c_proj.weight`` (C, 4C)/``.bias``, ``ln_f.weight``/``.bias``. The output layer is
``wte.weight`` itself (nanoGPT's ``lm_head.weight`` is the same tensor), so a PyTorch model
loads these arrays with ``model.transformer.load_state_dict(..., strict=False)``.

**Activation recomputation** (Chen et al. 2016, "Training deep nets with sublinear memory
cost"; Megatron's ``--recompute-granularity full``): with ``keep="inputs"`` the forward
keeps only each block's input; backward runs that block's forward again to rebuild its
cache just before using it. The gradients are the same arrays computed by the same code, so
bit-identical; the price is one more forward of every block (``step_flops``).

**Layers** (``layers``) list which parameters each stage of the computation owns, in forward
order: ``embed`` (wte, wpe), ``h.0`` ... ``h.{L-1}``, ``head`` (ln_f; it also *uses* the tied
wte). ZeRO-3/FSDP gathers one layer's parameters, runs it, frees them; the per-layer
functions (``embed_forward``, ``block_forward``, ``head_forward`` and their backwards) read
only that layer's names from the mapping they are given, so a trainer can pass just the
gathered layer. ``backward_layers`` yields each layer's gradients the moment they are
complete, last layer first, which is when a ZeRO-2/3 trainer reduce-scatters them.

The dtype of every computation is the dtype of the parameters: float64 for gradient
checks, float32 for the memory measurements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from ..backend import namespace_of, require_numpy

_MODULE = "reference_impl.parallel.transformer"  # NumPy-only: other arrays are refused, naming it

LN_EPS = 1e-5
ACTIVATIONS = ("gelu_tanh", "gelu")
KEEP = ("all", "inputs")


@dataclass(frozen=True)
class GPTConfig:
    """Model shape, in nanoGPT's names: ``n_embd`` is C, ``block_size`` the longest sequence."""

    vocab_size: int = 96
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    activation: str = "gelu_tanh"

    def __post_init__(self):
        if min(self.vocab_size, self.block_size, self.n_layer, self.n_head, self.n_embd) < 1:
            raise ValueError(f"GPTConfig: every size must be >= 1, got {self}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"GPTConfig: activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# ------------------------------------------------------------------ parameters and layers
@dataclass(frozen=True)
class Layer:
    """One unit of the computation: the parameters it ``owns`` and all those it ``uses``.

    Every parameter is owned by exactly one layer (a ZeRO-3 shard belongs to its owner);
    ``uses`` adds the tied ones (``head`` uses ``wte.weight``, owned by ``embed``)."""

    name: str
    owns: tuple[str, ...]
    uses: tuple[str, ...]


_BLOCK_PARAMS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


def layers(config: GPTConfig) -> list[Layer]:
    """The layers in forward order: ``embed``, ``h.0`` ... ``h.{L-1}``, ``head``."""
    out = [Layer("embed", ("wte.weight", "wpe.weight"), ("wte.weight", "wpe.weight"))]
    for i in range(config.n_layer):
        names = tuple(f"h.{i}.{n}" for n in _BLOCK_PARAMS)
        out.append(Layer(f"h.{i}", names, names))
    out.append(Layer("head", ("ln_f.weight", "ln_f.bias"), ("ln_f.weight", "ln_f.bias", "wte.weight")))
    return out


def param_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, in ``layers`` order (PyTorch layouts: Linear weight is (out, in))."""
    C, V = config.n_embd, config.vocab_size
    shapes = {"wte.weight": (V, C), "wpe.weight": (config.block_size, C)}
    block = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (3 * C, C), "attn.c_attn.bias": (3 * C,),
             "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
             "mlp.c_fc.weight": (4 * C, C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (C, 4 * C),
             "mlp.c_proj.bias": (C,)}
    for i in range(config.n_layer):
        shapes.update({f"h.{i}.{n}": s for n, s in block.items()})
    shapes.update({"ln_f.weight": (C,), "ln_f.bias": (C,)})
    return shapes


def n_params(config: GPTConfig) -> int:
    """Ψ, the number of parameters (the tied output layer counted once)."""
    return sum(math.prod(s) for s in param_shapes(config).values())


def init_params(config: GPTConfig, seed: int = 0, dtype: type = np.float32) -> dict[str, np.ndarray]:
    """nanoGPT's initialisation: N(0, 0.02) weights and embeddings, zero biases, LayerNorm (1, 0),
    and the residual projections (``*.c_proj.weight``) scaled down to N(0, 0.02 / sqrt(2 L)) so
    the residual stream's variance does not grow with depth (GPT-2 paper, section 2.3)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(config).items():
        if name.startswith("ln") or ".ln_" in name:
            value = np.ones(shape) if name.endswith("weight") else np.zeros(shape)
        elif name.endswith("bias"):
            value = np.zeros(shape)
        else:
            std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02
            value = rng.standard_normal(shape) * std
        params[name] = value.astype(dtype)
    return params


# ------------------------------------------------------------------ building blocks
def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(out, xhat, rstd)``: ``xhat = (x - mean) / sqrt(var + eps)``, ``out = xhat * w + b``."""
    xhat = x - x.mean(axis=-1, keepdims=True)
    var = np.einsum("...c,...c->...", xhat, xhat)[..., None] / x.shape[-1]
    rstd = 1.0 / np.sqrt(var + LN_EPS)
    xhat *= rstd
    out = xhat * w
    out += b
    return out, xhat, rstd


def _layer_norm_backward(dout: np.ndarray, xhat: np.ndarray, rstd: np.ndarray,
                         w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dw, db)``: ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dout * w``."""
    dw = np.einsum("btc,btc->c", dout, xhat)
    db = dout.sum(axis=(0, 1))
    g = dout * w
    mean_g = g.mean(axis=-1, keepdims=True)
    dx = xhat * (np.einsum("...c,...c->...", g, xhat)[..., None] / xhat.shape[-1])
    np.subtract(g, dx, out=dx)
    del g
    dx -= mean_g
    dx *= rstd
    return dx, dw, db


_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def _gelu(h: np.ndarray, activation: str) -> np.ndarray:
    """GELU of ``h``: tanh approximation ``0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))`` or exact.

    The tanh form is array-API code (``h`` of any namespace: the tensor-parallel MLP runs on
    PyTorch and GPU arrays too); the exact form calls libm's erf, which the standard lacks,
    so it is NumPy-only."""
    if activation == "gelu":
        require_numpy("reference_impl.parallel.transformer (exact GELU: erf)", h)
        return (0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))).astype(h.dtype, copy=False)
    u = h * h
    u *= _GELU_A
    u += 1.0
    u *= h
    u *= _GELU_C
    u = _tanh_in_place(u)
    u += 1.0
    u *= h
    u *= 0.5
    return u


def _gelu_backward(dg: np.ndarray, h: np.ndarray, activation: str) -> np.ndarray:
    """``dg * gelu'(h)`` (array-API code for the tanh form, as ``_gelu``)."""
    if activation == "gelu":  # Phi(h) + h phi(h)
        require_numpy("reference_impl.parallel.transformer (exact GELU: erf)", h)
        phi = np.exp(-0.5 * h * h) / math.sqrt(2.0 * math.pi)
        return (dg * (0.5 * (1.0 + _erf(h / math.sqrt(2.0))) + h * phi)).astype(h.dtype, copy=False)
    h2 = h * h
    t = h2 * _GELU_A  # tanh(u), u = c (h + a h^3)
    t += 1.0
    t *= h
    t *= _GELU_C
    t = _tanh_in_place(t)
    h2 *= 3 * _GELU_A  # du/dh = c (1 + 3 a h^2)
    h2 += 1.0
    h2 *= _GELU_C
    s = t * t  # 0.5 h (1 - t^2) du/dh
    s *= -1.0
    s += 1.0
    s *= h
    s *= h2
    s *= 0.5
    del h2
    t += 1.0
    t *= 0.5
    t += s
    del s
    t *= dg
    return t


def _tanh_in_place(u: Any) -> Any:
    """``tanh(u)``, written over ``u`` where the library can (NumPy's ``out=``: one buffer less
    for a (B, T, 4C) activation); the standard has no ``out=``, so elsewhere a new array."""
    if isinstance(u, np.ndarray):
        return np.tanh(u, out=u)
    return namespace_of(u).tanh(u)


def _erf(x: np.ndarray) -> np.ndarray:
    """The exact error function, element by element (libm's erf; slow, for the exact-GELU option)."""
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype, copy=False)


_MASKS: dict[int, np.ndarray] = {}


def _causal_mask(T: int) -> np.ndarray:
    """``(T, T)`` booleans, True above the diagonal: key ``j`` is in query ``i``'s future."""
    if T not in _MASKS:
        _MASKS[T] = np.triu(np.ones((T, T), dtype=bool), k=1)
    return _MASKS[T]


def _heads(qkv: np.ndarray, n_head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Views ``q, k, v`` of shape ``(B, n_head, T, head_dim)`` into ``qkv`` of shape ``(B, T, 3C)``."""
    B, T, C3 = qkv.shape
    split = qkv.reshape(B, T, 3, n_head, C3 // (3 * n_head))
    return tuple(split[:, :, j].transpose(0, 2, 1, 3) for j in range(3))


# ------------------------------------------------------------------ per-layer forward
def embed_forward(params: Mapping[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """``wte[tokens] + wpe[:T]``: the input of block 0, ``(B, T, C)``."""
    require_numpy(_MODULE, tokens, *params.values())
    T = tokens.shape[1]
    x = params["wte.weight"][tokens]
    x += params["wpe.weight"][:T]
    return x


def block_forward(params: Mapping[str, np.ndarray], i: int, x: np.ndarray,
                  config: GPTConfig) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Block ``i`` on ``x`` ``(B, T, C)``: its output and the cache its backward needs.

    The cache (per token: 16 C values + n_head T attention probabilities + 2 reciprocal
    standard deviations; ``memory.block_cache_elements``): ``xhat1, rstd1`` (ln_1),
    ``a1`` (ln_1 output, input of c_attn), ``qkv``, ``att`` (softmax probabilities,
    ``(B, n_head, T, T)``), ``y`` (heads merged, input of attn.c_proj), ``xhat2, rstd2,
    a2`` (ln_2), ``h`` (c_fc output, input of GELU), ``g`` (GELU output, input of mlp.c_proj).
    """
    require_numpy(_MODULE, x)
    p = f"h.{i}."
    B, T, C = x.shape
    a1, xhat1, rstd1 = _layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"])
    qkv = a1 @ params[p + "attn.c_attn.weight"].T
    qkv += params[p + "attn.c_attn.bias"]
    q, k, v = _heads(qkv, config.n_head)
    att = q @ k.transpose(0, 1, 3, 2)  # (B, nh, T, T) scores
    att *= 1.0 / math.sqrt(config.head_dim)
    att[:, :, _causal_mask(T)] = -np.inf
    att -= att.max(axis=-1, keepdims=True)  # softmax over keys, in place
    np.exp(att, out=att)
    att /= att.sum(axis=-1, keepdims=True)
    y = np.empty_like(x)  # heads merged back: (B, T, C), head-major within C as nanoGPT
    np.matmul(att, v, out=y.reshape(B, T, config.n_head, config.head_dim).transpose(0, 2, 1, 3))
    x2 = y @ params[p + "attn.c_proj.weight"].T
    x2 += params[p + "attn.c_proj.bias"]
    x2 += x  # residual
    a2, xhat2, rstd2 = _layer_norm(x2, params[p + "ln_2.weight"], params[p + "ln_2.bias"])
    h = a2 @ params[p + "mlp.c_fc.weight"].T
    h += params[p + "mlp.c_fc.bias"]
    g = _gelu(h, config.activation)
    out = g @ params[p + "mlp.c_proj.weight"].T
    out += params[p + "mlp.c_proj.bias"]
    out += x2  # residual
    cache = dict(xhat1=xhat1, rstd1=rstd1, a1=a1, qkv=qkv, att=att, y=y,
                 xhat2=xhat2, rstd2=rstd2, a2=a2, h=h, g=g)
    return out, cache


def head_forward(params: Mapping[str, np.ndarray], x: np.ndarray,
                 targets: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """Final LayerNorm, tied output layer, and mean cross-entropy over the ``B*T`` tokens.

    The cache keeps ``xhat, rstd, a`` (ln_f) and ``probs`` (the softmax, ``(B*T, V)``,
    computed in place in the logits' buffer): ``dlogits = (probs - onehot) / (B*T)``."""
    a, xhat, rstd = _layer_norm(x, params["ln_f.weight"], params["ln_f.bias"])
    B, T, C = a.shape
    probs = a.reshape(B * T, C) @ params["wte.weight"].T  # logits (B*T, V)
    probs -= probs.max(axis=1, keepdims=True)
    rows, t = np.arange(B * T), targets.reshape(-1)
    picked = probs[rows, t]  # shifted logit of each target
    np.exp(probs, out=probs)
    total = probs.sum(axis=1, keepdims=True)
    probs /= total
    loss = float(np.mean(np.log(total[:, 0]) - picked))
    return loss, dict(xhat=xhat, rstd=rstd, a=a, probs=probs, targets=t)


def logits(params: Mapping[str, np.ndarray], tokens: np.ndarray, config: GPTConfig) -> np.ndarray:
    """The ``(B, T, V)`` logits (no loss, nothing kept): for evaluation and the causality check."""
    x = embed_forward(params, tokens)
    for i in range(config.n_layer):
        x, _ = block_forward(params, i, x, config)
    a, _, _ = _layer_norm(x, params["ln_f.weight"], params["ln_f.bias"])
    return a @ params["wte.weight"].T


def forward(params: Mapping[str, np.ndarray], tokens: np.ndarray, targets: np.ndarray, config: GPTConfig,
            *, keep: str = "all") -> tuple[float, dict]:
    """Mean cross-entropy of predicting ``targets`` from ``tokens`` (both ``(B, T)`` ints), and the cache.

    ``keep="all"``: the cache holds every block's internals (``block_forward``).
    ``keep="inputs"``: activation recomputation; it holds only each block's input ``(B, T, C)``
    and ``backward`` recomputes the rest, one block at a time.
    """
    require_numpy(_MODULE, tokens, targets)
    if keep not in KEEP:
        raise ValueError(f"forward: keep must be one of {KEEP}, got {keep!r}")
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    if tokens.ndim != 2 or targets.shape != tokens.shape:
        raise ValueError(f"forward: tokens {tokens.shape} and targets {targets.shape} must be the same (B, T)")
    if tokens.shape[1] > config.block_size:
        raise ValueError(f"forward: sequence of {tokens.shape[1]} exceeds block_size {config.block_size}")
    x = embed_forward(params, tokens)
    blocks = []
    for i in range(config.n_layer):
        x_in = x
        x, block_cache = block_forward(params, i, x_in, config)
        blocks.append(x_in if keep == "inputs" else block_cache)
        del block_cache, x_in
    loss, head = head_forward(params, x, targets)
    return loss, dict(keep=keep, tokens=tokens, blocks=blocks, head=head)


# ------------------------------------------------------------------ per-layer backward
def _weight_grad(dout: np.ndarray, x_in: np.ndarray) -> np.ndarray:
    """``dW = dout^T x`` over all ``B*T`` tokens for ``y = x @ W.T``: shape ``(out, in)`` (array-API code)."""
    xp = namespace_of(dout, x_in)
    return xp.reshape(dout, (-1, dout.shape[-1])).T @ xp.reshape(x_in, (-1, x_in.shape[-1]))


def head_backward(params: Mapping[str, np.ndarray], head: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Gradient at the last block's output and ``{ln_f.*, wte.weight (head's part)}``; consumes ``head``."""
    dlogits = head.pop("probs")  # (probs - onehot) / N, in the same buffer
    N = dlogits.shape[0]
    dlogits[np.arange(N), head["targets"]] -= 1.0
    dlogits /= N
    a = head.pop("a")
    B, T, C = a.shape
    dwte = dlogits.T @ a.reshape(N, C)
    del a
    da = (dlogits @ params["wte.weight"]).reshape(B, T, C)
    del dlogits
    dx, dw, db = _layer_norm_backward(da, head.pop("xhat"), head.pop("rstd"), params["ln_f.weight"])
    return dx, {"ln_f.weight": dw, "ln_f.bias": db, "wte.weight": dwte}


def block_backward(params: Mapping[str, np.ndarray], i: int, dout: np.ndarray, cache: dict,
                   config: GPTConfig) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Gradient at block ``i``'s input and its parameters' gradients; consumes ``cache``."""
    p = f"h.{i}."
    B, T, C = dout.shape
    nh, hd = config.n_head, config.head_dim
    grads = {}
    # MLP: out = x2 + c_proj(gelu(c_fc(ln_2(x2))))
    g = cache.pop("g")
    grads[p + "mlp.c_proj.weight"] = _weight_grad(dout, g)
    grads[p + "mlp.c_proj.bias"] = dout.sum(axis=(0, 1))
    del g
    dg = dout @ params[p + "mlp.c_proj.weight"]
    dh = _gelu_backward(dg, cache.pop("h"), config.activation)
    del dg
    a2 = cache.pop("a2")
    grads[p + "mlp.c_fc.weight"] = _weight_grad(dh, a2)
    grads[p + "mlp.c_fc.bias"] = dh.sum(axis=(0, 1))
    del a2
    da2 = dh @ params[p + "mlp.c_fc.weight"]
    del dh
    dx2, grads[p + "ln_2.weight"], grads[p + "ln_2.bias"] = _layer_norm_backward(
        da2, cache.pop("xhat2"), cache.pop("rstd2"), params[p + "ln_2.weight"])
    del da2
    dx2 += dout  # residual
    # attention: x2 = x + c_proj(attention(c_attn(ln_1(x))))
    y = cache.pop("y")
    grads[p + "attn.c_proj.weight"] = _weight_grad(dx2, y)
    grads[p + "attn.c_proj.bias"] = dx2.sum(axis=(0, 1))
    del y
    dy = (dx2 @ params[p + "attn.c_proj.weight"]).reshape(B, T, nh, hd).transpose(0, 2, 1, 3)
    qkv, att = cache.pop("qkv"), cache.pop("att")
    q, k, v = _heads(qkv, nh)
    dqkv = np.empty_like(qkv)
    dq, dk, dv = _heads(dqkv, nh)
    np.matmul(att.transpose(0, 1, 3, 2), dy, out=dv)
    datt = dy @ v.transpose(0, 1, 3, 2)  # d(probabilities), (B, nh, T, T)
    del dy
    datt -= np.einsum("bhij,bhij->bhi", datt, att)[..., None]  # softmax backward, in place:
    datt *= att  # dS = P * (dP - rowsum(dP * P))
    del att
    datt *= 1.0 / math.sqrt(hd)
    np.matmul(datt, k, out=dq)
    np.matmul(datt.transpose(0, 1, 3, 2), q, out=dk)
    del datt, q, k, v, qkv
    a1 = cache.pop("a1")
    grads[p + "attn.c_attn.weight"] = _weight_grad(dqkv, a1)
    grads[p + "attn.c_attn.bias"] = dqkv.sum(axis=(0, 1))
    del a1
    da1 = dqkv @ params[p + "attn.c_attn.weight"]
    del dqkv
    dx, grads[p + "ln_1.weight"], grads[p + "ln_1.bias"] = _layer_norm_backward(
        da1, cache.pop("xhat1"), cache.pop("rstd1"), params[p + "ln_1.weight"])
    del da1
    dx += dx2  # residual
    return dx, grads


def embed_backward(params: Mapping[str, np.ndarray], tokens: np.ndarray, dx: np.ndarray,
                   dwte_head: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """``{wte.weight, wpe.weight}`` gradients; ``dwte_head`` (the tied output layer's part) is added in place."""
    V, C = params["wte.weight"].shape
    dwte = np.zeros((V, C), dtype=dx.dtype) if dwte_head is None else dwte_head
    np.add.at(dwte, tokens.reshape(-1), dx.reshape(-1, C))
    dwpe = np.zeros_like(params["wpe.weight"])
    dwpe[:tokens.shape[1]] = dx.sum(axis=0)
    return {"wte.weight": dwte, "wpe.weight": dwpe}


def backward_layers(params: Mapping[str, np.ndarray], cache: dict,
                    config: GPTConfig) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """Yield ``(layer name, {parameter: gradient})`` for ``head``, ``h.{L-1}`` ... ``h.0``, ``embed``.

    Each layer's gradients are complete when yielded (``wte.weight`` comes with ``embed``, its
    owner, after the head's and the embedding's parts are summed). Consumes ``cache``: each
    block's cache is dropped as soon as its backward has run. With a recomputation cache
    (``keep="inputs"``) each block's forward runs again right before its backward.
    """
    dx, head_grads = head_backward(params, cache["head"])
    dwte = head_grads.pop("wte.weight")
    yield "head", head_grads
    blocks = cache["blocks"]
    for i in reversed(range(config.n_layer)):
        kept = blocks.pop()
        if cache["keep"] == "inputs":
            kept = block_forward(params, i, kept, config)[1]  # recompute the block's internals
        dx, grads = block_backward(params, i, dx, kept, config)
        del kept
        yield f"h.{i}", grads
    yield "embed", embed_backward(params, cache["tokens"], dx, dwte)


def backward(params: Mapping[str, np.ndarray], cache: dict, config: GPTConfig) -> dict[str, np.ndarray]:
    """Gradients of the loss for every parameter (keys of ``param_shapes``); consumes ``cache``."""
    grads: dict[str, np.ndarray] = {}
    for _, layer_grads in backward_layers(params, cache, config):
        grads.update(layer_grads)
    return grads


def loss_and_grads(params: Mapping[str, np.ndarray], tokens: np.ndarray, targets: np.ndarray, config: GPTConfig,
                   *, keep: str = "all") -> tuple[float, dict[str, np.ndarray]]:
    """``forward`` then ``backward``."""
    loss, cache = forward(params, tokens, targets, config, keep=keep)
    return loss, backward(params, cache, config)


# ------------------------------------------------------------------ cost
def step_flops(config: GPTConfig, batch: int, seq: int, *, recompute: bool = False) -> dict[str, int]:
    """Matrix-multiply FLOPs (2 per multiply-add) of one training step, and what recomputation adds.

    Per block forward: ``24 N C^2`` (c_attn 6, attn.c_proj 2, c_fc 8, mlp.c_proj 8) plus
    ``4 B T^2 C`` (scores and probabilities times values; the causal half is computed and
    masked, as a dense kernel does), ``N = B T``. The head: ``2 N C V``. Backward is twice the
    forward (a gradient for the input and one for the weight per product). Recomputation runs
    every block's forward once more, ``L block / (3 (L block + head))`` more: about a third
    when the head is small next to the blocks.
    """
    N, C, V = batch * seq, config.n_embd, config.vocab_size
    block = 24 * N * C * C + 4 * batch * seq * seq * C
    head = 2 * N * C * V
    forward_flops = config.n_layer * block + head
    extra = config.n_layer * block if recompute else 0
    return {"forward": forward_flops, "backward": 2 * forward_flops, "recompute": extra,
            "total": 3 * forward_flops + extra}
