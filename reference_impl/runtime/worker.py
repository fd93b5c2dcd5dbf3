"""``Worker``: one task of the cluster.  It holds registered partition graphs and the
variables of the sessions that use it, runs a partition when the master says so, and
exchanges the tensors of cut edges directly with the other workers.

A worker talks to the master and to every peer worker at once, with a communicator that
only receives from a *named* rank, and MPI sends of large tensors that complete only once
the receiver has posted a matching receive.  So it runs one reader per conversation, each
the only reader of its (source, tag): none can take a message meant for another, and every
peer's send finds a receive already waiting.

* the **master reader** (``_read_master``, tag ``TAG``) passes the master's requests to the
  main loop, except ``AbortStep``, which it acts on at once (wake the step's waits with an
  error): the main loop may be busy running the very step it aborts;
* the **main loop** (``serve``) answers the requests one at a time until ``Shutdown``:
  ``RegisterGraph`` (rebuild the partition from its GraphDef, keep it under a new handle),
  ``RunGraph`` (run the partition for one step id, here, and answer with the fetched values
  or the error naming the op), ``DeregisterGraph`` / ``DeleteWorkerSession`` (forget a
  graph / a session's variables).  A ``_Send`` whose ``_Recv`` is on this worker puts the
  value in the step's rendezvous; one whose ``_Recv`` is on another task sends one
  ``TensorMessage`` straight to that task's rank, on ``PEER_TAG``;
* a **receiver per peer** worker (``_receive_from``, ``PEER_TAG``) puts each of that peer's
  ``TensorMessage``s in the rendezvous of its step.  A tensor may arrive before this worker
  has even received the step's ``RunGraph`` (the rendezvous is then created early), or
  after the step failed here (it is dropped: steps run one at a time, in increasing id
  order, so an id at or below the last finished one belongs to a step that is over).
  At shutdown each worker sends its peers ``PeerClose``, which ends their receivers.

This is how TensorFlow's workers work: the master sends ``RunGraph`` and collects fetches,
and the cut edges go worker to worker (there a ``RecvTensor`` call; here a message the
receiving worker's thread for that peer is already waiting for).  Every wait is bounded:
a wait for a peer's tensor by ``WAIT_FRACTION`` of the communicator's timeout (the error
names the peer and the rendezvous key), everything else by the timeout itself.

Variables live in a *container* (a dict name → array) on the worker that owns their device,
so they persist across steps; by default each session has its own, freed when it closes.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any, Callable, Iterable

from ..comm import CommError, Communicator
from ..graph import Graph, execute, import_graph_def
from . import messages as m
from .channel import PEER_TAG, Channel
from .cluster import MASTER_RANK, ClusterSpec
from .executor import connect
from .rendezvous import Rendezvous, RendezvousError, RendezvousTimeout

DEFAULT_TIMEOUT_S = 60.0
# A step waits for a peer's tensor a little less than the master waits for the step's answer:
# when a worker goes silent, the workers waiting for its tensors answer first, naming it and
# the key, and the master's own timeout then singles out the silent one.
WAIT_FRACTION = 0.9


def comm_timeout(comm: Communicator) -> float:
    """How long a blocking call of ``comm`` may wait; the worker's own waits use the same bound.

    ``MPICommunicator`` says it (``timeout``); a thread rank's bound is its job's (``run_threads``'s
    ``timeout``); a wrapper such as ``CountingCommunicator`` is looked through (``inner``).
    """
    while comm is not None:
        for holder in (comm, getattr(comm, "_world", None)):
            t = getattr(holder, "timeout", None)
            if isinstance(t, (int, float)):
                return float(t)
        comm = getattr(comm, "inner", None)
    return DEFAULT_TIMEOUT_S


class StepRendezvous(Rendezvous):
    """One step's table on one worker; a timeout names the keys waited for and their senders."""

    def __init__(self, device: str, step_id: int, timeout: float, sender: Callable[[str], str]) -> None:
        super().__init__(timeout)
        self.device, self.step_id, self.sender = device, step_id, sender

    def recv_any(self, keys: Iterable[str]) -> tuple[str, Any]:
        keys = list(keys)
        try:
            return super().recv_any(keys)
        except RendezvousTimeout:
            missing = "; ".join(f"{k!r} from {self.sender(k)}" for k in keys)
            raise RendezvousTimeout(f"worker {self.device}, step {self.step_id}: no tensor arrived within "
                                    f"{self.timeout:g} s for {missing}") from None


class Worker:
    """The server of one task (a rank other than the master's)."""

    def __init__(self, comm: Communicator, cluster: ClusterSpec, timeout: float | None = None) -> None:
        self.channel, self.cluster = Channel(comm), cluster
        self.device = cluster.device_of(comm.rank)
        self.timeout = comm_timeout(comm) if timeout is None else timeout
        self.peers = {cluster.rank_of(d): d for d in cluster.devices if d != self.device}  # rank → device
        self.graphs: dict[str, tuple[str, Graph, str]] = {}  # handle → (session, graph, container)
        self.containers: dict[str, dict[str, Any]] = {}
        self._handles = itertools.count(1)
        self._steps: dict[int, StepRendezvous] = {}  # step id → its rendezvous, while it runs
        self._last_finished = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._last_active = time.monotonic()  # the last message from the master, or answer to it

    # ------------------------------------------------------------ main loop
    def serve(self) -> None:
        """Answer the master until ``Shutdown`` (or until the master goes silent: CommError)."""
        inbox: queue.Queue = queue.Queue()
        readers = [threading.Thread(target=self._read_master, args=(inbox,), daemon=True,
                                    name=f"{self.device}<-master")]
        readers += [threading.Thread(target=self._receive_from, args=(rank,), daemon=True,
                                     name=f"{self.device}<-rank{rank}") for rank in self.peers]
        for t in readers:
            t.start()
        try:
            self._loop(inbox)
        except BaseException:
            self._stopping.set()  # this worker dies: its readers stop at their next failed receive
            raise
        self._close_peers(readers)

    def _loop(self, inbox: queue.Queue) -> None:
        while True:
            item = inbox.get()  # the reader puts a message, or (CommError, seconds it waited)
            if isinstance(item, tuple):
                _, waited = item
                if waited < 0.5 * self.timeout or time.monotonic() - self._last_active >= self.timeout:
                    return  # the job is failing (a receive failed early), or the master left
                continue  # we answered a step recently: the master may still need us
            if isinstance(item, m.Shutdown):
                return
            reply = self.handle(item)
            if reply is not None:
                self.channel.send(reply, MASTER_RANK)
            self._last_active = time.monotonic()

    def _read_master(self, inbox: queue.Queue) -> None:
        """Reader thread: the master's messages go to the main loop, except ``AbortStep``,
        which acts at once (the main loop may be busy running the very step it aborts)."""
        while not self._stopping.is_set():
            asked = time.monotonic()
            try:
                msg = self.channel.recv(MASTER_RANK)
            except CommError as e:
                waited = time.monotonic() - asked
                if waited < 0.5 * self.timeout:  # not an idle timeout: the job is failing
                    self._abort_steps(f"the master (rank {MASTER_RANK}) is unreachable: {e}")
                inbox.put((e, waited))
                time.sleep(0.05)
                continue
            if isinstance(msg, m.AbortStep):
                with self._lock:
                    rendezvous = self._steps.get(msg.step_id)
                if rendezvous is not None:  # (a step that already ended here needs no abort)
                    rendezvous.abort(msg.reason)
                continue
            inbox.put(msg)
            if isinstance(msg, m.Shutdown):
                return

    def handle(self, msg: Any) -> Any:
        """Act on one request of the master; the reply to send back."""
        if isinstance(msg, m.RegisterGraphRequest):
            handle = f"{self.device}/graph-{next(self._handles)}"
            self.graphs[handle] = (msg.session_handle, import_graph_def(msg.graph_def), msg.container)
            return m.RegisterGraphResponse(handle)
        if isinstance(msg, m.RunGraphRequest):
            rendezvous = self._rendezvous(msg.step_id)
            if rendezvous is None:
                return m.RunGraphResponse(msg.step_id, error=f"step {msg.step_id} already ran on {self.device}")
            try:
                return self.run_graph(msg, rendezvous)
            finally:
                with self._lock:
                    self._steps.pop(msg.step_id, None)
                    self._last_finished = max(self._last_finished, msg.step_id)
        if isinstance(msg, m.DeregisterGraphRequest):
            self.graphs.pop(msg.graph_handle, None)
            return m.Ack("DeregisterGraph")
        if isinstance(msg, m.DeleteWorkerSessionRequest):
            for handle in [h for h, (s, _, _) in self.graphs.items() if s == msg.session_handle]:
                del self.graphs[handle]
            self.containers.pop(msg.container, None)
            return m.Ack("DeleteWorkerSession")
        raise TypeError(f"worker {self.device}: unexpected message {type(msg).__name__} from the master")

    # ------------------------------------------------------------ steps
    def run_graph(self, req: m.RunGraphRequest, rendezvous: StepRendezvous) -> m.RunGraphResponse:
        """Run the partition ``req`` names for one step; the fetched values, or the error."""
        if req.graph_handle not in self.graphs:
            return m.RunGraphResponse(req.step_id, error=f"no registered graph {req.graph_handle!r}")
        _, graph, container = self.graphs[req.graph_handle]
        state = self.containers.setdefault(container, {})

        def deliver(key: str, recv_device: str, value: Any) -> None:
            if recv_device == self.device:
                rendezvous.send(key, value)
                return
            rank = self.cluster.rank_of(recv_device)
            try:
                self.channel.send(m.TensorMessage(req.step_id, key, value), rank, PEER_TAG)
            except CommError as e:
                raise RendezvousError(f"worker {self.device}: sending {key!r} to peer {recv_device} "
                                      f"(rank {rank}) failed: {e}") from None

        start = time.monotonic()
        try:
            values = execute(graph, req.send, req.recv_key, state, *connect(rendezvous, req.step_id, deliver))
        except Exception as e:  # noqa: BLE001 - reported to the master, which raises it to the client
            return m.RunGraphResponse(req.step_id, error=f"{type(e).__name__}: {e} "
                                      f"(after {time.monotonic() - start:.2f} s)")
        return m.RunGraphResponse(req.step_id, recv=dict(zip(req.recv_key, values)))

    def _rendezvous(self, step_id: int) -> StepRendezvous | None:
        """The rendezvous of ``step_id`` (created by whichever comes first: its RunGraph or a
        peer's tensor); None for a step that already ended here."""
        with self._lock:
            if step_id <= self._last_finished:
                return None
            if step_id not in self._steps:
                self._steps[step_id] = StepRendezvous(self.device, step_id, WAIT_FRACTION * self.timeout,
                                                      self._sender)
            return self._steps[step_id]

    def _sender(self, key: str) -> str:
        device = key.split(";")[0]
        return f"peer {device} (rank {self.cluster.rank_of(device)})" if device != self.device else "this worker"

    def _abort_steps(self, reason: str) -> None:
        with self._lock:
            for rendezvous in self._steps.values():
                rendezvous.abort(reason)

    # ------------------------------------------------------------ peers
    def _receive_from(self, rank: int) -> None:
        """Receiver thread: put every tensor from peer ``rank`` in its step's rendezvous,
        until the peer says ``PeerClose`` (or, once this worker stops, a receive fails)."""
        device = self.peers[rank]
        while True:
            try:
                msg = self.channel.recv(rank, PEER_TAG)
            except CommError:
                if self._stopping.is_set():
                    return
                time.sleep(0.05)  # idle past the timeout, or a dead peer: post the receive again
                continue
            if isinstance(msg, m.PeerClose):
                return
            if not isinstance(msg, m.TensorMessage):
                self._abort_steps(f"peer {device} (rank {rank}) sent {type(msg).__name__}, not a tensor")
                continue
            rendezvous = self._rendezvous(msg.step_id)
            if rendezvous is None:
                continue  # its step already ended here (it failed): the tensor is no longer needed
            try:
                rendezvous.send(msg.key, msg.value)
            except RendezvousError as e:
                rendezvous.abort(f"from peer {device} (rank {rank}): {e}")

    def _close_peers(self, readers: list[threading.Thread]) -> None:
        """Tell every peer that no more tensors will come, then wait for their goodbyes
        (and for the master's reader, which stops at its next message or timeout)."""
        self._stopping.set()
        for rank in self.peers:
            try:
                self.channel.send(m.PeerClose(self.device), rank, PEER_TAG)
            except Exception:  # noqa: BLE001 - a dead peer (MPI may say so in its own exception)
                pass
        deadline = time.monotonic() + self.timeout + 1
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))
