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
#include "moe/Support/SourceChecks.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

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

  auto [inputFile, outputFile] = mlir::registerAndParseCLIOptions(
      argc, argv,
      "moe-mlir optimizer: the moe dialect, its passes and pipelines\n",
      registry);
  mlir::MlirOptMainConfig config =
      mlir::MlirOptMainConfig::createFromCLOptions();
  std::unique_ptr<llvm::MemoryBuffer> input;
  std::string error;
  if (config.shouldShowDialects() || config.shouldListPasses()) {
    input = llvm::MemoryBuffer::getMemBuffer(""); // (nothing is read)
  } else {
    input = mlir::openInputFile(inputFile, &error);
    if (!input) {
      llvm::errs() << "moe-opt: " << error << "\n";
      return EXIT_FAILURE;
    }
    // Input the parser would crash on (too deep, a malformed linalg array) is
    // refused first, with where it is.
    llvm::SourceMgr sources;
    sources.AddNewSourceBuffer(
        llvm::MemoryBuffer::getMemBuffer(input->getMemBufferRef(),
                                         /*RequiresNullTerminator=*/false),
        llvm::SMLoc());
    mlir::MLIRContext context;
    mlir::SourceMgrDiagnosticHandler handler(sources, &context);
    if (mlir::failed(
            mlir::moe::verifyParsable(input->getMemBufferRef(), &context)))
      return EXIT_FAILURE;
  }
  auto output = mlir::openOutputFile(outputFile, &error);
  if (!output) {
    llvm::errs() << "moe-opt: " << error << "\n";
    return EXIT_FAILURE;
  }
  if (mlir::failed(
          mlir::MlirOptMain(output->os(), std::move(input), registry, config)))
    return EXIT_FAILURE;
  output->keep();
  return EXIT_SUCCESS;
}
