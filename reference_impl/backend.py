"""The array namespace: which library holds our arrays.

Everything in ``reference_impl`` that touches array data in a portable kernel asks the
inputs for their namespace, ``xp = namespace_of(x)``, and calls only functions of the
Python array API standard on it. That is what lets one piece of code run on NumPy (CPU),
on a GPU, on PyTorch tensors and on ``array_api_strict`` (a namespace that rejects anything
outside the standard, which the tests use to prove the point).

The namespace comes from ``array_api_compat.array_namespace``: NumPy 2, CuPy and
``array_api_strict`` arrays name their namespace themselves (``__array_namespace__``);
PyTorch tensors do not, and array-api-compat supplies a conforming wrapper around
``torch`` for them (``array_api_compat.torch``). NumPy arrays get ``numpy`` itself, which
implements the standard since NumPy 2, so the default path is plain NumPy.

Devices, as ``get_namespace`` names them:

* ``cpu``: NumPy, the default;
* ``gpu``: CuPy (through ``array_api_compat.cupy``) if it is installed and sees a GPU, else
  PyTorch on CUDA. CuPy comes first
  because ``cupy.asarray(x)`` lands on the GPU with no device argument, so the same
  ``xp.asarray`` calls that work on NumPy put data on the GPU; PyTorch's namespace creates
  tensors on the CPU unless told otherwise, so that path sets PyTorch's default device to
  CUDA for the process;
* ``torch``: PyTorch tensors on the CPU, through ``array_api_compat.torch``: a second,
  independent implementation of the standard, which proves on a machine without a GPU that
  the GPU path's code is library-neutral;
* ``strict``: ``array_api_strict``.

A module that is inherently NumPy says so in its docstring and calls ``require_numpy`` on
its inputs, so that asking it for another namespace fails at once with its name.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import array_api_compat
import numpy

DEVICES = ("cpu", "gpu", "torch", "strict")


class BackendUnavailable(RuntimeError):
    """The namespace that was asked for cannot be used on this machine."""


def get_namespace(device: str = "cpu") -> ModuleType:
    """Return the array namespace for ``device``: "cpu" (NumPy), "gpu" (CuPy, else PyTorch on
    CUDA), "torch" (PyTorch on the CPU) or "strict" (``array_api_strict``).

    "strict" has the same data as NumPy, but every function outside the array API standard
    is missing, so code that runs on it runs on any conforming library.
    """
    if device == "cpu":
        return numpy
    if device == "gpu":
        return _gpu()
    if device == "torch":
        return _torch()
    if device == "strict":
        import array_api_strict

        return array_api_strict
    raise ValueError(f"unknown device {device!r}: expected one of {', '.join(DEVICES)}")


def _torch() -> ModuleType:
    try:
        import array_api_compat.torch as xp
    except ImportError as exc:
        raise BackendUnavailable(
            "device='torch' needs PyTorch, which is not installed: "
            "install the 'torch' extra (pip install -e '.[torch]')") from exc
    return xp


def _gpu() -> ModuleType:
    """CuPy when it is installed and sees a GPU, else PyTorch on CUDA; else why neither works."""
    reasons = []
    try:
        import cupy
    except ImportError:
        reasons.append("CuPy is not installed (the 'gpu' extra: pip install -e '.[gpu]')")
    else:
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001 - a missing or broken CUDA driver: CuPy raises its own types
            reasons.append(f"CuPy cannot use CUDA ({exc})")
        else:
            if count > 0:
                import array_api_compat.cupy as xp  # CuPy with the standard's names filled in

                return xp
            reasons.append("CuPy sees no GPU")
    if not _nvidia_driver():  # answered without importing PyTorch (seconds) only to hear "no"
        reasons.append("no NVIDIA driver is loaded (no /proc/driver/nvidia, no libcuda)")
        raise BackendUnavailable("device='gpu' asked for, but this machine has no usable GPU: "
                                 + "; ".join(reasons))
    try:
        import torch
    except ImportError:
        reasons.append("PyTorch is not installed")
    else:
        if torch.cuda.is_available():
            torch.set_default_device("cuda")  # xp.asarray / xp.zeros then allocate on the GPU
            return _torch()
        reasons.append(f"PyTorch {torch.__version__} sees no CUDA device")
    raise BackendUnavailable("device='gpu' asked for, but this machine has no usable GPU: "
                             + "; ".join(reasons))


def _nvidia_driver() -> bool:
    """Is an NVIDIA driver loaded here (what CUDA, hence PyTorch on CUDA, needs)?"""
    import ctypes.util
    import os

    return os.path.exists("/proc/driver/nvidia") or ctypes.util.find_library("cuda") is not None


def namespace_of(*xs: Any) -> ModuleType:
    """The array namespace that owns arrays ``xs`` (all must share one): ``numpy`` for NumPy
    arrays, ``array_api_compat.torch`` for PyTorch tensors, the array's own
    ``__array_namespace__()`` otherwise."""
    for x in xs:  # the common case, all NumPy arrays, answered at once (a loop: no generator)
        if type(x) is not numpy.ndarray:
            break
    else:
        if xs:
            return numpy
    try:
        xp = array_api_compat.array_namespace(*xs)
    except TypeError:
        kinds = ", ".join(dict.fromkeys(type(x).__name__ for x in xs))
        if len(xs) == 1:
            raise TypeError(f"expected an array (of NumPy, CuPy, PyTorch or another array-API library), "
                            f"got {kinds}") from None
        raise TypeError(f"expected arrays of one array-API namespace, got {kinds}") from None
    return numpy if xp.__name__ == "array_api_compat.numpy" else xp


def is_numpy(xp: ModuleType) -> bool:
    """Is ``xp`` NumPy (the default namespace, where NumPy-only modules may run)?"""
    return xp is numpy


def require_numpy(module: str, *xs: Any) -> None:
    """Refuse arrays of any namespace but NumPy in a module that is NumPy-only, naming it."""
    for x in xs:
        if isinstance(x, (numpy.ndarray, numpy.generic)):
            continue
        if hasattr(x, "__array_namespace__") or type(x).__module__.partition(".")[0] in ("torch", "cupy"):
            raise TypeError(f"{module} is NumPy-only: it got a {type(x).__module__}.{type(x).__name__}; "
                            "pass NumPy arrays (backend.to_numpy) or use a ported module")


def dtype(xp: ModuleType, name: str) -> Any:
    """The dtype of ``xp`` named ``name`` ("float32", "int64", "bool" ...)."""
    found = getattr(xp, name, None)
    if found is None:
        raise TypeError(f"the namespace {xp.__name__} has no dtype {name!r}")
    return found


def dtype_name(dt: Any) -> str:
    """The standard name of dtype ``dt`` ("float32" ...), whatever its library."""
    name = getattr(dt, "name", None)
    if isinstance(name, str):
        return name
    return str(dt).rpartition(".")[2]  # torch.float32 -> float32


def to_numpy(x: Any) -> "Any":
    """Copy any supported array to a NumPy array (for printing, comparison and MPI buffers)."""
    if isinstance(x, numpy.ndarray):
        return x
    if isinstance(x, numpy.generic):
        return numpy.asarray(x)
    module = type(x).__module__
    if module.startswith("cupy"):
        return x.get()
    if module.startswith("torch"):
        return x.detach().cpu().numpy()
    return numpy.from_dlpack(x)
