"""Checkpoints: round trip, sharding, keep-last-N, resharding, kill -9 mid-save, corrupt files, wrong model."""
import json
import os
import random
import select
import signal
import time
import warnings

import numpy as np
import pytest

from reference_impl.train import checkpoint as ckpt
from reference_impl.train import (CheckpointError, ModelMismatchError, Partitioned, load_checkpoint, partition_rows,
                                  save_checkpoint)

pytestmark = pytest.mark.timeout(60)


def model_state(step, rows=40):
    """A state whose every value encodes ``step``, so a load can be checked against the step it claims."""
    rng = np.random.default_rng(step)
    return {
        "dense/kernel": rng.standard_normal((rows, 16)).astype(np.float32),
        "dense/bias": np.full(16, step, np.float32),
        "embedding": rng.integers(0, 1000, (rows * 3, 8)),
        "global_step": np.int64(step),
    }


def assert_state_equal(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].shape == np.shape(b[name]) and a[name].dtype == np.asarray(b[name]).dtype, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_round_trip_keeps_names_shapes_dtypes_and_values(tmp_path):
    state = {**model_state(7), "empty": np.zeros((0, 3)), "f16": np.arange(6, dtype=np.float16).reshape(2, 3),
             "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4))}
    save_checkpoint(tmp_path, state, 7)
    loaded, step = load_checkpoint(tmp_path)
    assert step == 7
    assert_state_equal(loaded, state)


def test_large_tensors_are_cut_into_row_blocks_across_shards(tmp_path):
    state = model_state(3, rows=200)  # embedding: 600 x 8 int64 = 38400 bytes
    save_checkpoint(tmp_path, state, 3, max_shard_bytes=4096)
    shards = sorted(p for p in tmp_path.iterdir() if ".shard-" in p.name)
    assert len(shards) >= 10
    assert all(p.stat().st_size <= 4096 for p in shards)
    manifest = json.loads((tmp_path / "ckpt-0000000003.manifest.json").read_text())
    assert len(manifest["tensors"]["embedding"]["pieces"]) >= 10
    assert_state_equal(load_checkpoint(tmp_path)[0], state)


def test_keep_last_n_deletes_older_checkpoints_and_their_shards(tmp_path):
    for step in range(1, 8):
        save_checkpoint(tmp_path, model_state(step), step, keep_last=3, max_shard_bytes=2048)
    manifests = sorted(p.name for p in tmp_path.glob("*.manifest.json"))
    assert manifests == [f"ckpt-{s:010d}.manifest.json" for s in (5, 6, 7)]
    referenced = set()
    for m in manifests:
        tensors = json.loads((tmp_path / m).read_text())["tensors"]
        referenced |= {p["file"] for t in tensors.values() for p in t["pieces"]}
    assert {p.name for p in tmp_path.iterdir() if ".shard-" in p.name} == referenced
    for step in (5, 6, 7):
        assert_state_equal(load_checkpoint(tmp_path, step=step)[0], model_state(step))


def test_resave_of_the_same_step_replaces_it_atomically(tmp_path):
    save_checkpoint(tmp_path, model_state(1), 1)
    newer = {k: v + 1 for k, v in model_state(1).items()}
    save_checkpoint(tmp_path, newer, 1)
    assert_state_equal(load_checkpoint(tmp_path)[0], newer)


@pytest.mark.parametrize("old,new", [(3, 4), (4, 3), (2, 5), (3, 1)])
def test_restore_a_partitioned_variable_onto_a_different_number_of_workers(tmp_path, old, new):
    table = np.arange(23 * 4, dtype=np.float64).reshape(23, 4)
    parts = [table[slice(*partition_rows(23, old, k))] for k in range(old)]
    save_checkpoint(tmp_path, {"emb": Partitioned(parts), "w": np.ones(3)}, 10, max_shard_bytes=64)
    pieces = [load_checkpoint(tmp_path, partition=(new, k), partitioned=("emb",))[0] for k in range(new)]
    for k, state in enumerate(pieces):
        np.testing.assert_array_equal(state["emb"], table[slice(*partition_rows(23, new, k))])
        np.testing.assert_array_equal(state["w"], np.ones(3))
    np.testing.assert_array_equal(np.concatenate([s["emb"] for s in pieces]), table)  # every row exactly once
    np.testing.assert_array_equal(load_checkpoint(tmp_path)[0]["emb"], table)


def test_partition_rows_gives_every_row_one_owner():
    for n in range(0, 30):
        for workers in range(1, 7):
            spans = [partition_rows(n, workers, k) for k in range(workers)]
            assert spans[0][0] == 0 and spans[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= 1


# --------------------------------------------------------------------------- kill -9


def _fork_saver(directory, target_phase=None, first_step=1, loop=False):
    """Fork a child that saves checkpoints; it reports each phase/commit on a pipe. Returns (pid, read_fd)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)

            def hook(phase):
                if phase == target_phase:
                    os.write(w, f"at {phase}\n".encode())
                    time.sleep(60)  # wait here to be killed

            ckpt.phase_hook = hook
            step = first_step
            while True:
                save_checkpoint(directory, model_state(step), step, keep_last=2, max_shard_bytes=1500)
                os.write(w, f"committed {step}\n".encode())
                if not loop:
                    break
                step += 1
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def _read_line(fd, timeout=10.0):
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, "child did not report in time"
    return os.read(fd, 64).decode()


def _kill(pid, fd):
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    committed = [int(x.split()[1]) for x in os.read(fd, 1 << 16).decode().split("\n") if x.startswith("committed")]
    os.close(fd)
    return committed


PHASES = ["shard0:writing", "shard0:before-rename", "shard1:writing", "shard2:before-rename", "shards-written",
          "manifest:writing", "manifest:before-rename", "committed", "gc"]


@pytest.mark.parametrize("phase", PHASES)
def test_kill_9_at_each_phase_of_a_save_leaves_a_good_checkpoint(tmp_path, phase):
    for step in (1, 2):
        save_checkpoint(tmp_path, model_state(step), step, keep_last=2, max_shard_bytes=1500)
    pid, fd = _fork_saver(tmp_path, target_phase=phase, first_step=3)
    assert _read_line(fd).startswith(f"at {phase}")
    _kill(pid, fd)
    state, step = load_checkpoint(tmp_path)
    assert step == (3 if phase in ("committed", "gc") else 2)
    assert_state_equal(state, model_state(step))
    # The next save cleans up what the killed one left behind.
    save_checkpoint(tmp_path, model_state(4), 4, keep_last=2, max_shard_bytes=1500)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert_state_equal(load_checkpoint(tmp_path)[0], model_state(4))


def test_kill_9_at_random_moments_of_a_save_loop_never_loses_a_committed_checkpoint(tmp_path):
    rng = random.Random(0)
    last = 0
    for trial in range(24):
        pid, fd = _fork_saver(tmp_path, first_step=last + 1, loop=True)
        seen = _read_line(fd)  # the child has committed at least one save and is in the loop
        time.sleep(rng.uniform(0.0, 0.02))  # then kill it at a random moment of a later save
        committed = _kill(pid, fd) + [int(x.split()[1]) for x in seen.split("\n") if x.startswith("committed")]
        last = max([last] + committed)
        state, step = load_checkpoint(tmp_path)
        assert step >= last, f"trial {trial}: loaded step {step}, but step {last} had been committed"
        assert_state_equal(state, model_state(step))
        last = step
    assert last >= 24  # every trial committed at least one save before it was killed


# --------------------------------------------------------------------------- bad input


def _shard_of(directory, step, tensor):
    manifest = json.loads((directory / f"ckpt-{step:010d}.manifest.json").read_text())
    return directory / manifest["tensors"][tensor]["pieces"][0]["file"]


def test_a_corrupt_shard_is_reported_and_the_older_checkpoint_is_used(tmp_path):
    save_checkpoint(tmp_path, model_state(1), 1)
    save_checkpoint(tmp_path, model_state(2), 2)
    shard = _shard_of(tmp_path, 2, "dense/kernel")
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch in tensor 'dense/kernel'"):
        load_checkpoint(tmp_path, step=2)
    with pytest.warns(UserWarning, match="step 2: .*checksum mismatch"):
        state, step = load_checkpoint(tmp_path)
    assert step == 1
    assert_state_equal(state, model_state(1))


def test_truncated_shard_and_truncated_manifest_give_clear_errors(tmp_path):
    save_checkpoint(tmp_path, model_state(1), 1)
    shard = _shard_of(tmp_path, 1, "embedding")
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=f"{shard.name}: truncated: tensor '[a-z/]+' needs \\d+ bytes"):
        load_checkpoint(tmp_path, step=1)
    save_checkpoint(tmp_path, model_state(2), 2)
    manifest = tmp_path / "ckpt-0000000002.manifest.json"
    manifest.write_text(manifest.read_text()[:50])
    with pytest.raises(CheckpointError, match="manifest is not valid JSON"):
        load_checkpoint(tmp_path, step=2)
    both = r"no intact checkpoint:\n  step 2: .*not valid JSON.*\n  step 1: .*truncated"
    with pytest.raises(CheckpointError, match=both):
        load_checkpoint(tmp_path)


def test_missing_directory_and_missing_shard(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        load_checkpoint(tmp_path / "nothing")
    save_checkpoint(tmp_path, model_state(1), 1)
    _shard_of(tmp_path, 1, "dense/bias").unlink()
    with pytest.raises(CheckpointError, match="shard file of tensor 'dense/bias' is missing"):
        load_checkpoint(tmp_path, step=1)


def test_checkpoint_of_a_different_model_lists_every_difference(tmp_path):
    save_checkpoint(tmp_path, model_state(1), 1)
    model = model_state(1)
    model["dense/kernel"] = np.zeros((40, 32), np.float32)
    model["dense/bias"] = np.zeros(16, np.float64)
    del model["embedding"]
    model["head/kernel"] = np.zeros((16, 2), np.float32)
    with pytest.raises(ModelMismatchError) as err:
        load_checkpoint(tmp_path, like=model)
    text = str(err.value)
    assert "missing in checkpoint: 'head/kernel' (16, 2)" in text
    assert "not in the model: 'embedding' (120, 8)" in text
    assert "'dense/kernel': checkpoint has (40, 16) float32, the model has (40, 32) float32" in text
    assert "'dense/bias': checkpoint has (16,) float32, the model has (16,) float64" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_checkpoint(tmp_path, like=model_state(1))[1] == 1


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        save_checkpoint(tmp_path, model_state(1), -1)
    with pytest.raises(TypeError, match="tensor 'x' has dtype object"):
        save_checkpoint(tmp_path, {"x": np.array([None])}, 1)
    with pytest.raises(ValueError, match="parts must share trailing shape"):
        Partitioned([np.zeros((2, 3)), np.zeros((2, 4))])


def test_saving_an_older_step_into_a_newer_directory_is_refused(tmp_path):
    save_checkpoint(tmp_path, model_state(5), 5)
    with pytest.raises(ValueError, match="already holds step 5; saving the older step 2"):
        save_checkpoint(tmp_path, model_state(2), 2)
    assert load_checkpoint(tmp_path)[1] == 5
