"""An inference compiler for the graph runtime: freeze, optimise, generate NumPy or C, run.

``freeze`` (variables → constants), the passes ``algebraic_simplification`` and
``elementwise_fusion`` (CSE, constant folding and dead-code removal are the graph runtime's
own), the code generators ``generate_numpy`` and ``generate_c``, and ``jit``, which chains
them and returns a ``CompiledFunction`` (``c_entry`` writes the Python-to-C call in C).
"""
from .c_codegen import UnsupportedOpError, choose_format, generate_c
from .freeze import freeze
from .fusion import ELEMENTWISE, elementwise_fusion
from .jit import INFERENCE_PASSES, CompiledFunction, jit, optimize_for_inference
from .numpy_codegen import generate_numpy
from .simplify import algebraic_simplification

__all__ = ["ELEMENTWISE", "INFERENCE_PASSES", "CompiledFunction", "UnsupportedOpError", "algebraic_simplification",
           "choose_format", "elementwise_fusion", "freeze", "generate_c", "generate_numpy", "jit",
           "optimize_for_inference"]
