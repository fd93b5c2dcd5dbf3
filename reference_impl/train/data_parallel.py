"""Data-parallel SGD with gradient bucketing and communication/computation overlap.

NumPy-only: not ported to the array API (the portable code: ``reference_impl.backend``).

Every rank holds a full replica of the model and trains on its own shard of each global
batch. After backward, the replicas must agree on the *average* gradient, which costs an
allreduce. How the gradients are handed to the allreduce decides the step time:

* ``"per_tensor"``: one allreduce per parameter after backward. Every call pays the
  per-message latency (alpha in the cost model) 2(n-1) times, so a model with hundreds of
  small tensors spends its step in latency.
* ``"end"``: gradients are packed into *buckets* of about ``bucket_bytes`` (tensor fusion:
  Horovod's fusion buffer, PyTorch DDP's ``bucket_cap_mb``) and each bucket is reduced after
  backward, so the latency is paid once per bucket instead of once per tensor.
* ``"overlap"``: the same buckets, but a bucket is handed to a *communication thread* the
  moment its last gradient is computed, while backward goes on with the layers below. The
  allreduce of the last layers' gradients hides behind the backward of the first layers.

All three give the same averaged gradients: on 2 ranks bit for bit (a sum of two numbers
does not depend on the order), on more ranks up to rounding, because the bucket layout
decides which ring chunk, and so which order of additions, each element gets (see
docs/concepts/determinism.md).

Threads and communicators: the communication thread is the only user of the communicator
while a step runs; the training thread touches it only between steps (when the
communication thread is idle). Under MPI that needs ``MPI_THREAD_SERIALIZED`` or better,
which ``check_thread_support`` asks the library for (mpi4py requests
``MPI_THREAD_MULTIPLE`` by default).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..comm.allreduce import allreduce
from ..comm.bucketing import plan_buckets
from ..comm.communicator import CommError, Communicator
from .data import batch_indices, shard, synthetic_classification
from .mlp import backward, backward_order, cross_entropy, forward, init_mlp, sgd_update

MODES = ("overlap", "end", "per_tensor")
DEFAULT_BUCKET_BYTES = 25 << 20  # PyTorch DDP's default bucket_cap_mb = 25


# --------------------------------------------------------------------------- buckets


@dataclass
class Bucket:
    """A fusion buffer: the gradients of ``indices`` packed into one flat array, and its average."""

    indices: list[int]  # parameter indices, in backward order
    offsets: list[int]  # where each one starts in ``flat``
    flat: np.ndarray  # this rank's gradients, packed
    reduced: np.ndarray  # the average over ranks (the allreduce's output buffer)
    pending: int = 0  # gradients still missing in this step


@dataclass
class BucketTrace:
    """When one bucket became ready, and when its allreduce started and ended (perf_counter s)."""

    nbytes: int
    ready: float
    start: float = float("nan")
    end: float = float("nan")


@dataclass
class StepTrace:
    """Timestamps of one training step (``time.perf_counter()``, seconds)."""

    start: float
    forward_end: float = float("nan")
    backward_end: float = float("nan")
    comm_end: float = float("nan")  # every bucket averaged
    end: float = float("nan")  # parameters updated
    buckets: list[BucketTrace] = field(default_factory=list)

    @property
    def comm_started_before_backward_end(self) -> bool:
        """True when the first allreduce began while backward was still running."""
        return bool(self.buckets) and self.buckets[0].start < self.backward_end


# --------------------------------------------------------------------------- the comm thread


def check_thread_support(comm: Communicator) -> None:
    """Fail clearly if ``comm`` is an MPI communicator whose library forbids a communication thread."""
    inner = comm
    while hasattr(inner, "inner"):  # wrappers (counting, simulated network) keep theirs here
        inner = inner.inner
    if type(inner).__name__ != "MPICommunicator":
        return
    from mpi4py import MPI

    level = MPI.Query_thread()
    if level < MPI.THREAD_SERIALIZED:
        names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED"}
        raise RuntimeError(
            f"rank {comm.rank}: MPI was initialised with {names.get(level, level)}, but overlap mode "
            "calls MPI from a communication thread and needs MPI_THREAD_SERIALIZED or better "
            "(do not set mpi4py.rc.thread_level below 'serialized')"
        )


class CommThread:
    """A background thread that runs submitted jobs one at a time, in submission order.

    The order matters: every rank must start the same allreduces in the same sequence, or
    the ring's messages meet the wrong partners. An error in a job is kept and raised in
    the training thread by ``wait``; the thread stops taking jobs after it.
    """

    def __init__(self, rank: int, timeout: float = 60.0):
        self.rank = rank
        self.timeout = timeout
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._outstanding = 0
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"comm-rank-{rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
                self._done.put(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._done.put(exc)
                return

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; it runs after every job submitted before it."""
        if self._failed is not None:
            raise CommError(f"rank {self.rank}: the communication thread failed earlier: {self._failed}")
        self._outstanding += 1
        self._jobs.put(job)

    def wait(self) -> None:
        """Block until every submitted job has finished; raise the first job's error, if any."""
        while self._outstanding:
            try:
                result = self._done.get(timeout=self.timeout)
            except queue.Empty:
                raise CommError(
                    f"rank {self.rank}: the communication thread did not finish its allreduces "
                    f"within {self.timeout:g} s (a peer stopped, or ranks queued different buckets)"
                ) from None
            self._outstanding -= 1
            if isinstance(result, BaseException):
                self._failed = result
                self._outstanding = 0
                raise CommError(f"rank {self.rank}: allreduce on the communication thread failed: {result}") from result

    def close(self) -> None:
        """Stop the thread after the jobs already queued."""
        self._jobs.put(None)
        self._thread.join(self.timeout)


# --------------------------------------------------------------------------- the trainer


class DataParallelTrainer:
    """Synchronous data-parallel SGD on one rank: forward, backward, average gradients, update.

    ``params`` (``[W0, b0, ...]`` of ``mlp.init_mlp``) must be identical on every rank and is
    updated in place. Use as a context manager (or call ``close``) so the communication
    thread of ``"overlap"`` mode stops. ``traces`` holds one ``StepTrace`` per step.
    """

    def __init__(
        self,
        comm: Communicator,
        params: list[np.ndarray],
        lr: float = 0.1,
        mode: str = "overlap",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        algorithm: str = "ring",
        timeout: float = 60.0,
    ):
        if mode not in MODES:
            raise ValueError(f"DataParallelTrainer on rank {comm.rank}: unknown mode {mode!r}; expected one of {MODES}")
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1 or not np.issubdtype(next(iter(dtypes)), np.floating):
            raise TypeError(
                f"DataParallelTrainer on rank {comm.rank}: parameters must share one floating dtype, "
                f"got {sorted(str(d) for d in dtypes)}"
            )
        self.comm, self.params, self.lr, self.mode, self.algorithm = comm, params, lr, mode, algorithm
        self.order = backward_order(len(params))
        plan = plan_buckets([params[i].nbytes for i in self.order], 0 if mode == "per_tensor" else bucket_bytes)
        dtype = params[0].dtype
        self.buckets: list[Bucket] = []
        self._where: dict[int, tuple[int, int]] = {}  # param index -> (bucket, offset)
        for b, positions in enumerate(plan):
            indices = [self.order[p] for p in positions]
            offsets = list(np.cumsum([0] + [params[i].size for i in indices[:-1]]))
            total = sum(params[i].size for i in indices)
            self.buckets.append(Bucket(indices, [int(o) for o in offsets], np.empty(total, dtype), np.empty(total, dtype)))
            for i, off in zip(indices, offsets):
                self._where[i] = (b, int(off))
        self.traces: list[StepTrace] = []
        self._comm_thread: CommThread | None = None
        if mode == "overlap":
            check_thread_support(comm)
            self._comm_thread = CommThread(comm.rank, timeout)

    # -- one step

    def _average(self, bucket: Bucket, trace: BucketTrace) -> None:
        """Allreduce-sum the bucket into ``reduced`` and divide by the rank count (any thread)."""
        trace.start = time.perf_counter()
        allreduce(self.comm, bucket.flat, algorithm=self.algorithm, op="sum", out=bucket.reduced)
        bucket.reduced /= self.comm.size
        trace.end = time.perf_counter()

    # --8<-- [start:step]
    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One synchronous SGD step on this rank's shard ``(x, y)``; returns the local loss."""
        trace = StepTrace(start=time.perf_counter())
        self.traces.append(trace)
        logits, activations = forward(self.params, x)
        loss, dlogits = cross_entropy(logits, y)
        trace.forward_end = time.perf_counter()

        for bucket in self.buckets:
            bucket.pending = len(bucket.indices)
        ready: list[tuple[Bucket, BucketTrace]] = []
        for index, grad in backward(self.params, activations, dlogits):
            b, offset = self._where[index]
            bucket = self.buckets[b]
            bucket.flat[offset:offset + grad.size] = grad.reshape(-1)
            bucket.pending -= 1
            if bucket.pending == 0:  # the bucket is full: ship it
                bt = BucketTrace(bucket.flat.nbytes, ready=time.perf_counter())
                trace.buckets.append(bt)
                ready.append((bucket, bt))
                if self._comm_thread is not None:
                    self._comm_thread.submit(lambda bucket=bucket, bt=bt: self._average(bucket, bt))
        trace.backward_end = time.perf_counter()

        if self._comm_thread is not None:
            self._comm_thread.wait()
        else:
            for bucket, bt in ready:
                self._average(bucket, bt)
        trace.comm_end = time.perf_counter()

        sgd_update(self.params, self.averaged_grads(), self.lr)
        trace.end = time.perf_counter()
        return loss
    # --8<-- [end:step]

    def averaged_grads(self) -> list[np.ndarray]:
        """The last step's averaged gradients, indexed like ``params`` (views into the buckets)."""
        grads: list[Any] = [None] * len(self.params)
        for i, p in enumerate(self.params):
            b, offset = self._where[i]
            grads[i] = self.buckets[b].reduced[offset:offset + p.size].reshape(p.shape)
        return grads

    def close(self) -> None:
        if self._comm_thread is not None:
            self._comm_thread.close()
            self._comm_thread = None

    def __enter__(self) -> "DataParallelTrainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- a whole run


@dataclass
class TrainResult:
    params: list[np.ndarray]
    losses: list[float]  # this rank's loss on its shard, per step
    traces: list[StepTrace]
    history: list[list[np.ndarray]] = field(default_factory=list)  # parameters after each step, if kept


def train(
    comm: Communicator,
    widths: tuple[int, ...] = (32, 64, 64, 10),
    steps: int = 20,
    global_batch: int = 64,
    lr: float = 0.1,
    mode: str = "overlap",
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    seed: int = 0,
    n_samples: int = 2048,
    algorithm: str = "ring",
    dtype: type = np.float32,
    keep_history: bool = False,
) -> TrainResult:
    """Train an MLP of ``widths`` for ``steps`` steps on the seeded synthetic data set.

    Every rank builds the same data and the same initial parameters from ``seed``, takes
    the same global batch each step and keeps its shard of it, so a run is fully determined
    by its arguments and the rank count. ``keep_history`` keeps a copy of the parameters
    after every step (for comparing trajectories step by step).
    """
    x_all, y_all = synthetic_classification(n_samples, widths[0], widths[-1], seed=seed, dtype=dtype)
    params = init_mlp(widths, seed=seed + 1, dtype=dtype)
    losses, history = [], []
    with DataParallelTrainer(comm, params, lr=lr, mode=mode, bucket_bytes=bucket_bytes, algorithm=algorithm) as t:
        for s in range(steps):
            idx = batch_indices(n_samples, global_batch, s, seed=seed)
            x, y = shard(x_all[idx], y_all[idx], comm.rank, comm.size)
            losses.append(t.step(x, y))
            if keep_history:
                history.append([p.copy() for p in params])
    return TrainResult(params, losses, t.traces, history)
