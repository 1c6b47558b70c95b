"""moe-mlir from Python.

- ``moe_mlir.Module``: parse and print MLIR, run pass pipelines, compile to a
  shared object (the compiled extension ``moe_mlir._mlir`` over the C API).
- ``moe_mlir.load(path)``: call a compiled artifact's functions with numpy
  arrays (``moe_mlir.runtime``).
- ``moe_mlir.layers``: MoE layers as MLIR, from arguments or a Hugging Face
  ``config.json`` of the Qwen3-MoE family.
- ``moe_mlir.models``: whole MoE language models from a ``config.json``,
  compiled, with their train step; AdamW on numpy arrays.
- ``moe_mlir.hf``: transformers model directories (weights in and out,
  sharded, bf16; the tokenizer of the protein and DNA alphabets), numpy only.
- ``moe_mlir.mx``: the MX block-scaled formats in numpy (independent reference).
- ``moe_mlir.tools``: drive the moe-opt / mlir-runner command-line tools.
"""

from ._errors import MLIRError, RuntimeCallError

__all__ = ["MLIRError", "RuntimeCallError", "Module", "load", "hf", "layers", "models", "mx", "runtime", "tools"]


def __getattr__(name):
    # The extension is imported on first use, so the pure-Python parts work
    # without it (e.g. from a source checkout).
    if name == "Module":
        try:
            from ._mlir import Module
        except ImportError as err:
            raise ImportError(
                "moe_mlir was installed without its compiled extension (moe_mlir._mlir: "
                "Module, layers' and models' compilation); the pure-Python parts (hf, mx, "
                "runtime, load) work. Reinstall with MoeMLIR_DIR=<moe-mlir prefix>/lib/cmake/"
                f"MoeMLIR to build it ({err})") from None
        return Module
    if name == "load":
        from .runtime import load
        return load
    if name in ("hf", "layers", "models", "mx", "runtime", "tools"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'moe_mlir' has no attribute {name!r}")
