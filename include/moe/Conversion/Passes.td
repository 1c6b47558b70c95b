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

#endif
