/*===- moe-c/Dialects.h - the moe dialect from C ------------------*- C -*-===*\
|*                                                                            *|
|* Registers the moe dialect in a context; see moe-c/Passes.h for the passes  *|
|* and moe-c/Compiler.h for compiling modules to shared objects. The rest of  *|
|* MLIR's C API (mlir-c/IR.h, ...) is exported by the same library,           *|
|* libMoeMLIR-C.                                                              *|
\*===----------------------------------------------------------------------===*/
#ifndef MOE_C_DIALECTS_H
#define MOE_C_DIALECTS_H

#include "mlir-c/IR.h"

#ifdef __cplusplus
extern "C" {
#endif

MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(MoE, moe);

/// Adds every dialect moe programs use (the upstream dialects and their
/// extensions, the LLVM IR translations and moe) to `registry`.
MLIR_CAPI_EXPORTED void moeRegisterAllDialects(MlirDialectRegistry registry);

#ifdef __cplusplus
}
#endif

#endif
