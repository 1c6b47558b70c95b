/*===- moe-c/Models.h - MoE language models from C ----------------*- C -*-===*/
#ifndef MOE_C_MODELS_H
#define MOE_C_MODELS_H

#include "mlir-c/IR.h"
#include "mlir-c/Support.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Builds the loss function `@loss(parameters..., ids, labels)` of the MoE
/// language model a Hugging Face config.json describes (Qwen3-MoE family;
/// see moe/Models/LanguageModel.h), for `batch` sequences of `seq` tokens.
/// `config` is the JSON text; `source` names it in errors. On an invalid
/// config, returns a null module and reports an error on the context naming
/// the field.
MLIR_CAPI_EXPORTED MlirModule moeBuildLanguageModel(MlirContext context,
                                                    MlirStringRef config,
                                                    MlirStringRef source,
                                                    int64_t batch, int64_t seq);

/// moeBuildLanguageModel with options. `documentMask`: `@loss` takes a last
/// argument of role `documents`, i32 [batch, seq], the document of each
/// token of the packed rows, and attention stays within documents.
/// `layerFunctions`: each kind of decoder layer (MoE, dense) is one private
/// function called once per layer, so compile time follows the kinds of
/// layers rather than the depth.
MLIR_CAPI_EXPORTED MlirModule moeBuildLanguageModelWithOptions(
    MlirContext context, MlirStringRef config, MlirStringRef source,
    int64_t batch, int64_t seq, bool documentMask, bool layerFunctions);

#ifdef __cplusplus
}
#endif

#endif
