//===- GPUOptions.cpp - the GPU compile options' enums --------------------===//

#include "moe/Conversion/MoEToGPU/GPUOptions.h"

#include "moe/Conversion/MoEToGPU/GPUOptions.cpp.inc"

std::string mlir::moe::gpuChipNames() {
  std::string names;
  for (uint32_t i = 0; std::optional<GPUChip> chip = symbolizeGPUChip(i); ++i)
    names += (names.empty() ? "" : ", ") + stringifyGPUChip(*chip).str();
  return names;
}
