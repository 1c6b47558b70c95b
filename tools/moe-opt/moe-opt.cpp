//===- moe-opt.cpp - the moe-mlir optimizer driver ------------------------===//
//
// Parses MLIR, runs moe-mlir's passes and pipelines next to upstream ones,
// prints the result. Every upstream dialect and pass is registered so model
// graphs can mix `moe` with linalg, tensor, arith, math, scf, shard...
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Pipelines/Pipelines.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::registerAllPasses();
  mlir::moe::registerMoEPasses();
  mlir::moe::registerMoEConversionPasses();
  mlir::moe::registerMoEPipelines();

  mlir::DialectRegistry registry;
  mlir::registerAllDialects(registry);
  mlir::registerAllExtensions(registry);
  // GPU modules are serialized (to PTX/cubin) inside the pass pipeline.
  mlir::registerAllToLLVMIRTranslations(registry);
  registry.insert<mlir::moe::MoEDialect>();

  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv,
      "moe-mlir optimizer: the moe dialect, its passes and pipelines\n",
      registry));
}
