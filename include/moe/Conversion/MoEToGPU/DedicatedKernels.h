//===- DedicatedKernels.h - chip-specific GPU kernels -----------*- C++ -*-===//
#ifndef MOE_CONVERSION_MOETOGPU_DEDICATEDKERNELS_H
#define MOE_CONVERSION_MOETOGPU_DEDICATEDKERNELS_H

#include "moe/Conversion/MoEToGPU/GPUOptions.h"

namespace mlir::moe {

/// Whether `-moe-gpu-dedicated-kernels` has kernels for `chip` (an `sm_*`
/// name): pipelines add the pass only then. Today: Blackwell's block-scaled
/// MMA (tcgen05) for MXFP8 grouped GEMMs on sm_100a; Hopper's warpgroup MMA
/// (wgmma) for bf16 grouped GEMMs on sm_90a.
bool hasDedicatedGPUKernels(GPUChip chip);

} // namespace mlir::moe

#endif
