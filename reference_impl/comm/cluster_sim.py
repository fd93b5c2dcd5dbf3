"""An event simulation of data-parallel training steps, from 1 to thousands of workers.

Measuring overlap on a real 1024-GPU cluster is out of reach; simulating it is not. A step
is modelled as two resources working in parallel on every worker, as on a GPU with a
compute stream and a communication stream:

* **compute** runs the forward pass (layer 0 first), then the backward pass (last layer
  first). When a layer's backward finishes, its gradients exist.
* **communication** reduces buckets one at a time, in the order they fill (the same
  ``plan_buckets`` the trainer uses). A bucket of ``m`` bytes takes
  ``allreduce_time(algorithm, m, p, link)`` from the alpha-beta-gamma cost model.

With ``overlap=True`` a bucket may start as soon as it is full and the link is free; with
``overlap=False`` every bucket waits for the end of backward. Workers are identical and
synchronous, so simulating one of them simulates the job. The step ends when both
resources are done, plus the optimiser's update.

What it leaves out, on purpose: stragglers and jitter, contention between the two streams
(the simulator assumes communication costs no compute time), and hierarchical networks.
``simulate_step`` returns every bucket's ready/start/end time, so a prediction can be set
next to a measured trace bucket by bucket.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .bucketing import plan_buckets
from .cost_model import LinkParams, allreduce_time


@dataclass(frozen=True)
class Layer:
    """One layer's compute times (seconds) and the sizes of the gradients its backward produces."""

    forward_s: float
    backward_s: float
    grad_bytes: tuple[int, ...]  # in the order backward produces them (e.g. (weight, bias))


@dataclass
class SimStep:
    """The simulated timeline of one step on ``workers`` workers (seconds from the step's start)."""

    workers: int
    overlap: bool
    step_s: float
    forward_s: float
    backward_s: float
    comm_s: float  # total time the link was busy: the sum of the bucket allreduces
    update_s: float
    buckets: list[tuple[int, float, float, float]] = field(default_factory=list)  # (bytes, ready, start, end)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.update_s

    @property
    def exposed_comm_s(self) -> float:
        """Communication not hidden behind compute: the step's time beyond pure compute."""
        return self.step_s - self.compute_s

    @property
    def ratio(self) -> float:
        """Compute / communication: the number that decides whether overlap pays."""
        return self.compute_s / self.comm_s if self.comm_s > 0 else float("inf")


def simulate_step(
    layers: list[Layer],
    workers: int,
    link: LinkParams,
    bucket_bytes: int,
    algorithm: str = "ring",
    overlap: bool = True,
    update_s: float = 0.0,
) -> SimStep:
    """Simulate one synchronous data-parallel step; ``layers`` are listed input layer first."""
    if not layers:
        raise ValueError("simulate_step: need at least one layer")
    if workers < 1:
        raise ValueError(f"simulate_step: workers must be >= 1, got {workers}")
    for i, layer in enumerate(layers):
        if layer.forward_s < 0 or layer.backward_s < 0:
            raise ValueError(f"simulate_step: layer {i} has a negative compute time")
    # Tensors in production order: last layer's first.
    tensors = [(li, nbytes) for li in reversed(range(len(layers))) for nbytes in layers[li].grad_bytes]
    plan = plan_buckets([nbytes for _, nbytes in tensors], bucket_bytes)
    bucket_of = {pos: b for b, positions in enumerate(plan) for pos in positions}
    pending = [len(positions) for positions in plan]
    sizes = [sum(tensors[p][1] for p in positions) for positions in plan]
    duration = [allreduce_time(algorithm, m, workers, link) for m in sizes]

    # The event queue: (time, sequence, kind, argument). Compute never waits for the link in
    # data parallelism, so all compute events are known up front.
    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(t: float, kind: str, arg: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, arg))
        seq += 1

    forward_s = sum(layer.forward_s for layer in layers)
    backward_s = sum(layer.backward_s for layer in layers)
    t = forward_s
    for li in reversed(range(len(layers))):
        t += layers[li].backward_s
        push(t, "layer_done", li)
    push(t, "backward_done", -1)

    tensors_of_layer = {}  # layer -> positions of its tensors
    for pos, (li, _) in enumerate(tensors):
        tensors_of_layer.setdefault(li, []).append(pos)
    ready_at = [0.0] * len(plan)
    start_at = [0.0] * len(plan)
    end_at = [0.0] * len(plan)
    # --8<-- [start:event_loop]
    queue: list[int] = []  # buckets ready and waiting for the link
    link_busy = False
    held: list[int] = []  # without overlap: buckets held back until backward ends

    def start_next(now: float) -> None:
        nonlocal link_busy
        if not link_busy and queue:
            b = queue.pop(0)
            start_at[b], end_at[b] = now, now + duration[b]
            link_busy = True
            push(end_at[b], "allreduce_done", b)

    while events:
        now, _, kind, arg = heapq.heappop(events)
        if kind == "layer_done":
            for pos in tensors_of_layer.get(arg, []):
                b = bucket_of[pos]
                pending[b] -= 1
                if pending[b] == 0:
                    ready_at[b] = now
                    (queue if overlap else held).append(b)
        elif kind == "backward_done":
            queue.extend(held)
            held.clear()
        else:  # allreduce_done
            link_busy = False
        start_next(now)
    # --8<-- [end:event_loop]

    compute_end = forward_s + backward_s
    comm_end = max(end_at) if plan else compute_end
    return SimStep(
        workers=workers, overlap=overlap, step_s=max(compute_end, comm_end) + update_s,
        forward_s=forward_s, backward_s=backward_s, comm_s=sum(duration), update_s=update_s,
        buckets=[(sizes[b], ready_at[b], start_at[b], end_at[b]) for b in range(len(plan))],
    )


def scaling(
    layers: list[Layer],
    link: LinkParams,
    worker_counts: list[int],
    bucket_bytes: int,
    algorithm: str = "ring",
    update_s: float = 0.0,
) -> list[dict[str, float]]:
    """Weak scaling (fixed batch per worker): step time and efficiency with and without overlap.

    Efficiency at ``p`` workers is ``step(1) / step(p)``: 1 means the extra workers cost
    nothing, so throughput grows ``p``-fold.
    """
    rows = []
    alone = simulate_step(layers, 1, link, bucket_bytes, algorithm, True, update_s).step_s
    for p in worker_counts:
        with_ov = simulate_step(layers, p, link, bucket_bytes, algorithm, True, update_s)
        without = simulate_step(layers, p, link, bucket_bytes, algorithm, False, update_s)
        rows.append({
            "workers": p,
            "step_overlap_s": with_ov.step_s,
            "step_end_s": without.step_s,
            "comm_s": with_ov.comm_s,
            "compute_s": with_ov.compute_s,
            "ratio": with_ov.ratio,
            "efficiency_overlap": alone / with_ov.step_s,
            "efficiency_end": alone / without.step_s,
            "gain": without.step_s / with_ov.step_s,
        })
    return rows


def gain_vs_ratio(
    layers: list[Layer],
    workers: int,
    link: LinkParams,
    bucket_bytes: int,
    beta_factors: list[float],
    algorithm: str = "ring",
) -> list[dict[str, float]]:
    """Overlap gain ``step(no overlap) / step(overlap)`` as the link slows down by ``beta_factors``.

    Scaling beta (seconds per byte) moves the compute/communication ratio through 1 with
    everything else fixed; the gain peaks where backward and communication take about the
    same time, and falls back towards 1 on either side.
    """
    rows = []
    for f in beta_factors:
        slower = LinkParams(link.alpha, link.beta * f, link.gamma)
        ov = simulate_step(layers, workers, slower, bucket_bytes, algorithm, True)
        end = simulate_step(layers, workers, slower, bucket_bytes, algorithm, False)
        rows.append({
            "beta_factor": f,
            "comm_s": ov.comm_s,
            "ratio": ov.ratio,
            "backward_ratio": ov.backward_s / ov.comm_s if ov.comm_s else float("inf"),
            "step_overlap_s": ov.step_s,
            "step_end_s": end.step_s,
            "gain": end.step_s / ov.step_s,
        })
    return rows
