//===- Passes.td - moe-mlir conversion passes --------------*- tablegen -*-===//
#ifndef MOE_CONVERSION_PASSES_TD
#define MOE_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertMoEToLinalg : Pass<"convert-moe-to-linalg", "ModuleOp"> {
  let summary = "Lower every moe op to linalg, tensor, scf, arith and math";
  let description = [{
    The reference semantics of the `moe` dialect, as upstream tensor-level
    ops that every MLIR backend can compile (the CPU pipeline runs them).

    - `!moe.mx` values become two tensors, the data and the E8M0 scales,
      across function signatures, calls and returns too;
    - `moe.quantize` / `moe.dequantize` become `linalg.generic`s built from
      the shared MX arithmetic (bit-exact, see `moe.quantize`);
    - `moe.grouped_matmul`(`_wgrad`) and `moe.experts` become an `scf.for`
      over experts around a matmul / the body on that expert's rows;
    - `moe.grouped_mlp` is first expanded (see `-moe-expand-grouped-mlp`);
    - `moe.router`, `moe.dispatch` become loops over tokens;
      `moe.combine` a gather-and-reduce `linalg.generic`;
    - `moe.all_to_all` over a group of one rank is a copy; larger groups
      need the communication runtime and are reported as errors here.

    With `parallel`, router, dispatch and the grouped matmuls are lowered
    to data-parallel `linalg.generic`s instead (each output element computed
    on its own, loops only inside generic bodies), with identical results:
    the form GPU pipelines map to threads. `moe.experts` has no such form:
    run `-moe-group-experts` first.
  }];
  let options = [
    Option<"parallel", "parallel", "bool", /*default=*/"false",
           "Lower router, dispatch and grouped matmuls to data-parallel "
           "linalg (for GPUs) instead of host loops">
  ];
  let dependentDialects = [
    "::mlir::linalg::LinalgDialect",
    "::mlir::tensor::TensorDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::arith::ArithDialect",
    "::mlir::math::MathDialect",
    "::mlir::func::FuncDialect"
  ];
}

def MoECopyToLinalg : Pass<"moe-copy-to-linalg", "func::FuncOp"> {
  let summary = "Turn memref.copy into linalg.copy";
  let description = [{
    Buffer copies then lower like every other linalg op (to loops on the
    CPU, to kernels on the GPU) instead of calling the `memrefCopy` runtime
    function, so compiled artifacts need no MLIR runtime library.
  }];
  let dependentDialects = ["::mlir::linalg::LinalgDialect"];
}

def MoEDecomposeAggregates : Pass<"moe-decompose-aggregates", "func::FuncOp"> {
  let summary = "Decompose aggregate linalg ops (softmax, ...) into generics";
  let description = [{
    Ops such as `linalg.softmax` have no loop lowering of their own; their
    `AggregatedOpInterface` decomposition into `linalg.generic`s and
    reductions is applied on tensors, before bufferization.
  }];
  let dependentDialects = ["::mlir::linalg::LinalgDialect",
                           "::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect"];
}

def MoEGPUMapLoops : Pass<"moe-gpu-map-loops", "func::FuncOp"> {
  let summary = "Turn bufferized linalg ops into parallel loops mapped to GPU blocks and threads";
  let description = [{
    Prepares bufferized programs (after `-moe-copy-to-linalg`) for
    `convert-parallel-loops-to-gpu`: every linalg op becomes an
    `scf.parallel` nest (reductions stay sequential inside); the innermost
    parallel dimension is tiled by `block-size`, the tiles go to GPU blocks
    and the points of a tile to the threads of a block.
  }];
  let options = [
    Option<"blockSize", "block-size", "int64_t", /*default=*/"128",
           "Threads per block along the innermost parallel dimension">
  ];
  let dependentDialects = ["::mlir::scf::SCFDialect",
                           "::mlir::gpu::GPUDialect",
                           "::mlir::linalg::LinalgDialect"];
}

def MoEGPUDeviceBuffers : Pass<"moe-gpu-device-buffers", "ModuleOp"> {
  let summary = "Place every buffer of host code in GPU memory";
  let description = [{
    After loops became `gpu.launch`es, host code only allocates, copies and
    launches. This pass makes that true for memory too: `memref.alloc` and
    `memref.dealloc` become `gpu.alloc`/`gpu.dealloc`; a `memref.get_global`
    (constants) becomes a device buffer filled by `gpu.memcpy` from the host
    global; host loops still touching buffers (sequential reductions) run as
    one-thread kernels. Function arguments and results are device buffers.
    Host code that would read a device buffer itself (a scalar feeding host
    control flow) is reported as an error with its location.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect",
                           "::mlir::memref::MemRefDialect"];
}

#endif
