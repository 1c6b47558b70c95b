"""Drive the moe-mlir tools: compile a program for the CPU and run it.

``run_cpu(source)`` compiles MLIR text with ``moe-opt --moe-cpu-pipeline``, runs
its ``@main`` with ``mlir-runner`` and returns every tensor the program printed
(``printMemrefF32`` / ``printMemrefI32``) as a flat numpy array, in order.
Tools are looked up on PATH, then in ``MOE_MLIR_BUILD/bin`` and
``/usr/lib/llvm-22``.
"""

import os
import re
import shutil
import subprocess

import numpy as np

LLVM = os.environ.get("MOE_LLVM_DIR", "/usr/lib/llvm-22")


class ToolError(RuntimeError):
    """A tool failed; the message carries its diagnostics."""


def _find(tool):
    build = os.environ.get("MOE_MLIR_BUILD")
    for candidate in ([os.path.join(build, "bin", tool)] if build else []) + \
            [shutil.which(tool) or "", os.path.join(LLVM, "bin", tool)]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ToolError(f"cannot find {tool}: put it on PATH or set MOE_MLIR_BUILD")


def runner_libs():
    libs = os.environ.get("MOE_RUNNER_LIBS")
    if libs:
        return libs
    return ",".join(os.path.join(LLVM, "lib", n)
                    for n in ("libmlir_runner_utils.so", "libmlir_c_runner_utils.so"))


def moe_opt(source, *args):
    """Runs moe-opt with the given flags on MLIR text; returns its output."""
    opt = subprocess.run([_find("moe-opt"), *args], input=source, text=True,
                         capture_output=True)
    if opt.returncode:
        raise ToolError("moe-opt failed:\n" + opt.stderr)
    return opt.stdout


def compile_cpu(source, parallel=False):
    """MLIR text -> LLVM-dialect MLIR text. With ``parallel``, moe ops are
    lowered in their data-parallel form (the one GPUs run) first."""
    if parallel:
        source = moe_opt(source, "--convert-moe-to-linalg=parallel=true")
    return moe_opt(source, "--moe-cpu-pipeline")


def run_cpu(source, parallel=False):
    """Compile and run ``@main``; return the printed tensors as numpy arrays."""
    out = subprocess.run([_find("mlir-runner"), "-e", "main", "-entry-point-result=void",
                          "-shared-libs=" + runner_libs()],
                         input=compile_cpu(source, parallel), text=True,
                         capture_output=True)
    if out.returncode:
        raise ToolError("mlir-runner failed:\n" + out.stderr)
    tensors = []
    for dump in out.stdout.split("Unranked Memref")[1:]:
        body = dump.split("data =", 1)[1]
        values = re.findall(r"-?nan|-?inf|-?\d+(?:\.\d*)?(?:e[-+]?\d+)?", body)
        tensors.append(np.array([float(v) for v in values]))
    return tensors
