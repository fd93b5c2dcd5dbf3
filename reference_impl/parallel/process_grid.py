"""The process grid: one world of ranks cut into tensor-, data-, pipeline- and expert-parallel groups.

**What.** Large-model training combines the strategies of this room: ``tp`` ranks split
every matrix (tensor parallelism), ``pp`` stages split the layers (pipeline parallelism),
and ``dp`` replicas of that ``tp x pp`` model split the batch (data parallelism), so
``world = dp x tp x pp``. Each rank then belongs to one group per strategy and runs each
strategy's collectives on that group only: the TP allreduces of activations on its
``tp_group``, the gradient allreduce on its ``dp_group``, the stage-to-stage sends on its
``pp_group``. Each group is a communicator of its own, made with ``Communicator.split``
(``MPI_Comm_split``), so the existing collectives run on it unchanged.

**Which ranks go together (Megatron-LM's order).** Megatron-LM numbers the ranks by the
order string ``"tp-cp-ep-dp-pp"`` (``megatron/core/parallel_state.py``,
``initialize_model_parallel(order=...)``, ``RankGenerator``,
``generate_masked_orthogonal_rank_groups``): the first name varies fastest, so with context
parallelism ``cp = 1``::

    rank = tp_rank + tp * dp_rank + tp * dp * pp_rank

TP ranks are adjacent: with ``tp`` at most the GPUs of one node, a TP group never leaves
its node, and its two allreduces per layer (forward and backward) ride NVLink, not the
network; PP is outermost, so a stage boundary is the only traffic that must cross nodes
when the model does not fit one. A group is the set of ranks whose *other* coordinates are
equal; its members are listed in the order of their own coordinate, and groups are numbered
by the other coordinates, first name fastest (``orthogonal_groups``). Megatron's own
example, 16 GPUs with ``tp = 2, pp = 4`` (so ``dp = 2``): TP groups ``[0, 1], [2, 3], ...``,
DP groups ``[0, 2], [1, 3], [4, 6], ...``, PP groups ``[0, 4, 8, 12], [1, 5, 9, 13], ...``.

**Expert parallelism is carved out of data parallelism** (``ep_group``). Megatron builds a
second ``RankGenerator`` for the MoE layers with the same order and ``ep`` placed before
``dp`` (``expert_decoder_rank_generator``, expert TP = TP by default): the ``dp`` replicas
are grouped ``ep`` at a time, each of the ``ep`` ranks holding ``1/ep`` of the experts, and
the expert gradients are averaged over the remaining ``expert_dp = dp / ep`` ranks that hold
the same experts (``expert_dp_group``, Megatron's expert data-parallel group)::

    dp_rank = ep_rank + ep * expert_dp_rank

**The embedding group.** With ``pp > 1`` the tied word embedding lives on the first stage
(input) and on the last (output layer); Megatron keeps the two copies equal by allreducing
their gradients over the *embedding group*, the first and last rank of each pipeline group
(``default_embedding_ranks``; used by ``_allreduce_word_embedding_grads`` in
``megatron/core/distributed/finalize_model_grads.py``). ``embedding_group`` is that group
(``None`` on the middle stages), for ``hybrid.py``.

**Bad input.** A grid whose product is not the world size raises ``ValueError`` naming
both numbers; ``ep`` must divide ``dp``. Whether ``tp`` divides the model's heads and widths
is checked where the model is sharded (``hybrid.py``, ``tensor_parallel_model.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..comm.communicator import Communicator

ORDER = "tp-cp-ep-dp-pp"  # Megatron-LM's default (initialize_model_parallel); cp is 1 here


def orthogonal_groups(axes: list[tuple[str, int]], token: str) -> list[list[int]]:
    """Every group of the axes named in ``token`` (``"dp"``, ``"tp-pp"``...), as lists of ranks.

    ``axes`` lists ``(name, size)`` fastest-varying first, ``rank = sum(coord_i * stride_i)``
    with ``stride_i`` the product of the sizes before axis ``i``. A group holds the ranks
    whose coordinates on the *other* axes are equal, listed with the named coordinates
    counting up (first named fastest); groups are numbered by the other coordinates, first
    fastest. The same lists as Megatron's ``generate_masked_orthogonal_rank_groups``.
    """
    names = [n for n, _ in axes]
    wanted = token.split("-")
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ValueError(f"orthogonal_groups: unknown axis {unknown[0]!r}; the axes are {names}")
    strides, stride = {}, 1
    for name, size in axes:
        strides[name] = stride
        stride *= size
    inside = [(s, strides[n]) for n, s in axes if n in wanted]
    outside = [(s, strides[n]) for n, s in axes if n not in wanted]

    def offset(index: int, dims: list[tuple[int, int]]) -> int:
        total = 0
        for size, step in dims:  # decompose ``index`` over ``dims``, first fastest
            total += (index % size) * step
            index //= size
        return total

    group_size = 1
    for size, _ in inside:
        group_size *= size
    n_groups = stride // group_size
    return [[offset(g, outside) + offset(i, inside) for i in range(group_size)] for g in range(n_groups)]


@dataclass(frozen=True)
class GridCoords:
    """Where one rank sits: its index in each group (``ep`` and ``expert_dp`` split ``dp``)."""

    tp: int
    dp: int
    pp: int
    ep: int
    expert_dp: int


GROUP_KINDS = ("tp", "dp", "pp", "ep", "expert_dp", "embedding")


@dataclass(frozen=True)
class GridLayout:
    """The arithmetic of a ``dp x tp x pp`` grid (``ep`` dividing ``dp``), without any communicator."""

    dp: int
    tp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ProcessGrid: {name} must be a positive int, got {value!r}")
        if self.dp % self.ep:
            raise ValueError(f"ProcessGrid: ep={self.ep} must divide dp={self.dp} (expert parallelism is carved "
                             "out of data parallelism)")

    @property
    def size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def expert_dp(self) -> int:
        return self.dp // self.ep

    @property
    def dense_axes(self) -> list[tuple[str, int]]:
        """Megatron's ``decoder_rank_generator``: ``tp-dp-pp`` (its ``tp-cp-ep-dp-pp`` with cp = ep = 1)."""
        return [("tp", self.tp), ("dp", self.dp), ("pp", self.pp)]

    @property
    def expert_axes(self) -> list[tuple[str, int]]:
        """Megatron's ``expert_decoder_rank_generator``: ``tp-ep-dp-pp`` with the expert dp = dp / ep."""
        return [("tp", self.tp), ("ep", self.ep), ("expert_dp", self.expert_dp), ("pp", self.pp)]

    def groups(self, kind: str) -> list[list[int]]:
        """All groups of one kind (``GROUP_KINDS``), as lists of world ranks."""
        if kind == "embedding":  # Megatron's default_embedding_ranks: first and last stage
            return [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in self.groups("pp")]
        if kind not in GROUP_KINDS:
            raise ValueError(f"ProcessGrid: unknown group kind {kind!r}; expected one of {GROUP_KINDS}")
        return orthogonal_groups(self.expert_axes if kind in ("ep", "expert_dp") else self.dense_axes, kind)

    # --8<-- [start:rank_order]
    def coords_of(self, rank: int) -> GridCoords:
        """``rank = tp + TP * dp + TP * DP * pp`` (TP fastest, PP slowest); ``dp = ep + EP * expert_dp``."""
        if not 0 <= rank < self.size:
            raise ValueError(f"ProcessGrid: rank {rank} is outside 0..{self.size - 1}")
        dp = (rank // self.tp) % self.dp
        return GridCoords(tp=rank % self.tp, dp=dp, pp=rank // (self.tp * self.dp), ep=dp % self.ep,
                          expert_dp=dp // self.ep)

    def rank_of(self, *, tp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The world rank at coordinates ``(tp, dp, pp)``."""
        for name, value, size in (("tp", tp, self.tp), ("dp", dp, self.dp), ("pp", pp, self.pp)):
            if not 0 <= value < size:
                raise ValueError(f"ProcessGrid: {name}={value} is outside 0..{size - 1}")
        return tp + self.tp * (dp + self.dp * pp)
    # --8<-- [end:rank_order]


class ProcessGrid:
    """``ProcessGrid(world, dp=, tp=, pp=, ep=1)``: the world split into its parallel groups (Megatron's order).

    Attributes: ``world``, ``layout`` (a ``GridLayout``: ``groups``, ``coords_of``, ``rank_of``),
    ``coords`` (this rank's); the communicators ``tp_group``, ``dp_group``, ``pp_group``,
    ``ep_group``, ``expert_dp_group`` (a rank's index in each is its coordinate there) and
    ``embedding_group`` (first and last pipeline stage; ``None`` on the others), Megatron's
    ``get_tensor_model_parallel_group()``, ``get_data_parallel_group()`` and so on. Building
    it is a collective over ``world``: six splits, in this fixed order.
    """

    def __init__(self, world: Communicator, *, dp: int, tp: int = 1, pp: int = 1, ep: int = 1):
        self.layout = GridLayout(dp=dp, tp=tp, pp=pp, ep=ep)
        if self.layout.size != world.size:
            raise ValueError(f"ProcessGrid: dp x tp x pp = {dp} x {tp} x {pp} = {self.layout.size} ranks, "
                             f"but the communicator has {world.size}")
        self.world = world
        self.dp, self.tp, self.pp, self.ep = dp, tp, pp, ep
        self.coords = self.layout.coords_of(world.rank)
        self.tp_group = self._split("tp")
        self.dp_group = self._split("dp")
        self.pp_group = self._split("pp")
        self.ep_group = self._split("ep")
        self.expert_dp_group = self._split("expert_dp")
        self.embedding_group = self._split("embedding")

    @property
    def is_first_stage(self) -> bool:
        return self.coords.pp == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords.pp == self.pp - 1

    def __repr__(self) -> str:
        c = self.coords
        return (f"ProcessGrid(rank {self.world.rank} of {self.world.size}: dp={self.dp} tp={self.tp} pp={self.pp} "
                f"ep={self.ep}; coords tp={c.tp} dp={c.dp} pp={c.pp} ep={c.ep} expert_dp={c.expert_dp})")

    def _split(self, kind: str) -> Communicator | None:
        """Color = the index of this rank's group, key = its place in it: the split orders the members as listed.
        A rank in no group of this kind (a middle stage, for ``embedding``) passes color None."""
        for color, members in enumerate(self.layout.groups(kind)):
            if self.world.rank in members:
                return self.world.split(color, members.index(self.world.rank))
        return self.world.split(None)
