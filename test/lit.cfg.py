# -*- Python -*-
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "MOE"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".py", ".test"]
# torch_results.py and torch_patch_gpu.py need a GPU: scripts/gpu-check.sh runs them there.
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "CMakeLists.txt", "Inputs", "pylib",
                   "consumer", "torch_results.py", "torch_patch_gpu.py"]
# The sanitized build (scripts/build.sh --sanitized): python3 cannot load
# sanitized libraries, so the Python tests (and the C API and install tests,
# whose libraries that build skips) run on the Release build only.
if config.moe_sanitizer:
    config.suffixes = [".mlir", ".test"]
    config.excludes += ["python", "Install", "CAPI"]
    # (User poisoning off: see scripts/fuzz.sh.)
    config.environment["ASAN_OPTIONS"] = "detect_leaks=0:allow_user_poisoning=0:abort_on_error=1"
    config.environment["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.moe_obj_root, "test")

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.moe_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)

# Our Python (the project venv: numpy, ml_dtypes) before lit's own %python.
config.substitutions.insert(0, ("%python", config.python_executable))
config.substitutions.append(("%moe_obj_root", config.moe_obj_root))
# lit itself (tests of the test command's settings).
config.substitutions.append(("%lit", "/usr/lib/llvm-22/bin/lit"))
config.substitutions.append(("%cxx", config.cxx))
config.substitutions.append(("%cc", config.cc))
config.substitutions.append(("%moe_src_root", config.moe_src_root))
config.substitutions.append(
    ("%mlir_runner_utils", config.mlir_runner_utils))
config.substitutions.append(
    ("%mlir_c_runner_utils", config.mlir_c_runner_utils))
# Compile a moe program for the CPU and run its @main.
config.substitutions.append(
    ("%run_cpu",
     "moe-opt --moe-cpu-pipeline | mlir-runner -e main -entry-point-result=void "
     f"-shared-libs={config.mlir_runner_utils},{config.mlir_c_runner_utils}"))

config.environment["MOE_RUNNER_LIBS"] = (
    f"{config.mlir_runner_utils},{config.mlir_c_runner_utils}")

# The package, and test/pylib (what the Python tests share).
config.environment["PYTHONPATH"] = os.pathsep.join(
    [os.path.join(config.moe_obj_root, "python_packages"),
     os.path.join(config.test_source_root, "pylib")])
config.environment["MOE_MLIR_BUILD"] = config.moe_obj_root

# The same, with the data-parallel lowering (what the GPU pipeline maps to
# threads): results must not change.
config.substitutions.append(
    ("%run_parallel_cpu",
     "moe-opt --convert-moe-to-linalg=parallel=true | moe-opt --moe-cpu-pipeline | "
     "mlir-runner -e main -entry-point-result=void "
     f"-shared-libs={config.mlir_runner_utils},{config.mlir_c_runner_utils}"))

# ptxas (from the CUDA toolkit) checks the generated kernels.
import shutil
cuda_bin = os.path.dirname(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
llvm_config.with_environment("PATH", cuda_bin, append_path=True)

# Expert parallelism across processes: Open MPI's mpirun (as root in CI
# containers, more ranks than cores, no ptrace-based single copy). Tests that
# need it say `REQUIRES: mpi`; it is there when mpirun is and libmoert was
# built with its MPI backend. Python tests get the command in MOE_MPIRUN.
mpirun = shutil.which("mpirun")
libmoert = os.path.join(config.moe_obj_root, "lib", "libmoert.so")
try:
    with open(libmoert, "rb") as f:
        moert_has_mpi = b"MPI_Init_thread" in f.read()
except OSError:
    moert_has_mpi = False
if mpirun and moert_has_mpi:
    config.available_features.add("mpi")
    # (under `timeout`: a test that hangs fails instead of stopping the suite)
    mpirun_cmd = (f"timeout -k 10 300 {mpirun} --allow-run-as-root --oversubscribe "
                  "--mca btl_vader_single_copy_mechanism none")
    config.substitutions.append(("%mpirun", mpirun_cmd))
    config.environment["MOE_MPIRUN"] = mpirun_cmd

tools = ["moe-opt", "moe-compile", "moe-model", "moe-train", "moe-capi-test", "moe-ir-fuzzer",
         "moe-reader-fuzzer", "mlir-runner", "FileCheck", "not", "count",
         "moert-allocator-test", "moert-gpu-info", "moert-seq-info", "moert-comm-test", "moert-ep-check",
         "moert-train-test", "moert-train"]
llvm_config.add_tool_substitutions(tools, [config.moe_tools_dir, config.llvm_tools_dir])
