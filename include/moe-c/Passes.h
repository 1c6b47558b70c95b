/*===- moe-c/Passes.h - moe passes and pipelines from C -----------*- C -*-===*/
#ifndef MOE_C_PASSES_H
#define MOE_C_PASSES_H

#include "mlir-c/IR.h"
#include "mlir-c/Support.h"

#ifdef __cplusplus
extern "C" {
#endif

/// Registers the moe passes (-moe-*), conversions (-convert-moe-to-*) and
/// named pipelines (-moe-train-pipeline, -moe-cpu-pipeline,
/// -moe-gpu-pipeline) with the global registry, plus MLIR's own passes.
MLIR_CAPI_EXPORTED void moeRegisterPasses(void);

/// Parses `pipeline` (textual form, e.g.
/// "builtin.module(moe-train-pipeline{ep-size=2},moe-cpu-pipeline)") and runs
/// it on `module`. Problems are reported as diagnostics on the module's
/// context (a malformed pipeline too); the result says whether it worked.
MLIR_CAPI_EXPORTED MlirLogicalResult moeRunPipeline(MlirModule module,
                                                    MlirStringRef pipeline);

#ifdef __cplusplus
}
#endif

#endif
