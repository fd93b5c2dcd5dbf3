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
    with pytest.raises(ValueError, match="unknown device 'tpu'.*cpu, gpu, strict"):
        backend.get_namespace("tpu")


def test_gpu_without_cupy_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # make `import cupy` fail
    with pytest.raises(backend.BackendUnavailable, match="needs CuPy.*gpu"):
        backend.get_namespace("gpu")


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
