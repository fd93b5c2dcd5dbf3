"""``Mailbox``: how a worker listens. One reader thread per conversation, and the rule for
when to stop listening.

A worker talks to the master and to every peer worker at once, with a communicator that
only receives from a *named* rank, and MPI sends of large tensors that complete only once
the receiver has posted a matching receive. So it runs one reader per conversation, each
the only reader of its (source, tag): none can take a message meant for another, and every
peer's send finds a receive already waiting.

* the **master reader** (tag ``TAG``) queues the master's requests for the worker's main
  loop, except ``AbortStep``, which it hands on at once (``on_abort``): the main loop may be
  busy running the very step it aborts;
* a **receiver per peer** worker (``PEER_TAG``) hands each of that peer's ``TensorMessage``s
  on at once (``on_tensor``), to the rendezvous of its step; at shutdown each worker sends
  its peers ``PeerClose``, which ends their receivers.

**When to stop.** ``next_request`` returns the master's next request, or None when the
worker should stop: after ``Shutdown``; when a receive from the master failed early (the job
is failing: its steps are aborted first, through ``on_abort_all``); or when the master has
said nothing for ``timeout`` seconds and the worker has not answered anything for that long
either. An idle timeout right after an answer is not the end: the master may still need us.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from ..comm import CommError
from . import messages as m
from .channel import PEER_TAG, Channel
from .cluster import MASTER_RANK

EARLY_FAILURE = 0.5  # a receive that fails before this fraction of the timeout: the job is failing


class Mailbox:
    """The reader threads of one worker, and its queue of the master's requests."""

    def __init__(self, channel: Channel, device: str, peers: dict[int, str], timeout: float, *,
                 on_abort: Callable[[int, str], None], on_abort_all: Callable[[str], None],
                 on_tensor: Callable[[m.TensorMessage, int], None]) -> None:
        self.channel, self.device, self.peers, self.timeout = channel, device, peers, timeout
        self.on_abort, self.on_abort_all, self.on_tensor = on_abort, on_abort_all, on_tensor
        self._inbox: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        self._last_active = time.monotonic()  # the last message from the master, or answer to it
        self._readers = [threading.Thread(target=self._read_master, daemon=True, name=f"{device}<-master")]
        self._readers += [threading.Thread(target=self._receive_from, args=(rank,), daemon=True,
                                           name=f"{device}<-rank{rank}") for rank in peers]

    def start(self) -> None:
        for t in self._readers:
            t.start()

    # ------------------------------------------------------------ the master's requests
    def next_request(self) -> Any | None:
        """The master's next request, or None when the worker should stop (see the module)."""
        while True:
            item = self._inbox.get()  # a message, or (CommError, seconds the receive waited)
            if isinstance(item, tuple):
                _, waited = item
                idle = time.monotonic() - self._last_active
                if waited < EARLY_FAILURE * self.timeout or idle >= self.timeout:
                    return None  # the job is failing (a receive failed early), or the master left
                continue  # we answered a step recently: the master may still need us
            if isinstance(item, m.Shutdown):
                return None
            return item

    def answered(self) -> None:
        """The worker replied to the master: it is active, whatever the readers saw meanwhile."""
        self._last_active = time.monotonic()

    def _read_master(self) -> None:
        while not self._stopping.is_set():
            asked = time.monotonic()
            try:
                msg = self.channel.recv(MASTER_RANK)
            except CommError as e:
                waited = time.monotonic() - asked
                if waited < EARLY_FAILURE * self.timeout:  # not an idle timeout: the job is failing
                    self.on_abort_all(f"the master (rank {MASTER_RANK}) is unreachable: {e}")
                self._inbox.put((e, waited))
                time.sleep(0.05)
                continue
            if isinstance(msg, m.AbortStep):
                self.on_abort(msg.step_id, msg.reason)
                continue
            self._inbox.put(msg)
            if isinstance(msg, m.Shutdown):
                return

    # ------------------------------------------------------------ the peers' tensors
    def _receive_from(self, rank: int) -> None:
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
                self.on_abort_all(f"peer {device} (rank {rank}) sent {type(msg).__name__}, not a tensor")
                continue
            self.on_tensor(msg, rank)

    # ------------------------------------------------------------ the end
    def stop(self) -> None:
        """The worker is dying: every reader stops at its next failed receive."""
        self._stopping.set()

    def close(self) -> None:
        """Tell every peer that no more tensors will come, then wait for their goodbyes (and
        for the master's reader, which stops at its next message or timeout)."""
        self._stopping.set()
        for rank in self.peers:
            try:
                self.channel.send(m.PeerClose(self.device), rank, PEER_TAG)
            except Exception:  # noqa: BLE001 - a dead peer (MPI may say so in its own exception)
                pass
        deadline = time.monotonic() + self.timeout + 1
        for t in self._readers:
            t.join(max(0.0, deadline - time.monotonic()))
