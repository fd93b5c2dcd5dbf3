"""``TorchCommunicator``: the ``Communicator`` interface over a ``torch.distributed`` process group.

The same collectives that run on thread ranks and on MPI processes run unchanged on the
processes ``torchrun`` starts, because all they need is point-to-point ``send``/``recv``,
which ``torch.distributed`` offers as ``isend``/``irecv`` on a process group. Two backends:

* **gloo** (CPU data: NumPy arrays and CPU tensors). Messages travel over TCP between every
  pair of ranks; this is the path the lab's tests run.
* **NCCL** (CUDA tensors only). Written from PyTorch's documented API (``isend``/``irecv``
  and ``all_reduce`` on an NCCL group, which carry CUDA tensors; NCCL's point-to-point calls
  ignore ``tag`` and match messages between a pair in the order they were posted) and
  **untested here**: the lab's machines have no GPU.

What MPICommunicator guarantees, this one guarantees too:

* **Every blocking call is bounded.** Each call posts nonblocking work and waits on it with
  ``Work.wait(timeout)``; after ``timeout`` seconds (default ``LAB_COMM_TIMEOUT``, else 60)
  it raises ``CommError`` naming the peer. A timed-out wait makes gloo close every connection
  of the group ("Application timeout caused pair closure"), so after a timeout this
  communicator is finished: the job ends, as MPI jobs do.
* **A message says what it holds.** gloo matches a receive by source and tag and checks only
  that the bytes fit: a shorter message fills part of the buffer without complaint, and a
  float32 message received into an int32 buffer arrives as garbage. So every message is two:
  a 16-byte *header* (dtype code, byte count), then the payload. The receiver takes the
  header first and posts the payload's receive only if both agree with its buffer, else it
  raises ``CommError`` at once, naming the sender and both dtypes and sizes. The price is
  one extra small message per send, which the benchmarks measure.
* **No copies on the way.** A contiguous NumPy array travels as ``torch.from_numpy`` of its
  bytes, which shares its memory; a tensor travels as itself.

``recv_any`` is gloo's receive from any source (``irecv`` without ``src``: gloo's
``recvFromAny``); NCCL has none and says so. ``split`` makes real process groups with
``torch.distributed.new_group``, for the reason MPICommunicator uses ``Comm.Split``: a sub-
communicator with a group of its own has its own connections and tag space, and its
``library_allreduce`` can hand a whole reduction to ``all_reduce`` on that group. PyTorch
needs every process of the job to call ``new_group`` for every group, in the same order, so
this works for splits of the world communicator; a split of a split falls back to the
generic ``SplitCommunicator`` (point-to-point only).
"""
from __future__ import annotations

import atexit
import collections
import datetime
import sys
import time
from typing import Any

import numpy as np

from .communicator import Communicator, CommError, dissemination_barrier, split_communicator, split_key
from .mpi import DTYPES, TIMEOUT_ENV, timeout_from_env

WIRE_DTYPES = (*DTYPES, "bfloat16")  # header codes 1..len; 0 for any other dtype
_BARRIER_TAG = 1023  # the dissemination barrier's tag (kept clear of the collectives' small tags)
_MAX_TAG = 2**31 - 1  # gloo takes a non-negative int32 tag
EAGER_BYTES = 64 << 10  # sends up to this size return before the receiver has taken them (see _post_send)
MAX_PENDING = 256  # eager sends in flight before a send waits for the oldest

_NUMPY_BYTES = {}  # numpy dtype -> (wire code, itemsize), cached: str(dtype) per message is slow


def _code_of(name: str) -> int:
    return WIRE_DTYPES.index(name) + 1 if name in WIRE_DTYPES else 0


def _name_of(code: int) -> str:
    return WIRE_DTYPES[code - 1] if 1 <= code <= len(WIRE_DTYPES) else "another dtype"


class TorchCommunicator(Communicator):
    """A ``Communicator`` over a ``torch.distributed`` process group (the default group if ``group`` is None).

    ``TorchCommunicator.world()`` initialises the default group from the environment
    ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) when that has
    not happened yet. ``timeout`` bounds every blocking call in seconds (default
    ``timeout_from_env()``).
    """

    def __init__(self, group: Any = None, timeout: float | None = None):
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("TorchCommunicator: torch.distributed is not initialised; use "
                               "TorchCommunicator.world() (it calls init_process_group) or call it yourself")
        self._torch, self._dist = torch, dist
        self.group = dist.group.WORLD if group is None else group
        self.backend = str(dist.get_backend(self.group))
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"TorchCommunicator serves the gloo and nccl backends, not {self.backend!r}")
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self.timeout = timeout_from_env() if timeout is None else float(timeout)
        self._device = torch.device("cpu") if self.backend == "gloo" else torch.device("cuda", torch.cuda.current_device())
        self._pending: collections.deque = collections.deque()  # (work, what) of eager sends
        atexit.register(self._flush_at_exit)

    def _flush_at_exit(self) -> None:
        try:
            self.flush()
        except CommError as exc:
            print(f"TorchCommunicator at exit: {exc}", file=sys.stderr)

    @classmethod
    def world(cls, backend: str = "gloo", timeout: float | None = None) -> "TorchCommunicator":
        """The communicator of every process of the job, initialising ``torch.distributed`` if needed.

        ``backend`` is ``"gloo"`` (CPU) or ``"nccl"`` (CUDA tensors; needs a GPU, and each
        process is bound to GPU ``LOCAL_RANK``). The process group's own timeout is set to
        ``timeout`` too, so the library's collectives are bounded like this class's calls.
        """
        import torch
        import torch.distributed as dist

        seconds = timeout_from_env() if timeout is None else float(timeout)
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"TorchCommunicator.world: backend must be 'gloo' or 'nccl', got {backend!r}")
        if backend == "nccl" and not torch.cuda.is_available():
            raise RuntimeError("TorchCommunicator.world: backend 'nccl' needs a CUDA GPU, and this process "
                               "sees none (torch.cuda.is_available() is False); use backend='gloo'")
        if not dist.is_initialized():
            import os

            missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
            if missing:
                raise RuntimeError(f"TorchCommunicator.world: {', '.join(missing)} not set; start the program "
                                   f"with torchrun (see torchrun_command)")
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=seconds))
            # The group this call made is torn down at exit, after the communicator's own exit
            # hook (registered later, so run earlier) has waited for its last sends: a gloo group
            # left to the interpreter's teardown can end the process in std::terminate while its
            # threads still run ("terminate called without an active exception").
            atexit.register(_destroy_world)
        return cls(None, timeout=seconds)

    # ------------------------------------------------------------------ buffers

    def _outgoing(self, buf: Any) -> tuple[Any, int, int]:
        """``(bytes as a tensor, dtype code, byte count)`` for array or tensor ``buf``, sharing its memory if contiguous."""
        torch = self._torch
        if isinstance(buf, torch.Tensor):
            self._check_device(buf)
            flat = buf.detach().contiguous().reshape(-1)
            return self._bytes_of_tensor(flat), _code_of(str(flat.dtype).removeprefix("torch.")), flat.numel() * flat.element_size()
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"rank {self.rank}: TorchCommunicator sends NumPy arrays and torch tensors, "
                            f"got {type(buf).__name__}")
        self._check_device(buf)
        if not buf.flags.c_contiguous or not buf.flags.writeable:
            buf = np.array(buf, order="C")  # torch.from_numpy needs a writable array
        code = self._numpy_code(buf.dtype)
        return torch.from_numpy(buf.reshape(-1).view(np.uint8)), code, buf.nbytes

    def _incoming(self, buf: Any) -> tuple[Any, int, int, Any]:
        """``(bytes to receive into, dtype code, byte count, copy-back)``: copy-back is None when
        the bytes are ``buf``'s own memory, else a function that writes them into ``buf``."""
        torch = self._torch
        if isinstance(buf, torch.Tensor):
            self._check_device(buf)
            code = _code_of(str(buf.dtype).removeprefix("torch."))
            nbytes = buf.numel() * buf.element_size()
            if buf.is_contiguous():
                return self._bytes_of_tensor(buf.reshape(-1)), code, nbytes, None
            staging = torch.empty_like(buf, memory_format=torch.contiguous_format)
            return self._bytes_of_tensor(staging.reshape(-1)), code, nbytes, lambda: buf.copy_(staging)
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"rank {self.rank}: TorchCommunicator receives into NumPy arrays and torch "
                            f"tensors, got {type(buf).__name__}")
        self._check_device(buf)
        if not buf.flags.writeable:
            raise ValueError(f"rank {self.rank}: the receive buffer is read-only")
        code = self._numpy_code(buf.dtype)
        if buf.flags.c_contiguous:
            return torch.from_numpy(buf.reshape(-1).view(np.uint8)), code, buf.nbytes, None
        staging = np.empty(buf.shape, buf.dtype)

        def copy_back() -> None:
            buf[...] = staging

        return torch.from_numpy(staging.reshape(-1).view(np.uint8)), code, buf.nbytes, copy_back

    def _bytes_of_tensor(self, flat: Any) -> Any:
        torch = self._torch
        if flat.is_complex():
            flat = torch.view_as_real(flat).reshape(-1)
        return flat.view(torch.uint8)

    @staticmethod
    def _numpy_code(dtype: Any) -> int:
        code = _NUMPY_BYTES.get(dtype)
        if code is None:
            if dtype.hasobject:
                raise TypeError(f"TorchCommunicator cannot send arrays of Python objects (dtype {dtype})")
            code = _NUMPY_BYTES[dtype] = _code_of(dtype.name)
        return code

    def _check_device(self, buf: Any) -> None:
        """Data the backend cannot carry fails here, before anything is posted."""
        if self.backend == "gloo":
            device = getattr(buf, "device", None)
            if isinstance(buf, self._torch.Tensor) and device.type != "cpu":
                raise ValueError(f"rank {self.rank}: TorchCommunicator over gloo carries CPU data, got a tensor "
                                 f"on {device}; use backend 'nccl' for CUDA tensors, or move it with .cpu()")
        elif not isinstance(buf, self._torch.Tensor) or buf.device.type != "cuda":
            where = "a NumPy array" if isinstance(buf, np.ndarray) else f"a tensor on {buf.device}"
            raise ValueError(f"rank {self.rank}: TorchCommunicator over nccl carries CUDA tensors only, got "
                             f"{where}; use backend 'gloo' for CPU data")

    def _header(self, code: int, nbytes: int) -> Any:
        header = self._torch.tensor([code, nbytes], dtype=self._torch.int64)
        return header if self.backend == "gloo" else header.to(self._device)

    # ------------------------------------------------------------------ waiting

    def _wait(self, work: Any, deadline: float, what: str) -> None:
        """Wait for ``work`` until ``deadline``; a timeout or a failure becomes ``CommError`` saying ``what``."""
        left = max(deadline - time.monotonic(), 1e-3)
        try:
            work.wait(datetime.timedelta(seconds=left))
        except RuntimeError as exc:
            text = str(exc)
            if "imed out" in text or "timeout" in text.lower():
                raise CommError(
                    f"rank {self.rank}: still waiting for {what} after {self.timeout:g} s (a peer that failed, "
                    f"never joined, or is in another collective; set {TIMEOUT_ENV} to wait longer)"
                ) from None
            raise CommError(f"rank {self.rank}: waiting for {what} failed: {text.splitlines()[-1]}") from None

    def _check_tag(self, tag: int) -> None:
        if not 0 <= tag <= _MAX_TAG:
            raise ValueError(f"rank {self.rank}: tag {tag} is outside 0..{_MAX_TAG}")

    def _post_send(self, buf: Any, dest: int, tag: int) -> tuple[list[Any], int]:
        """Post header and payload; return the works the caller must wait for, and the byte count.

        A message of at most ``EAGER_BYTES`` is sent *eagerly*: its payload is copied, both works
        join ``_pending`` (see ``flush``), and the caller may return at once and reuse ``buf``, as MPI libraries
        do with small messages. (gloo completes a send only when the receiver has posted its
        receive, so without this, two ranks that each send before they receive, a pattern MPI
        programs rely on for small messages, would wait for each other forever.) A larger
        message waits for the receiver: the rendezvous protocol, and no copy.
        """
        payload, code, nbytes = self._outgoing(buf)
        isend = self._dist.isend
        eager = nbytes <= EAGER_BYTES
        if eager and nbytes and payload.data_ptr() == self._address(buf):
            payload = payload.clone()  # the caller may overwrite buf as soon as send returns
        works = [isend(self._header(code, nbytes), group=self.group, tag=tag, group_dst=dest)]
        if nbytes:
            works.append(isend(payload, group=self.group, tag=tag, group_dst=dest))
        if not eager:
            return works, nbytes
        self._pending.extend((work, f"rank {dest} to take {nbytes} bytes (tag {tag})") for work in works)
        while len(self._pending) > MAX_PENDING:  # bound the memory held by copies: wait for the oldest
            self._wait_pending()
        return [], nbytes

    def _address(self, buf: Any) -> int:
        return buf.data_ptr() if isinstance(buf, self._torch.Tensor) else buf.__array_interface__["data"][0]

    def flush(self) -> None:
        """Wait until every eager send has been taken by its receiver (each bounded by ``timeout``).

        gloo reports a send done only to a ``wait`` on it, so eager sends are waited for here
        (at ``barrier`` and when the process exits: a process that ended with a message unsent
        would close the connection under its receiver) or once more than ``MAX_PENDING`` are out;
        each wait is bounded by ``timeout`` from when it starts.
        """
        while self._pending:
            self._wait_pending()

    def _wait_pending(self) -> None:
        work, what = self._pending.popleft()
        self._wait(work, time.monotonic() + self.timeout, what)

    def _post_header_recv(self, source: int | None, tag: int) -> tuple[Any, Any]:
        header = self._header(0, 0)
        if source is None:
            return header, self._dist.irecv(header, group=self.group, tag=tag)
        return header, self._dist.irecv(header, group=self.group, tag=tag, group_src=source)

    def _finish_recv(self, buf: Any, header: Any, source: int, tag: int, deadline: float) -> None:
        """The header has arrived from ``source``: check it against ``buf``, then receive the payload."""
        target, code, nbytes, copy_back = self._incoming(buf)
        got_code, got_bytes = (int(v) for v in header.tolist())
        if got_code != code or got_bytes != nbytes:
            raise CommError(
                f"rank {self.rank}: message from rank {source} (tag {tag}) holds {_name_of(got_code)} data "
                f"({got_bytes} bytes), but the receive buffer holds {self._elements(buf)} elements of "
                f"{self._dtype_name(buf)} ({nbytes} bytes)"
            )
        if nbytes:
            work = self._dist.irecv(target, group=self.group, tag=tag, group_src=source)
            self._wait(work, deadline, f"the data of a message from rank {source} (tag {tag})")
            if copy_back is not None:
                copy_back()

    @staticmethod
    def _elements(buf: Any) -> int:
        return int(buf.numel()) if hasattr(buf, "numel") else int(buf.size)

    @staticmethod
    def _dtype_name(buf: Any) -> str:
        return str(buf.dtype).removeprefix("torch.")

    # ------------------------------------------------------------------ the interface

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        self._check_tag(tag)
        deadline = time.monotonic() + self.timeout
        works, nbytes = self._post_send(buf, dest, tag)
        for work in works:
            self._wait(work, deadline, f"rank {dest} to take {nbytes} bytes (tag {tag})")

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(source, "source")
        self._check_tag(tag)
        deadline = time.monotonic() + self.timeout
        header, work = self._post_header_recv(source, tag)
        self._wait(work, deadline, f"a message from rank {source} (tag {tag})")
        self._finish_recv(buf, header, source, tag, deadline)

    def recv_any(self, buf: Any, tag: int = 0) -> int:
        """gloo's receive from any source: the header from whichever rank sent first, then its payload."""
        if self.backend != "gloo":
            raise NotImplementedError("TorchCommunicator over nccl has no receive-from-any (recv_any): "
                                      "NCCL's point-to-point calls need the peer's rank")
        self._check_tag(tag)
        deadline = time.monotonic() + self.timeout
        header, work = self._post_header_recv(None, tag)
        self._wait(work, deadline, f"a message from any rank (tag {tag})")
        source = work._source_rank()  # the group rank the header came from (what dist.recv returns)
        self._finish_recv(buf, header, source, tag, deadline)
        return source

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        self._check_peer(source, "source")
        self._check_tag(tag)
        deadline = time.monotonic() + self.timeout
        header, receive = self._post_header_recv(source, tag)
        sends, nbytes = self._post_send(sendbuf, dest, tag)
        self._wait(receive, deadline, f"a message from rank {source} (tag {tag})")
        self._finish_recv(recvbuf, header, source, tag, deadline)
        for work in sends:
            self._wait(work, deadline, f"rank {dest} to take {nbytes} bytes (tag {tag})")

    def barrier(self) -> None:
        """A dissemination barrier of empty messages, so it is bounded and names a missing peer like every call here;
        every eager send of this rank has been taken when it returns."""
        self.flush()
        dissemination_barrier(self, _BARRIER_TAG)

    def split(self, color: int | None, key: int | None = None) -> "Communicator | None":
        """``MPI_Comm_split`` with ``torch.distributed.new_group``: a process group per color.

        Colors and keys are all-gathered (the lab's ring allgather), then every rank calls
        ``new_group`` for every color, in increasing color order, with the members ordered by
        ``(key, rank)`` (``sort_ranks=False`` keeps that order as the group's rank order). PyTorch
        requires every process of the job to make each ``new_group`` call, so a split of a
        communicator that is not the whole job uses the generic ``SplitCommunicator`` instead.
        """
        if self.size != self._dist.get_world_size():
            return split_communicator(self, color, key)
        from .ring import allgather

        key = split_key(self, color, key)
        mine = np.array([-1 if color is None else color, key], dtype=np.int64)
        table = np.asarray(allgather(self, mine)).reshape(self.size, 2)
        chosen = None
        for c in sorted({int(c) for c in table[:, 0] if c >= 0}):
            members = [r for _, r in sorted((int(table[r, 1]), r) for r in range(self.size) if table[r, 0] == c)]
            ranks = [self._dist.get_global_rank(self.group, r) for r in members]
            group = self._dist.new_group(ranks, timeout=datetime.timedelta(seconds=self.timeout), sort_ranks=False)
            if c == color:
                chosen = group
        return None if chosen is None else TorchCommunicator(chosen, timeout=self.timeout)

    # ------------------------------------------------------------------ the library's own collective

    def library_allreduce(self, x: Any, out: Any, op: str) -> None:
        """``torch.distributed.all_reduce`` on this group: ``out`` (1-D, contiguous) gets ``x`` reduced with ``op``.

        ``mean`` is a sum here (not ``ReduceOp.AVG``) and ``allreduce`` divides once afterwards, as
        for every other algorithm, so all of them divide the same sum the same way.
        """
        dist = self._dist
        ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
               "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        torch = self._torch
        if isinstance(out, torch.Tensor):
            self._check_device(out)
            tensor = out
            tensor.copy_(x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x)))
        else:
            self._check_device(out)
            out[...] = x
            tensor = torch.from_numpy(out)
        if tensor.numel() == 0:
            return
        deadline = time.monotonic() + self.timeout
        try:
            work = dist.all_reduce(tensor, op=ops[op], group=self.group, async_op=True)
        except RuntimeError as exc:
            raise TypeError(f"rank {self.rank}: torch.distributed.all_reduce over {self.backend} cannot reduce "
                            f"{self._dtype_name(out)} with {op}: {str(exc).splitlines()[0]}") from None
        self._wait(work, deadline, f"the other ranks to join all_reduce ({self.backend})")

    def __repr__(self) -> str:
        return f"TorchCommunicator(rank={self.rank}, size={self.size}, backend={self.backend!r})"


def _destroy_world() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def torchrun_command(n_ranks: int, *program: str) -> list[str]:
    """The command that runs ``PROGRAM...`` (a script and its arguments, or ``-m module ...``) on ``n_ranks`` processes.

    ``torchrun`` comes from the PyTorch installed next to this Python, so interpreter and
    library match; ``--standalone`` runs its rendezvous on this host on a free port, so
    several jobs can run at once. ``torchrun`` ends the other processes when one fails.
    """
    from pathlib import Path

    beside = Path(sys.executable).parent / "torchrun"
    if not beside.exists():
        raise FileNotFoundError(f"torchrun not found next to {sys.executable}: install the 'torch' extra "
                                f"(pip install -e '.[torch]')")
    if n_ranks < 1:
        raise ValueError(f"torchrun_command: need at least one process, got {n_ranks}")
    return [str(beside), "--standalone", "--nproc-per-node", str(n_ranks), *program]
