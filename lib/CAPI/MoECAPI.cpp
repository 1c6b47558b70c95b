//===- MoECAPI.cpp - the C API --------------------------------------------===//

#include "moe-c/Compiler.h"
#include "moe-c/Dialects.h"
#include "moe-c/Passes.h"

#include "moe/Compiler/Compiler.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Pipelines/Pipelines.h"

#include "mlir/CAPI/IR.h"
#include "mlir/CAPI/Registration.h"
#include "mlir/CAPI/Support.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/raw_ostream.h"

#include <mutex>

using namespace mlir;

MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(MoE, moe, mlir::moe::MoEDialect)

void moeRegisterAllDialects(MlirDialectRegistry registry) {
  moe::registerCompilerDialects(*unwrap(registry));
}

void moeRegisterPasses(void) {
  static std::once_flag once;
  std::call_once(once, [] {
    registerAllPasses();
    moe::registerMoEPasses();
    moe::registerMoEConversionPasses();
    moe::registerMoEPipelines();
  });
}

MlirLogicalResult moeRunPipeline(MlirModule module, MlirStringRef pipeline) {
  moeRegisterPasses();
  ModuleOp op = unwrap(module);
  std::string errors;
  llvm::raw_string_ostream os(errors);
  FailureOr<OpPassManager> parsed = parsePassPipeline(unwrap(pipeline), os);
  if (failed(parsed)) {
    emitError(op.getLoc(), "invalid pass pipeline: ") << errors;
    return wrap(failure());
  }
  PassManager pm(op.getContext(), parsed->getOpAnchorName());
  static_cast<OpPassManager &>(pm) = std::move(*parsed);
  return wrap(pm.run(op));
}

MlirLogicalResult moeCompile(MlirModule module, MlirStringRef target,
                             MlirStringRef output) {
  moe::CompileOptions options;
  options.target = unwrap(target).str();
  return wrap(moe::compileToSharedObject(unwrap(module), unwrap(output),
                                         options, llvm::nulls()));
}
