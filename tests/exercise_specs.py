"""The exercises' data, written once: one ``Exercise`` per assignment of exercises/source/.

tests/test_exercises.py runs the checks every assignment shares over this table (full marks
for the released notebook with its solutions, zero for the released stubs, nothing secret
in the release, every source cell passing in process); tests/test_exercise_NN.py keeps what
is specific to one exercise and reads its row here (``EXERCISES["01_ring_allreduce"]``).

``wrong`` holds the plausible wrong solutions that are graded through ``python -m grader``
in the same concurrent run as the released notebooks (``graded(assignment)`` in conftest,
once per session): name -> the edits that make it, each ``(cell grade_id, edit)`` with an
edit as :func:`notebook_tools.edit_cell` takes it. Mistakes checked only in process stay in
their exercise's module.

Not a test module (its name does not start with ``test_``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

from notebook_tools import ROOT, edit_cell, read_nb, replacing

Edit = Union[str, Callable[[str], str]]


@dataclass(frozen=True)
class Exercise:
    """What the common checks need to know about one assignment."""

    assignment: str                      # exercises/source/<assignment>/
    notebook: str                        # its notebook's file name
    solution_cells: tuple[str, ...]      # grade ids of the cells the learner writes, in notebook order
    max_score: float
    tests: int                           # test cells graded (visible and hidden)
    hidden: int                          # of which hidden (grade id ``hidden_...``)
    concept_page: str                    # the notebook's ``lab.concept_page``, under docs/
    secrets: tuple[str, ...]             # text only the source has (beyond the solution / hidden markers)
    wrong: dict[str, tuple[tuple[str, Edit], ...]] = field(default_factory=dict)
    devices: tuple[str, ...] | None = None  # the notebook's ``lab.devices``, if it lists any
    # {test: case pattern} where the stubs' NotImplementedError picks a written case instead of the
    # general hint (a case pattern that also matches the stub's message)
    stub_advice: dict[str, str] = field(default_factory=dict)
    in_process_seconds: float = 60.0     # every source cell in process must take less (the grader allows 60 s a cell)
    needs_c_compiler: bool = False       # skip, rather than fail, where there is none

    @property
    def source(self) -> Path:
        """The source notebook (with solutions and hidden tests)."""
        return ROOT / "exercises" / "source" / self.assignment / self.notebook

    def wrong_notebook(self, name: str, source: dict[str, Any] | None = None) -> dict[str, Any]:
        """The source notebook with the edits of ``wrong[name]`` made."""
        nb = read_nb(self.source) if source is None else source
        for cell, edit in self.wrong[name]:
            nb = edit_cell(nb, cell, edit)
        return nb

    def wrong_notebooks(self) -> dict[str, dict[str, Any]]:
        """Every wrong solution of ``wrong``, by name (what ``grade_assignment`` grades besides the release)."""
        source = read_nb(self.source)
        return {name: self.wrong_notebook(name, source) for name in self.wrong}


# --------------------------------------------------------------------------- the wrong solutions graded

# 03: a recursive doubling without the fold, right only when comm.size is a power of two.
NO_FOLD = '''
def recursive_doubling_allreduce(comm, x, op="sum"):
    data = np.array(x, copy=True).reshape(-1)
    exchange(comm, data, op, comm.size)  # no fold: only right when comm.size is a power of two
    if op == "mean":
        data /= comm.size
    return data.reshape(np.shape(x))
'''

# 04: a learner's bucketer that gets the numbers right but reduces every bucket in wait().
REDUCE_AT_THE_END = '''
class GradientBucketer:
    def __init__(self, comm, params, bucket_bytes):
        self.comm, self.params = comm, params
        order = backward_order(len(params))
        self.buckets, self.where = [], {}
        for positions in plan_buckets([params[i].nbytes for i in order], bucket_bytes):
            offset = 0
            for p in positions:
                self.where[order[p]] = (len(self.buckets), offset)
                offset += params[order[p]].size
            self.buckets.append(np.empty(offset, dtype=params[0].dtype))

    def add(self, index, grad):
        b, offset = self.where[index]
        self.buckets[b][offset:offset + grad.size] = grad.reshape(-1)

    def wait(self):
        averaged = [allreduce(self.comm, flat, op="sum") / self.comm.size for flat in self.buckets]
        return [averaged[b][o:o + p.size].reshape(p.shape)
                for p, (b, o) in ((p, self.where[i]) for i, p in enumerate(self.params))]

    def close(self):
        pass
'''

# 18: a stage-3 schedule that never re-gathers: each layer stays gathered from its forward to its
# backward (right gradients, ZeRO-2's memory: every layer at once, and one all-gather per layer less).
KEEP_GATHERED = '''
def fsdp_schedule(n_layers, prefetch=True):
    ops = []
    for i in range(n_layers):
        ops += [("gather", i), ("forward", i)]  # kept gathered until its backward
    for i in reversed(range(n_layers)):
        ops += [("backward", i), ("free", i), ("reduce_scatter", i)]
    return ops
'''


# 20: capacity applied token by token (each token's k choices in turn) instead of GShard's order (every first
# choice, then every second choice): the same drop count, other tokens dropped; right when k = 1.
TOKEN_BY_TOKEN = '''
def keep_within_capacity(experts, capacity, n_experts):
    T, k = experts.shape
    if capacity is None:
        return np.ones((T, k), dtype=bool), 0
    kept = np.zeros((T, k), dtype=bool)
    load = np.zeros(n_experts, dtype=np.int64)
    for t in range(T):  # token by token: each token's k choices in turn
        for j in range(k):
            e = experts[t, j]
            if load[e] < capacity:
                kept[t, j] = True
                load[e] += 1
    return kept, int(T * k - kept.sum())
'''


# --------------------------------------------------------------------------- the table

_TABLE = [
    Exercise(
        "01_ring_allreduce", "ring_allreduce.ipynb", ("chunk_bounds", "reduce_scatter", "allgather"),
        max_score=25.0, tests=11, hidden=7, concept_page="concepts/allreduce-vs-parameter-servers.md",
        devices=("cpu", "gpu", "torch", "strict"),
        secrets=("_ref_allreduce", "def _smallest_first", "CountingCommunicator"),
        wrong={
            # pieces that lose an element on uneven splits
            "off_by_one": (("chunk_bounds", replacing("r < extra", "r < extra - 1")),),
            # reduce_scatter stores what arrives instead of adding it
            "rs_overwrites": (("reduce_scatter", replacing("""        incoming = xp.empty_like(chunks[recv_i])
        comm.sendrecv(chunks[send_i], right, incoming, left)
        chunks[recv_i] += incoming""", "        comm.sendrecv(chunks[send_i], right, chunks[recv_i], left)")),),
            # allgather with reduce-scatter's indices: it forwards chunks it never completed
            "ag_rs_indices": (("allgather", replacing("send_i, recv_i = (r + 1 - s) % n, (r - s) % n",
                                                      "send_i, recv_i = (r - s) % n, (r - s - 1) % n")),),
        },
    ),
    Exercise(
        "02_alpha_beta", "alpha_beta.ipynb", ("pingpong", "fit_alpha_beta", "ring_allreduce_time",
                                              "recursive_doubling_time"),
        max_score=20.0, tests=10, hidden=6, concept_page="concepts/latency-vs-throughput.md",
        secrets=("np.linalg.lstsq(design", "statistics.median(halves)", "_ref_fit", "2 * (p - 1) / p * n_bytes * beta"),
        in_process_seconds=30.0,  # the notebook must stay quick to grade
        wrong={
            # ordinary least squares on the seconds (alpha drowned by the large messages), together
            # with a ring formula that forgets the 2(p-1)/p factor
            "wrong_ols_no_factor": (
                ("fit_alpha_beta", replacing(
                    "design = np.stack([1 / t, m / t], axis=1)\n"
                    "    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)",
                    "design = np.stack([np.ones_like(m), m], axis=1)\n"
                    "    (alpha, beta), *_ = np.linalg.lstsq(design, t, rcond=None)")),
                ("ring_allreduce_time", replacing("2 * (p - 1) / p * n_bytes * beta", "n_bytes * beta")),
            ),
        },
    ),
    Exercise(
        "03_recursive_doubling", "recursive_doubling.ipynb",
        ("largest_power_of_two", "exchange", "recursive_doubling_allreduce"),
        max_score=20.0, tests=10, hidden=6, concept_page="concepts/allreduce-algorithms.md",
        devices=("cpu", "gpu", "torch"),
        secrets=("comm.recv(incoming, r + p2)", "_expected_traffic", "_ref_allreduce", "CountingCommunicator"),
        wrong={"no_fold": (("recursive_doubling_allreduce", NO_FOLD),)},
    ),
    Exercise(
        "04_gradient_bucketing", "gradient_bucketing.ipynb", ("plan_buckets", "GradientBucketer"),
        max_score=16.0, tests=7, hidden=4, concept_page="concepts/overlap.md",
        secrets=("_ref_plan", "_RefTrainer", "self.jobs.put(b)"),
        wrong={"at_end": (("GradientBucketer", REDUCE_AT_THE_END),)},
    ),
    Exercise(
        "05_autodiff", "autodiff.ipynb", ("grad_rules", "gradients"),
        max_score=12.0, tests=6, hidden=4, concept_page="concepts/autodiff.md",
        secrets=("def _random_graph", "sum_to(g * b, a)"),
        wrong={
            # gradients keeps only the last contribution to a tensor instead of summing them
            "no_sum": (("gradients", replacing("grads.setdefault(t, []).append(gt)", "grads[t] = [gt]")),),
            # grad_add / grad_mul without unbroadcasting
            "no_bc": (("grad_rules", replacing("return [sum_to(g, a), sum_to(g, b)]", "return [g, g]")),
                      ("grad_rules", replacing("return [sum_to(g * b, a), sum_to(g * a, b)]",
                                               "return [g * b, g * a]"))),
        },
    ),
    Exercise(
        "06_partitioning", "partitioning.ipynb", ("prune", "partition"),
        max_score=11.0, tests=5, hidden=3, concept_page="concepts/pruning-placement-partitioning.md",
        secrets=("def _random_graph", "def recv_for"),
        # one Send/Recv pair per consumer instead of per (edge, destination device)
        wrong={"per_consumer": (("partition", replacing("key = (edge, dst_device)",
                                                        "key = (edge, dst_device, len(copies))")),)},
    ),
    Exercise(
        "07_custom_op", "custom_op.ipynb", ("kernel_source", "op"),
        max_score=10.0, tests=6, hidden=5, concept_page="concepts/custom-ops.md",
        secrets=("LAB_AT2(x, i, j)", "def grad(op, g)", "x[0] != s[0]"),
        needs_c_compiler=True,  # its mistakes are checked in process: cheaper than another sandboxed grading
    ),
    Exercise(
        "08_sparsity", "sparsity.ipynb", ("magnitude_prune", "csr_from_dense", "csr_matvec"),
        max_score=10.0, tests=6, hidden=3, concept_page="concepts/sparse-models.md",
        secrets=("_ref_magnitude_mask", "np.bincount(row_of"),
        # pruning by signed value instead of magnitude
        wrong={"signed": (("magnitude_prune", replacing('np.argsort(np.abs(flat), kind="stable")',
                                                        'np.argsort(flat, kind="stable")')),)},
    ),
    Exercise(
        "09_sparse_table", "sparse_table.ipynb", ("pull", "grad_push"),
        max_score=11.0, tests=6, hidden=4, concept_page="concepts/parameter-servers.md",
        secrets=("np.add.at(d_matrix", "_reference_worker"),
        # a gradient that assigns instead of scatter-adding (keeps one of the repeated rows)
        wrong={"no_add_at": (("grad_push", replacing("np.add.at(d_matrix, local_index.ravel(), d_out.reshape(-1, dim))",
                                                     "d_matrix[local_index.ravel()] += d_out.reshape(-1, dim)")),)},
    ),
    Exercise(
        "10_adam", "adam.ipynb", ("adam_update", "adam_class"),
        max_score=10.0, tests=5, hidden=3, concept_page="concepts/optimisers.md", devices=("cpu", "gpu", "torch"),
        secrets=("_RefAdam", "m_hat = m / (1 - G.pow(beta1, t))"),
        # Adam.update returns the old slots instead of the new ones: the state never moves
        wrong={"stale_slots": (("adam_class", replacing('return new_var, {"m": m, "v": v}',
                                                        'return new_var, {"m": slots["m"], "v": slots["v"]}')),)},
    ),
    Exercise(
        "11_loss_scaling", "loss_scaling.ipynb", ("unscale", "update_loss_scale"),
        max_score=8.0, tests=4, hidden=2, concept_page="concepts/mixed-precision.md", devices=("cpu", "gpu", "torch"),
        secrets=("_ref_update_loss_scale", "good_steps += 1"),
        # the state machine keeps its good-step count after an overflow (one graded wrong variant
        # only, to keep the number of parallel gradings, and the suite's time, down)
        wrong={"keep_count": (("update_loss_scale", replacing(
            "return max(scale / factor, min_scale), 0, False",
            "return max(scale / factor, min_scale), good_steps, False")),)},
    ),
    Exercise(
        "12_pipeline_schedule", "pipeline_schedule.ipynb", ("bubble", "schedules", "simulate"),
        max_score=13.0, tests=8, hidden=4, concept_page="concepts/model-parallelism.md",
        secrets=("_shuffled_schedule", "w = min(p - s - 1, m)"),
        # two plausible mistakes in one notebook (one grading run fewer): a bubble over m instead
        # of m + p - 1, and a 1F1B warm-up one forward too long
        wrong={"wrong": (("bubble", replacing("return (p - 1) / (m + p - 1)", "return (p - 1) / m")),
                         ("schedules", replacing("w = min(p - s - 1, m)", "w = min(p - s, m)")))},
    ),
    Exercise(
        "13_codegen", "codegen.ipynb", ("generate_layer",),
        max_score=6.0, tests=3, hidden=2, concept_page="concepts/jit-compilation.md",
        secrets=("np.flatnonzero(w[:, j])",),
        # a generator that writes every weight, zeros included
        wrong={"with_zeros": (("generate_layer", replacing("for k in np.flatnonzero(w[:, j])]",
                                                           "for k in range(k_in)]")),)},
    ),
    Exercise(
        "14_constant_folding", "constant_folding.ipynb", ("fold_constants",),
        max_score=7.0, tests=3, hidden=2, concept_page="concepts/jit-compilation.md",
        secrets=("_ref_constant_folding", "opdef.kernel("),
        # foldability decided on the old graph's inputs, so chains do not fold in one sweep
        wrong={"old_inputs": (("fold_constants", replacing('all(t.op.type == "Const" for t in inputs)',
                                                           'all(t.op.type == "Const" for t in op.inputs)')),)},
    ),
    Exercise(
        "15_ssp_clock", "ssp_clock.ipynb", ("clock",),
        max_score=8.0, tests=4, hidden=3, concept_page="concepts/consistency-models.md",
        secrets=("notify_all()", "_RefClock"),
        # the timeout names the waiting worker instead of the slow one
        wrong={"names_itself": (("clock", replacing(
            "slow = min(range(len(self.clocks)), key=self.clocks.__getitem__)", "slow = worker")),)},
    ),
    Exercise(
        "16_crossed_column", "crossed_column.ipynb", ("cross", "buckets"),
        max_score=8.0, tests=5, hidden=3, concept_page="concepts/feature-columns.md",
        secrets=("splitmix64(h ^ ids)", "_ref_cross_hash"),
        # "...case 0: 3 columns of 185 ids into 1 buckets: expected a result, found NotImplementedError"
        # matches the num_buckets = 1 case: the stubs are advised to check num_buckets = 1
        stub_advice={"hidden_buckets": r"into 1 buckets|\], 1\)"},
        # the bucket taken with the signed modulo (h % m on int64: in range, but not the lab's bucket)
        wrong={"signed_mod": (("buckets", replacing("(h.view(np.uint64) % np.uint64(num_buckets)).astype(np.int64)",
                                                    "h % num_buckets")),)},
    ),
    Exercise(
        "17_zero_stage2", "zero_stage2.ipynb", ("shard_bounds", "reduce_scatter_mean", "Zero2Adam"),
        max_score=18.0, tests=9, hidden=6, concept_page="concepts/zero-and-fsdp.md",
        secrets=("mine /= comm.size", "_ref_train", "self.params[...] = full[:self.params.size]"),
        # the reduce-scattered gradient left as the sum over ranks (Adam nearly hides it: only eps sees the scale)
        wrong={"no_average": (("reduce_scatter_mean", replacing("    mine /= comm.size\n", "")),)},
    ),
    Exercise(
        "18_fsdp_schedule", "fsdp_schedule.ipynb", ("fsdp_schedule", "fsdp_step"),
        max_score=16.0, tests=7, hidden=4, concept_page="concepts/zero-and-fsdp.md",
        secrets=("computations[k + 1][1]", "_ref_compute_order", "class _Watched"),
        # every layer kept gathered from its forward to its backward (no re-gather, no prefetch)
        wrong={"keep_gathered": (("fsdp_schedule", KEEP_GATHERED),)},
    ),
    Exercise(
        "19_tensor_parallel", "tensor_parallel.ipynb",
        ("f_and_g", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP"),
        max_score=19.0, tests=9, hidden=5, concept_page="concepts/tensor-and-sequence-parallelism.md",
        devices=("cpu", "gpu", "torch"),
        secrets=("_ref_mlp", "return y + self.bias  # once, after the allreduce", "_ref_comm_bytes"),
        wrong={
            # f allreduces in the forward too: the replicated input counted p times (and one allreduce too many)
            "f_allreduces_forward": (("f_and_g", replacing("return x  # nothing to send: x is replicated",
                                                           "return allreduce(comm, x)")),),
            # the row-parallel layer adds its replicated bias before g's allreduce: the bias counted p times
            "bias_before_reduce": (("RowParallelLinear", replacing(
                "        y = g_forward(self.comm, x_r @ self.weight.T)  # the p partial sums added\n"
                "        return y + self.bias  # once, after the allreduce",
                "        return g_forward(self.comm, x_r @ self.weight.T + self.bias)")),),
        },
    ),
    Exercise(
        "20_moe_dispatch", "moe_dispatch.ipynb", ("keep_within_capacity", "dispatch", "combine", "ExpertParallelMoE"),
        max_score=20.0, tests=9, hidden=5, concept_page="concepts/moe-and-alltoall.md",
        secrets=("_ref_keep", "np.add.at(y, t, gates[t, j][:, None] * rows)", "_ref_comm_bytes"),
        wrong={
            # GShard's order broken: token by token (loses the capacity and layer value tests, keeps the traffic)
            "token_by_token": (("keep_within_capacity", TOKEN_BY_TOKEN),),
            # combine adds the expert outputs without their gates
            "no_gates": (("combine", replacing("np.add.at(y, t, gates[t, j][:, None] * rows)",
                                               "np.add.at(y, t, rows)")),),
        },
    ),
]

EXERCISES: dict[str, Exercise] = {e.assignment: e for e in _TABLE}
