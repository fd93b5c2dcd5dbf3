"""``python -m benchmarks model_parallel`` (section ``alltoall``) and the speed paths it measures.

* a tiny run (2 MPI ranks, 8 B to 256 B, one alltoallv size, one forced MPICH algorithm)
  gives every row the plotter reads, each checked against MPI before and after timing, with
  nccl-tests' bandwidths (algbw = bytes / time, busbw = algbw (n - 1) / n) and ratios that
  follow from the rows; the plotter renders it; never a timing asserted;
* the correctness check fails loudly on a wrong block, naming rank, size and block;
* the alltoallv counts are uneven yet every rank sends and receives the same total;
* ``alltoall(out=)`` and ``alltoallv(out=)`` equal NumPy's transposition, for contiguous and
  strided inputs and outputs, and on array_api_strict; a contiguous buffer is sent as it is
  (no copy), a strided one is copied; bad ``out`` arguments are refused with a clear error;
* the pairwise schedule pairs ``r`` with ``r XOR s`` on a power-of-two rank count (MPICH's
  rule) and shifts by ``s`` otherwise, and either way every rank meets every other once.
* sections ``layouts`` and ``predicted`` (tiny workload, 2 ranks): every layout trains the same
  model (its losses equal the one-process baseline's, whose first loss is the single-process
  model's); parameters held and ``zero.zero_memory``'s peaks recomputed; the planner's
  predictions recomputed from the stored rate and link; the plotter renders them; the loss
  guard names the layout and step; Kendall's tau; every layout fits its rank count and the
  planner accepts it; a bad rank count or a missing layouts section is refused.
"""
from __future__ import annotations

import importlib
import json
import math  # noqa: F401  (imported before docs/hooks, which holds a math.py, goes on sys.path)
import statistics  # the plotter's import; likewise
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import model_parallel as mp
from reference_impl.backend import get_namespace, to_numpy
from reference_impl.comm import run_threads

a2a = importlib.import_module("reference_impl.comm.alltoall")  # the module (the package exports the function)

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(120)


def plotter():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import plot_model_parallel
    finally:
        sys.path.pop(0)
    return plot_model_parallel


def test_a_tiny_run_has_the_schema_the_plotter_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the mpiexec workers import benchmarks from here
    out = tmp_path / "model_parallel.json"
    # --only alltoall: the other sections (routing, activations, layouts, predicted) have their own tests
    machine = {"cpu": "test", "cores": 2, "mpi_library": "MPICH", "date": "2025-01-01T00:00:00+00:00"}
    out.write_text(json.dumps({"benchmark": "model_parallel", "machine": machine}))
    assert mp.main(["--only", "alltoall", "--ranks", "2", "--min-bytes", "8", "--max-bytes", "256",
                    "--v-sizes", "1024", "--forced", "pairwise", "--repeat-scale", "0.1", "--warmup", "1",
                    "--timeout", "100", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "model_parallel" and len(doc["section_machines"]["alltoall"]["loadavg"]) == 3
    section = doc["alltoall"]
    assert "MPICH" in section["mpi_library"] and "AlltoAllGetBw" in section["busbw_source"]
    assert [(j["ranks"], j["job"]) for j in section["jobs"]] == [(2, "main"), (2, "forced:pairwise")]
    assert section["jobs"][1]["env"] == {"MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM": "pairwise",
                                         "MPIR_CVAR_DEVICE_COLLECTIVES": "none"}
    assert all(len(j["loadavg_before"]) == len(j["loadavg_after"]) == 3 for j in section["jobs"])

    rows = section["results"]
    sizes = [8, 16, 32, 64, 128, 256]
    got = sorted((r["job"], r["op"], r["bytes"], r["impl"]) for r in rows)
    want = sorted([("main", "alltoall", b, i) for b in sizes for i in ("pairwise", "bruck", "mpi")]
                  + [("forced:pairwise", "alltoall", b, i) for b in sizes for i in ("pairwise", "bruck", "mpi:pairwise")]
                  + [("main", "alltoallv", 1023, i) for i in ("pairwise", "mpi", "pairwise+counts", "mpi+counts")])
    assert got == want
    for r in rows:
        assert r["verified"] is True and r["ranks"] == 2 and r["repeats"] >= 3 and r["time_s"] > 0
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * (2 - 1) / 2)
    v = [r for r in rows if r["op"] == "alltoallv"]
    assert all(r["counts"] == mp.v_counts(1024, 2) and r["nominal_bytes"] == 1024 for r in v)
    assert v[0]["bytes"] == sum(mp.v_counts(1024, 2)[0]) == 1023

    busbw = {(r["job"], r["op"], r["bytes"], r["impl"]): r["busbw_GBps"] for r in rows}
    ratios = section["ratios"]
    assert len(ratios) == 2 * len(sizes) + 1
    for q in ratios:
        mpi = busbw[(q["job"], q["op"], q["bytes"], q["against"])]
        mine = [busbw[(q["job"], q["op"], q["bytes"], i)] for i in (("pairwise", "bruck") if q["op"] == "alltoall"
                                                                     else ("pairwise",))]
        assert q["ours_over_mpi"] == pytest.approx(max(mine) / mpi)
        assert q["pairwise_over_mpi"] == pytest.approx(busbw[(q["job"], q["op"], q["bytes"], "pairwise")] / mpi)
    assert "busbw ratio" in capsys.readouterr().out

    figures, summary = plotter().plot(out, doc)
    assert set(figures) == {"alltoall-busbw-2", "alltoall-ratio"}
    assert all(f.lstrip().startswith(b"<?xml") and b"<svg" in f[:1000] for f in figures.values())
    assert "| 2 | 1 KiB |" in summary  # the alltoallv table (no size reaches 1 MiB here, so no alltoall table)


def test_the_check_names_rank_size_and_wrong_block():
    good = np.arange(12, dtype=np.uint8).reshape(3, 4)
    mp.check_same("x", good.copy(), good, rank=1, n_bytes=12)
    bad = good.copy()
    bad[2, 1] ^= 1
    with pytest.raises(AssertionError, match=r"rank 1: pairwise gave a wrong result at 12 B per rank: block\(s\) \[2\]"):
        mp.check_same("pairwise", bad, good, rank=1, n_bytes=12)
    with pytest.raises(AssertionError, match="first wrong byte at index 9"):
        mp.check_same("v", bad.reshape(-1), good.reshape(-1), rank=0, n_bytes=12)
    # the seeded blocks differ per (sender, receiver), so a swapped pair cannot pass
    assert not np.array_equal(mp.block(0, 1, 64), mp.block(1, 0, 64))
    assert np.array_equal(mp.block(3, 2, 64), mp.block(3, 2, 64))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_alltoallv_counts_are_uneven_with_equal_totals(p):
    counts = np.array(mp.v_counts(1 << 20, p))
    assert (counts.sum(axis=1) == counts.sum(axis=1)[0]).all() and (counts.sum(axis=0) == counts.sum(axis=1)).all()
    assert counts.sum(axis=1)[0] <= 1 << 20
    assert len(set(counts[0].tolist())) == p  # every block of a row has its own size


def test_busbw_is_nccl_tests_formula():
    algbw, busbw = mp.alltoall_bandwidths(8 << 20, 1e-3, 4)
    assert algbw == pytest.approx(8.388608) and busbw == pytest.approx(algbw * 3 / 4)
    assert mp.alltoall_bandwidths(1000, 1.0, 1)[1] == 0.0  # one rank: nothing leaves it


def _inputs(p: int, m: int) -> list[np.ndarray]:
    rng = np.random.default_rng(p)
    return [rng.integers(-1000, 1000, size=(p, m, 2)).astype(np.float64) for _ in range(p)]


@pytest.mark.parametrize("algorithm", ["pairwise", "bruck"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_alltoall_into_out_contiguous_or_strided(p, algorithm):
    xs = _inputs(p, 3)
    expected = np.stack(xs).swapaxes(0, 1)
    for strided in (False, True):
        def body(comm):
            x = xs[comm.rank]
            if strided:  # a view with gaps: not one run of memory, on both sides
                x = np.repeat(x, 2, axis=1)[:, ::2]
                out = np.zeros((p, 6, 2))[:, ::2]
            else:
                out = np.zeros_like(x)
            assert x.flags.c_contiguous != strided and out.flags.c_contiguous != strided
            result = a2a.alltoall(comm, x, algorithm=algorithm, out=out)
            return result is out, out.copy()
        for r, (same, got) in enumerate(run_threads(p, body)):
            assert same
            np.testing.assert_array_equal(got, expected[r])


def test_contiguous_buffers_are_sent_as_they_are():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    send = a2a._send_rows(np, x, 4)
    assert np.shares_memory(send, x) and send.shape == (4, 6)
    strided = np.arange(48, dtype=np.float32).reshape(4, 12)[:, ::2]
    copy = a2a._send_rows(np, strided, 4)
    assert not np.shares_memory(copy, strided) and copy.flags.c_contiguous
    np.testing.assert_array_equal(copy, strided)
    recv, in_place = a2a._recv_rows(np, np.empty((4, 3, 2)), 4)
    assert in_place and recv.shape == (4, 6)
    assert a2a._recv_rows(np, strided, 4)[1] is False


def test_out_on_the_array_api_strict_namespace():
    xp = get_namespace("strict")
    p = 3
    xs = _inputs(p, 2)
    expected = np.stack(xs).swapaxes(0, 1)
    for algorithm in ("pairwise", "bruck"):
        def body(comm):
            out = xp.zeros((p, 2, 2), dtype=xp.float64)
            return a2a.alltoall(comm, xp.asarray(xs[comm.rank]), algorithm=algorithm, out=out) is out, out
        for r, (same, got) in enumerate(run_threads(p, body)):
            assert same
            np.testing.assert_array_equal(to_numpy(got), expected[r])


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_alltoallv_receives_into_out(p):
    counts = np.array(mp.v_counts(40, p))  # counts[src][dst]
    rng = np.random.default_rng(7)
    blocks = [[rng.integers(0, 100, int(counts[s, d])).astype(np.int64) for d in range(p)] for s in range(p)]

    def body(comm):
        r = comm.rank
        buf = np.full(2 * int(counts[:, r].sum()), -1, np.int64)
        strided = [buf[::2][int(counts[:i, r].sum()):int(counts[:i + 1, r].sum())] for i in range(p)]
        result = a2a.alltoallv(comm, blocks[r], out=strided)
        return [o is s for o, s in zip(result, strided)], buf[::2].copy()

    for r, (same, got) in enumerate(run_threads(p, body)):
        assert all(same)
        np.testing.assert_array_equal(got, np.concatenate([blocks[i][r] for i in range(p)]))


def test_bad_out_arguments_are_refused():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"out must be a separate array of x's shape \(2, 3\) and dtype float32, "
                                         r"got shape \(2, 4\)"):
        run_threads(2, lambda comm: a2a.alltoall(comm, x, out=np.zeros((2, 4), np.float32)))
    with pytest.raises(ValueError, match="got shape \\(2, 3\\) and dtype float64"):
        run_threads(2, lambda comm: a2a.alltoall(comm, x, out=np.zeros((2, 3))))
    one = np.zeros((1, 3), np.float32)
    with pytest.raises(ValueError, match="out must be a separate array"):
        run_threads(1, lambda comm: a2a.alltoall(comm, one, out=one))
    blocks = [np.zeros(2), np.zeros(3)]
    with pytest.raises(ValueError, match=r"recv_counts \[2, 2\] disagree with the lengths of out, \[2, 3\]"):
        run_threads(2, lambda comm: a2a.alltoallv(comm, blocks, recv_counts=[2, 2], out=[np.zeros(2), np.zeros(3)]))
    with pytest.raises(ValueError, match="out must be 2 1-D arrays of dtype float64"):
        run_threads(2, lambda comm: a2a.alltoallv(comm, blocks, out=[np.zeros(2, np.float32), np.zeros(3)]))


@pytest.mark.parametrize("p", range(1, 10))
def test_pairwise_schedule(p):
    meets = set()
    for s in range(1, p):
        dests = [a2a.pairwise_peers(p, r, s)[0] for r in range(p)]
        sources = [a2a.pairwise_peers(p, r, s)[1] for r in range(p)]
        assert sorted(dests) == list(range(p))  # a permutation: every rank receives once per step
        for r in range(p):
            assert sources[dests[r]] == r  # my destination receives from me in the same step
            if p & (p - 1) == 0:
                assert dests[r] == sources[r] == r ^ s  # a swap, MPICH's exclusive-or pairing
            else:
                assert (dests[r], sources[r]) == ((r + s) % p, (r - s) % p)
            meets.add((r, dests[r]))
    assert meets == {(a, b) for a in range(p) for b in range(p) if a != b}


# ----------------------------------------------------------------- sections layouts and predicted


def test_layouts_and_predicted_tiny_run(tmp_path, monkeypatch):
    """``--only layouts --only predicted`` on 2 MPI ranks with the tiny workload: every row the
    plotter reads, the closed forms recomputed here, the planner's numbers recomputed from the
    rates and link the section stored; structure only, no timing asserted."""
    import os

    from benchmarks import model_parallel_layouts as lay
    from reference_impl.comm.cost_model import LinkParams
    from reference_impl.parallel import planner, zero
    from reference_impl.parallel import transformer as tf

    monkeypatch.chdir(ROOT)  # the mpiexec workers import benchmarks from here
    out = tmp_path / "model_parallel.json"
    machine = {"cpu": "test", "cores": 2, "mpi_library": "MPICH", "date": "2025-01-01T00:00:00+00:00"}
    out.write_text(json.dumps({"benchmark": "model_parallel", "machine": machine}))
    assert mp.main(["--only", "layouts", "--only", "predicted", "--layouts-ranks", "2", "--layouts-repeats", "2",
                    "--layouts-workload", "tiny", "--timeout", "100", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    section, pred = doc["layouts"], doc["predicted"]
    assert set(doc["section_machines"]) == {"layouts", "predicted"}
    w = lay.WORKLOADS["tiny"]
    config = w.config()
    assert section["workload"] == "tiny" and (section["batch"], section["seq"]) == (w.batch, w.seq)
    [job] = section["jobs"]
    assert job["ranks"] == 2 and job["oversubscribed"] == (2 > (os.cpu_count() or 1))
    assert len(job["loadavg_before"]) == len(job["loadavg_after"]) == 3

    rows = section["results"]
    gpt = {r["layout"]: r for r in rows if r["kind"] == "gpt"}
    assert list(gpt) == ["1 rank", "DP", "ZeRO-3", "TP2", "TP2+SP", "PP2"]
    assert sorted(r["layout"] for r in rows if r["kind"] == "moe_layer") == \
        ["EP2 k=1", "EP2 k=2", "replicated x2 k=1", "replicated x2 k=2"]
    for r in rows:
        assert len(r["step_times"]) == 2 and r["step_s"] == pytest.approx(statistics.median(r["step_times"]))
        assert len(r["peak_bytes_per_rank"]) == r["ranks"] and r["peak_bytes"] == max(r["peak_bytes_per_rank"])
        assert r["model_state_bytes_per_rank"] == [16 * n for n in r["held_parameters_per_rank"]]
        assert len(r["losses"]) == 1 + 2  # warm-up and timed steps
    # the same training everywhere: the baseline's first loss is the single-process model's own
    tokens, targets = zero.global_batch(0, w.batch, w.seq)
    loss0, _ = tf.loss_and_grads(tf.init_params(config, dtype=np.float32), tokens, targets, config)
    assert gpt["1 rank"]["losses"][0] == pytest.approx(float(loss0), rel=1e-5)
    for r in gpt.values():
        np.testing.assert_allclose(r["losses"], gpt["1 rank"]["losses"], rtol=lay.LOSS_RTOL)
    # parameters held, from the model's own counts; the closed-form peaks of zero.zero_memory
    assert gpt["1 rank"]["held_parameters_per_rank"] == [tf.n_params(config)]
    assert gpt["DP"]["held_parameters_per_rank"] == [zero.padded_params(config, 2)] * 2
    assert gpt["ZeRO-3"]["held_parameters_per_rank"] == [zero.padded_params(config, 2) // 2] * 2
    assert all(max(gpt[n]["held_parameters_per_rank"]) < tf.n_params(config) for n in ("TP2", "TP2+SP", "PP2"))
    for name, stage in (("DP", 0), ("ZeRO-3", 3)):
        closed = zero.zero_memory(config, w.batch // 2, w.seq, stage=stage, ranks=2, prefetch=False, itemsize=4)
        assert gpt[name]["predicted_peak_bytes"] == closed["peak"]
        assert gpt[name]["peak_bytes"] == pytest.approx(closed["peak"], rel=0.15)  # tracemalloc, not a timing
    moe = {r["layout"]: r for r in rows if r["kind"] == "moe_layer"}
    for k in (1, 2):
        ep, rep = moe[f"EP2 k={k}"], moe[f"replicated x2 k={k}"]
        np.testing.assert_allclose(ep["losses"], rep["losses"], rtol=lay.LOSS_RTOL)
        assert rep["held_parameters_per_rank"][0] == sum(int(np.prod(s)) for s in moe_shapes(w, k).values())
        assert ep["held_parameters_per_rank"][0] < rep["held_parameters_per_rank"][0]

    # predicted: the planner's own numbers for the stored rate and link
    link = LinkParams(pred["link"]["alpha"], pred["link"]["beta"], pred["link"]["gamma"])
    assert pred["flops_per_s"] == {"2": gpt["1 rank"]["flops_per_s"]}
    assert gpt["1 rank"]["flops_per_s"] == pytest.approx(
        tf.step_flops(config, w.batch, w.seq)["total"] / gpt["1 rank"]["forward_backward_s"])
    model = planner.Model.from_config(config, w.seq, precision="fp32")
    assert [r["layout"] for r in pred["rows"]] == ["DP", "ZeRO-3", "TP2", "TP2+SP", "PP2"]
    for r in pred["rows"]:
        m = gpt[r["layout"]]
        layout = planner.Layout(tp=m["tp"], pp=m["pp"], dp=m["dp"], zero=m["zero"],
                                micro_batch=w.batch // (m["dp"] * m["microbatches"]),
                                sequence_parallel=m["sequence_parallel"])
        est = planner.predict_step(layout, model, planner.local_cluster(r["flops_per_s"], link, 2), w.batch)
        assert r["predicted_s"] == pytest.approx(est.step_s) and r["ratio"] == pytest.approx(est.step_s / m["step_s"])
        assert r["predicted_memory_bytes"] == pytest.approx(est.memory["total"])
        assert r["within_target"] == (abs(r["ratio"] - 1) <= lay.TARGET)
    [ranking] = pred["ranking"]
    assert ranking["measured_order"] == [r["layout"] for r in sorted(pred["rows"], key=lambda r: r["measured_s"])]
    assert ranking["predicted_order"] == [r["layout"] for r in sorted(pred["rows"], key=lambda r: r["predicted_s"])]
    told_apart = [(a, b) for i, a in enumerate(pred["rows"]) for b in pred["rows"][i + 1:]
                  if abs(a["predicted_s"] / b["predicted_s"] - 1) > lay.DECISIVE]
    assert ranking["decisive_pairs"] == len(told_apart)
    assert ranking["decisive_agree"] == sum((a["predicted_s"] < b["predicted_s"]) == (a["measured_s"] < b["measured_s"])
                                            for a, b in told_apart)

    figures, summary = plotter().plot(out, doc)
    assert set(figures) == {"layouts", "layouts-moe", "predicted"}
    assert all(f.lstrip().startswith(b"<?xml") and b"<svg" in f[:1000] for f in figures.values())
    assert "| 1 | 1 rank (baseline of the 2-rank job) |" in summary and "| 2 | EP2 k=2 |" in summary and "predicted / measured" in summary


def moe_shapes(w, k):
    from reference_impl.parallel import moe

    return moe.param_shapes(moe.MoEConfig(n_embd=w.n_embd, n_experts=8, top_k=k))


def test_predicted_needs_the_layouts_section(tmp_path, monkeypatch, capsys):
    out = tmp_path / "model_parallel.json"
    out.write_text(json.dumps({"benchmark": "model_parallel", "machine": {}}))
    with pytest.raises(SystemExit):
        mp.main(["--only", "predicted", "--out", str(out)])
    assert "the predicted section needs the layouts section" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mp.main(["--only", "layouts", "--layouts-ranks", "3", "--out", str(out)])
    assert "--layouts-ranks '3' must name some of [2, 4] (not [3])" in capsys.readouterr().err


def test_loss_check_names_the_layout_and_step():
    from benchmarks import model_parallel_layouts as lay

    ok = {"1 rank": [4.0, 3.5], "DP": [4.0 * (1 + 1e-6), 3.5], "TP2": [4.0, 3.5 * (1 - 2e-5)]}
    assert lay.check_losses(ok, "1 rank") == pytest.approx(2e-5)
    with pytest.raises(AssertionError,
                       match=r"layout PP2: loss 3\.6 at step 1 differs from 1 rank's 3\.5 by 2\.86e-02"):
        lay.check_losses({**ok, "PP2": [4.0, 3.6]}, "1 rank")
    with pytest.raises(AssertionError, match="layout PP2: 1 losses, 1 rank has 2"):
        lay.check_losses({**ok, "PP2": [4.0]}, "1 rank")


def test_kendall_and_slowest():
    from benchmarks import model_parallel_layouts as lay

    assert lay.kendall(["a", "b", "c"], ["a", "b", "c"]) == (1.0, [])
    assert lay.kendall(["a", "b", "c"], ["c", "b", "a"]) == (-1.0, [["a", "b"], ["a", "c"], ["b", "c"]])
    tau, swapped = lay.kendall(["a", "b", "c", "d"], ["b", "a", "c", "d"])
    assert swapped == [["a", "b"]] and tau == pytest.approx(1 - 2 / 6)
    with pytest.raises(ValueError, match="different names"):
        lay.kendall(["a", "b"], ["a", "c"])
    assert lay.slowest([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]


def test_every_layout_fits_its_rank_count():
    """Each layout's grid fills its job (dp x tp x pp = ranks), its micro-batches split the batch
    and the planner accepts it: the sections can never measure a layout the planner refuses."""
    from benchmarks import model_parallel_layouts as lay
    from reference_impl.comm.cost_model import LinkParams
    from reference_impl.parallel import planner

    for name, w in lay.WORKLOADS.items():
        model = planner.Model.from_config(w.config(), w.seq, precision="fp32")
        for ranks, specs in lay.GPT_LAYOUTS.items():
            cluster = planner.local_cluster(1e10, LinkParams(1e-6, 1e-10), ranks)
            for spec in specs:
                row = lay.layout_fields(lay.resolve(spec, w))
                assert row["dp"] * row["tp"] * row["pp"] == ranks, (name, spec)
                assert w.batch % (row["dp"] * row["microbatches"]) == 0, (name, spec)
                est = planner.predict_step(lay._planner_layout(row, w.batch), model, cluster, w.batch)
                assert est.kind in (None, "memory"), (name, spec, est.reason)
    with pytest.raises(ValueError, match=r"no layouts for rank counts \[3\]"):
        lay.layouts_section((3,))
