"""``Master`` and ``MasterSession``: turn a client's step into work for the workers.

``CreateSession`` stores the client's GraphDef in a new ``MasterSession`` under a unique
handle.  ``RunStep`` then:

1. looks up the step's signature (sorted fetches, feeds, targets) in the session's cache;
   the first time only, it prunes the graph to what the signature needs, places every op
   on a device, partitions by device with ``_Send``/``_Recv`` on the cut edges, and
   registers each partition with the worker that owns its device (``RegisterGraph``);
2. gives the step a new id and sends ``RunGraph`` to each worker of the plan, with the fed
   values its partition consumes and the fetches it holds;
3. waits for every worker of the step to answer (a thread each).  The tensors on cut edges
   never pass through here: each worker sends them straight to the worker that consumes
   them (see ``worker``), so the master only sends requests and collects fetches.  A worker
   that answers with an error, or stays silent for the communicator's timeout, fails the
   step: the other workers get ``AbortStep`` so none is left waiting for its tensors, and
   the client gets an error naming the worker.  A silent worker is marked unavailable, so
   later steps fail at once instead of waiting.

``CloseSession`` deregisters the session's partitions and deletes its variables (unless
they live in a shared container).  Steps run one at a time (a lock), whichever session
they belong to.
"""
from __future__ import annotations

import itertools
import threading
import uuid
from dataclasses import dataclass, field

from ..comm import CommError, Communicator
from ..graph import (Graph, GraphError, as_graph_def, count_send_recv, import_graph_def, partition, place,
                     prune)
from . import messages as m
from .channel import Channel
from .cluster import ClusterSpec


class SessionError(GraphError):
    """A distributed session was used wrongly: unknown or closed handle, stale version."""


class StepError(RuntimeError):
    """A step failed on a worker, or a worker did not answer in time."""


@dataclass
class _Plan:
    """One signature's partitions: device → graph handle, and which fetches/feeds each holds."""
    handles: dict[str, str]
    fetches: dict[str, list[str]]
    feeds: dict[str, list[str]]
    send_recv_pairs: int


@dataclass
class MasterSession:
    handle: str
    nodes: list[dict]
    graph: Graph
    container: str
    shared_container: bool
    version: int = 0
    plans: dict[tuple, _Plan] = field(default_factory=dict)
    partition_count: int = 0  # how many times a step had to be pruned, placed and partitioned
    closed: bool = False


class Master:
    """The master of a cluster, on rank 0 of ``comm``; the client calls its methods directly."""

    def __init__(self, comm: Communicator, cluster: ClusterSpec,
                 default_device: str = "/job:worker/task:0") -> None:
        self.channel, self.cluster, self.default_device = Channel(comm), cluster, default_device
        self.sessions: dict[str, MasterSession] = {}
        self.unavailable: dict[str, str] = {}  # device → why it is considered dead
        self._step_ids = itertools.count(1)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ client-facing calls
    def create_session(self, req: m.CreateSessionRequest) -> m.CreateSessionResponse:
        graph = import_graph_def(req.graph_def)  # checks the document: references, cycles
        handle = f"session-{uuid.uuid4().hex[:16]}"
        container = req.container if req.container is not None else handle
        self.sessions[handle] = MasterSession(handle, list(req.graph_def["node"]), graph, container,
                                              req.container is not None)
        return m.CreateSessionResponse(handle, 0)

    def extend_session(self, req: m.ExtendSessionRequest) -> m.ExtendSessionResponse:
        s = self._session(req.session_handle)
        if req.current_graph_version != s.version:
            raise SessionError(f"ExtendSession for {s.handle}: version {req.current_graph_version} is stale, "
                               f"the session's graph is at version {s.version}")
        nodes = s.nodes + list(req.graph_def["node"])
        s.graph = import_graph_def({"node": nodes})
        s.nodes, s.version = nodes, s.version + 1
        return m.ExtendSessionResponse(s.version)

    # --8<-- [start:run_step]
    def run_step(self, req: m.RunStepRequest) -> m.RunStepResponse:
        s = self._session(req.session_handle)
        for name in req.feed:
            t = s.graph.get_tensor_by_name(name)
            if t.op.type != "Placeholder":
                raise GraphError(f"cannot feed {name}: only placeholders can be fed, it is a {t.op.type}")
        for name in req.fetch:
            s.graph.get_tensor_by_name(name)
        for name in req.target:
            s.graph.get_operation_by_name(name)
        with self._lock:
            plan = self._plan(s, req)
            step_id = next(self._step_ids)
            values = self._run_graphs(s, plan, req, step_id)
        return m.RunStepResponse({name: values[name] for name in req.fetch}, step_id)
    # --8<-- [end:run_step]

    def close_session(self, req: m.CloseSessionRequest) -> m.CloseSessionResponse:
        s = self._session(req.session_handle)
        with self._lock:  # (a worker marked unavailable is skipped: what it held died with it)
            for plan in s.plans.values():
                for device, handle in plan.handles.items():
                    if device not in self.unavailable:
                        self._call(device, m.DeregisterGraphRequest(s.handle, handle))
            if not s.shared_container:
                for device in self.cluster.devices:
                    if device not in self.unavailable:
                        self._call(device, m.DeleteWorkerSessionRequest(s.handle, s.container))
        s.plans.clear()
        s.closed = True
        return m.CloseSessionResponse()

    def shutdown(self) -> None:
        """Tell every worker to stop serving (the end of the job)."""
        for device in self.cluster.devices:
            try:
                self.channel.send(m.Shutdown(), self.cluster.rank_of(device))
            except CommError:
                pass

    # ------------------------------------------------------------ helpers
    def _session(self, handle: str) -> MasterSession:
        s = self.sessions.get(handle)
        if s is None:
            raise SessionError(f"no session with handle {handle!r} on this master")
        if s.closed:
            raise SessionError(f"session {handle} is closed")
        return s

    def _call(self, device: str, request: object) -> object:
        """One request/response with the worker of ``device`` (outside steps)."""
        if device in self.unavailable:
            raise StepError(f"worker {device} is unavailable: {self.unavailable[device]}")
        rank = self.cluster.rank_of(device)
        self.channel.send(request, rank)
        while True:
            try:
                reply = self.channel.recv(rank)
            except CommError as e:
                self.unavailable[device] = str(e)
                raise StepError(f"worker {device} (rank {rank}) did not answer "
                                f"{type(request).__name__}: {e}") from None
            if not isinstance(reply, m.RunGraphResponse):
                return reply  # (a late answer of an abandoned step is dropped)

    def _plan(self, s: MasterSession, req: m.RunStepRequest) -> _Plan:
        key = (tuple(sorted(req.fetch)), tuple(sorted(req.feed)), tuple(sorted(req.target)))
        if key in s.plans:
            return s.plans[key]
        fed_ops = [name.partition(":")[0] for name in req.feed]
        pruned = prune(s.graph, req.fetch, req.target, fed_ops)
        for op in pruned.operations:
            if op.type == "Placeholder" and op.name not in fed_ops:
                raise GraphError(f"placeholder {op.name!r} must be fed: the fetches depend on it")
        parts = partition(place(pruned, self.default_device))
        for device in parts:
            self.cluster.rank_of(device)  # a device outside the cluster: a clear error now
        handles = {device: self._call(device, m.RegisterGraphRequest(s.handle, as_graph_def(g), s.container)
                                      ).graph_handle for device, g in parts.items()}
        holder = {op.name: d for d, g in parts.items() for op in g.operations}
        fetches = {d: [] for d in parts}
        for name in req.fetch:
            fetches[holder[name.partition(":")[0]]].append(name)
        feeds = {d: [] for d in parts}
        for name in req.feed:
            op_name = name.partition(":")[0]
            if op_name in holder:  # a fed placeholder that nothing needs is harmless
                feeds[holder[op_name]].append(name)
        s.partition_count += 1
        s.plans[key] = _Plan(handles, fetches, feeds, count_send_recv(parts)[0])
        return s.plans[key]

    # --8<-- [start:run_graphs]
    def _run_graphs(self, s: MasterSession, plan: _Plan, req: m.RunStepRequest, step_id: int) -> dict:
        for device in plan.handles:
            if device in self.unavailable:
                raise StepError(f"step {step_id}: worker {device} is unavailable: {self.unavailable[device]}")
        for device, handle in plan.handles.items():
            send = {name.partition(":")[0]: req.feed[name] for name in plan.feeds[device]}
            self.channel.send(m.RunGraphRequest(s.handle, handle, step_id, send, plan.fetches[device]),
                              self.cluster.rank_of(device))
        results: dict[str, dict] = {}
        errors: dict[str, str] = {}
        lock = threading.Lock()

        def fail(device: str, why: str) -> None:
            with lock:
                first = not errors
                errors[device] = why
            if first:  # wake every other worker of the step that may be waiting for a tensor
                for other in plan.handles:
                    if other != device and other not in self.unavailable:
                        try:
                            self.channel.send(m.AbortStep(step_id, f"{device} failed"), self.cluster.rank_of(other))
                        except CommError:
                            pass

        def listen(device: str) -> None:
            rank = self.cluster.rank_of(device)
            while True:
                try:
                    msg = self.channel.recv(rank)
                except CommError as e:
                    self.unavailable[device] = f"no answer to step {step_id}: {e}"
                    fail(device, f"worker {device} (rank {rank}) did not answer RunGraph: {e}")
                    return
                if isinstance(msg, m.RunGraphResponse) and msg.step_id == step_id:
                    if msg.error is not None:
                        fail(device, f"worker {device} (rank {rank}) failed: {msg.error}")
                    results[device] = msg.recv
                    return

        threads = [threading.Thread(target=listen, args=(d,), daemon=True) for d in plan.handles]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:  # a silent worker first: the others' timeouts are usually its consequence
            order = sorted(errors, key=lambda d: (d not in self.unavailable, list(errors).index(d)))
            raise StepError(f"step {step_id} failed: " + "; and ".join(errors[d] for d in order))
        return {k: v for r in results.values() for k, v in r.items()}
    # --8<-- [end:run_graphs]
