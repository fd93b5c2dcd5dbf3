"""The array namespace: which library holds our arrays.

Everything in ``reference_impl`` that touches array data asks for a namespace ``xp`` and
uses only functions of the Python array API standard on it. That is what lets one piece
of code run on NumPy (CPU), CuPy (GPU) and ``array_api_strict`` (a namespace that rejects
anything outside the standard, used by the tests to prove the point).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

DEVICES = ("cpu", "gpu", "strict")


class BackendUnavailable(RuntimeError):
    """The namespace that was asked for cannot be used on this machine."""


def get_namespace(device: str = "cpu") -> ModuleType:
    """Return the array namespace for ``device``: "cpu" (NumPy), "gpu" (CuPy) or "strict".

    "strict" is ``array_api_strict``: the same data as NumPy, but every function outside
    the array API standard is missing, so code that runs on it runs on any conforming library.
    """
    if device == "cpu":
        import numpy

        return numpy
    if device == "gpu":
        return _cupy()
    if device == "strict":
        import array_api_strict

        return array_api_strict
    raise ValueError(f"unknown device {device!r}: expected one of {', '.join(DEVICES)}")


def _cupy() -> ModuleType:
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailable(
            "device='gpu' needs CuPy, which is not installed: "
            "install the 'gpu' extra (pip install -e '.[gpu]') on a machine with CUDA"
        ) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing or broken: CuPy raises its own types
        raise BackendUnavailable(f"device='gpu' asked for, but CUDA is not usable: {exc}") from exc
    if count == 0:
        raise BackendUnavailable("device='gpu' asked for, but CuPy sees no GPU on this machine")
    return cupy


def namespace_of(x: Any) -> ModuleType:
    """The array namespace that owns array ``x`` (its ``__array_namespace__``)."""
    get = getattr(x, "__array_namespace__", None)
    if get is None:
        raise TypeError(
            f"expected an array (an object with __array_namespace__), got {type(x).__name__}"
        )
    return get()


def to_numpy(x: Any) -> "Any":
    """Copy any supported array to a NumPy array (for printing, comparison and MPI buffers)."""
    import numpy

    if isinstance(x, numpy.ndarray):
        return x
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return numpy.from_dlpack(x)
