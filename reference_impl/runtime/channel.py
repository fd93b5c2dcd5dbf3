"""Python objects over a ``Communicator``, which only moves arrays of a known shape.

NumPy-only: messages carry NumPy buffers between ranks (the graph executor is portable).

``send_obj`` pickles the object and sends two messages: its length (one int64, on ``tag``),
then its bytes (uint8, on ``tag + 1``: a separate tag, so that a receive waiting for the next
length never sees the bytes of the previous message as a message of the wrong dtype).  ``recv_obj``
receives the length, makes a buffer that size and receives
into it.  Messages between two ranks with one tag never overtake each other, so the pair
stays together as long as one thread at a time sends on a (destination, tag): ``Channel``
holds a lock per (destination, tag) for that, because a worker answers the master from its
step thread while its main loop may be sending too.  Every receive is bounded by the
communicator's timeout.

Two pairs of tags keep the two conversations apart: ``TAG`` carries the master's requests
and the workers' answers, ``PEER_TAG`` the tensors workers send each other on cut edges.
A worker reads both at once (its main loop on ``TAG`` from the master, one receiver thread
per peer on ``PEER_TAG``), and neither can take a message meant for the other.
"""
from __future__ import annotations

import pickle
import threading
from typing import Any

import numpy as np

from ..comm import Communicator

TAG = 7  # master <-> worker messages (lengths on 7, bytes on 8); collectives use other tags
PEER_TAG = 9  # worker -> worker tensors on cut edges (lengths on 9, bytes on 10)


def send_obj(comm: Communicator, obj: Any, dest: int, tag: int = TAG) -> None:
    """Send any picklable ``obj`` to rank ``dest``."""
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
    comm.send(np.array([payload.size], dtype=np.int64), dest, tag)
    comm.send(payload, dest, tag + 1)


def recv_obj(comm: Communicator, source: int, tag: int = TAG) -> Any:
    """Receive the next object ``source`` sent with ``send_obj`` (raises ``CommError`` on timeout)."""
    size = np.zeros(1, dtype=np.int64)
    comm.recv(size, source, tag)
    payload = np.empty(int(size[0]), dtype=np.uint8)
    comm.recv(payload, source, tag + 1)
    return pickle.loads(payload.tobytes())


class Channel:
    """``send_obj``/``recv_obj`` with one send lock per (destination, tag) (safe from many threads).

    Receives are not locked: the runtime has one reader per (source, tag) by construction.
    """

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self._locks: dict[tuple[int, int], threading.Lock] = {}
        self._guard = threading.Lock()

    def send(self, obj: Any, dest: int, tag: int = TAG) -> None:
        with self._guard:
            lock = self._locks.setdefault((dest, tag), threading.Lock())
        with lock:
            send_obj(self.comm, obj, dest, tag)

    def recv(self, source: int, tag: int = TAG) -> Any:
        return recv_obj(self.comm, source, tag)
