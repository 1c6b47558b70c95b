//===- MoETypeInterfaces.td - moe dialect type interfaces --*- tablegen -*-===//

#ifndef MOE_TYPE_INTERFACES_TD
#define MOE_TYPE_INTERFACES_TD

include "mlir/IR/OpBase.td"

def MoE_BlockScaledTypeInterface : TypeInterface<"BlockScaledType"> {
  let cppNamespace = "::mlir::moe";
  let description = [{
    A tensor of narrow elements whose blocks share scales (`!moe.mx`,
    `!moe.fp8block`): a shape, an element type, and the two tensors it
    lowers to, the data and the scales.
  }];
  let methods = [
    InterfaceMethod<"The shape of the represented tensor.",
                    "::llvm::ArrayRef<int64_t>", "getShape">,
    InterfaceMethod<"The narrow element type.", "::mlir::Type",
                    "getElementType">,
    InterfaceMethod<"The tensor holding the narrow elements.",
                    "::mlir::RankedTensorType", "getDataType">,
    InterfaceMethod<"The tensor holding the scales.",
                    "::mlir::RankedTensorType", "getScalesType">,
    InterfaceMethod<[{
      The same kind of type (element type, blocks, scale rule) with shape
      `shape`, for ops that change sizes but not the blocking (a shard of
      rows or experts).
    }], "::mlir::Type", "withShape", (ins "::llvm::ArrayRef<int64_t>":$shape)>,
  ];
}

#endif // MOE_TYPE_INTERFACES_TD
