"""A simulated network: every message costs α + m·β of a chosen interconnect.

``SimulatedNetwork(inner, profile)`` wraps any ``Communicator`` (thread ranks or MPI ranks).
Data still travels through ``inner``, so results are real; what the wrapper adds is *time*:
each message is charged the latency α and the per-byte cost β of an interconnect profile
(10/25/100 Gb Ethernet with TCP, RoCE, InfiniBand HDR and NDR, or your own). It is what
SimGrid's SMPI does for MPI programs (virtual time), and, in ``"sleep"`` timing, what Linux
``tc netem`` does to a real interface (delay and rate), for a few lines of Python.

The link model, per rank: one outbound and one inbound link, both full duplex.

* **send** of ``m`` bytes starts when the rank calls it, or when its outbound link has
  finished the previous message, whichever is later (``start``); the link is then busy for
  ``m·β``, and the message is complete at the receiver at ``start + α + m·β``. A send never
  blocks the sender: like an eager (buffered) MPI send or an RDMA write, the network
  interface does the work, so the sender's CPU is free at once.
* **recv** completes when the message is complete, or when the inbound link has delivered
  the earlier messages plus this one's ``m·β``, whichever is later. Messages share the
  inbound link in the order they are received, which is what makes ``n`` senders into one
  receiver (a parameter server's incast) take ``α + n·m·β``, not ``α + m·β``.

This is slightly richer than the round-by-round closed forms of ``cost_model``, which
charge ``α + m·β`` per round: a rank that sends several messages in a row (the root of a
tree broadcast, the fold of recursive doubling when ``p`` is not a power of two) overlaps
their latencies here, so such runs can finish earlier than the formula says. The ring, and
all four allreduce algorithms on a power of two, match the formulas exactly.

The sender's timestamp travels with the message: a small float64 header sent through
``inner`` just before the payload, on its own tag (``tag + HEADER_TAG_OFFSET``) so that no
receive can take a header for a payload, whatever the payload's dtype. The model therefore
works the same across threads and MPI processes; user tags must be below the offset.
Two timings:

* ``timing="virtual"`` (default): each rank keeps a simulated clock, ``now()``. Nothing
  sleeps; a receive moves the clock to the completion time computed above, and
  ``advance(seconds)`` adds computation time. The result is deterministic and exact: a
  ring allreduce of ``N`` bytes on ``p`` ranks ends at exactly
  ``cost_model.ring_allreduce_time(N, p, link)``, on threads and on MPI alike.
* ``timing="sleep"``: the clock is the host's monotonic clock, and a receive *sleeps* until
  the completion time. A transfer then costs wall-clock time but no CPU, so computation on
  another thread overlaps with it, as it would with a network interface doing the copy.
  Ranks must share one host's clock (threads, or MPI processes on one machine), and times
  below about 0.1 ms are only approximate (the operating system's sleep granularity).

Both count what this rank sends and receives (messages and payload bytes; headers are
bookkeeping, not traffic) and the time its receives spent waiting (``waited_s``). Like any
communicator, one rank's ``SimulatedNetwork`` is used by one thread at a time (for overlap,
that is the rank's communication thread).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from .communicator import Communicator, dissemination_barrier, itemsize
from .cost_model import LinkParams

TIMINGS = ("virtual", "sleep")
HEADER_TAG_OFFSET = 512  # headers use tag + 512; tags stay below 1024, which any MPI allows
BARRIER_TAG = HEADER_TAG_OFFSET - 1  # the barrier's own tag, the last one users may use


@dataclass(frozen=True)
class Interconnect:
    """A network technology as the α–β model sees it: link rate, latency, how it gets there.

    ``link_gbps`` is the nominal data rate per direction (Gb/s, 10^9 bits per second);
    real payload throughput is a few percent lower (packet headers, PCIe). ``latency_s`` is
    the one-way time of a small message between two applications, software included.
    """

    name: str
    link_gbps: float
    latency_s: float
    transport: str

    @property
    def link(self) -> LinkParams:
        """α = latency, β = 8 / (link rate in bits per second) seconds per byte, γ = 0."""
        return LinkParams(alpha=self.latency_s, beta=8.0 / (self.link_gbps * 1e9))


# --8<-- [start:profiles]
# Link rates are the standards' nominal data rates:
#   Ethernet: IEEE Std 802.3ae-2002 (10 Gb/s), 802.3by-2016 (25 Gb/s), 802.3ba-2010 (100 Gb/s);
#   InfiniBand: the InfiniBand Trade Association's roadmap, 4x ports at HDR = 200 Gb/s
#   (50 Gb/s per lane) and NDR = 400 Gb/s (100 Gb/s per lane); NVIDIA ConnectX-6 (HDR) and
#   ConnectX-7 (NDR) adapters run them; RoCE v2 is IBTA's Annex A17 (RDMA over UDP/IP).
# Latencies are typical ranges, and we take a value inside each:
#   kernel TCP/IP over Ethernet: 10-50 us one way for a small message, dominated by the
#   host software (system calls, interrupts, copies between kernel and user memory), so
#   it barely changes with the link rate (Belay et al., "IX: A protected dataplane
#   operating system for high throughput and low latency", OSDI 2014, measure Linux TCP
#   against kernel-bypass stacks); we use 25 us for all three Ethernet rates.
#   RDMA (InfiniBand verbs, or RoCE on Ethernet) bypasses the kernel: MPI ping-pong
#   latencies of about 1-2 us through a switch on HDR/NDR (the OSU micro-benchmarks'
#   osu_latency is the usual measurement); we use 1.5 us for InfiniBand and 2 us for RoCE,
#   whose Ethernet switches add a little.
TCP_LATENCY_S = 25e-6
INTERCONNECTS: dict[str, Interconnect] = {
    i.name: i
    for i in (
        Interconnect("10GbE", 10, TCP_LATENCY_S, "TCP/IP over Ethernet (kernel stack)"),
        Interconnect("25GbE", 25, TCP_LATENCY_S, "TCP/IP over Ethernet (kernel stack)"),
        Interconnect("100GbE", 100, TCP_LATENCY_S, "TCP/IP over Ethernet (kernel stack)"),
        Interconnect("RoCE-100G", 100, 2.0e-6, "RDMA over Converged Ethernet v2 (kernel bypass)"),
        Interconnect("IB-HDR", 200, 1.5e-6, "InfiniBand HDR, RDMA verbs (kernel bypass)"),
        Interconnect("IB-NDR", 400, 1.5e-6, "InfiniBand NDR, RDMA verbs (kernel bypass)"),
    )
}
# --8<-- [end:profiles]


def interconnect(profile: str | Interconnect | LinkParams) -> Interconnect:
    """A profile by name (see ``INTERCONNECTS``), an ``Interconnect``, or custom ``LinkParams``."""
    if isinstance(profile, Interconnect):
        return profile
    if isinstance(profile, LinkParams):
        if profile.alpha < 0 or profile.beta <= 0:
            raise ValueError(f"a custom link needs alpha >= 0 and beta > 0, got {profile}")
        return Interconnect("custom", 8.0 / profile.beta / 1e9, profile.alpha, "custom")
    if profile not in INTERCONNECTS:
        raise ValueError(f"unknown interconnect {profile!r}; known: {', '.join(INTERCONNECTS)} "
                         "(or pass an Interconnect or LinkParams)")
    return INTERCONNECTS[profile]


class SimulatedNetwork(Communicator):
    """One rank's view of a simulated network; wraps that rank's real communicator ``inner``."""

    def __init__(self, inner: Communicator, profile: str | Interconnect | LinkParams = "10GbE",
                 timing: str = "virtual"):
        if timing not in TIMINGS:
            raise ValueError(f"unknown timing {timing!r}; expected one of {TIMINGS}")
        self.inner = inner
        self.rank, self.size = inner.rank, inner.size
        self.interconnect = interconnect(profile)
        self.link = self.interconnect.link
        self.timing = timing
        self.messages_sent = self.bytes_sent = 0
        self.messages_received = self.bytes_received = 0
        self.waited_s = 0.0
        self._clock = 0.0  # simulated seconds on this rank (virtual timing only)
        self._tx_free = self._rx_free = -math.inf  # when each link is next idle

    # ------------------------------------------------------------------ time

    def now(self) -> float:
        """This rank's time: simulated seconds since start (virtual), or ``time.monotonic()``."""
        return self._clock if self.timing == "virtual" else time.monotonic()

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of computation pass on this rank (virtual: the clock; sleep: sleeps)."""
        if not seconds >= 0:
            raise ValueError(f"rank {self.rank}: advance needs seconds >= 0, got {seconds}")
        if self.timing == "virtual":
            self._clock += seconds
        else:
            time.sleep(seconds)

    def _stamp(self, buf: Any) -> Any:
        """Charge the outbound link for ``buf``; the header carries its completion time."""
        import numpy as np

        n_bytes = math.prod(buf.shape) * itemsize(buf)
        start = max(self.now(), self._tx_free)
        self._tx_free = start + n_bytes * self.link.beta
        self.messages_sent += 1
        self.bytes_sent += n_bytes
        return np.array([start + self.link.alpha + n_bytes * self.link.beta, n_bytes])

    def _deliver(self, header: Any) -> None:
        """The message in ``header`` is received: wait for it to be complete on the inbound link."""
        complete, n_bytes = float(header[0]), int(header[1])
        done = max(complete, self._rx_free + n_bytes * self.link.beta)
        self._rx_free = done
        self.messages_received += 1
        self.bytes_received += n_bytes
        wait = done - self.now()
        if wait > 0:
            self.waited_s += wait
            if self.timing == "virtual":
                self._clock = done
            else:
                time.sleep(wait)

    # ------------------------------------------------------------------ messages

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._check_peer(dest, "destination")
        self.inner.send(self._stamp(buf), dest, self._header_tag(tag))
        self.inner.send(buf, dest, tag)

    def recv(self, buf: Any, source: int, tag: int = 0) -> None:
        import numpy as np

        self._check_peer(source, "source")
        header = np.empty(2)
        self.inner.recv(header, source, self._header_tag(tag))
        self.inner.recv(buf, source, tag)
        self._deliver(header)

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int, tag: int = 0) -> None:
        import numpy as np

        self._check_peer(dest, "destination")
        self._check_peer(source, "source")
        header = np.empty(2)
        self.inner.sendrecv(self._stamp(sendbuf), dest, header, source, self._header_tag(tag))
        self.inner.sendrecv(sendbuf, dest, recvbuf, source, tag)
        self._deliver(header)

    def _header_tag(self, tag: int) -> int:
        # a split communicator's tags are context * 1024 + t (communicator.CONTEXT_TAG_SPAN): the
        # header stays inside its context's block of 1024 when t < 512
        if not (0 <= tag and tag % 1024 < HEADER_TAG_OFFSET):
            raise ValueError(f"rank {self.rank}: tag {tag} is outside 0..{HEADER_TAG_OFFSET - 1}, the tags "
                             "a SimulatedNetwork passes on (it uses tag + 512 for its own headers)")
        return tag + HEADER_TAG_OFFSET

    def barrier(self) -> None:
        """Dissemination barrier of empty messages: ceil(log2 p) rounds, so it costs ceil(log2 p)·α.

        Round k: send to rank + 2^k, receive from rank - 2^k. After the last round every
        rank has (indirectly) heard from every other, so none leaves before all arrived,
        and every clock has moved past the latest arrival (``dissemination_barrier``).
        """
        dissemination_barrier(self, BARRIER_TAG)
