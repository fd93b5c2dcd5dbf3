"""``python -m grader check --device cpu|gpu|torch|strict``: the hidden tests run on that array namespace.

Exercise 01 declares ``lab.devices = ["cpu", "gpu", "torch", "strict"]``. On ``strict``
(``array_api_strict``: only the array API standard, on the CPU) the learner's functions get
arrays that have no NumPy-only methods, and on ``torch`` they get PyTorch tensors (through
array-api-compat: a second library, the one ``gpu`` falls back to on CUDA), which is how
this machine, without a GPU, proves that code graded full marks there would also run on the
GPU namespace. Checked here:

* the source notebook of 01 scores full marks on ``strict`` and on ``torch``, and the report
  names the device;
* a solution that copies with the NumPy-only ``.copy()`` scores full marks on ``cpu`` but, on
  ``strict``, loses exactly the tests that call it, with a hint naming the missing ``copy``;
* a device an assignment does not list is refused before grading, in one line;
* ``--device gpu`` without a usable GPU is refused, saying there is none and why.
"""
from __future__ import annotations

from typing import Any

import pytest
from notebook_tools import (
    ROOT,
    Started,
    edit_cell,
    read_nb,
    replacing,
    start_check,
    write_nb,
)

COURSE = ROOT / "exercises"
SOURCE = COURSE / "source" / "01_ring_allreduce" / "ring_allreduce.ipynb"
OTHER = COURSE / "source" / "02_alpha_beta" / "alpha_beta.ipynb"
MAX_SCORE = 25.0

pytestmark = pytest.mark.timeout(240)

# The tests that run reduce_scatter (directly or through ring_allreduce): the ones a
# NumPy-only call inside it costs on strict.
USES_REDUCE_SCATTER = {"test_reduce_scatter_example", "test_allreduce_examples", "hidden_reduce_scatter",
                       "hidden_allreduce_even", "hidden_allreduce_any", "hidden_traffic_per_rank",
                       "hidden_traffic_total"}


def numpy_only_solution() -> dict[str, Any]:
    """01's solution with reduce_scatter sending a ``.copy()``: right on NumPy, not array-API code."""
    return edit_cell(read_nb(SOURCE), "reduce_scatter", replacing(
        "comm.sendrecv(chunks[send_i], right, incoming, left)",
        "comm.sendrecv(chunks[send_i].copy(), right, incoming, left)"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """The gradings of this module, run at once."""
    work = tmp_path_factory.mktemp("device")
    numpy_only = write_nb(work / "numpy_only" / SOURCE.name, numpy_only_solution())
    started = {
        "source_strict": start_check(work, "source_strict", SOURCE, "--device", "strict"),
        "source_torch": start_check(work, "source_torch", SOURCE, "--device", "torch"),
        "numpy_only_cpu": start_check(work, "numpy_only_cpu", numpy_only, "--device", "cpu"),
        "numpy_only_default": start_check(work, "numpy_only_default", numpy_only),
        "numpy_only_strict": start_check(work, "numpy_only_strict", numpy_only, "--device", "strict"),
    }
    return {name: run.wait().result() for name, run in started.items()}


def test_source_scores_full_marks_on_strict(runs):
    result = runs["source_strict"]
    assert [t["id"] for t in result["tests"] if not t["passed"]] == []
    assert result["score"] == result["max_score"] == MAX_SCORE
    assert result["isolation"]["device"] == "strict (array_api_strict)"


def test_source_scores_full_marks_on_pytorch_tensors(runs):
    result = runs["source_torch"]
    assert [t["id"] for t in result["tests"] if not t["passed"]] == []
    assert result["score"] == result["max_score"] == MAX_SCORE
    assert result["isolation"]["device"] == "torch (PyTorch CPU)"


def test_numpy_only_call_passes_on_cpu_and_fails_on_strict(runs):
    on_cpu, on_strict = runs["numpy_only_cpu"], runs["numpy_only_strict"]
    assert on_cpu["score"] == MAX_SCORE and on_cpu["isolation"]["device"] == "cpu (NumPy)"
    failed = {t["id"]: t["hint"] for t in on_strict["tests"] if not t["passed"]}
    assert set(failed) == USES_REDUCE_SCATTER
    for test_id, hint in failed.items():
        assert "(device strict)" in hint and "has no attribute 'copy'" in hint, (test_id, hint)
    lost = sum(t["max_score"] for t in on_strict["tests"] if t["id"] in USES_REDUCE_SCATTER)
    assert on_strict["score"] == MAX_SCORE - lost == 8.0


def test_array_api_assignment_is_graded_on_strict_by_default(runs):
    """01 says its code must be array-API code: without --device it is graded on NumPy and on
    array_api_strict, so a NumPy-only call loses the same points as with --device strict."""
    result = runs["numpy_only_default"]
    assert result["isolation"]["device"] == "cpu (NumPy) and strict (array_api_strict)"
    assert result["score"] == runs["numpy_only_strict"]["score"] == 8.0
    failed = {t["id"]: t["hint"] for t in result["tests"] if not t["passed"]}
    assert set(failed) == USES_REDUCE_SCATTER
    assert all(hint.startswith("on strict (array_api_strict): ") for hint in failed.values()), failed


def test_table_header_names_the_device():
    from grader.report import GradingResult, TestResult

    result = GradingResult("01_ring_allreduce", "nb.ipynb", tests=[TestResult("t", 1, 1, True)],
                           isolation={"device": "strict (array_api_strict)"})
    assert result.to_table().splitlines()[0] == (
        "Assignment 01_ring_allreduce: nb.ipynb  (device: strict (array_api_strict))")


def test_unsupported_device_is_refused_in_one_line(tmp_path):
    assert "devices" not in read_nb(OTHER)["metadata"].get("lab", {})  # so it supports cpu only
    run = Started("check", str(OTHER), "--device", "strict", "--feedback-dir", "fb", cwd=tmp_path).wait()
    assert run.returncode == 2
    assert run.stderr == ("grader: --device strict: assignment 02_alpha_beta supports only cpu "
                          "(its source notebook's lab.devices); grade it with --device cpu\n")
    assert run.stdout == "" and not (tmp_path / "fb").exists()  # refused before grading


def test_device_gpu_without_cupy_gives_the_backend_reason(tmp_path):
    from reference_impl.backend import BackendUnavailable, get_namespace

    try:
        get_namespace("gpu")
    except BackendUnavailable as exc:
        reason = str(exc)
    else:
        pytest.skip("CuPy and a GPU are usable here: --device gpu would grade")
    assert reason.startswith("device='gpu' asked for, but this machine has no usable GPU: "), reason
    run = Started("check", str(SOURCE), "--device", "gpu", "--feedback-dir", "fb", cwd=tmp_path).wait()
    assert run.returncode == 2
    assert run.stderr == f"grader: --device gpu refused: {reason}\n"
    assert not (tmp_path / "fb").exists()
