/*===- capi.c - the moe C API, end to end ---------------------------------===*\
|* Registers the dialects and passes, parses a module, verifies and prints    *|
|* it, runs the training pipeline on it, reports a bad pipeline and a bad     *|
|* module as errors, compiles the module to a shared object for the CPU, and  *|
|* builds a language model from a config (and refuses a bad one).            *|
\*===----------------------------------------------------------------------===*/
#include "moe-c/Compiler.h"
#include "moe-c/Dialects.h"
#include "moe-c/Models.h"
#include "moe-c/Parse.h"
#include "moe-c/Passes.h"

#include "mlir-c/Diagnostics.h"
#include "mlir-c/IR.h"

#include <stdio.h>
#include <string.h>

static void print(MlirStringRef s, void *user) {
  (void)user;
  fwrite(s.data, 1, s.length, stdout);
}

static MlirLogicalResult onDiagnostic(MlirDiagnostic d, void *user) {
  (void)user;
  fputs("diagnostic: ", stdout);
  mlirDiagnosticPrint(d, print, NULL);
  fputs("\n", stdout);
  return mlirLogicalResultSuccess();
}

static const char *layer =
    "func.func @layer(%x: tensor<8x32xf32>, %idx: tensor<8x1xi32>, %w: "
    "tensor<4x32x32xf32>)\n"
    "    -> tensor<8x32xf32> {\n"
    "  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4)\n"
    "      : tensor<8x32xf32>, tensor<8x1xi32> -> tensor<8x32xf32>, "
    "tensor<5xi32>, tensor<4xi32>, tensor<8x1xi32>\n"
    "  %y = moe.grouped_matmul %s, %w, %o : tensor<8x32xf32>, "
    "tensor<4x32x32xf32>, tensor<5xi32> -> tensor<8x32xf32>\n"
    "  %ones = arith.constant dense<1.0> : tensor<8x1xf32>\n"
    "  %out = moe.combine %y, %ones, %p : tensor<8x32xf32>, tensor<8x1xf32>, "
    "tensor<8x1xi32> -> tensor<8x32xf32>\n"
    "  return %out : tensor<8x32xf32>\n"
    "}\n";

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: moe-capi-test OUTPUT.so\n");
    return 2;
  }
  MlirDialectRegistry registry = mlirDialectRegistryCreate();
  moeRegisterAllDialects(registry);
  MlirContext ctx = mlirContextCreateWithRegistry(registry, false);
  mlirDialectRegistryDestroy(registry);
  mlirContextAttachDiagnosticHandler(ctx, onDiagnostic, NULL, NULL);
  moeRegisterPasses();

  MlirDialect moe =
      mlirContextGetOrLoadDialect(ctx, mlirStringRefCreateFromCString("moe"));
  printf("moe dialect loaded: %d\n", !mlirDialectIsNull(moe));

  MlirModule module =
      mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(layer));
  if (mlirModuleIsNull(module))
    return 1;
  MlirOperation op = mlirModuleGetOperation(module);
  printf("verified: %d\n", mlirOperationVerify(op));

  MlirLogicalResult bad = moeRunPipeline(
      module, mlirStringRefCreateFromCString("builtin.module(no-such-pass)"));
  printf("bad pipeline failed: %d\n", mlirLogicalResultIsFailure(bad));

  MlirLogicalResult ok = moeRunPipeline(
      module,
      mlirStringRefCreateFromCString(
          "builtin.module(moe-train-pipeline{ep-size=2 recipe=mxfp8})"));
  printf("train pipeline: %d\n", mlirLogicalResultIsSuccess(ok));
  mlirOperationPrint(op, print, NULL);
  printf("\n");

  MlirModule broken = mlirModuleCreateParse(
      ctx, mlirStringRefCreateFromCString("func.func @f( {"));
  printf("broken module rejected: %d\n", mlirModuleIsNull(broken));

  // moeModuleCreateParse: text the parser would crash on is refused with a
  // diagnostic; a slice of a larger string (no NUL after it) parses.
  static char deep[8 * 300 + 1];
  for (int i = 0; i < 300; ++i)
    memcpy(deep + 8 * i, "module {", 8);
  MlirModule nested =
      moeModuleCreateParse(ctx, mlirStringRefCreate(deep, 8 * 300));
  printf("deep nesting rejected: %d\n", mlirModuleIsNull(nested));
  const char *text = "func.func @sliced() { return }}}}garbage";
  MlirModule sliced = moeModuleCreateParse(
      ctx, mlirStringRefCreate(text, strlen("func.func @sliced() { return }")));
  printf("slice parsed: %d\n", !mlirModuleIsNull(sliced));
  if (!mlirModuleIsNull(sliced))
    mlirModuleDestroy(sliced);

  MlirModule plain =
      mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(layer));
  MlirLogicalResult compiled =
      moeCompile(plain, mlirStringRefCreateFromCString("cpu"),
                 mlirStringRefCreateFromCString(argv[1]));
  printf("compiled: %d\n", mlirLogicalResultIsSuccess(compiled));
  mlirModuleDestroy(plain);

  // GPU options are checked (names and values) before anything is lowered.
  MlirModule gpu =
      mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(layer));
  MlirLogicalResult badOption = moeCompileWithOptions(
      gpu, mlirStringRefCreateFromCString("sm_90a"),
      mlirStringRefCreateFromCString("pair-round-trips=sometimes"),
      mlirStringRefCreateFromCString(argv[1]));
  printf("bad GPU option failed: %d\n", mlirLogicalResultIsFailure(badOption));
  mlirModuleDestroy(gpu);

  const char *config =
      "{\"hidden_size\": 32, \"moe_intermediate_size\": 16, \"num_experts\": 4,"
      " \"num_experts_per_tok\": 2, \"num_hidden_layers\": 1, "
      "\"num_attention_heads\": 4,"
      " \"num_key_value_heads\": 2, \"vocab_size\": 24}";
  MlirModule lm = moeBuildLanguageModel(
      ctx, mlirStringRefCreateFromCString(config),
      mlirStringRefCreateFromCString("config.json"), 2, 16);
  printf("language model: %d\n",
         !mlirModuleIsNull(lm) &&
             mlirOperationVerify(mlirModuleGetOperation(lm)));
  MlirLogicalResult step = moeRunPipeline(
      lm, mlirStringRefCreateFromCString("builtin.module(moe-autodiff)"));
  printf("train step: %d\n", mlirLogicalResultIsSuccess(step));
  mlirModuleDestroy(lm);
  // With a document mask and the decoder layer as a function: @loss takes
  // the documents last and calls the layer.
  MlirModule masked = moeBuildLanguageModelWithOptions(
      ctx, mlirStringRefCreateFromCString(config),
      mlirStringRefCreateFromCString("config.json"), 2, 16,
      /*documentMask=*/true, /*layerFunctions=*/true);
  printf("masked language model: %d\n",
         !mlirModuleIsNull(masked) &&
             mlirOperationVerify(mlirModuleGetOperation(masked)));
  MlirLogicalResult maskedGrad = moeRunPipeline(
      masked, mlirStringRefCreateFromCString("builtin.module(moe-autodiff)"));
  printf("masked train step: %d\n", mlirLogicalResultIsSuccess(maskedGrad));
  mlirOperationPrint(mlirModuleGetOperation(masked), print, NULL);
  printf("\n");
  mlirModuleDestroy(masked);
  MlirModule badModel = moeBuildLanguageModel(
      ctx, mlirStringRefCreateFromCString("{\"hidden_size\": 32}"),
      mlirStringRefCreateFromCString("bad.json"), 2, 16);
  printf("bad config rejected: %d\n", mlirModuleIsNull(badModel));
  mlirModuleDestroy(module);
  mlirContextDestroy(ctx);
  return 0;
}
