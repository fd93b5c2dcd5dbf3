"""``Worker``: one task of the cluster.  It holds registered partition graphs and the
variables of the sessions that use it, runs a partition when the master says so, and
exchanges the tensors of cut edges directly with the other workers.

It reads like TensorFlow's worker service: one handler per request of the master,

* ``register_graph`` (``RegisterGraph``): rebuild the partition from its GraphDef and keep it
  under a new handle;
* ``run_graph`` (``RunGraph``): run the partition for one step id, here, and answer with the
  fetched values or the error naming the op. A ``_Send`` whose ``_Recv`` is on this worker
  puts the value in the step's rendezvous; one whose ``_Recv`` is on another task sends one
  ``TensorMessage`` straight to that task's rank, on ``PEER_TAG``;
* ``deregister_graph`` (``DeregisterGraph``) and ``delete_worker_session``
  (``DeleteWorkerSession``): forget a graph, or a session's graphs and variables;

and two events from its ``Mailbox`` (``runtime/mailbox.py``: the reader threads, and when to
stop listening): ``abort_step`` (the master's ``AbortStep``: wake the step's waits with an
error) and ``tensor_arrived`` (a peer's ``TensorMessage``, put in the rendezvous of its step).
A tensor may arrive before this worker has even received the step's ``RunGraph`` (the
rendezvous is then created early), or after the step failed here (it is dropped: steps run
one at a time, in increasing id order, so an id at or below the last finished one belongs to
a step that is over).

In TensorFlow the cut edges also go worker to worker (there a ``RecvTensor`` call; here a
message the receiving worker's thread for that peer is already waiting for). Every wait is
bounded: a wait for a peer's tensor by ``WAIT_FRACTION`` of the communicator's ``timeout``
(the error names the peer and the rendezvous key), everything else by the timeout itself.

Variables live in a *container* (a dict name → array) on the worker that owns their device,
so they persist across steps; by default each session has its own, freed when it closes.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Iterable

from ..comm import CommError, Communicator
from ..graph import Graph, execute, import_graph_def
from . import messages as m
from .channel import PEER_TAG, Channel
from .cluster import MASTER_RANK, ClusterSpec
from .executor import connect
from .mailbox import Mailbox
from .rendezvous import Rendezvous, RendezvousError, RendezvousTimeout

# A step waits for a peer's tensor a little less than the master waits for the step's answer:
# when a worker goes silent, the workers waiting for its tensors answer first, naming it and
# the key, and the master's own timeout then singles out the silent one.
WAIT_FRACTION = 0.9


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
        self.timeout = comm.timeout if timeout is None else timeout
        self.peers = {cluster.rank_of(d): d for d in cluster.devices if d != self.device}  # rank → device
        self.graphs: dict[str, tuple[str, Graph, str]] = {}  # handle → (session, graph, container)
        self.containers: dict[str, dict[str, Any]] = {}
        self._handles = itertools.count(1)
        self._steps: dict[int, StepRendezvous] = {}  # step id → its rendezvous, while it runs
        self._last_finished = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ main loop
    def serve(self) -> None:
        """Answer the master until ``Shutdown`` (or until the master goes silent)."""
        mailbox = Mailbox(self.channel, self.device, self.peers, self.timeout, on_abort=self.abort_step,
                          on_abort_all=self._abort_steps, on_tensor=self.tensor_arrived)
        mailbox.start()
        try:
            while (request := mailbox.next_request()) is not None:
                reply = self.handle(request)
                if reply is not None:
                    self.channel.send(reply, MASTER_RANK)
                mailbox.answered()
        except BaseException:
            mailbox.stop()  # this worker dies: its readers stop at their next failed receive
            raise
        mailbox.close()

    def handle(self, msg: Any) -> Any:
        """Act on one request of the master; the reply to send back."""
        handler = {m.RegisterGraphRequest: self.register_graph, m.RunGraphRequest: self.run_graph,
                   m.DeregisterGraphRequest: self.deregister_graph,
                   m.DeleteWorkerSessionRequest: self.delete_worker_session}.get(type(msg))
        if handler is None:
            raise TypeError(f"worker {self.device}: unexpected message {type(msg).__name__} from the master")
        return handler(msg)

    # ------------------------------------------------------------ graphs and sessions
    def register_graph(self, req: m.RegisterGraphRequest) -> m.RegisterGraphResponse:
        handle = f"{self.device}/graph-{next(self._handles)}"
        self.graphs[handle] = (req.session_handle, import_graph_def(req.graph_def), req.container)
        return m.RegisterGraphResponse(handle)

    def deregister_graph(self, req: m.DeregisterGraphRequest) -> m.Ack:
        self.graphs.pop(req.graph_handle, None)
        return m.Ack("DeregisterGraph")

    def delete_worker_session(self, req: m.DeleteWorkerSessionRequest) -> m.Ack:
        for handle in [h for h, (s, _, _) in self.graphs.items() if s == req.session_handle]:
            del self.graphs[handle]
        self.containers.pop(req.container, None)
        return m.Ack("DeleteWorkerSession")

    # ------------------------------------------------------------ steps
    # --8<-- [start:run_graph]
    def run_graph(self, req: m.RunGraphRequest) -> m.RunGraphResponse:
        """Run the partition ``req`` names for one step; the fetched values, or the error."""
        rendezvous = self._rendezvous(req.step_id)
        if rendezvous is None:
            return m.RunGraphResponse(req.step_id, error=f"step {req.step_id} already ran on {self.device}")
        try:
            return self._run_step(req, rendezvous)
        finally:
            with self._lock:
                self._steps.pop(req.step_id, None)
                self._last_finished = max(self._last_finished, req.step_id)

    def _run_step(self, req: m.RunGraphRequest, rendezvous: StepRendezvous) -> m.RunGraphResponse:
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
    # --8<-- [end:run_graph]

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

    # ------------------------------------------------------------ events from the mailbox
    def abort_step(self, step_id: int, reason: str) -> None:
        """The master's ``AbortStep``: wake the step's waits with an error."""
        with self._lock:
            rendezvous = self._steps.get(step_id)
        if rendezvous is not None:  # (a step that already ended here needs no abort)
            rendezvous.abort(reason)

    def tensor_arrived(self, msg: m.TensorMessage, rank: int) -> None:
        """A peer's tensor for a cut edge: into the rendezvous of its step."""
        rendezvous = self._rendezvous(msg.step_id)
        if rendezvous is None:
            return  # its step already ended here (it failed): the tensor is no longer needed
        try:
            rendezvous.send(msg.key, msg.value)
        except RendezvousError as e:
            rendezvous.abort(f"from peer {self.peers[rank]} (rank {rank}): {e}")
