"""reference_impl.backend: picking the array namespace, and clear errors when it cannot."""
import sys

import numpy as np
import pytest

from reference_impl import backend


def test_cpu_is_numpy():
    assert backend.get_namespace() is np
    assert backend.get_namespace("cpu") is np


def test_strict_namespace_rejects_numpy_extras():
    xp = backend.get_namespace("strict")
    a = xp.asarray([1.0, 2.0])
    assert backend.namespace_of(a) is xp
    # array_api_strict has no NumPy-only helpers: code that passes on it uses only the standard.
    assert not hasattr(xp, "cumproduct") and not hasattr(xp, "fromiter")
    np.testing.assert_array_equal(backend.to_numpy(a), [1.0, 2.0])


def test_unknown_device_names_the_choices():
    with pytest.raises(ValueError, match="unknown device 'tpu'.*cpu, gpu, torch, strict"):
        backend.get_namespace("tpu")


def test_gpu_without_cupy_or_cuda_says_exactly_that(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # make `import cupy` fail
    import torch

    no_cupy = "CuPy is not installed (the 'gpu' extra: pip install -e '.[gpu]')"
    monkeypatch.setattr(backend, "_nvidia_driver", lambda: False)
    with pytest.raises(backend.BackendUnavailable) as info:
        backend.get_namespace("gpu")
    assert str(info.value) == ("device='gpu' asked for, but this machine has no usable GPU: "
                               f"{no_cupy}; no NVIDIA driver is loaded (no /proc/driver/nvidia, no libcuda)")
    monkeypatch.setattr(backend, "_nvidia_driver", lambda: True)  # a driver, but PyTorch finds no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(backend.BackendUnavailable) as info:
        backend.get_namespace("gpu")
    assert str(info.value) == ("device='gpu' asked for, but this machine has no usable GPU: "
                               f"{no_cupy}; PyTorch {torch.__version__} sees no CUDA device")


def test_torch_namespace_through_array_api_compat():
    import torch

    xp = backend.get_namespace("torch")
    assert xp.__name__ == "array_api_compat.torch"
    t = torch.arange(3, dtype=torch.float32)  # a plain tensor: no __array_namespace__ of its own
    assert backend.namespace_of(t) is xp and backend.dtype_name(t.dtype) == "float32"
    np.testing.assert_array_equal(backend.to_numpy(xp.cumulative_sum(t)), [0.0, 1.0, 3.0])
    assert backend.namespace_of(np.ones(2)) is np  # NumPy 2 is its own conforming namespace


def test_mixed_namespaces_and_numpy_only_modules_are_refused_by_name():
    import torch

    with pytest.raises(TypeError, match="one array-API namespace, got ndarray, Tensor"):
        backend.namespace_of(np.ones(2), torch.ones(2))
    backend.require_numpy("reference_impl.sparsity.formats", np.ones(2), 3)
    with pytest.raises(TypeError, match=r"^reference_impl\.sparsity\.formats is NumPy-only: it got a torch\.Tensor"):
        backend.require_numpy("reference_impl.sparsity.formats", np.ones(2), torch.ones(2))


def test_gpu_when_available():
    try:
        xp = backend.get_namespace("gpu")
    except backend.BackendUnavailable as exc:
        pytest.skip(f"no GPU here: {exc}")
    x = xp.arange(4)
    assert backend.namespace_of(x) is xp


def test_namespace_of_non_array_names_the_type():
    with pytest.raises(TypeError, match="got list"):
        backend.namespace_of([1, 2, 3])
