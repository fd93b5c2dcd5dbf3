"""The client: ``DistributedSession(master).run(fetches, feed_dict)``, like ``Session``.

The client lives in the master's process (rank 0), so its requests are method calls on
the ``Master``, with the protocol's messages as arguments.  It sends the graph as a
GraphDef when the session is created and, before a run, any nodes added since as an
``ExtendSession`` carrying the version it extends.  Fetch structures, name resolution and
feed checks are ``Session``'s, inherited; the work itself is a ``RunStep``.

``run_cluster(client, cluster)`` starts a whole job on thread ranks: the master (calling
``client(master)``) on rank 0 and a ``Worker`` on every other rank; ``serve_rank`` is the
same split for one rank of an MPI job.
"""
from __future__ import annotations

from typing import Any, Callable

from ..comm import Communicator, run_threads
from ..graph import Graph, GraphError, Operation, Session, Tensor, as_graph_def
from . import messages as m
from .cluster import MASTER_RANK, ClusterSpec
from .master import Master
from .worker import Worker


class DistributedSession(Session):
    """A session whose graph runs on the workers of ``target`` (a ``Master``)."""

    def __init__(self, target: Master, graph: Graph | None = None, container: str | None = None) -> None:
        super().__init__(graph, optimize=False)
        self.master = target
        reply = target.create_session(m.CreateSessionRequest(as_graph_def(self.graph), container))
        self.handle, self.version = reply.session_handle, reply.graph_version
        self._sent = len(self.graph.operations)
        self.last_step_id: int | None = None

    def _extend(self) -> None:
        """Send the nodes added to the graph since the last request (TensorFlow does the same)."""
        if len(self.graph.operations) == self._sent:
            return
        new = as_graph_def(self.graph)["node"][self._sent:]
        reply = self.master.extend_session(m.ExtendSessionRequest(self.handle, {"node": new}, self.version))
        self.version, self._sent = reply.new_graph_version, len(self.graph.operations)

    def run(self, fetches: Any, feed_dict: dict | None = None) -> Any:
        if self._closed:
            raise GraphError(f"this DistributedSession ({self.handle}) is closed")
        leaves: list = []
        template = self._flatten(fetches, leaves)
        feeds = self._feed(feed_dict or {})
        self._extend()
        fetch = list(dict.fromkeys(x.name for x in leaves if isinstance(x, Tensor)))
        target = list(dict.fromkeys(x.name for x in leaves if isinstance(x, Operation)))
        reply = self.master.run_step(m.RunStepRequest(self.handle, {f"{k}:0": v for k, v in feeds.items()},
                                                      fetch, target))
        self.last_step_id = reply.step_id
        return self._rebuild(template, [reply.tensor[x.name] if isinstance(x, Tensor) else None
                                        for x in leaves])

    def close(self) -> None:
        """Free the session's partitions and variables on the workers (CloseSession)."""
        if not self._closed:
            self.master.close_session(m.CloseSessionRequest(self.handle))
        super().close()


def serve_rank(comm: Communicator, cluster: ClusterSpec, client: Callable[[Master], Any]) -> Any:
    """Rank 0: build the master, run ``client(master)``, then shut the workers down.
    Any other rank: serve as the worker of its task until shut down."""
    if comm.rank != MASTER_RANK:
        Worker(comm, cluster).serve()
        return None
    master = Master(comm, cluster)
    try:
        return client(master)
    finally:
        master.shutdown()


def run_cluster(client: Callable[[Master], Any], cluster: ClusterSpec, timeout: float = 30.0) -> Any:
    """Run a job on thread ranks; returns what ``client(master)`` returned on rank 0."""
    return run_threads(cluster.size, serve_rank, cluster, client, timeout=timeout)[MASTER_RANK]
