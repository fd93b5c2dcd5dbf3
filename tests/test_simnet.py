"""The simulated network: its virtual clock reproduces the α–β closed forms exactly.

What is checked, against independent computations:

* a ring allreduce on p thread ranks ends at exactly ``cost_model.ring_allreduce_time`` for
  every profile, and sends what ``CountingCommunicator`` (outside the simulation) counts;
* the other allreduce algorithms match their closed forms on powers of two;
* the link model: ping-pong, back-to-back sends, incast, late receivers, the barrier;
* calibration on a simulated network recovers the profile's α and β;
* MPI ranks (mpiexec -n 2 and 4) give exactly the same simulated times as thread ranks;
* "sleep" timing takes wall-clock time but no CPU, so computation overlaps with it;
* the interconnects benchmark runs on a small sweep; bad input is named.
"""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from reference_impl.comm import CountingCommunicator, allreduce, run_threads
from reference_impl.comm.calibrate import calibrate, pingpong
from reference_impl.comm.cost_model import LinkParams, allreduce_time, ring_allreduce_time
from reference_impl.comm.mpi import mpiexec_command
from reference_impl.comm.simnet import INTERCONNECTS, Interconnect, SimulatedNetwork, interconnect

from conftest import ROOT

pytestmark = pytest.mark.timeout(120)


def simulated(profile, n_ranks, fn, timing="virtual", outer=None):
    """Run ``fn(comm)`` on thread ranks, each wrapped in a SimulatedNetwork (and ``outer``)."""
    def wrap(c):
        net = SimulatedNetwork(c, profile, timing=timing)
        return outer(net) if outer else net
    return run_threads(n_ranks, fn, timeout=30, wrap=wrap)


# --------------------------------------------------------------------------- the closed forms


@pytest.mark.parametrize("profile", list(INTERCONNECTS))
@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_ring_allreduce_takes_exactly_the_closed_form_time(profile, p):
    n = 256 * p  # float32 elements: p divides n, so every chunk has n / p elements
    inputs = [np.random.default_rng(r).integers(-50, 50, n).astype(np.float32) for r in range(p)]

    def step(comm):
        out = allreduce(comm, inputs[comm.rank], algorithm="ring")
        return comm.now(), out

    results = simulated(profile, p, step)
    expected_time = ring_allreduce_time(4 * n, p, INTERCONNECTS[profile].link)
    for rank, (t, out) in enumerate(results):
        assert t == pytest.approx(expected_time, rel=1e-12, abs=0), (rank, t, expected_time)
        assert np.array_equal(out, np.sum(inputs, axis=0)), rank


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_counts_match_an_independent_counter_and_the_ring_formula(p):
    n = 1000 * p

    def step(counting):
        allreduce(counting, np.ones(n, dtype=np.float64), algorithm="ring")
        net = counting.inner
        return counting.messages_sent, counting.bytes_sent, net.messages_sent, net.bytes_sent, \
            net.messages_received, net.bytes_received

    for got in simulated("25GbE", p, step, outer=CountingCommunicator):
        outer_msgs, outer_bytes, msgs, sent, msgs_in, received = got
        assert msgs == outer_msgs == msgs_in == 2 * (p - 1)
        assert sent == outer_bytes == received == 2 * (p - 1) * (n // p) * 8


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "rabenseifner", "tree"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_other_algorithms_match_their_closed_forms_on_powers_of_two(algorithm, p):
    link = INTERCONNECTS["IB-HDR"].link
    n = 512 * p
    times = simulated(link, p, lambda c: (allreduce(c, np.ones(n, np.float32), algorithm=algorithm), c.now())[1])
    assert max(times) == pytest.approx(allreduce_time(algorithm, 4 * n, p, link), rel=1e-12)


# --------------------------------------------------------------------------- the link model

CUSTOM = LinkParams(alpha=1e-5, beta=1e-9)  # 10 us, 1 GB/s: round numbers for hand checks


def test_pingpong_measures_alpha_plus_m_beta_exactly():
    sizes = [0, 8, 1000, 1 << 20]
    got = simulated(CUSTOM, 2, lambda c: pingpong(c, sizes, repeats=3, clock=c.now))[0]
    assert got == pytest.approx([CUSTOM.alpha + m * CUSTOM.beta for m in sizes], rel=1e-12)


@pytest.mark.parametrize("profile", list(INTERCONNECTS))
def test_calibration_on_a_simulated_network_recovers_its_alpha_and_beta(profile):
    links = simulated(profile, 3, lambda c: calibrate(c, sizes=[8, 4096, 1 << 16, 1 << 20], repeats=2,
                                                       reduction_sizes=(), clock=c.now))
    expected = INTERCONNECTS[profile].link
    for link in links:  # every rank gets the same parameters
        assert link.alpha == pytest.approx(expected.alpha, rel=1e-9)
        assert link.beta == pytest.approx(expected.beta, rel=1e-9)
        assert link.gamma == 0.0 and link.fit.max_relative_error < 1e-9


def test_back_to_back_sends_share_the_outbound_link_and_do_not_block_the_sender():
    m, k = 1 << 16, 5
    buf = np.zeros(m, dtype=np.uint8)

    def step(comm):
        if comm.rank == 0:
            for _ in range(k):
                comm.send(buf, 1)
            return comm.now()
        arrivals = []
        for _ in range(k):
            comm.recv(buf, 0)
            arrivals.append(comm.now())
        return arrivals

    sender_clock, arrivals = simulated(CUSTOM, 2, step)
    assert sender_clock == 0.0  # the network interface does the sending
    assert arrivals == pytest.approx([CUSTOM.alpha + (i + 1) * m * CUSTOM.beta for i in range(k)], rel=1e-12)


@pytest.mark.parametrize("p", [3, 5])
def test_incast_serialises_on_the_receivers_inbound_link(p):
    m = 1 << 18
    buf = np.zeros(m, dtype=np.uint8)

    def step(comm):
        if comm.rank == 0:
            for source in range(1, p):
                comm.recv(buf, source)
        else:
            comm.send(buf, 0)
        return comm.now()

    times = simulated(CUSTOM, p, step)
    assert times[0] == pytest.approx(CUSTOM.alpha + (p - 1) * m * CUSTOM.beta, rel=1e-12)
    assert times[1:] == [0.0] * (p - 1)


def test_a_late_receiver_does_not_wait_and_waiting_is_accounted():
    buf = np.zeros(1000, dtype=np.uint8)

    def step(comm):
        if comm.rank == 0:
            comm.send(buf, 1)
            comm.advance(1e-3)
            comm.recv(buf, 1)  # sent at 0 by rank 1: long arrived
        else:
            comm.send(buf, 0)
            comm.recv(buf, 0)  # arrives at alpha + m beta: rank 1 waits for it
        return comm.now(), comm.waited_s

    (t0, wait0), (t1, wait1) = simulated(CUSTOM, 2, step)
    one_message = CUSTOM.alpha + 1000 * CUSTOM.beta
    assert (t0, wait0) == (1e-3, 0.0)
    assert t1 == pytest.approx(one_message) and wait1 == pytest.approx(one_message)


@pytest.mark.parametrize("p", [1, 2, 5, 8])
def test_barrier_waits_for_the_last_rank_and_costs_log_p_latencies(p):
    def step(comm):
        comm.advance(1e-3 * comm.rank)
        comm.barrier()
        return comm.now(), comm.messages_sent, comm.bytes_sent

    results = simulated(CUSTOM, p, step)
    rounds = math.ceil(math.log2(p)) if p > 1 else 0
    last_entry = 1e-3 * (p - 1)
    for t, messages, n_bytes in results:
        assert last_entry <= t <= last_entry + rounds * CUSTOM.alpha + 1e-15
        assert messages == rounds and n_bytes == 0
    if p > 1:
        equal_entry = simulated(CUSTOM, p, lambda c: (c.barrier(), c.now())[1])
        assert equal_entry == pytest.approx([rounds * CUSTOM.alpha] * p, rel=1e-12)


def test_payloads_from_the_strict_array_api_namespace():
    xp = pytest.importorskip("array_api_strict")
    out = simulated("IB-NDR", 3, lambda c: (allreduce(c, xp.ones(30, dtype=xp.float32), algorithm="ring"),
                                            c.bytes_sent)[1])
    assert out == [2 * 2 * 10 * 4] * 3


# --------------------------------------------------------------------------- MPI ranks


def _scenario():
    spec = importlib.util.spec_from_file_location("simnet_times", ROOT / "tests/mpi_programs/simnet_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.scenario


@pytest.mark.parametrize("n_ranks", [2, 4])
def test_mpi_ranks_give_exactly_the_simulated_times_of_thread_ranks(n_ranks):
    run = subprocess.run(mpiexec_command(n_ranks, str(ROOT / "tests/mpi_programs/simnet_times.py")),
                         capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    over_mpi = json.loads(run.stdout)
    on_threads = run_threads(n_ranks, _scenario(), timeout=30)
    assert [d["rank"] for d in over_mpi] == list(range(n_ranks))
    for mpi_rank, thread_rank in zip(over_mpi, on_threads):
        assert mpi_rank["readings"] == thread_rank["readings"]  # bit for bit
    # and the first reading (1024 n float32 elements: even chunks) is the ring's closed form
    assert over_mpi[0]["readings"][0] == pytest.approx(
        ring_allreduce_time(4 * 1024 * n_ranks, n_ranks, INTERCONNECTS["10GbE"].link), rel=1e-12)


# --------------------------------------------------------------------------- sleep timing

SLOW = LinkParams(alpha=0.0, beta=0.1 / (1 << 20))  # 1 MiB takes 0.1 s


def test_sleep_timing_takes_wall_clock_time_but_no_cpu():
    buf = np.zeros(1 << 20, dtype=np.uint8)

    def step(comm):
        t0, cpu0 = time.monotonic(), time.thread_time()
        comm.sendrecv(buf, 1 - comm.rank, np.empty_like(buf), 1 - comm.rank)
        return time.monotonic() - t0, time.thread_time() - cpu0, comm.waited_s

    for wall, cpu, waited in simulated(SLOW, 2, step, timing="sleep"):
        assert 0.09 <= wall < 0.3, wall  # the peer may have started its send a little earlier
        assert cpu < 0.05, cpu  # the transfer slept; the copy through threads is ~1 ms
        assert waited == pytest.approx(wall, abs=0.05)


def test_sleep_timing_lets_computation_overlap_with_a_transfer():
    """Rank 0 starts a 0.1 s transfer on a helper thread and computes 0.1 s meanwhile."""
    buf = np.zeros(1 << 20, dtype=np.uint8)

    def busy(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def step(comm):
        t0 = time.monotonic()
        if comm.rank == 0:
            transfer = threading.Thread(target=comm.recv, args=(buf.copy(), 1))
            transfer.start()
            busy(0.1)
            computed = time.monotonic() - t0
            transfer.join()
            return computed, time.monotonic() - t0
        comm.send(buf, 0)

    computed, total = simulated(SLOW, 2, step, timing="sleep")[0]
    # In sequence it would take computed + 0.1 s; overlapped, about max(computed, 0.1 s).
    assert total >= 0.09 and total < max(computed, 0.1) + 0.05, (
        f"compute took {computed:.3f} s and the 0.1 s transfer, overlapped, {total:.3f} s in all")


# --------------------------------------------------------------------------- input and the benchmark


def test_bad_input_is_named():
    inner = run_threads(1, lambda c: c)[0]
    with pytest.raises(ValueError, match="unknown interconnect 'token-ring'.*10GbE"):
        SimulatedNetwork(inner, "token-ring")
    with pytest.raises(ValueError, match="unknown timing 'wallclock'"):
        SimulatedNetwork(inner, "10GbE", timing="wallclock")
    with pytest.raises(ValueError, match="beta > 0"):
        interconnect(LinkParams(alpha=1e-6, beta=0.0))
    with pytest.raises(ValueError, match="rank 0: advance needs seconds >= 0"):
        SimulatedNetwork(inner).advance(-1.0)
    with pytest.raises(ValueError, match="rank 0: destination rank 3"):
        SimulatedNetwork(inner).send(np.zeros(1), 3)
    with pytest.raises(ValueError, match="rank 0: tag 600 is outside 0..511"):
        SimulatedNetwork(inner).send(np.zeros(1), 0, tag=600)


def test_profiles_follow_their_link_rates():
    assert INTERCONNECTS["100GbE"].link.beta == pytest.approx(8 / 100e9)
    assert INTERCONNECTS["IB-NDR"].link.beta == pytest.approx(INTERCONNECTS["IB-HDR"].link.beta / 2)
    custom = interconnect(LinkParams(alpha=2e-6, beta=1e-10))
    assert isinstance(custom, Interconnect) and custom.link == LinkParams(2e-6, 1e-10)


def test_interconnects_benchmark_writes_json(tmp_path):
    out = tmp_path / "interconnects.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", "interconnects", "--max-bytes", str(1 << 20),
         "--sim-max-bytes", str(64 << 10), "--profiles", "10GbE,IB-NDR", "--out", str(out)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "interconnects" and set(doc["profiles"]) == {"10GbE", "IB-NDR"}
    assert doc["max_relative_error"] < 1e-9 and doc["machine"]["cpu"]
    kinds = {r["kind"] for r in doc["results"]}
    assert kinds == {"model", "simulated", "split"}
    for r in doc["results"]:
        if r["kind"] == "model":
            link = INTERCONNECTS[r["profile"]].link
            assert r["time_s"] == pytest.approx(ring_allreduce_time(r["bytes"], r["ranks"], link))
        if r["kind"] == "simulated":
            assert r["time_s"] == pytest.approx(r["model_s"], rel=1e-9)


def test_plotter_draws_the_committed_file_and_refuses_a_broken_one():
    sys.path.append(str(ROOT / "docs" / "hooks"))
    import plot_interconnects
    from mkdocs.exceptions import PluginError

    path = ROOT / "docs" / "assets" / "bench" / "interconnects.json"
    data = json.loads(path.read_text())
    svgs, summary = plot_interconnects.plot(path, data)
    assert set(svgs) == {"time", "speedup", "split"}
    assert all(b"<path" in svg and b'id="line2d_' in svg for svg in svgs.values())
    assert "| IB-NDR | 400 Gb/s |" in summary and "*Check:*" in summary
    broken = dict(data, results=[dict(data["results"][0], profile="token-ring")])
    with pytest.raises(PluginError, match="profile 'token-ring' is not in 'profiles'"):
        plot_interconnects.plot(path, broken)
