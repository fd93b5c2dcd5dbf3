"""Run under mpiexec -n 4: rank 0 receives from any rank, in the order the messages were sent.

Ranks 3, 1, 2 send to rank 0 in that order (a token passed 3 -> 1 -> 2 enforces it), each
with a payload of its own rank; rank 1 sends a second message afterwards, which must come
after its first. Then rank 0 waits on a tag nobody sends and must get a CommError naming
"any rank" within its short timeout. Rank 0 prints one OK line.
"""
import time

import numpy as np

from reference_impl.comm import CommError, MPICommunicator

comm = MPICommunicator(timeout=20)
token = np.zeros(1, dtype=np.int8)
order = [3, 1, 2]
if comm.rank == 0:
    sources, values = [], []
    buf = np.empty(4, dtype=np.float64)
    for _ in range(4):
        sources.append(comm.recv_any(buf, tag=5))
        values.append(buf.copy())
    assert sources == [3, 1, 2, 1] or sources == [3, 1, 1, 2], sources
    for s, v in zip(sources, values):
        assert v[0] == s, (s, v)
    assert [v[1] for s, v in zip(sources, values) if s == 1] == [0.0, 1.0]  # non-overtaking
    quick = MPICommunicator(timeout=0.5)
    start = time.monotonic()
    try:
        quick.recv_any(buf, tag=6)
        raise AssertionError("a receive from any rank with no sender returned")
    except CommError as exc:
        assert "still waiting for a message from any rank (tag 6)" in str(exc), str(exc)
    waited = time.monotonic() - start
    assert waited < 3.0, waited
else:
    position = order.index(comm.rank)
    if position > 0:
        comm.recv(token, order[position - 1], tag=9)
    comm.send(np.array([comm.rank, 0.0, 0.0, 0.0]), 0, tag=5)
    if position + 1 < len(order):
        comm.send(token, order[position + 1], tag=9)
    if comm.rank == 1:
        comm.send(np.array([1.0, 1.0, 0.0, 0.0]), 0, tag=5)
comm.barrier()
if comm.rank == 0:
    print("OK recv_any on 4 ranks", flush=True)
