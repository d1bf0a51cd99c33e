"""TensorFlow 2 front end: lowering Keras training steps, profiling, code generation, compiling a step
for a budget and measuring it, the model zoo.

Importing this package imports TensorFlow; the submodules load on first use of their names.
``checkmate.tf2.compile`` is the function :func:`checkmate.tf2.step.compile`.
"""

from __future__ import annotations

import importlib

from checkmate.kernels import prefer_onednn

# before TensorFlow starts: the CPU kernels whose temporaries the plan accounts for (checkmate.kernels)
prefer_onednn()

from checkmate.tf2.lowered import LoweredGraph  # noqa: E402

__all__ = ["LoweredGraph", "lower", "zoo", "build_model", "lowering", "profiling",
           "compile", "compile_lowered", "CompiledStep", "RematModel", "measure_peak_memory", "generate", "codegen",
           "memory", "step", "keras_model", "measure"]

# Public name -> (module, attribute or None for the module itself).
_LAZY = {
    "lower": ("checkmate.tf2.lowering", "lower"),
    "lowering": ("checkmate.tf2.lowering", None),
    "profiling": ("checkmate.tf2.profiling", None),
    "zoo": ("checkmate.tf2.zoo", None),
    "build_model": ("checkmate.tf2.zoo", "build_model"),
    "compile": ("checkmate.tf2.step", "compile"),
    "compile_lowered": ("checkmate.tf2.step", "compile_lowered"),
    "CompiledStep": ("checkmate.tf2.step", "CompiledStep"),
    "RematModel": ("checkmate.tf2.keras_model", "RematModel"),
    "step": ("checkmate.tf2.step", None),
    "keras_model": ("checkmate.tf2.keras_model", None),
    "measure": ("checkmate.tf2.measure", None),
    "measure_peak_memory": ("checkmate.tf2.memory", "measure_peak_memory"),
    "generate": ("checkmate.tf2.codegen", "generate"),
    "codegen": ("checkmate.tf2.codegen", None),
    "memory": ("checkmate.tf2.memory", None),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'checkmate.tf2' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value
