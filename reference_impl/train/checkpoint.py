"""Checkpoints that survive ``kill -9``: sharded data files, a manifest, atomic commit, keep-last-N.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

A checkpoint of step ``s`` in ``directory`` is

* one or more **data shards** ``ckpt-<s>-<token>.shard-<i>-of-<n>``: the raw bytes of the
  tensors, packed in order, each shard at most ``max_shard_bytes`` (a tensor larger than that
  is cut into row blocks across shards), and
* one **manifest** ``ckpt-<s>.manifest.json``: for every tensor its name, shape, dtype and
  the pieces it is made of (file, byte offset, byte count, rows, CRC-32 of the bytes).

The manifest is written *last*, and it is the commit point: a checkpoint exists if and only
if its manifest does. Every file is written to a temporary name, flushed and ``fsync``-ed,
then renamed over its final name (``os.replace`` is atomic on POSIX), and the directory is
``fsync``-ed so the rename itself survives a power cut. A process killed at any instant
leaves either the old set of manifests or the new one, never a half-written manifest; stray
shards or temporary files of an unfinished save are ignored by the loader and removed by the
next save. ``token`` is random per save, so re-saving a step never overwrites the shards the
committed manifest of that step still points at. One process writes to a directory at a time
(rank 0 in a data-parallel job): the clean-up removes every shard no manifest names.

Restoring onto a different number of workers: a variable that lives split over workers (an
embedding table with rows on every worker) is saved as ``Partitioned([part_0, part_1, ...])``
and stored as one logical tensor whose pieces keep each worker's rows. ``load_checkpoint(...,
partition=(num_workers, index))`` returns, for such a tensor, only the rows that worker
``index`` of ``num_workers`` owns under ``partition_rows`` (reading only those bytes), so 4
workers can restore a checkpoint that 3 workers wrote.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

FORMAT = "reference_impl.checkpoint/1"
MANIFEST_RE = re.compile(r"^ckpt-(\d{10})\.manifest\.json$")
DEFAULT_SHARD_BYTES = 64 << 20

# A test hook: called with the name of each phase of a save, so a test can stop the process
# at an exact point (and kill -9 it there). ``None`` in normal use.
phase_hook: Callable[[str], None] | None = None


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, truncated, or belongs to a different model."""


class ModelMismatchError(CheckpointError):
    """The checkpoint is intact but its names, shapes or dtypes are not the model's."""


@dataclass
class Partitioned:
    """A variable split by rows over workers: ``parts[k]`` are worker ``k``'s rows, in order."""

    parts: list[np.ndarray]

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("Partitioned: needs at least one part")
        tails = {(p.shape[1:], p.dtype) for p in self.parts}
        if len(tails) != 1:
            raise ValueError(f"Partitioned: parts must share trailing shape and dtype, got {sorted(map(str, tails))}")


def partition_rows(n_rows: int, num_workers: int, index: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of worker ``index`` when ``n_rows`` rows are split over ``num_workers``.

    The first ``n_rows % num_workers`` workers get one row more (TensorFlow's
    ``fixed_size_partitioner`` rule), so every row has exactly one owner.
    """
    if num_workers < 1 or not 0 <= index < num_workers:
        raise ValueError(f"partition_rows: worker index {index} is outside 0..{num_workers - 1}")
    base, extra = divmod(n_rows, num_workers)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _hook(phase: str) -> None:
    if phase_hook is not None:
        phase_hook(phase)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --8<-- [start:atomic]
def _write_atomically(path: Path, chunks: list[bytes | memoryview], phase: str) -> None:
    """Write ``chunks`` to ``path`` so that ``path`` is either absent/old or complete: tmp, fsync, rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        for i, chunk in enumerate(chunks):
            f.write(chunk)
            if i == 0:
                _hook(f"{phase}:writing")
        f.flush()
        os.fsync(f.fileno())
    _hook(f"{phase}:before-rename")
    os.replace(tmp, path)
# --8<-- [end:atomic]


def _as_pieces(value: np.ndarray | Partitioned) -> tuple[tuple[int, ...], np.dtype, list[np.ndarray]]:
    """The full shape, dtype and row blocks (each C-contiguous) of a state entry."""
    if isinstance(value, Partitioned):
        parts = [np.asarray(p, order="C") for p in value.parts]
        shape = (sum(p.shape[0] for p in parts),) + parts[0].shape[1:]
        return shape, parts[0].dtype, parts
    array = np.asarray(value, order="C")
    return array.shape, array.dtype, [array]


def save_checkpoint(
    directory: str | os.PathLike,
    state: dict[str, np.ndarray | Partitioned],
    step: int,
    keep_last: int = 5,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Save ``state`` (name -> array or ``Partitioned``) as the checkpoint of ``step``; return the manifest path.

    Keeps the newest ``keep_last`` checkpoints and deletes older ones (manifest first, so
    a kill during clean-up never leaves a manifest whose shards are gone).
    """
    directory = Path(directory)
    if not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"save_checkpoint: step must be a non-negative integer, got {step!r}")
    if keep_last < 1 or max_shard_bytes < 1:
        raise ValueError(f"save_checkpoint: keep_last ({keep_last}) and max_shard_bytes ({max_shard_bytes}) "
                         "must be >= 1")
    directory.mkdir(parents=True, exist_ok=True)
    newest = latest_step(directory)
    if newest is not None and step < newest:
        raise ValueError(f"save_checkpoint: {directory} already holds step {newest}; saving the older step {step} "
                         "there would make keep-last-N delete newer work (start a fresh directory instead)")

    # Plan: cut every tensor into pieces of whole rows, pack pieces into shards of bounded size.
    shards: list[list[tuple[str, np.ndarray]]] = [[]]
    sizes = [0]
    tensors = {}
    for name, value in state.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"save_checkpoint: tensor names must be non-empty strings, got {name!r}")
        shape, dtype, blocks = _as_pieces(value)
        if dtype.kind not in "biufc":
            raise TypeError(f"save_checkpoint: tensor {name!r} has dtype {dtype}; only numeric arrays can be saved")
        tensors[name] = {"shape": list(shape), "dtype": dtype.str, "pieces": []}
        row = 0
        for block in blocks:
            n_rows = block.shape[0] if block.ndim else 1
            row_bytes = max(block[:1].nbytes if block.ndim else block.nbytes, 1)
            rows_per = max(1, max_shard_bytes // row_bytes)
            for start in range(0, max(n_rows, 1), rows_per):
                piece = block[start:start + rows_per] if block.ndim else block
                if sizes[-1] and sizes[-1] + piece.nbytes > max_shard_bytes:
                    shards.append([])
                    sizes.append(0)
                shards[-1].append((name, piece))
                sizes[-1] += piece.nbytes
                n = piece.shape[0] if block.ndim else 1
                tensors[name]["pieces"].append({"rows": [row + start, row + start + n]})
            row += n_rows

    # --8<-- [start:commit]
    token = secrets.token_hex(4)
    prefix = f"ckpt-{int(step):010d}"
    piece_iter = {name: iter(t["pieces"]) for name, t in tensors.items()}
    for i, shard in enumerate(shards):
        fname = f"{prefix}-{token}.shard-{i:05d}-of-{len(shards):05d}"
        offset = 0
        chunks = []
        for name, piece in shard:
            data = np.asarray(piece, order="C").reshape(-1).view(np.uint8)
            record = next(piece_iter[name])
            record.update(file=fname, offset=offset, nbytes=piece.nbytes, crc32=zlib.crc32(data))
            offset += piece.nbytes
            chunks.append(data)
        _write_atomically(directory / fname, chunks or [b""], f"shard{i}")
    _fsync_dir(directory)  # the shards' renames are durable before the manifest can name them
    _hook("shards-written")

    manifest = {"format": FORMAT, "step": int(step), "tensors": tensors}
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()
    path = directory / f"{prefix}.manifest.json"
    _write_atomically(path, [body], "manifest")
    _fsync_dir(directory)  # the rename is durable from here on: the checkpoint is committed
    _hook("committed")
    _collect_garbage(directory, keep_last)
    # --8<-- [end:commit]
    return path


def _committed_steps(directory: Path) -> list[int]:
    """Steps with a manifest, newest first."""
    if not directory.is_dir():
        return []
    steps = [int(m.group(1)) for p in directory.iterdir() if (m := MANIFEST_RE.match(p.name))]
    return sorted(steps, reverse=True)


def _collect_garbage(directory: Path, keep_last: int) -> None:
    """Delete manifests beyond the newest ``keep_last``, then every file no manifest refers to."""
    for step in _committed_steps(directory)[keep_last:]:
        (directory / f"ckpt-{step:010d}.manifest.json").unlink(missing_ok=True)
        _hook("gc")
    referenced = set()
    for step in _committed_steps(directory):
        try:
            manifest = json.loads((directory / f"ckpt-{step:010d}.manifest.json").read_text())
            referenced |= {p["file"] for t in manifest["tensors"].values() for p in t["pieces"]}
        except (OSError, ValueError, KeyError, TypeError):
            return  # a damaged manifest: keep every file, the loader will report it
    for p in directory.iterdir():
        if p.name.startswith(("ckpt-", ".ckpt-")) and ".shard-" in p.name and p.name not in referenced:
            p.unlink(missing_ok=True)
        elif p.name.startswith(".ckpt-") and ".tmp-" in p.name:
            p.unlink(missing_ok=True)
    _fsync_dir(directory)


def _read_manifest(directory: Path, step: int) -> dict:
    path = directory / f"ckpt-{step:010d}.manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint manifest") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: manifest is not valid JSON (corrupt or truncated): {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("step") != step:
        raise CheckpointError(f"{path}: not a {FORMAT} manifest for step {step}")
    return manifest


def _read_rows(directory: Path, name: str, entry: dict, rows: tuple[int, int] | None) -> np.ndarray:
    """Assemble tensor ``name`` (or only its rows ``[start, stop)``) from its pieces, checking every CRC."""
    shape, dtype = tuple(entry["shape"]), np.dtype(entry["dtype"])
    lo, hi = rows if rows is not None else (0, shape[0] if shape else 1)
    out_shape = (hi - lo,) + shape[1:] if shape else ()
    out = np.empty(out_shape, dtype)
    flat = out.reshape(-1) if shape else out.reshape(1)
    row_items = int(np.prod(shape[1:], dtype=np.int64)) if shape else 1
    filled = 0
    for piece in entry["pieces"]:
        p_lo, p_hi = piece["rows"]
        if p_hi <= lo or p_lo >= hi:
            continue
        path = directory / piece["file"]
        try:
            with open(path, "rb") as f:
                f.seek(piece["offset"])
                data = f.read(piece["nbytes"])
        except FileNotFoundError:
            raise CheckpointError(f"{path}: shard file of tensor {name!r} is missing") from None
        if len(data) != piece["nbytes"]:
            raise CheckpointError(
                f"{path}: truncated: tensor {name!r} needs {piece['nbytes']} bytes at offset {piece['offset']}, "
                f"found {len(data)}"
            )
        if zlib.crc32(data) != piece["crc32"]:
            raise CheckpointError(f"{path}: checksum mismatch in tensor {name!r} rows {p_lo}..{p_hi} (corrupt data)")
        values = np.frombuffer(data, dtype)
        a, b = max(lo, p_lo), min(hi, p_hi)
        flat[(a - lo) * row_items:(b - lo) * row_items] = values[(a - p_lo) * row_items:(b - p_lo) * row_items]
        filled += (b - a) * row_items
    if filled != flat.size:
        raise CheckpointError(f"{directory}: tensor {name!r}: pieces cover {filled} of {flat.size} elements")
    return out


def _check_like(path: Path, tensors: dict, like: dict) -> None:
    """Raise, listing every difference, unless the checkpoint has exactly ``like``'s names, shapes and dtypes."""
    problems = []
    for name in sorted(set(like) - set(tensors)):
        problems.append(f"missing in checkpoint: {name!r} {tuple(np.shape(like[name]))}")
    for name in sorted(set(tensors) - set(like)):
        problems.append(f"not in the model: {name!r} {tuple(tensors[name]['shape'])}")
    for name in sorted(set(tensors) & set(like)):
        want = (tuple(np.shape(like[name])), np.asarray(like[name]).dtype)
        have = (tuple(tensors[name]["shape"]), np.dtype(tensors[name]["dtype"]))
        if want != have:
            problems.append(f"{name!r}: checkpoint has {have[0]} {have[1]}, the model has {want[0]} {want[1]}")
    if problems:
        raise ModelMismatchError(f"{path}: checkpoint is from a different model:\n  " + "\n  ".join(problems))


def load_checkpoint(
    directory: str | os.PathLike,
    step: int | None = None,
    like: dict[str, np.ndarray] | None = None,
    partition: tuple[int, int] | None = None,
    partitioned: tuple[str, ...] = (),
) -> tuple[dict[str, np.ndarray], int]:
    """``(state, step)`` of the newest checkpoint in ``directory`` that reads back intact.

    A newer checkpoint that fails its checks (missing shard, truncation, checksum) is skipped
    with a warning naming the file and the reason; if none is good, ``CheckpointError`` lists
    each one and why. ``step`` asks for exactly that checkpoint (its error is raised, no
    fallback). ``like`` (name -> array of the model) makes a checkpoint of a different model
    an error listing the missing, extra and mismatched names and shapes. With ``partition =
    (num_workers, index)``, every tensor named in ``partitioned`` comes back as only worker
    ``index``'s rows under ``partition_rows``.
    """
    directory = Path(directory)
    steps = [step] if step is not None else _committed_steps(directory)
    if not steps:
        raise CheckpointError(f"{directory}: no checkpoint found (no ckpt-*.manifest.json)")
    failures = []
    for s in steps:
        try:
            manifest = _read_manifest(directory, s)
            tensors = manifest["tensors"]
            if like is not None:
                _check_like(directory / f"ckpt-{s:010d}.manifest.json", tensors, like)
            unknown = set(partitioned) - set(tensors)
            if unknown:
                raise CheckpointError(f"{directory}: partitioned tensors {sorted(unknown)} are not in checkpoint {s}")
            state = {}
            for name, entry in tensors.items():
                rows = None
                if partition is not None and name in partitioned:
                    if not entry["shape"]:
                        raise CheckpointError(f"{directory}: tensor {name!r} is a scalar and cannot be partitioned")
                    rows = partition_rows(entry["shape"][0], *partition)
                state[name] = _read_rows(directory, name, entry, rows)
            if failures:
                warnings.warn(f"load_checkpoint: skipped newer damaged checkpoints: {'; '.join(failures)}",
                              stacklevel=2)
            return state, s
        except CheckpointError as exc:
            if step is not None or isinstance(exc, ModelMismatchError):
                raise
            failures.append(f"step {s}: {exc}")
    raise CheckpointError(f"{directory}: no intact checkpoint:\n  " + "\n  ".join(failures))


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest committed step in ``directory`` (not verified), or ``None``."""
    steps = _committed_steps(Path(directory))
    return steps[0] if steps else None
