"""Fitting α, β, γ (cost_model) and measuring them (calibrate), checked independently.

* the fits recover known parameters from exact and from noisy synthetic data, agree with
  NumPy's own weighted ``polyfit``, and report R² and relative residuals as defined;
* plain least squares on the seconds gets α badly wrong on the same data: the reason the
  fit minimises relative errors;
* bad input is refused with a message that names what is wrong;
* ``pingpong`` and ``reduction_time`` measure on real thread ranks (no timing asserted
  beyond positivity and shape: figures come from the benchmark, not from tests);
* the alpha_beta benchmark runs end to end on a tiny sweep and writes well-formed JSON.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from reference_impl.comm import run_threads
from reference_impl.comm.calibrate import calibrate, pingpong, reduction_time
from reference_impl.comm.cost_model import (
    FittedLinkParams, LinkParams, fit_alpha_beta, fit_gamma, fit_line, ring_allreduce_time,
)

from conftest import ROOT

pytestmark = pytest.mark.timeout(120)

SIZES = [2.0**k for k in range(3, 27)]  # 8 B .. 64 MiB, as the benchmark sweeps


def synthetic(alpha, beta, noise, rng, sizes=SIZES):
    """Times of ``alpha + m beta`` with multiplicative noise of relative size ``noise``."""
    m = np.asarray(sizes)
    return (alpha + m * beta) * (1 + noise * rng.standard_normal(m.size))


def test_exact_data_gives_exact_parameters():
    link = fit_alpha_beta(SIZES, 20e-6 + np.asarray(SIZES) / 1.25e9)
    assert isinstance(link, FittedLinkParams) and isinstance(link, LinkParams)
    assert link.alpha == pytest.approx(20e-6, rel=1e-9) and link.beta == pytest.approx(8e-10, rel=1e-9)
    assert link.gamma == 0.0 and link.fit.r_squared == pytest.approx(1.0)
    assert link.fit.max_relative_error < 1e-9


@pytest.mark.parametrize("seed", range(5))
def test_noisy_data_recovers_parameters_and_matches_numpy_weighted_polyfit(seed):
    rng = np.random.default_rng(seed)
    alpha, beta = 10 ** rng.uniform(-6.5, -4), 1 / 10 ** rng.uniform(9, 10.5)
    t = synthetic(alpha, beta, 0.03, rng)
    link = fit_alpha_beta(SIZES, t)
    assert link.alpha == pytest.approx(alpha, rel=0.1) and link.beta == pytest.approx(beta, rel=0.1)
    # Independent: polyfit minimises sum (w_i (t_i - p(m_i)))^2, so w = 1/t is relative error.
    slope, intercept = np.polyfit(SIZES, t, 1, w=1 / t)
    assert link.alpha == pytest.approx(intercept, rel=1e-6) and link.beta == pytest.approx(slope, rel=1e-6)
    fitted = intercept + slope * np.asarray(SIZES)
    r2 = 1 - np.sum((t - fitted) ** 2) / np.sum((t - t.mean()) ** 2)
    assert link.fit.r_squared == pytest.approx(r2, rel=1e-9)
    assert link.fit.relative_residuals == pytest.approx(list((t - fitted) / fitted), rel=1e-6, abs=1e-12)
    assert link.fit.predict(4096) == pytest.approx(intercept + 4096 * slope)


def test_plain_least_squares_on_seconds_would_get_alpha_wrong():
    """Why relative errors: the largest messages' noise swamps the latency in plain least squares."""
    errors_relative, errors_plain = [], []
    for seed in range(40):
        t = synthetic(20e-6, 8e-10, 0.05, np.random.default_rng(seed))
        errors_relative.append(abs(fit_alpha_beta(SIZES, t).alpha / 20e-6 - 1))
        plain_intercept = np.polyfit(SIZES, t, 1)[1]
        errors_plain.append(abs(plain_intercept / 20e-6 - 1))
    assert np.median(errors_relative) < 0.05 < 0.5 < np.median(errors_plain)


def test_fit_gamma_is_the_slope_of_reduction_time():
    sizes = [2.0**k for k in range(12, 27)]
    t = 2e-6 + np.asarray(sizes) / 20e9  # 2 us call overhead, 20 GB/s
    assert fit_gamma(sizes, t) == pytest.approx(1 / 20e9, rel=1e-9)


@pytest.mark.parametrize(
    "sizes, times, message",
    [
        ([8, 16, 32], [1e-6, 2e-6], "got 3 sizes but 2 times"),
        ([64, 64, 64], [1e-6, 1.1e-6, 0.9e-6], "at least two distinct sizes"),
        ([8, 16], [1e-6, 0.0], "times must be finite and > 0"),
        ([8, 16], [1e-6, -2e-6], "times must be finite and > 0"),
        ([8, 16], [1e-6, float("nan")], "times must be finite and > 0"),
        ([-8, 16], [1e-6, 2e-6], "sizes must be finite and >= 0"),
        ([8, 1 << 20], [1e-3, 1e-6], "alpha = .* beta = .*time per byte > 0"),
        ([8, 1 << 20], [1e-6, 1e-3 + 1e-6], None),  # alpha ~0 but fine
    ],
)
def test_bad_input_is_refused_with_a_clear_message(sizes, times, message):
    if message is None:
        fit_alpha_beta(sizes, times)
        return
    with pytest.raises(ValueError, match=message):
        fit_alpha_beta(sizes, times)


def test_fit_line_names_what_it_fits():
    with pytest.raises(ValueError, match="fit gamma: .*two distinct"):
        fit_gamma([1024], [1e-6])
    with pytest.raises(ValueError, match="fit gamma: reduction time does not grow"):
        fit_gamma([1024, 2048], [2e-6, 1e-6])
    assert fit_line([0, 1], [1.0, 3.0]).slope == pytest.approx(2.0)


# --------------------------------------------------------------------------- measuring


def test_pingpong_on_thread_ranks_returns_one_time_per_size_on_rank_0():
    sizes = [8, 4096, 1 << 16]
    results = run_threads(3, lambda c: pingpong(c, sizes, repeats=3, warmup=1), timeout=30)
    assert results[1] is None and results[2] is None
    assert len(results[0]) == 3 and all(t > 0 for t in results[0])


def test_pingpong_and_calibrate_refuse_bad_input():
    with pytest.raises(ValueError, match="at least 2 ranks, the communicator has 1"):
        run_threads(1, lambda c: pingpong(c, [8]))
    with pytest.raises(ValueError, match="repeats >= 1"):
        run_threads(2, lambda c: pingpong(c, [8], repeats=0))
    with pytest.raises(ValueError, match="sizes must be a non-empty list"):
        run_threads(2, lambda c: calibrate(c, sizes=[]))


def test_reduction_time_times_the_in_place_add():
    times = reduction_time(np, [4096, 1 << 20], repeats=3)
    assert len(times) == 2 and all(t > 0 for t in times)
    calls = []
    reduction_time(np, [64], repeats=2, warmup=1, sync=lambda: calls.append(1))
    assert len(calls) == 3  # sync after every timed and warm-up call


def test_calibrate_on_thread_ranks_gives_every_rank_the_same_link():
    links = run_threads(2, lambda c: calibrate(c, sizes=[8, 1 << 12, 1 << 16, 1 << 20], repeats=5,
                                               reduction_sizes=[1 << 16, 1 << 20]), timeout=60)
    assert links[0] == links[1]
    assert links[0].alpha >= 0 and links[0].beta > 0 and links[0].gamma > 0


# --------------------------------------------------------------------------- the benchmark


def test_alpha_beta_benchmark_writes_json(tmp_path):
    out = tmp_path / "alpha_beta.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", "alpha_beta", "--max-bytes", str(64 << 10),
         "--ranks", "2", "--allreduce-sizes", "64,4096", "--warmup", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "alpha_beta" and "MPICH" in doc["machine"]["mpi_library"]
    assert [r["bytes"] for r in doc["pingpong"]] == [2**k for k in range(3, 17)]
    fit = doc["fit"]
    refit = fit_alpha_beta([r["bytes"] for r in doc["pingpong"]], [r["time_s"] for r in doc["pingpong"]])
    assert fit["alpha_s"] == refit.alpha and fit["beta_s_per_byte"] == refit.beta
    assert fit["n_half_bytes"] == pytest.approx(fit["alpha_s"] / fit["beta_s_per_byte"])
    link = LinkParams(fit["alpha_s"], fit["beta_s_per_byte"], fit["gamma_s_per_byte"])
    assert {(r["ranks"], r["bytes"]) for r in doc["results"]} == {(2, 64), (2, 4096)}
    for r in doc["results"]:
        assert r["predicted_s"] == pytest.approx(ring_allreduce_time(r["bytes"], r["ranks"], link))
        assert r["measured_s"] > 0 and r["measured_over_predicted"] == pytest.approx(r["measured_s"] / r["predicted_s"])


def test_plotter_draws_the_committed_file_and_refuses_a_broken_one(tmp_path):
    sys.path.append(str(ROOT / "docs" / "hooks"))
    import plot_alpha_beta
    from mkdocs.exceptions import PluginError

    path = ROOT / "docs" / "assets" / "bench" / "alpha_beta.json"
    data = json.loads(path.read_text())
    svgs, summary = plot_alpha_beta.plot(path, data)
    assert set(svgs) == {"pingpong", "residuals", "allreduce"}
    assert all(b"<path" in svg and b'id="line2d_' in svg for svg in svgs.values())
    assert "| α |" in summary and "*Machine:*" in summary
    broken = dict(data, fit={k: v for k, v in data["fit"].items() if k != "alpha_s"})
    with pytest.raises(PluginError, match="'fit' must be an object with numbers alpha_s"):
        plot_alpha_beta.plot(path, broken)
