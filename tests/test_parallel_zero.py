"""ZeRO stages 0-3 (reference_impl/parallel/zero.py, fsdp.py) against plain single-process training.

* equivalence: every stage, on 1, 2, 3, 4 thread ranks and on 4 MPI processes, ends 50 float64
  Adam steps within 1e-6 of single-process Adam on the same global batches;
* traffic: the bytes a rank sends per step are exactly ``comm_elements`` (2 Ψ_pad (N-1)/N for
  stages 0-2, 3 Ψ_pad (N-1)/N for stage 3), padding included;
* memory: each rank's peak, measured with tracemalloc in its own MPI process, is within 10%
  of ``zero_memory`` for 1, 2, 4 and 8 ranks;
* checkpoints restore at another rank count and another stage; a checkpoint of another
  model is refused clearly; a step is restored only if every rank committed it;
* a rank that dies during an all-gather fails every other rank's step within the timeout,
  naming the step, the layer and (on its ring neighbour) the dead rank.
"""
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from reference_impl.comm import Communicator, CountingCommunicator, run_threads
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.parallel import transformer as tf
from reference_impl.parallel import zero
from reference_impl.train.checkpoint import CheckpointError, ModelMismatchError

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "mpi_programs" / "zero_train.py"
pytestmark = pytest.mark.timeout(60)

# units of 1050 (embed), 1330 (each block) and 20 (head) values: 3 and 4 ranks need padding
TINY = tf.GPTConfig(vocab_size=96, block_size=9, n_layer=2, n_head=2, n_embd=10)
BATCH, SEQ, STEPS = 12, 9, 50
RUNS = [(0, True), (1, True), (2, True), (3, True), (3, False)]


@pytest.fixture(scope="module")
def reference():
    return zero.reference_train(TINY, STEPS, BATCH, SEQ)


def max_diff(a, b):
    assert sorted(a) == sorted(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def test_layout_pads_every_unit_to_a_multiple_of_the_rank_count():
    psi = tf.n_params(TINY)
    assert [u.numel for u in zero.flat_units(TINY, 1)] == [1050, 1330, 1330, 20]
    for n in (1, 2, 3, 4, 8):
        units = zero.flat_units(TINY, n)
        assert all(u.padded % n == 0 and 0 <= u.padded - u.numel < n for u in units)
        assert zero.padded_params(TINY, n) == sum(u.padded for u in units) >= psi
    assert zero.padded_params(TINY, 4) == 1052 + 1332 + 1332 + 20 > psi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("stage,prefetch", RUNS)
def test_every_stage_equals_single_process_adam_on_thread_ranks(reference, stage, prefetch, ranks):
    results = run_threads(ranks, lambda comm: zero.train(comm, TINY, stage=stage, steps=STEPS, batch=BATCH, seq=SEQ,
                                                         prefetch=prefetch), timeout=30)
    for r in results:
        assert max_diff(r.params, reference) < 1e-6


def test_every_stage_equals_single_process_adam_on_four_mpi_processes():
    run = subprocess.run(mpiexec_command(4, str(PROGRAM), "equivalence"), capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = re.findall(r"EQUIV stage=(\d) prefetch=(\w+) ranks=4 maxdiff=(\S+) bytes=(\d+) expected=(\d+)", run.stdout)
    assert [(int(s), p == "True") for s, p, *_ in lines] == RUNS, run.stdout
    for _, _, diff, sent, expected in lines:
        assert float(diff) < 1e-6 and sent == expected


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("stage,prefetch", RUNS)
def test_bytes_sent_per_step_are_the_closed_form(stage, prefetch, ranks):
    def body(comm):
        with zero.ZeroTrainer(comm, TINY, tf.init_params(TINY, dtype=np.float64), stage=stage, prefetch=prefetch) as t:
            sent = []
            for s in range(3):
                before = comm.bytes_sent
                t.step(*zero.local_batch(s, BATCH, SEQ, comm.rank, comm.size))
                sent.append(comm.bytes_sent - before)
            return sent

    psi_pad = zero.padded_params(TINY, ranks)
    per_rank = (3 if stage == 3 else 2) * psi_pad * (ranks - 1) // ranks  # exact: psi_pad is a multiple of N
    assert zero.comm_elements(TINY, stage, ranks) == per_rank
    for sent in run_threads(ranks, body, timeout=30, wrap=CountingCommunicator):
        assert sent == [8 * per_rank] * 3


def test_memory_accounting_counts_the_padding():
    config = tf.GPTConfig(vocab_size=96, block_size=16, n_layer=4, n_head=2, n_embd=62)
    for n in (1, 2, 4, 8):
        psi_pad = zero.padded_params(config, n)
        m = [zero.zero_memory(config, 2, 16, stage=s, ranks=n) for s in range(4)]
        assert [(x["parameters"], x["gradients"], x["optimizer_state"]) for x in m] == [
            (4 * psi_pad, 4 * psi_pad, 8 * psi_pad), (4 * psi_pad, 4 * psi_pad, 8 * psi_pad // n),
            (4 * psi_pad, 4 * psi_pad // n, 8 * psi_pad // n), (4 * psi_pad // n, 4 * psi_pad // n, 8 * psi_pad // n)]
    assert zero.padded_params(config, 8) > tf.n_params(config)  # 46934-value blocks do not split 8 ways


@pytest.mark.timeout(120)
def test_measured_peak_per_rank_follows_the_accounting_from_1_to_8_ranks():
    run = subprocess.run(mpiexec_command(8, str(PROGRAM), "memory"), capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = re.findall(r"MEM stage=(\d) prefetch=(\w+) ranks=(\d) rank=(\d) measured=(\d+) predicted=(\d+)", run.stdout)
    assert len(rows) == len(RUNS) * 4 * 8  # 8 processes, each in a group of 8, 4, 2 and 1
    peaks = {}
    for stage, prefetch, ranks, rank, measured, predicted in rows:
        assert abs(int(predicted) / int(measured) - 1) < 0.10, (stage, prefetch, ranks, rank, measured, predicted)
        peaks.setdefault((int(stage), prefetch, int(ranks)), []).append(int(measured))
    for n in (2, 4, 8):  # sharding shows: more ranks, less per rank, for every stage but 0
        for stage in (1, 2, 3):
            assert max(peaks[(stage, "True", n)]) < min(peaks[(stage, "True", n // 2)])


class DiesDuringCollective(Communicator):
    """Wraps a rank's communicator; after ``after`` ring steps the rank dies (it just stops, as a killed process)."""

    def __init__(self, inner, after):
        self.inner, self.rank, self.size, self.after, self.calls = inner, inner.rank, inner.size, after, 0

    def send(self, buf, dest, tag=0):
        self.inner.send(buf, dest, tag)

    def recv(self, buf, source, tag=0):
        self.inner.recv(buf, source, tag)

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        self.calls += 1
        if self.calls > self.after:
            raise SystemExit(f"rank {self.rank} killed")
        self.inner.sendrecv(sendbuf, dest, recvbuf, source, tag)

    def barrier(self):
        self.inner.barrier()


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_rank_dying_during_an_all_gather_fails_the_step_within_the_timeout(prefetch):
    n, timeout, dead = 4, 3.0, 2
    per_step = 3 * len(tf.layers(TINY)) * (n - 1)  # 2 gathers and 1 reduce-scatter per unit, N-1 ring steps each
    after = per_step + 2 * (n - 1) + 1  # step 1, forward: embed and h.0 gathered, then one step into h.1's

    def body(comm):
        me = DiesDuringCollective(comm, after) if comm.rank == dead else comm
        start = time.monotonic()
        try:
            zero.train(me, TINY, stage=3, steps=3, batch=BATCH // 3, seq=SEQ, prefetch=prefetch)
        except BaseException as exc:  # noqa: BLE001 - the dead rank just stops; the others report
            return ("dead" if comm.rank == dead else str(exc)), time.monotonic() - start
        return "finished", time.monotonic() - start

    results = run_threads(n, body, timeout=timeout)
    assert results[dead][0] == "dead"
    for rank, (message, seconds) in enumerate(results):
        if rank != dead:  # every other rank fails within the timeout, saying where it was
            assert seconds < 1.5 * timeout, (rank, seconds)
            where = rf"rank {rank}: step 1: all-gather \(forward\) of layer '[\w.]+' failed: "
            assert re.match(where, message), message
    # the dead rank's right neighbour waited on it in the gather it died in; the ranks further
    # round the ring may have finished that gather from buffered messages and stopped in the next
    neighbour = results[(dead + 1) % n][0]
    assert "all-gather (forward) of layer 'h.1' failed" in neighbour and f"no message from rank {dead}" in neighbour


@pytest.mark.parametrize("saved,restored", [((3, 4), (3, 2)), ((3, 4), (1, 3)), ((0, 2), (3, 4)), ((2, 3), (0, 1))])
def test_a_sharded_checkpoint_restores_at_another_rank_count_and_stage(tmp_path, reference, saved, restored):
    (s_stage, s_ranks), (r_stage, r_ranks) = saved, restored
    half = STEPS // 2
    run_threads(s_ranks, lambda comm: _train_and_save(comm, s_stage, half, tmp_path), timeout=30)

    def resume(comm):
        params = tf.init_params(TINY, seed=99, dtype=np.float64)  # overwritten by the checkpoint
        with zero.ZeroTrainer(comm, TINY, params, stage=r_stage) as t:
            assert zero.load_sharded(t, tmp_path) == half and t.opt.t == half
            return zero.train(comm, TINY, stage=r_stage, steps=STEPS, batch=BATCH, seq=SEQ, start=half, trainer=t)

    for r in run_threads(r_ranks, resume, timeout=30):
        assert max_diff(r.params, reference) < 1e-6


def _train_and_save(comm, stage, steps, directory):
    with zero.ZeroTrainer(comm, TINY, tf.init_params(TINY, dtype=np.float64), stage=stage) as t:
        for s in range(steps):
            t.step(*zero.local_batch(s, BATCH, SEQ, comm.rank, comm.size))
            if s in (steps // 2 - 1, steps - 1):
                zero.save_sharded(t, directory)


def test_a_step_not_committed_by_every_rank_is_not_restored(tmp_path):
    run_threads(2, lambda comm: _train_and_save(comm, 3, 6, tmp_path), timeout=30)  # saves steps 3 and 6
    (tmp_path / "rank-00001-of-00002" / "ckpt-0000000006.manifest.json").unlink()  # rank 1 died before committing
    assert run_threads(2, _load, 1, TINY, tmp_path, timeout=30) == [3, 3]
    with pytest.raises(CheckpointError, match="no sharded checkpoint"):
        run_threads(1, _load, 3, TINY, tmp_path / "empty")


def _load(comm, stage, config, directory):
    with zero.ZeroTrainer(comm, config, tf.init_params(config, dtype=np.float64), stage=stage) as t:
        return zero.load_sharded(t, directory)


def test_restoring_another_models_checkpoint_is_a_clear_error(tmp_path):
    run_threads(2, lambda comm: _train_and_save(comm, 3, 2, tmp_path), timeout=30)
    wider = tf.GPTConfig(vocab_size=96, block_size=9, n_layer=2, n_head=2, n_embd=12)
    with pytest.raises(ModelMismatchError, match="different model configuration"):
        run_threads(1, _load, 1, wider, tmp_path)


def test_trainer_rejects_bad_configuration():
    def make(comm, params, stage):
        zero.ZeroTrainer(comm, TINY, params, stage=stage, prefetch=False)

    with pytest.raises(ValueError, match="stage must be one of"):
        run_threads(1, make, tf.init_params(TINY), 4)
    mixed = {**tf.init_params(TINY), "wpe.weight": np.zeros((9, 10), np.float64)}
    with pytest.raises(TypeError, match="one floating dtype"):
        run_threads(1, make, mixed, 3)
    with pytest.raises(ValueError, match="not divisible"):
        zero.local_batch(0, 10, SEQ, 0, 4)
