/*===- moe-c/Parse.h - parse moe programs from C ------------------*- C -*-===*\
|*                                                                            *|
|* Parsing that refuses, with a diagnostic, text the MLIR parser cannot take: *|
|* brackets nested thousands deep overflow its recursive descent.             *|
\*===----------------------------------------------------------------------===*/
#ifndef MOE_C_PARSE_H
#define MOE_C_PARSE_H

#include "mlir-c/IR.h"

#ifdef __cplusplus
extern "C" {
#endif

/// mlirModuleCreateParse after checking the nesting of `text`: a null module
/// and an error diagnostic on `context` (with the line and column) when its
/// brackets nest deeper than moe-opt and moe-compile accept, or when it does
/// not parse.
MLIR_CAPI_EXPORTED MlirModule moeModuleCreateParse(MlirContext context,
                                                   MlirStringRef text);

#ifdef __cplusplus
}
#endif

#endif
