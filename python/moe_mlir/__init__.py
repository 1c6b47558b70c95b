"""moe-mlir from Python.

- ``moe_mlir.mx``: the MX (OCP microscaling) block-scaled formats in numpy, an
  independent reference of the compiler's ``moe.quantize``/``moe.dequantize``.
- ``moe_mlir.tools``: compile a ``moe`` program for the CPU with ``moe-opt`` and
  run it, reading the tensors it prints back as numpy arrays.
"""

from . import mx, tools  # noqa: F401

__all__ = ["mx", "tools"]
