"""An inference compiler for the graph runtime: freeze, optimise, generate NumPy or C, run.

``freeze`` (variables → constants), the passes ``algebraic_simplification`` and
``elementwise_fusion`` (CSE, constant folding and dead-code removal are the graph runtime's
own), the code generators ``generate_numpy`` and ``generate_c``, and ``jit``, which chains
them and returns a ``CompiledFunction``. The speed tricks sit beside that teaching path, used
by default and switched off with ``jit(..., fast=False)`` or ``LAB_JIT_FAST=0``:
``fast_kernels`` (packed dense panels, batched CSR, the AVX-512 bitmask form, ``.incbin``
arrays) and ``fast_call`` (the crossing into C: ``c_entry``'s extension module, pinned
``ctypes`` slots, the quick check).
"""
from .c_codegen import EMITTERS, UnsupportedOpError, choose_format, generate_c
from .freeze import freeze
from .fusion import ELEMENTWISE, elementwise_fusion
from .jit import INFERENCE_PASSES, CompiledFunction, jit, optimize_for_inference
from .numpy_codegen import generate_numpy
from .simplify import algebraic_simplification

__all__ = ["ELEMENTWISE", "EMITTERS", "INFERENCE_PASSES", "CompiledFunction", "UnsupportedOpError",
           "algebraic_simplification", "choose_format", "elementwise_fusion", "freeze", "generate_c",
           "generate_numpy", "jit", "optimize_for_inference"]
