"""An input pipeline in the style of ``tf.data``: sources, transformations, and sharding by worker.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

A ``Dataset`` is a recipe, not data: it holds a function that starts a fresh iterator, so
the same dataset can be iterated once per epoch and every transformation returns a new
recipe wrapped around the old one::

    ds = (Dataset.from_jsonl(files, parser)   # one parsed record per line
          .shard(num_workers, index)          # this worker's files (or records)
          .shuffle(buffer_size=1000, seed=0)  # a sliding-window shuffle
          .batch(32)                          # records -> dicts of stacked arrays
          .prefetch(2))                       # a thread fills the next batches while training runs

**Sharding** splits the input so each of ``num_workers`` workers reads a disjoint part and
together they read everything exactly once. *File-level* sharding (``level="file"``) gives
each worker whole files: a worker opens only its own files, which is what makes reading
scale, but needs at least as many files as workers and balanced files. *Record-level*
sharding keeps every ``num_workers``-th record: perfectly balanced, but every worker reads
every file and throws away most of it. Shard *before* shuffling, so the workers' parts stay
disjoint whatever the shuffle seed.

**Shuffle with a buffer** keeps ``buffer_size`` records and emits a random one of them each
time a new record arrives; it streams (memory ``buffer_size``), but a record can only move
about ``buffer_size`` places, so files sorted by label need a buffer comparable to the
data set or file-order shuffling as well.

**Prefetch** runs the upstream pipeline on a background thread into a bounded queue, so
parsing the next batches overlaps with the training step (NumPy and file reads release the
GIL). An error in the producer thread is raised in the consumer, never swallowed.
"""
from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from .records import RecordParser

_END = object()


class Dataset:
    """A re-iterable stream of elements, built from a function that starts a fresh iterator."""

    def __init__(self, make_iterator: Callable[[], Iterator[Any]]):
        self._make_iterator = make_iterator
        self.files: tuple[Path, ...] | None = None  # set on file sources, for file-level sharding
        self._reader: Callable[[tuple[Path, ...]], "Dataset"] | None = None

    def __iter__(self) -> Iterator[Any]:
        return self._make_iterator()

    # ------------------------------------------------------------------ sources

    @staticmethod
    def from_arrays(*arrays: np.ndarray) -> "Dataset":
        """One element per row: ``x[i]`` for one array, ``(x[i], y[i], ...)`` for several."""
        if not arrays:
            raise ValueError("Dataset.from_arrays: needs at least one array")
        arrays = tuple(np.asarray(a) for a in arrays)
        lengths = {a.shape[0] if a.ndim else None for a in arrays}
        if len(lengths) != 1 or None in lengths:
            raise ValueError(f"Dataset.from_arrays: arrays must share their first dimension, got shapes "
                             f"{[a.shape for a in arrays]}")
        n = arrays[0].shape[0]
        if len(arrays) == 1:
            return Dataset(lambda: (arrays[0][i] for i in range(n)))
        return Dataset(lambda: (tuple(a[i] for a in arrays) for i in range(n)))

    @staticmethod
    def from_generator(fn: Callable[[], Iterable[Any]]) -> "Dataset":
        """Elements of ``fn()``, called anew for every pass."""
        return Dataset(lambda: iter(fn()))

    @staticmethod
    def from_csv(paths: Sequence[str | Path], parser: RecordParser) -> "Dataset":
        """Parsed records of CSV files (each with a header line); malformed lines go to the parser's reject file."""
        return Dataset._from_files(paths, parser, "csv")

    @staticmethod
    def from_jsonl(paths: Sequence[str | Path], parser: RecordParser) -> "Dataset":
        """Parsed records of JSON-lines files; malformed lines go to the parser's reject file."""
        return Dataset._from_files(paths, parser, "jsonl")

    @staticmethod
    def _from_files(paths: Sequence[str | Path], parser: RecordParser, kind: str) -> "Dataset":
        files = tuple(Path(p) for p in paths)
        if not files:
            raise ValueError(f"Dataset.from_{kind}: no files given")
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"Dataset.from_{kind}: no such file(s): {', '.join(missing)}")

        def records() -> Iterator[dict]:
            for f in files:
                yield from parser.parse_file(f, kind)

        ds = Dataset(records)
        ds.files = files
        ds._reader = lambda subset: Dataset._from_files(subset, parser, kind)
        return ds

    # ------------------------------------------------------------------ transformations

    def map(self, fn: Callable[[Any], Any]) -> "Dataset":
        """``fn(element)`` for every element."""
        return Dataset(lambda: (fn(e) for e in self))

    def filter(self, keep: Callable[[Any], bool]) -> "Dataset":
        """Only the elements for which ``keep`` is true."""
        return Dataset(lambda: (e for e in self if keep(e)))

    def shard(self, num_workers: int, index: int, level: str = "record") -> "Dataset":
        """Worker ``index``'s disjoint part of ``num_workers``: whole files (``level="file"``) or every n-th record."""
        if num_workers < 1 or not 0 <= index < num_workers:
            raise ValueError(f"Dataset.shard: worker index {index} is outside 0..{num_workers - 1}")
        if level == "record":
            def every_nth() -> Iterator[Any]:
                for i, e in enumerate(self):
                    if i % num_workers == index:
                        yield e
            return Dataset(every_nth)
        if level != "file":
            raise ValueError(f"Dataset.shard: level must be 'record' or 'file', got {level!r}")
        if self.files is None or self._reader is None:
            raise ValueError("Dataset.shard(level='file') must come right after from_csv/from_jsonl, "
                             "before any other step; shard at record level otherwise")
        if len(self.files) < num_workers:
            raise ValueError(f"Dataset.shard: {len(self.files)} files cannot be split over {num_workers} workers "
                             f"at file level (worker {len(self.files)} would read nothing); use level='record'")
        return self._reader(self.files[index::num_workers])

    def batch(self, batch_size: int, drop_remainder: bool = False) -> "Dataset":
        """Groups of ``batch_size`` consecutive elements, stacked (dicts and tuples field by field)."""
        if batch_size < 1:
            raise ValueError(f"Dataset.batch: batch_size must be >= 1, got {batch_size}")

        def batches() -> Iterator[Any]:
            group: list[Any] = []
            for e in self:
                group.append(e)
                if len(group) == batch_size:
                    yield stack(group)
                    group = []
            if group and not drop_remainder:
                yield stack(group)

        return Dataset(batches)

    def shuffle(self, buffer_size: int, seed: int | None = None) -> "Dataset":
        """A streaming shuffle through a buffer of ``buffer_size`` elements; a new order every pass."""
        if buffer_size < 1:
            raise ValueError(f"Dataset.shuffle: buffer_size must be >= 1, got {buffer_size}")
        passes = [0]

        def shuffled() -> Iterator[Any]:
            rng = np.random.default_rng(None if seed is None else [seed, passes[0]])
            passes[0] += 1
            buffer: list[Any] = []
            for e in self:
                if len(buffer) < buffer_size:
                    buffer.append(e)
                    continue
                k = int(rng.integers(buffer_size))
                yield buffer[k]
                buffer[k] = e
            rng.shuffle(buffer)
            yield from buffer

        return Dataset(shuffled)

    def repeat(self, count: int | None = None) -> "Dataset":
        """The dataset ``count`` times over (forever for ``None``)."""
        if count is not None and count < 0:
            raise ValueError(f"Dataset.repeat: count must be >= 0 or None, got {count}")

        def repeated() -> Iterator[Any]:
            n = 0
            while count is None or n < count:
                empty = True
                for e in self:
                    empty = False
                    yield e
                if empty:
                    return  # repeating nothing forever would spin
                n += 1

        return Dataset(repeated)

    def take(self, count: int) -> "Dataset":
        """The first ``count`` elements."""
        def first() -> Iterator[Any]:
            for i, e in enumerate(self):
                if i >= count:
                    return
                yield e
        return Dataset(first)

    def skip(self, count: int) -> "Dataset":
        """Everything after the first ``count`` elements (fast-forwarding a deterministic input after a restart)."""
        if count < 0:
            raise ValueError(f"Dataset.skip: count must be >= 0, got {count}")

        def rest() -> Iterator[Any]:
            for i, e in enumerate(self):
                if i >= count:
                    yield e
        return Dataset(rest)

    def prefetch(self, buffer_size: int = 2, timeout: float = 60.0) -> "Dataset":
        """Produce up to ``buffer_size`` elements ahead on a background thread."""
        if buffer_size < 1:
            raise ValueError(f"Dataset.prefetch: buffer_size must be >= 1, got {buffer_size}")

        def prefetched() -> Iterator[Any]:
            q: queue.Queue = queue.Queue(buffer_size)
            stop = threading.Event()

            def produce() -> None:
                try:
                    for e in self:
                        while not stop.is_set():
                            try:
                                q.put(e, timeout=0.1)
                                break
                            except queue.Full:
                                continue
                        if stop.is_set():
                            return
                    q.put(_END)
                except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                    q.put(exc)

            thread = threading.Thread(target=produce, name="prefetch", daemon=True)
            thread.start()
            try:
                while True:
                    try:
                        e = q.get(timeout=timeout)
                    except queue.Empty:
                        raise TimeoutError(
                            f"Dataset.prefetch: no element from the producer thread in {timeout:g} s") from None
                    if e is _END:
                        return
                    if isinstance(e, BaseException):
                        raise RuntimeError(f"Dataset.prefetch: the input pipeline failed: {e}") from e
                    yield e
            finally:
                stop.set()  # the consumer stopped early: let the producer end

        return Dataset(prefetched)


def stack(elements: list[Any]) -> Any:
    """Stack a list of elements into one batch: arrays/scalars along a new axis 0, dicts and tuples field-wise."""
    first = elements[0]
    if isinstance(first, dict):
        return {k: stack([e[k] for e in elements]) for k in first}
    if isinstance(first, tuple):
        return tuple(stack([e[i] for e in elements]) for i in range(len(first)))
    return np.stack([np.asarray(e) for e in elements])
