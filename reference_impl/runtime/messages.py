"""The messages of the master/worker protocol, named as in TensorFlow's ``master.proto`` and
``worker.proto``.  Each is a plain data class; ``channel.send_obj`` pickles it for the wire.

NumPy-only: messages carry NumPy buffers between ranks (the graph executor is portable).

Client → master (the client lives in the master's process, so these are method calls):
``CreateSession`` (a GraphDef in, a unique session handle out), ``ExtendSession`` (nodes
added since, with the version they extend; a stale version is refused), ``RunStep``
(feeds, fetches, targets in; fetched values and the step id out), ``CloseSession``.

Master → worker (over the communicator): ``RegisterGraph`` (a partition's GraphDef in, a
graph handle out), ``RunGraph`` (run a registered partition for one step id),
``DeregisterGraph``, ``DeleteWorkerSession`` (free the session's variables), ``Shutdown``.

While a step runs, each cut edge's tensor travels as one ``TensorMessage`` straight from the
worker that produced it to the worker that consumes it (worker → worker, never through the
master); ``AbortStep`` (master → worker) tells a worker that the step it is running has
failed elsewhere, so it stops waiting for tensors.  ``PeerClose`` (worker → worker, at
shutdown) tells a peer's receiver thread that no more tensors will come from this worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


# ---------------------------------------------------------------- client → master
@dataclass
class CreateSessionRequest:
    graph_def: dict
    container: str | None = None  # None: variables private to the session; a name: shared


@dataclass
class CreateSessionResponse:
    session_handle: str
    graph_version: int


@dataclass
class ExtendSessionRequest:
    session_handle: str
    graph_def: dict  # only the nodes added since ``current_graph_version``
    current_graph_version: int


@dataclass
class ExtendSessionResponse:
    new_graph_version: int


@dataclass
class RunStepRequest:
    session_handle: str
    feed: dict[str, np.ndarray]  # placeholder tensor name → value
    fetch: list[str]  # tensor names
    target: list[str]  # op names run for their effect


@dataclass
class RunStepResponse:
    tensor: dict[str, Any]  # fetched tensor name → value
    step_id: int


@dataclass
class CloseSessionRequest:
    session_handle: str


@dataclass
class CloseSessionResponse:
    pass


# ---------------------------------------------------------------- master → worker
@dataclass
class RegisterGraphRequest:
    session_handle: str
    graph_def: dict
    container: str


@dataclass
class RegisterGraphResponse:
    graph_handle: str


@dataclass
class RunGraphRequest:
    session_handle: str
    graph_handle: str
    step_id: int
    send: dict[str, np.ndarray] = field(default_factory=dict)  # fed op name → value
    recv_key: list[str] = field(default_factory=list)  # tensor names to return


@dataclass
class RunGraphResponse:
    step_id: int
    recv: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the worker's error, naming the op, if the step failed there


@dataclass
class DeregisterGraphRequest:
    session_handle: str
    graph_handle: str


@dataclass
class DeleteWorkerSessionRequest:
    session_handle: str
    container: str


@dataclass
class Ack:
    """The reply to DeregisterGraph and DeleteWorkerSession."""
    what: str


@dataclass
class Shutdown:
    pass


# ---------------------------------------------------------------- during a step
@dataclass
class TensorMessage:
    """Worker → worker: the value of one cut edge for one step."""
    step_id: int
    key: str  # rendezvous key: "{send_device};{recv_device};{edge};{step_id}"
    value: Any


@dataclass
class PeerClose:
    """Worker → worker, at shutdown: the sender will send no more tensors."""
    device: str


@dataclass
class AbortStep:
    step_id: int
    reason: str
