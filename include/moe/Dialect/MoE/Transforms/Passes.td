//===- Passes.td - moe dialect passes ----------------------*- tablegen -*-===//
#ifndef MOE_TRANSFORMS_PASSES_TD
#define MOE_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def MoEExpandGroupedMlp : Pass<"moe-expand-grouped-mlp"> {
  let summary = "Expand moe.grouped_mlp into grouped matmuls, SwiGLU and quantize";
  let description = [{
    The inverse of fusion: every `moe.grouped_mlp` becomes the op sequence
    that defines it (`moe.grouped_matmul` to f32, `moe.swiglu`, a rowwise
    `moe.quantize` when `w2` is block-scaled, `moe.grouped_matmul`). Used by
    lowerings without a fused kernel and to check a fused kernel against its
    definition.
  }];
}

#endif
