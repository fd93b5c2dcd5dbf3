"""``Worker``: one task of the cluster.  It holds registered partition graphs and the
variables of the sessions that use it, and runs a partition when the master says so.

``serve()`` answers the master's requests one at a time until ``Shutdown``:

* ``RegisterGraph``: rebuild the partition from its GraphDef, keep it under a new handle;
* ``RunGraph``: run that partition for one step id, with the fed values the request
  carries, and answer with the fetched values, or with the error (naming the op);
* ``DeregisterGraph`` / ``DeleteWorkerSession``: forget a graph / a session's variables.

Variables live in a *container* (a dict name → array) on the worker that owns their device,
so they persist across steps; by default each session has its own, freed when it closes.

Cut edges: a ``_Send`` whose ``_Recv`` is on another task sends a ``TensorMessage`` to the
master, which forwards it (our communicator receives from a named rank, so the master,
which listens to every worker, is the switch; TensorFlow's workers pull tensors from each
other directly with a ``RecvTensor`` call).  While its partition waits for a tensor, the
worker reads the master's messages (``RemoteRendezvous``): a ``TensorMessage`` of this
step fills the table, an ``AbortStep`` ends the wait with an error, and messages of older
steps (a step that already failed) are dropped: the step id makes them harmless.
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Any

from ..comm import CommError, Communicator
from ..graph import Graph, import_graph_def
from . import messages as m
from .channel import Channel
from .cluster import MASTER_RANK, ClusterSpec
from .executor import execute
from .rendezvous import Rendezvous, RendezvousError, RendezvousTimeout


class RemoteRendezvous(Rendezvous):
    """A step's rendezvous on a worker: waiting means reading the next message from the master."""

    def __init__(self, worker: "Worker", step_id: int, timeout: float) -> None:
        super().__init__(timeout)
        self.worker, self.step_id = worker, step_id

    def _wait(self, deadline: float, keys: list[str]) -> None:
        try:
            msg = self.worker.channel.recv(MASTER_RANK)
        except CommError as e:
            raise RendezvousTimeout(f"waiting for rendezvous key {keys[0]!r}: {e}") from None
        if isinstance(msg, m.TensorMessage):
            if msg.step_id == self.step_id:
                self._table[msg.key] = msg.value
        elif isinstance(msg, m.AbortStep):
            if msg.step_id == self.step_id:
                self._aborted = msg.reason
        else:
            raise RendezvousError(f"worker {self.worker.device}: got {type(msg).__name__} in the middle "
                                  f"of step {self.step_id}")


class Worker:
    """The server loop of one task (a rank other than the master's)."""

    def __init__(self, comm: Communicator, cluster: ClusterSpec) -> None:
        self.channel = Channel(comm)
        self.device = cluster.device_of(comm.rank)
        self.graphs: dict[str, tuple[str, Graph, str]] = {}  # handle → (session, graph, container)
        self.containers: dict[str, dict[str, Any]] = {}
        self._handles = itertools.count(1)

    def serve(self) -> None:
        """Answer the master until ``Shutdown`` (or until the master goes silent: CommError)."""
        while True:
            try:
                msg = self.channel.recv(MASTER_RANK)
            except CommError:
                return  # the master is gone or idle past the timeout: nothing left to serve
            if isinstance(msg, m.Shutdown):
                return
            reply = self.handle(msg)
            if reply is not None:
                self.channel.send(reply, MASTER_RANK)

    def handle(self, msg: Any) -> Any:
        if isinstance(msg, m.RegisterGraphRequest):
            handle = f"{self.device}/graph-{next(self._handles)}"
            self.graphs[handle] = (msg.session_handle, import_graph_def(msg.graph_def), msg.container)
            return m.RegisterGraphResponse(handle)
        if isinstance(msg, m.RunGraphRequest):
            return self.run_graph(msg)
        if isinstance(msg, m.DeregisterGraphRequest):
            self.graphs.pop(msg.graph_handle, None)
            return m.Ack("DeregisterGraph")
        if isinstance(msg, m.DeleteWorkerSessionRequest):
            for handle in [h for h, (s, _, _) in self.graphs.items() if s == msg.session_handle]:
                del self.graphs[handle]
            self.containers.pop(msg.container, None)
            return m.Ack("DeleteWorkerSession")
        if isinstance(msg, (m.TensorMessage, m.AbortStep)):
            return None  # left over from a step that already ended: the step id says so
        raise TypeError(f"worker {self.device}: unexpected message {type(msg).__name__}")

    def run_graph(self, req: m.RunGraphRequest) -> m.RunGraphResponse:
        if req.graph_handle not in self.graphs:
            return m.RunGraphResponse(req.step_id, error=f"no registered graph {req.graph_handle!r}")
        _, graph, container = self.graphs[req.graph_handle]
        state = self.containers.setdefault(container, {})
        # No deadline of its own: each wait is a receive from the master, which the
        # communicator bounds (its timeout), turning into RendezvousTimeout naming the key.
        rendezvous = RemoteRendezvous(self, req.step_id, math.inf)

        def deliver(key: str, recv_device: str, value: Any) -> None:
            if recv_device == self.device:
                rendezvous.send(key, value)
            else:
                self.channel.send(m.TensorMessage(req.step_id, key, recv_device, value), MASTER_RANK)

        start = time.monotonic()
        try:
            out = execute(graph, req.send, req.recv_key, state, rendezvous, req.step_id, deliver)
        except Exception as e:  # noqa: BLE001 - reported to the master, which raises it to the client
            return m.RunGraphResponse(req.step_id, error=f"{type(e).__name__}: {e} "
                                      f"(after {time.monotonic() - start:.2f} s)")
        return m.RunGraphResponse(req.step_id, recv=out)
