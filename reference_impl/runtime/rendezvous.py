"""The rendezvous: where a ``_Send`` leaves a tensor and the matching ``_Recv`` picks it up.

Both sides name the tensor by the same key, ``"{send_device};{recv_device};{edge};{step_id}"``
(``reference_impl.graph.rendezvous_key``), so neither needs to know when the other runs:

* ``send`` never blocks: it stores the value (a second send of one key is an error);
* ``recv`` waits until the key is there, for at most ``timeout`` seconds, then raises
  ``RendezvousTimeout`` naming the key, i.e. the edge and the two devices;
* ``recv_any`` waits for whichever of several keys comes first: the executor uses it so
  that it never blocks on one ``_Recv`` while another input that is already there could
  let it run the op whose ``_Send`` a peer is waiting for;
* ``abort`` wakes every waiter with an error (the step failed elsewhere).

``Rendezvous`` is the in-process table (threads).  A worker keeps one per step
(``worker.StepRendezvous``): its own ``_Send``s fill it directly, and its receiver threads,
one per peer worker, fill it with the tensors that peer sends over the communicator.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable


class RendezvousError(RuntimeError):
    """A step's tensors could not be exchanged: a timeout, an abort, or a key sent twice."""


class RendezvousTimeout(RendezvousError, TimeoutError):
    pass


class Rendezvous:
    """A table of (key → value) with blocking, bounded receives; one per step."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._table: dict[str, Any] = {}
        self._cond = threading.Condition()
        self._aborted: str | None = None

    def send(self, key: str, value: Any) -> None:
        with self._cond:
            if key in self._table:
                raise RendezvousError(f"rendezvous key {key!r} was sent twice")
            self._table[key] = value
            self._cond.notify_all()

    def recv(self, key: str) -> Any:
        return self.recv_any([key])[1]

    def recv_any(self, keys: Iterable[str]) -> tuple[str, Any]:
        """The first of ``keys`` to arrive, and its value (removed from the table)."""
        keys = list(keys)
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while True:
                for k in keys:
                    if k in self._table:
                        return k, self._table.pop(k)
                if self._aborted is not None:
                    raise RendezvousError(f"step aborted while waiting for {keys[0]!r}: {self._aborted}")
                if time.monotonic() >= deadline:
                    raise RendezvousTimeout(
                        f"no tensor arrived for rendezvous key {keys[0]!r}"
                        + (f" (or {len(keys) - 1} other keys)" if len(keys) > 1 else "")
                        + f" within {self.timeout:g} s: its sender failed or never ran")
                self._wait(deadline, keys)

    def _wait(self, deadline: float, keys: list[str]) -> None:
        """Block until something may have changed (called with the lock held)."""
        self._cond.wait(max(0.0, deadline - time.monotonic()))

    def abort(self, reason: str) -> None:
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()
