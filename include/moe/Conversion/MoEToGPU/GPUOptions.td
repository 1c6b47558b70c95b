//===- GPUOptions.td - the GPU compile options' enums ------*- tablegen -*-===//
//
// The values of the GPU pipeline's and -moe-gpu-dedicated-kernels' enum
// options, declared once: the pass options (Passes.td), the pipeline
// options (Pipelines.h), moe-compile, the C API and the Python package all
// take these names.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_CONVERSION_GPUOPTIONS_TD
#define MOE_CONVERSION_GPUOPTIONS_TD

include "mlir/IR/EnumAttr.td"

def MoE_GPUChip : I32EnumAttr<"GPUChip",
    "an NVIDIA GPU architecture kernels are generated for", [
      I32EnumAttrCase<"sm_70", 0>, I32EnumAttrCase<"sm_75", 1>,
      I32EnumAttrCase<"sm_80", 2>, I32EnumAttrCase<"sm_86", 3>,
      I32EnumAttrCase<"sm_87", 4>, I32EnumAttrCase<"sm_89", 5>,
      I32EnumAttrCase<"sm_90", 6>, I32EnumAttrCase<"sm_90a", 7>,
      I32EnumAttrCase<"sm_100", 8>, I32EnumAttrCase<"sm_100a", 9>,
      I32EnumAttrCase<"sm_101", 10>, I32EnumAttrCase<"sm_101a", 11>,
      I32EnumAttrCase<"sm_103", 12>, I32EnumAttrCase<"sm_103a", 13>,
      I32EnumAttrCase<"sm_120", 14>, I32EnumAttrCase<"sm_120a", 15>
    ]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_KernelFormat : I32EnumAttr<"KernelFormat",
    "how GPU kernels are embedded in the compiled module", [
      I32EnumAttrCase<"isa", 0>, I32EnumAttrCase<"bin", 1>,
      I32EnumAttrCase<"fatbin", 2>
    ]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_RoundTripPairing : I32EnumAttr<"RoundTripPairing",
    "when the two MX round trips of one tensor share one kernel", [
      I32EnumAttrCase<"peak", 0>, I32EnumAttrCase<"always", 1>
    ]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_MXActivations : I32EnumAttr<"MXActivations",
    "where SwiGLU epilogues write their activation's MX encoding", [
      I32EnumAttrCase<"peak", 0>, I32EnumAttrCase<"always", 1>
    ]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

#endif
