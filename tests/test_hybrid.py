"""DP x TP x PP training of the GPT on a process grid (reference_impl/parallel/hybrid.py).

* after 3 Adam steps (float64) the parameters rebuilt from every rank's shards equal plain
  single-rank Adam on the whole global batch (zero.reference_train) to 1e-6 (in fact ~1e-15),
  and every step's loss equals the single-rank loss, on thread ranks for the grids DP x TP = 2 x 2,
  TP x PP = 2 x 2 (2 micro-batches; also with sequence parallelism), 1 x 1, DP = 4, TP = 4,
  PP = 4 (a 4-block model), DP x PP = 2 x 2 and DP x TP x PP = 2 x 2 x 2 on 8 ranks;
* the same under ``mpiexec -n 4`` for both 2 x 2 grids (tests/mpi_programs/hybrid_train.py);
* the bytes each rank sends on each group (tp, dp, pp, embedding: CountingCommunicator's
  children) equal the closed forms of ``hybrid.step_comm_bytes``: m activations and m gradients
  of b T C values per stage boundary, one allreduce of the stage's shard on DP, one of the wte
  shard on the embedding group, the tensor-parallel model's per-layer/embedding/head traffic;
* the tied embedding needs the embedding group: without its allreduce (Megatron's
  _allreduce_word_embedding_grads) the first and last stage's copies of wte drift apart;
* layouts that do not fit are refused with both numbers named; train reports step times and a
  tracemalloc peak above the parameters and Adam state it must hold.
"""
import subprocess
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import CountingCommunicator, run_threads
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.parallel import hybrid, zero
from reference_impl.parallel import transformer as tf
from reference_impl.parallel.adam import Adam
from reference_impl.parallel.process_grid import GridLayout, ProcessGrid

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "mpi_programs" / "hybrid_train.py"
pytestmark = pytest.mark.timeout(180)

CFG = tf.GPTConfig(vocab_size=96, block_size=8, n_layer=2, n_head=4, n_embd=16)
DEEP = tf.GPTConfig(vocab_size=96, block_size=8, n_layer=4, n_head=4, n_embd=16)
STEPS, BATCH, SEQ = 3, 8, 8


def reference(config):
    """Single-rank Adam on the global batches: the parameters (zero.reference_train) and each step's loss."""
    params = tf.init_params(config, dtype=np.float64)
    opt, losses = Adam(1e-3), []
    for s in range(STEPS):
        loss, grads = tf.loss_and_grads(params, *zero.global_batch(s, BATCH, SEQ), config)
        opt.step(params, grads)
        losses.append(loss)
    assert all(np.array_equal(v, params[k]) for k, v in zero.reference_train(config, STEPS, BATCH, SEQ).items())
    return params, losses


REFERENCE = {}


def run_layout(config, dp=1, tp=1, pp=1, microbatches=1, sequence_parallel=False, wrap=None):
    n = dp * tp * pp
    return run_threads(n, lambda comm: hybrid.train(comm, config, dp=dp, tp=tp, pp=pp, steps=STEPS, batch=BATCH,
                                                    seq=SEQ, microbatches=microbatches,
                                                    sequence_parallel=sequence_parallel), wrap=wrap, timeout=120)


LAYOUTS = {
    "DPxTP 2x2": (CFG, dict(dp=2, tp=2)),
    "TPxPP 2x2": (CFG, dict(tp=2, pp=2, microbatches=2)),
    "TPxPP 2x2, sequence parallel": (CFG, dict(tp=2, pp=2, microbatches=2, sequence_parallel=True)),
    "1x1": (CFG, dict()),
    "DP 4": (CFG, dict(dp=4)),
    "TP 4": (CFG, dict(tp=4)),
    "PP 4": (DEEP, dict(pp=4, microbatches=4)),
    "DPxPP 2x2": (CFG, dict(dp=2, pp=2, microbatches=2)),
    "DPxTPxPP 2x2x2": (CFG, dict(dp=2, tp=2, pp=2, microbatches=2)),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_grid_training_equals_single_rank(name):
    config, layout = LAYOUTS[name]
    if config not in REFERENCE:
        REFERENCE[config] = reference(config)
    params, losses = REFERENCE[config]
    results = run_layout(config, **layout)
    grid = GridLayout(dp=layout.get("dp", 1), tp=layout.get("tp", 1), pp=layout.get("pp", 1))
    full = hybrid.full_params([r.shards for r in results], grid, config)
    assert sorted(full) == sorted(params)
    assert max(float(np.abs(full[k] - params[k]).max()) for k in params) < 1e-6
    for r in results:
        assert np.allclose(r.losses, losses, rtol=0, atol=1e-9), (r.rank, r.losses, losses)
        assert len(r.step_seconds) == STEPS and min(r.step_seconds) > 0


@pytest.mark.parametrize("layout", [dict(dp=2, tp=2), dict(tp=2, pp=2, microbatches=2),
                                    dict(dp=2, tp=2, pp=2, microbatches=2), dict(dp=4), dict(tp=4)])
def test_bytes_per_group_equal_the_closed_forms(layout):
    results = run_layout(CFG, wrap=CountingCommunicator, **layout)
    grid = GridLayout(dp=layout.get("dp", 1), tp=layout.get("tp", 1), pp=layout.get("pp", 1))
    m = layout.get("microbatches", 1)
    for r in results:
        want = {k: STEPS * v for k, v in hybrid.step_comm_bytes(CFG, grid, r.coords, BATCH, SEQ, m).items()}
        assert {k: r.bytes_sent.get(k, 0) for k in want} == want, r.rank
        b = BATCH // (grid.dp * m)
        if grid.pp == 2:  # by hand: m activations (or gradients) of b T C float64 per step, one direction each
            assert r.bytes_sent["pp"] == STEPS * m * b * SEQ * CFG.n_embd * 8


def test_the_tied_embedding_needs_the_embedding_group():
    """Drop the embedding group's allreduce: stage 0's wte and the last stage's copy drift apart."""

    def body(comm, drop):
        grid = ProcessGrid(comm, dp=1, tp=2, pp=2)
        trainer = hybrid.HybridTrainer(grid, CFG, tf.init_params(CFG, dtype=np.float64), microbatches=2)
        if drop:
            grid.embedding_group = None
        for s in range(STEPS):
            trainer.step(*zero.local_batch(s, BATCH, SEQ, 0, 1))
        return trainer.shards

    layout = GridLayout(dp=1, tp=2, pp=2)
    hybrid.full_params(run_threads(4, body, False), layout, CFG)  # with the allreduce: the copies agree
    with pytest.raises(ValueError, match="the two copies of wte.weight"):
        hybrid.full_params(run_threads(4, body, True), layout, CFG)


def test_bad_layouts_name_the_numbers():
    def attempt(n, **kw):
        args = dict(steps=1, batch=BATCH, seq=SEQ) | kw
        run_threads(n, lambda comm: hybrid.train(comm, CFG, **args))

    with pytest.raises(ValueError, match=r"over 3 ranks needs n_head = 4 divisible by 3"):
        attempt(3, tp=3)
    with pytest.raises(ValueError, match=r"global batch 8 does not split into dp = 2 replicas x 3 micro-batches"):
        attempt(2, dp=2, microbatches=3)
    with pytest.raises(ValueError, match=r"4 pipeline stages need at least 4 blocks, the model has n_layer = 2"):
        attempt(4, pp=4, microbatches=4)
    with pytest.raises(ValueError, match=r"dp x tp x pp = 2 x 2 x 1 = 4 ranks, but the communicator has 2"):
        attempt(2, dp=2, tp=2)
    with pytest.raises(ValueError, match=r"needs seq = 6 divisible by 4"):
        attempt(4, tp=4, seq=6, sequence_parallel=True)


def test_train_reports_memory():
    [result] = run_threads(1, lambda comm: hybrid.train(comm, CFG, steps=2, batch=BATCH, seq=SEQ,
                                                         measure_memory=True))
    state = 3 * tf.n_params(CFG) * 8  # parameters and Adam's two moments, float64
    assert result.peak_bytes > state


def test_hybrid_training_under_mpiexec():
    run = subprocess.run(mpiexec_command(4, str(PROGRAM)), capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("HYBRID")]
    assert [line.split(" maxdiff")[0] for line in lines] == [
        "HYBRID dp=2 tp=2 pp=1 m=1 sp=0", "HYBRID dp=1 tp=2 pp=2 m=2 sp=0", "HYBRID dp=1 tp=2 pp=2 m=2 sp=1"]
    for line in lines:
        assert float(line.split("maxdiff=")[1].split()[0]) < 1e-6 and "bytes=ok" in line, line
