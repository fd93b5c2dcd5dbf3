"""Back-of-envelope calculators for interviews, backed by the reference cost models.

The site's calculator pages (``docs/calculators/``) run the same formulas in the browser;
a build hook (``docs/hooks/calculators.py``) writes ``calculator_constants()`` into those
pages, so the interconnect profiles and byte counts come from here, and a browser test
(``tests/test_calculators.py``) checks the pages' answers against these functions.

* ``allreduce_seconds``: one allreduce of a model's gradients, with the α–β–γ closed forms
  of ``reference_impl.comm.cost_model`` on a link of ``reference_impl.comm.simnet``.
* ``parameter_server_seconds`` and ``ps_vs_allreduce``: synchronous parameter servers (push
  gradients, pull weights) against a ring allreduce, in bytes and in seconds. The
  parameter-server time follows the model of the concept page *Allreduce vs parameter
  servers*: with ``n`` workers and ``k`` server shards, each server takes ``n`` messages of
  ``N/k`` bytes in and sends ``n`` out through its one link.
* ``pipeline_bubble_fraction``: the idle share of a synchronous pipeline (GPipe / 1F1B).
* ``training_memory``: bytes of weights, gradients, optimiser state and activations in
  float32 or in mixed precision (float16 compute, float32 master weights and state), the
  accounting of Rajbhandari et al., "ZeRO: Memory optimizations toward training trillion
  parameter models" (SC 2020), section 3.1.
* ``sharded_memory``: bytes per rank of parameters, gradients, optimiser state and
  activations of a GPT-shaped transformer under plain data parallelism or ZeRO stage 1, 2
  or 3 (FSDP), and the bytes a rank sends per step. The formulas are those of
  ``reference_impl.parallel.memory`` (``memory_breakdown``, ``activation_elements``) and
  ``reference_impl.parallel.zero`` (``comm_elements``), called, not rewritten.
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path

from reference_impl.comm.cost_model import ALLREDUCE_TIME, LinkParams, allreduce_time, ring_allreduce_time
from reference_impl.comm.simnet import INTERCONNECTS, interconnect
from reference_impl.parallel import memory as parallel_memory
from reference_impl.parallel import planner as parallel_planner
from reference_impl.parallel import transformer as parallel_transformer
from reference_impl.parallel import zero as parallel_zero

PRECISIONS = ("fp32", "mixed")
# What the calculator pages call the algorithms of cost_model.ALLREDUCE_TIME (a name missing
# here is shown with its underscores as spaces).
ALGORITHM_LABELS = {"ring": "ring", "recursive_doubling": "recursive doubling", "rabenseifner": "Rabenseifner",
                    "tree": "binomial tree (reduce + broadcast)"}
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}  # float32 values of state per parameter


def _link(network: str | LinkParams) -> LinkParams:
    """A named interconnect profile (``simnet.INTERCONNECTS``) or custom ``LinkParams``."""
    return network if isinstance(network, LinkParams) else interconnect(network).link


def _positive(name: str, value: float, minimum: float = 1) -> None:
    if not value >= minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


def allreduce_seconds(model_bytes: float, ranks: int, network: str | LinkParams = "10GbE",
                      algorithm: str = "ring") -> float:
    """Predicted seconds to allreduce ``model_bytes`` of gradients on ``ranks`` ranks.

    ``network`` is an interconnect profile name (``10GbE``, ``IB-NDR`` …) or ``LinkParams``;
    ``algorithm`` one of ``cost_model.ALLREDUCE_TIME`` (ring, recursive_doubling,
    rabenseifner, tree). Reduction time (γ) is 0 for the named profiles.
    """
    ranks = _count("ranks", ranks)
    _positive("model_bytes", model_bytes, 0)
    return allreduce_time(algorithm, model_bytes, ranks, _link(network))


def parameter_server_seconds(model_bytes: float, workers: int, servers: int,
                             network: str | LinkParams = "10GbE") -> float:
    """Synchronous push-then-pull through ``servers`` shards: ``2·max(n, k)·α + 2·max(n/k, 1)·N·β + (n/k)·N·γ``.

    Each of the ``k`` servers receives one ``N/k``-byte message from each of the ``n``
    workers and sends one back, through its single link; each worker sends and receives
    ``N`` bytes in ``k`` messages. The busier side (servers when ``n > k``) sets the time.
    """
    n, k = _count("workers", workers), _count("servers", servers)
    _positive("model_bytes", model_bytes, 0)
    c = _link(network)
    N = float(model_bytes)
    return 2 * max(n, k) * c.alpha + 2 * max(n / k, 1.0) * N * c.beta + n / k * N * c.gamma


@dataclass(frozen=True)
class TrafficComparison:
    """Bytes and seconds per synchronous step: ring allreduce against parameter servers.

    Per-link figures count one direction: each link is full duplex and carries the same
    amount the other way (a ring rank receives what its neighbour sends; a worker pulls as
    many bytes of weights as it pushes of gradients; a server sends back what it took in).
    """

    ring_bytes_per_worker: float      # sent by each worker
    ring_bytes_total: float           # sent over the network by all workers together
    ring_seconds: float
    ps_bytes_per_worker: float        # pushed by each worker (it pulls as many)
    ps_bytes_per_server: float        # received by each server shard (it sends as many)
    ps_bytes_total: float             # sent by everyone: pushes plus pulls
    ps_seconds: float


def ps_vs_allreduce(model_bytes: float, workers: int, servers: int,
                    network: str | LinkParams = "10GbE") -> TrafficComparison:
    """Traffic and predicted time of one step's gradient exchange both ways (see the module doc)."""
    n, k = _count("workers", workers), _count("servers", servers)
    _positive("model_bytes", model_bytes, 0)
    N = float(model_bytes)
    ring_each = 2 * (n - 1) / n * N
    return TrafficComparison(
        ring_bytes_per_worker=ring_each,
        ring_bytes_total=ring_each * n,
        ring_seconds=ring_allreduce_time(N, n, _link(network)),
        ps_bytes_per_worker=N,
        ps_bytes_per_server=n * N / k,
        ps_bytes_total=2 * n * N,
        ps_seconds=parameter_server_seconds(N, n, k, network),
    )


def pipeline_bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle share of a balanced synchronous pipeline: ``(p - 1) / (m + p - 1)``.

    Each of ``p`` stages works ``m`` slots of the ``m + p - 1`` a step takes (filling and
    draining the pipeline leaves ``p - 1`` slots idle per stage), for GPipe and 1F1B alike.
    """
    stages, microbatches = _count("stages", stages), _count("microbatches", microbatches)
    return (stages - 1) / (microbatches + stages - 1)


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per replica of each part of training state (``total`` is their sum)."""

    weights: float
    gradients: float
    master_weights: float
    optimizer_state: float
    activations: float

    @property
    def total(self) -> float:
        return sum(asdict(self).values())


def training_memory(parameters: float, precision: str = "mixed", optimizer: str = "adam",
                    activation_values: float = 0.0) -> TrainingMemory:
    """Memory of one data-parallel replica for ``parameters`` weights.

    ``fp32``: weights, gradients and optimiser state in float32 (4 bytes each).
    ``mixed``: float16 weights and gradients (2 bytes each) for compute, plus a float32
    master copy of the weights and float32 optimiser state, so that small updates are not
    lost to float16 rounding. ``optimizer`` sets the state per weight (sgd 0, momentum 1,
    adam 2 values). ``activation_values`` is the number of activation values kept for the
    backward pass (per batch), stored in the compute precision.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZER_SLOTS)}, got {optimizer!r}")
    _positive("parameters", parameters, 0)
    _positive("activation_values", activation_values, 0)
    compute_bytes = 4 if precision == "fp32" else 2
    return TrainingMemory(
        weights=compute_bytes * parameters,
        gradients=compute_bytes * parameters,
        master_weights=0.0 if precision == "fp32" else 4.0 * parameters,
        optimizer_state=4.0 * OPTIMIZER_SLOTS[optimizer] * parameters,
        activations=compute_bytes * activation_values,
    )


@dataclass(frozen=True)
class ShardedMemory:
    """Bytes per rank of a sharded data-parallel step, and the bytes one rank sends per step.

    ``total`` sums the four parts (model states plus activations); temporaries, the layer a
    stage holds gathered or packed, and the allocator's fragmentation come on top.
    ``architecture_parameters`` is the Ψ the layer sizes imply (GPT-2 layout, tied output
    layer), to compare with the Ψ given.
    """

    parameters: float
    gradients: float
    optimizer_state: float
    activations: float
    comm_bytes_per_step: float
    architecture_parameters: int

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_state + self.activations


def _count(name: str, value, minimum: int = 1) -> int:
    """A count: an integer (``7.0`` is accepted, ``7.5`` is not) of at least ``minimum``."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value != int(value) or value < minimum):
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def sharded_memory(parameters: float, layers: int, hidden: int, heads: int, seq: int, batch: int,
                   vocab: int = 50257, precision: str = "bf16", optimizer: str = "adam", stage: int = 0,
                   ranks: int = 1, recompute: bool = False) -> ShardedMemory:
    """Memory per rank and communication per step of training a transformer with ZeRO ``stage``.

    ``parameters`` is Ψ. ``layers``, ``hidden`` (C), ``heads``, ``seq`` (T), ``batch`` (the
    micro-batch per rank) and ``vocab`` describe the GPT-2-shaped model whose activations
    ``parallel.memory.activation_elements`` counts: per block ``16 N C + 2 N + B heads T²``
    values (``N = B T``), or its input ``N C`` alone with ``recompute``, plus the head's.
    ``precision``: ``fp32``, or ``bf16``/``fp16`` (16-bit parameters, gradients and
    activations; float32 master weights and optimiser state). ``stage`` 0 is plain data
    parallelism; 1, 2, 3 shard the optimiser state, then the gradients, then the parameters
    over ``ranks``.

    The model-state bytes are ``memory_breakdown``'s bytes per parameter (it is linear in
    Ψ) times ``parameters``; the bytes sent per step are ``comm_elements``' values per padded
    parameter, ``2 (N-1)/N`` (stages 0-2) or ``3 (N-1)/N`` (stage 3), times Ψ, at the
    gradients' bytes per value.
    """
    if precision not in parallel_memory.PRECISIONS:
        raise ValueError(f"precision must be one of {tuple(parallel_memory.PRECISIONS)}, got {precision!r}")
    if optimizer not in parallel_memory.OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer must be one of {tuple(parallel_memory.OPTIMIZER_SLOTS)}, got {optimizer!r}")
    if stage not in parallel_zero.STAGES:
        raise ValueError(f"stage must be one of {parallel_zero.STAGES} (0: plain data parallelism), got {stage!r}")
    _positive("parameters", parameters, 0)
    layers, hidden, heads = _count("layers", layers), _count("hidden", hidden), _count("heads", heads)
    seq, batch, vocab, ranks = _count("seq", seq), _count("batch", batch), _count("vocab", vocab), _count("ranks", ranks)
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    config = parallel_transformer.GPTConfig(vocab_size=vocab, block_size=seq, n_layer=layers, n_head=heads,
                                            n_embd=hidden)
    arch = parallel_transformer.n_params(config)
    b = parallel_memory.memory_breakdown(config, optimizer, precision, batch, seq, stage=stage, ranks=ranks,
                                         recompute=recompute)
    per_param = float(parameters) / arch  # memory_breakdown is linear in Ψ
    grad_bytes = parallel_memory.PRECISIONS[precision][1]
    sent_per_value = parallel_zero.comm_elements(config, stage, ranks) / parallel_zero.padded_params(config, ranks)
    return ShardedMemory(parameters=b.parameters * per_param, gradients=b.gradients * per_param,
                         optimizer_state=b.optimizer_state * per_param, activations=b.activations,
                         comm_bytes_per_step=grad_bytes * sent_per_value * float(parameters),
                         architecture_parameters=arch)


MEASURED_PROFILE = "measured on this machine"


def measured_link(alpha_beta_json: str | Path) -> LinkParams:
    """α, β and γ fitted by ``python -m benchmarks alpha_beta`` (its ``fit`` entry).

    That benchmark times MPI ping-pongs and local reductions on the machine it runs on, so
    this is the link between two ranks there (shared memory on one host, a network across
    hosts), not a nominal profile.
    """
    path = Path(alpha_beta_json)
    try:
        fit = json.loads(path.read_text(encoding="utf-8"))["fit"]
        return LinkParams(alpha=float(fit["alpha_s"]), beta=float(fit["beta_s_per_byte"]),
                          gamma=float(fit["gamma_s_per_byte"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not an alpha_beta benchmark result with a fit "
                         f"(alpha_s, beta_s_per_byte, gamma_s_per_byte): {exc}") from exc


def calculator_constants(alpha_beta_json: str | Path | None = None) -> dict:
    """What the browser calculators need from Python: profiles, algorithms, byte counts.

    With ``alpha_beta_json`` (the committed ``docs/assets/bench/alpha_beta.json``), the
    profiles also hold ``MEASURED_PROFILE``: the link fitted on the benchmark machine.
    """
    links = {name: (i.link, i.link_gbps, i.transport) for name, i in INTERCONNECTS.items()}
    if alpha_beta_json is not None:
        link = measured_link(alpha_beta_json)
        links[MEASURED_PROFILE] = (link, 8 / link.beta / 1e9, "fitted by the alpha_beta benchmark")
    return {
        "interconnects": {
            name: {"alpha": link.alpha, "beta": link.beta, "gamma": link.gamma,
                   "link_gbps": gbps, "transport": transport}
            for name, (link, gbps, transport) in links.items()
        },
        "algorithms": list(ALLREDUCE_TIME),
        "labels": {name: ALGORITHM_LABELS.get(name, name.replace("_", " ")) for name in ALLREDUCE_TIME},
        "measured_profile": MEASURED_PROFILE,
        "optimizer_slots": dict(OPTIMIZER_SLOTS),
        "precisions": list(PRECISIONS),
        # the sharded-memory calculator: parallel.memory's bytes per parameter, (compute copy,
        # gradient, float32 master copy), its optimiser slots, and the ZeRO stages
        "sharded_precisions": {name: list(b) for name, b in parallel_memory.PRECISIONS.items()},
        "sharded_optimizer_slots": dict(parallel_memory.OPTIMIZER_SLOTS),
        "zero_stages": [str(s) for s in parallel_zero.STAGES],
        # the parallel-layout planner: cluster presets, the lists it enumerates, bytes per value
        "parallel_layout": parallel_planner.browser_constants(),
    }
