//===- MoEAttrs.td - moe dialect enums and attributes ------*- tablegen -*-===//
#ifndef MOE_ATTRS_TD
#define MOE_ATTRS_TD

include "mlir/IR/EnumAttr.td"

def MoE_ScoreFunction : I32EnumAttr<"ScoreFunction",
    "how router logits become expert scores", [
      I32EnumAttrCase<"softmax", 0>,
      I32EnumAttrCase<"sigmoid", 1>
    ]> {
  let cppNamespace = "::mlir::moe";
}

def MoE_ScaleMode : I32EnumAttr<"ScaleMode",
    "how the shared exponent of an MX block is chosen from its amax", [
      I32EnumAttrCase<"rceil", 0>,
      I32EnumAttrCase<"floor", 1>
    ]> {
  let cppNamespace = "::mlir::moe";
}

def MoE_SwigluLayout : I32EnumAttr<"SwigluLayout",
    "where the gate and up halves sit in the last dimension", [
      I32EnumAttrCase<"split", 0>,
      I32EnumAttrCase<"interleaved", 1>
    ]> {
  let cppNamespace = "::mlir::moe";
}

#endif // MOE_ATTRS_TD
