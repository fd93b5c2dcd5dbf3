"""Custom ops: an op declared in Python whose kernel is C, compiled, loaded and registered.

``op.CustomOp`` (declaration, build, registration), ``abi`` (the checks and the call across
the C boundary, mirroring ``lab_op.h``), and two examples that register themselves when
imported: ``segment_sum`` (``sparse_segment_sum``) and ``bias_relu`` (``bias_add_relu``).
The examples are not imported here, so importing this package never runs a compiler.
"""
from .abi import InvalidArgumentError, KernelError
from .op import Attr, CustomOp, Input

__all__ = ["Attr", "CustomOp", "Input", "InvalidArgumentError", "KernelError"]
