//===- MoECAPI.cpp - the C API --------------------------------------------===//

#include "moe-c/Compiler.h"
#include "moe-c/Dialects.h"
#include "moe-c/Models.h"
#include "moe-c/Parse.h"
#include "moe-c/Passes.h"

#include "moe/Compiler/Compiler.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Models/LanguageModel.h"
#include "moe/Pipelines/Pipelines.h"
#include "moe/Support/SourceChecks.h"

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

MlirModule moeModuleCreateParse(MlirContext context, MlirStringRef text) {
  llvm::MemoryBufferRef buffer(unwrap(text), "<string>");
  if (failed(moe::verifyParsable(buffer, unwrap(context))))
    return MlirModule{nullptr};
  // MLIR's lexer reads up to a NUL after the text: a caller's slice of a
  // larger string would be read past its end.
  std::string terminated(text.data, text.length);
  return mlirModuleCreateParse(
      context, mlirStringRefCreate(terminated.data(), terminated.size()));
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

MlirModule moeBuildLanguageModel(MlirContext context, MlirStringRef config,
                                 MlirStringRef source, int64_t batch,
                                 int64_t seq) {
  return moeBuildLanguageModelWithOptions(context, config, source, batch, seq,
                                          /*documentMask=*/false,
                                          /*layerFunctions=*/false);
}

MlirModule moeBuildLanguageModelWithOptions(MlirContext context,
                                            MlirStringRef config,
                                            MlirStringRef source, int64_t batch,
                                            int64_t seq, bool documentMask,
                                            bool layerFunctions) {
  MLIRContext *ctx = unwrap(context);
  Location loc = FileLineColLoc::get(ctx, unwrap(source), 1, 1);
  if (batch < 1 || seq < 1 || batch > (int64_t(1) << 31) ||
      seq > (int64_t(1) << 31) || batch * seq > (int64_t(1) << 31)) {
    emitError(loc) << "batch and seq must be positive, with batch x seq at "
                      "most 2^31 tokens; got "
                   << batch << " and " << seq;
    return MlirModule{nullptr};
  }
  llvm::Expected<moe::ModelConfig> parsed =
      moe::ModelConfig::parse(unwrap(config), unwrap(source));
  if (!parsed) {
    emitError(loc) << llvm::toString(parsed.takeError());
    return MlirModule{nullptr};
  }
  return wrap(moe::buildLanguageModel(ctx, *parsed, batch, seq, documentMask,
                                      layerFunctions)
                  .release());
}

MlirLogicalResult moeCompile(MlirModule module, MlirStringRef target,
                             MlirStringRef output) {
  return moeCompileWithOptions(module, target, mlirStringRefCreate("", 0),
                               output);
}

MlirLogicalResult moeCompileWithOptions(MlirModule module, MlirStringRef target,
                                        MlirStringRef gpuOptions,
                                        MlirStringRef output) {
  moe::CompileOptions options;
  options.target = unwrap(target).str();
  options.gpuOptions = unwrap(gpuOptions).str();
  return wrap(moe::compileToSharedObject(unwrap(module), unwrap(output),
                                         options, llvm::nulls()));
}
