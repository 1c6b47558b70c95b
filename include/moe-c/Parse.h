/*===- moe-c/Parse.h - parse moe programs from C ------------------*- C -*-===*\
|*                                                                            *|
|* Parsing that refuses, with a diagnostic, text the MLIR parser crashes on:  *|
|* brackets nested thousands deep, a malformed linalg permutation/dimensions. *|
\*===----------------------------------------------------------------------===*/
#ifndef MOE_C_PARSE_H
#define MOE_C_PARSE_H

#include "mlir-c/IR.h"

#ifdef __cplusplus
extern "C" {
#endif

/// mlirModuleCreateParse after the checks moe-opt and moe-compile make
/// (moe/Support/SourceChecks.h): a null module and an error diagnostic on
/// `context` (with the line and column) when `text` would crash the parser,
/// or when it does not parse. `text` need not end with a NUL (MLIR's own
/// mlirModuleCreateParse reads past an unterminated string's end).
MLIR_CAPI_EXPORTED MlirModule moeModuleCreateParse(MlirContext context,
                                                   MlirStringRef text);

#ifdef __cplusplus
}
#endif

#endif
