// Parses a moe program, runs the training pipeline, prints the result.
#include "moe/Compiler/Compiler.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Pipelines/Pipelines.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

int main() {
  mlir::DialectRegistry registry;
  mlir::moe::registerCompilerDialects(registry);
  mlir::MLIRContext context(registry);
  auto module = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
    func.func @q(%x: tensor<4x64xbf16>) -> tensor<4x64xf32> {
      %q = moe.quantize %x : tensor<4x64xbf16> -> !moe.mx<4x64xf8E4M3FN, axis = 1>
      %y = moe.dequantize %q : !moe.mx<4x64xf8E4M3FN, axis = 1> -> tensor<4x64xf32>
      return %y : tensor<4x64xf32>
    })mlir",
                                                        &context);
  if (!module)
    return 1;
  mlir::PassManager pm(&context);
  mlir::moe::buildCPUPipeline(pm);
  if (mlir::failed(pm.run(*module)))
    return 1;
  llvm::outs() << "lowered to LLVM: "
               << (module->lookupSymbol("q") ? "yes" : "no") << "\n";
  return 0;
}
