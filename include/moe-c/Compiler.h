/*===- moe-c/Compiler.h - compile moe modules from C --------------*- C -*-===*/
#ifndef MOE_C_COMPILER_H
#define MOE_C_COMPILER_H

#include "mlir-c/IR.h"
#include "mlir-c/Support.h"

#ifdef __cplusplus
extern "C" {
#endif

/// Compiles `module` (consumed: it is lowered in place) for `target` ("cpu"
/// or a GPU chip such as "sm_90a") into the shared object `output`, as
/// moe-compile does. Errors are diagnostics on the module's context; an
/// existing `output` is left untouched when compiling fails.
MLIR_CAPI_EXPORTED MlirLogicalResult moeCompile(MlirModule module,
                                                MlirStringRef target,
                                                MlirStringRef output);

/// moeCompile with options of the GPU pipeline for GPU targets, as
/// `-moe-gpu-pipeline` and moe-compile take them (`gpuOptions`: for example
/// "pair-round-trips=always mx-activations=peak"; empty for the defaults).
/// Unknown options or values are diagnostics.
MLIR_CAPI_EXPORTED MlirLogicalResult
moeCompileWithOptions(MlirModule module, MlirStringRef target,
                      MlirStringRef gpuOptions, MlirStringRef output);

#ifdef __cplusplus
}
#endif

#endif
