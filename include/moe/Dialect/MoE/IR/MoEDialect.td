//===- MoEDialect.td - the moe dialect ---------------------*- tablegen -*-===//
#ifndef MOE_DIALECT_TD
#define MOE_DIALECT_TD

include "mlir/IR/OpBase.td"

def MoE_Dialect : Dialect {
  let name = "moe";
  let cppNamespace = "::mlir::moe";
  let summary = "Mixture-of-Experts routing, expert groups and block-scaled MX tensors";
  let description = [{
    The `moe` dialect describes a Mixture-of-Experts (MoE) layer at the tensor
    level, with value semantics:

    ```
    logits ──moe.router──► (expert indices, combine weights)
    tokens ──moe.dispatch──► tokens sorted by expert, group offsets, positions
           ──moe.grouped_matmul / moe.swiglu / moe.grouped_mlp──► expert outputs
           ──moe.combine──► tokens (weighted sum over the top-k experts)
    ```

    Expert weights are stacked on a leading expert dimension `E`. Groups of
    rows are described by an `offsets` tensor of `E + 1` integers: rows
    `[offsets[e], offsets[e+1])` belong to expert `e`; rows at or beyond
    `offsets[E]` belong to no expert and produce zeros.

    Block-scaled "MX" tensors (`!moe.mx<...>`) carry 8-bit (or smaller)
    elements and one power-of-two E8M0 scale per block of 32 consecutive
    values along one axis, with the exact semantics of the OCP MX
    specification (see `moe.quantize`).
  }];
  let useDefaultTypePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerTypes();
  }];
  let dependentDialects = [
    "::mlir::tensor::TensorDialect",
    "::mlir::arith::ArithDialect"
  ];
}

class MoE_Op<string mnemonic, list<Trait> traits = []>
    : Op<MoE_Dialect, mnemonic, traits>;

#endif // MOE_DIALECT_TD
