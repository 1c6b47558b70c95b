//===- IRFuzzer.cpp - parse, verify and run a pass pipeline on mutated IR -===//
//
// libFuzzer target over moe-mlir's compiler. An input is one byte choosing a
// pass pipeline (its value modulo the number of pipelines below), then MLIR
// text. The text is checked as the tools check it (SourceChecks.h), parsed,
// verified, printed and parsed again, then the chosen pipeline runs with the
// verifier after every pass. Diagnostics are expected (most mutated inputs
// are invalid); a crash, a sanitizer report or a module that prints text
// that no longer parses is a finding.
//
//===----------------------------------------------------------------------===//

#include "moe/Compiler/Compiler.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Pipelines/Pipelines.h"
#include "moe/Support/SourceChecks.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

using namespace mlir;

namespace {

/// Every moe pass with its defaults, the options that change what a pass
/// does, and the pipelines the tools run (the GPU one up to PTX text: no
/// ptxas, no driver).
const char *const kPipelines[] = {
    "", // parse, verify, print, parse again
    "convert-moe-to-linalg",
    "convert-moe-to-linalg{parallel=true}",
    "convert-moe-to-runtime",
    "moe-gpu-fuse-elementwise",
    "moe-gpu-split-reductions",
    "moe-gpu-map-loops",
    "moe-gpu-device-buffers",
    "moe-gpu-name-kernels",
    "moe-gpu-sink-index-computations",
    "moe-gpu-merge-kernels",
    "moe-gpu-elide-host-syncs",
    "moe-gpu-fuse-row-gathers",
    "moe-gpu-dedicated-kernels",
    "moe-copy-to-linalg",
    "moe-decompose-aggregates",
    "moe-read-only-arguments",
    "moe-update-arguments-in-place",
    "moe-dense-to-grouped",
    "moe-adamw",
    "moe-read-inserted-slices",
    "moe-split-empty-tensors",
    "moe-expand-grouped-mlp",
    "moe-quantize",
    "moe-quantize{recipe=bf16}",
    "moe-hoist-quantize",
    "moe-split-deallocs",
    "moe-buffer-lifetimes",
    "moe-place-weight-gradients",
    "moe-buffer-report",
    "moe-fuse-grouped-mlp",
    "moe-group-experts",
    "moe-expert-parallel{ep-size=2}",
    "moe-autodiff",
    "moe-reuse-forward-values",
    "moe-train-pipeline",
    "moe-train-pipeline{recipe=mxfp8}",
    "moe-train-pipeline{autodiff=true recipe=bf16 optimizer=adamw}",
    "moe-train-pipeline{autodiff=true ep-size=2 recipe=mxfp8}",
    "moe-cpu-pipeline",
    "moe-gpu-pipeline{chip=sm_90a format=isa}",
};
constexpr size_t kNumPipelines = sizeof(kPipelines) / sizeof(kPipelines[0]);

/// The pipelines, each nested under the op its passes anchor on
/// (builtin.module or func.func), parsed once.
std::vector<std::string> &anchoredPipelines() {
  static std::vector<std::string> pipelines;
  return pipelines;
}

DialectRegistry &registry() {
  static DialectRegistry registry;
  return registry;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  registerAllPasses();
  moe::registerMoEPasses();
  moe::registerMoEConversionPasses();
  moe::registerMoEPipelines();
  moe::registerCompilerDialects(registry());
  for (const char *text : kPipelines) {
    std::string pipeline = text;
    if (!pipeline.empty()) {
      // A pass declared on func.func runs nested in every function.
      std::string error;
      llvm::raw_string_ostream os(error);
      FailureOr<OpPassManager> parsed =
          parsePassPipeline("any(" + pipeline + ")", os);
      if (failed(parsed)) {
        llvm::errs() << "moe-ir-fuzzer: bad pipeline '" << pipeline
                     << "': " << error << "\n";
        std::abort();
      }
      bool onFunctions = parsed->size() > 0;
      for (Pass &pass : parsed->getPasses())
        onFunctions &= pass.getOpName() == StringRef("func.func");
      if (onFunctions)
        pipeline = "func.func(" + pipeline + ")";
    }
    anchoredPipelines().push_back(
        pipeline.empty() ? "" : "builtin.module(" + pipeline + ")");
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  const std::string &pipeline = anchoredPipelines()[data[0] % kNumPipelines];
  // (A copy: MLIR's lexer reads up to the NUL the buffers it is given
  // end with, and libFuzzer's data has none.)
  const std::string text(reinterpret_cast<const char *>(data) + 1, size - 1);

  MLIRContext context(registry(), MLIRContext::Threading::DISABLED);
  // Mutated inputs are mostly invalid: their diagnostics are dropped.
  ScopedDiagnosticHandler quiet(&context,
                                [](Diagnostic &) { return success(); });
  llvm::MemoryBufferRef buffer(text, "input");
  if (failed(moe::verifyParsable(buffer, &context)))
    return 0;
  ParserConfig config(&context);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, config);
  if (!module)
    return 0;

  // What the printer writes parses again.
  std::string printed;
  {
    llvm::raw_string_ostream os(printed);
    module->print(os);
  }
  {
    std::string why;
    ScopedDiagnosticHandler record(&context, [&](Diagnostic &d) {
      why += d.str() + "\n";
      return success();
    });
    if (!parseSourceString<ModuleOp>(printed, config)) {
      llvm::errs() << "moe-ir-fuzzer: the printed module does not parse ("
                   << why << "):\n"
                   << printed << "\n";
      std::abort();
    }
  }

  if (pipeline.empty())
    return 0;
  PassManager pm(&context);
  std::string error;
  llvm::raw_string_ostream os(error);
  if (failed(parsePassPipeline(pipeline, pm, os))) {
    llvm::errs() << "moe-ir-fuzzer: " << error << "\n";
    std::abort();
  }
  (void)pm.run(*module);
  return 0;
}
