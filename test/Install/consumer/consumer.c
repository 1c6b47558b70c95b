/* The C API from an installed package. */
#include "mlir-c/IR.h"
#include "moe-c/Dialects.h"
#include "moe-c/Passes.h"
#include <stdio.h>

int main(void) {
  MlirDialectRegistry registry = mlirDialectRegistryCreate();
  moeRegisterAllDialects(registry);
  MlirContext ctx = mlirContextCreateWithRegistry(registry, 0);
  mlirDialectRegistryDestroy(registry);
  MlirModule m = mlirModuleCreateParse(
      ctx, mlirStringRefCreateFromCString(
               "func.func @s(%h: tensor<2x8xf32>) -> tensor<2x4xf32> {\n"
               "  %a = moe.swiglu %h : tensor<2x8xf32> -> tensor<2x4xf32>\n"
               "  return %a : tensor<2x4xf32>\n}\n"));
  printf("parsed: %d\n", !mlirModuleIsNull(m));
  MlirLogicalResult r = moeRunPipeline(
      m,
      mlirStringRefCreateFromCString("builtin.module(convert-moe-to-linalg)"));
  printf("lowered: %d\n", mlirLogicalResultIsSuccess(r));
  mlirModuleDestroy(m);
  mlirContextDestroy(ctx);
  return 0;
}
