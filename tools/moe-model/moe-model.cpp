//===- moe-model.cpp - MoE language models from a config.json -------------===//
//
//   moe-model config.json --batch 4 --seq 128 [-o model.mlir] [--train-step]
//
// Prints the model graph of a Qwen3-MoE-family config.json (see
// include/moe/Models/LanguageModel.h): @loss(parameters..., ids, labels);
// with --train-step also @loss_grad (-moe-autodiff). --parameters lists
// the parameters (Hugging Face name, shape, initialization) instead.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Models/LanguageModel.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
namespace cl = llvm::cl;

/// The options --help lists (LLVM's own stay available, unlisted).
static cl::OptionCategory moeModelOptions("moe-model options");

static cl::opt<std::string> configFile(cl::Positional,
                                       cl::desc("<config.json>"), cl::Required,
                                       cl::cat(moeModelOptions));
static cl::opt<std::string>
    outputFile("o", cl::desc("Output file (default: stdout)"),
               cl::value_desc("model.mlir"), cl::init("-"),
               cl::cat(moeModelOptions));
static cl::opt<int64_t> batch("batch",
                              cl::desc("Sequences per step (default 1)"),
                              cl::init(1), cl::cat(moeModelOptions));
static cl::opt<int64_t> seq("seq",
                            cl::desc("Tokens per sequence (default 128)"),
                            cl::init(128), cl::cat(moeModelOptions));
static cl::opt<bool> trainStep(
    "train-step",
    cl::desc("Also emit @loss_grad, the loss and every parameter's gradient "
             "(-moe-autodiff)"),
    cl::init(false), cl::cat(moeModelOptions));
static cl::opt<bool> documentMask(
    "document-mask",
    cl::desc("Attention within documents: @loss takes the document of each "
             "token of the packed rows (i32 [batch, seq], role 'documents')"),
    cl::init(false), cl::cat(moeModelOptions));
static cl::opt<bool> layerFunctions(
    "layer-functions",
    cl::desc("Each kind of decoder layer as one function called per layer "
             "(compile time follows the kinds of layers, not the depth) "
             "instead of every layer's ops in @loss"),
    cl::init(false), cl::cat(moeModelOptions));
static cl::opt<int64_t> expertRowPadding(
    "expert-row-padding",
    cl::desc("Pad every expert's group of dispatched rows to a multiple of N "
             "(moe.dispatch pad_to; as moe-train does, 32 for the mxfp8 "
             "recipe and 128 for fp8-blockwise, so that no scale block along "
             "the rows spans two experts). Default 1"),
    cl::value_desc("N"), cl::init(1), cl::cat(moeModelOptions));
static cl::opt<bool> debugInfo(
    "debug-info",
    cl::desc("Print each op's location: the module path it was built for "
             "(model.layers.3.self_attn, ...), which names the GPU kernels "
             "made from it"),
    cl::init(false), cl::cat(moeModelOptions));
static cl::opt<bool> listParameters(
    "parameters",
    cl::desc("List the parameters (name, shape, init) instead of the graph"),
    cl::init(false), cl::cat(moeModelOptions));

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions({moeModelOptions});
  cl::ParseCommandLineOptions(
      argc, argv,
      "moe-model: the MoE language model of a Hugging Face config.json "
      "(Qwen3-MoE family) as MLIR\n");
  for (auto [name, v] : {std::pair<const char *, int64_t>{"--batch", batch},
                         {"--seq", seq},
                         {"--expert-row-padding", expertRowPadding}})
    if (v < 1 || v > (int64_t(1) << 31)) {
      llvm::errs() << "moe-model: " << name
                   << " must be a positive integer below 2^31, got " << v
                   << "\n";
      return 1;
    }
  if (int64_t(batch) * int64_t(seq) > (int64_t(1) << 31)) {
    llvm::errs() << "moe-model: --batch x --seq exceeds 2^31 tokens\n";
    return 1;
  }
  llvm::Expected<moe::ModelConfig> config = moe::ModelConfig::load(configFile);
  if (!config) {
    llvm::errs() << "moe-model: " << llvm::toString(config.takeError()) << "\n";
    return 1;
  }
  std::string error;
  auto output = openOutputFile(outputFile, &error);
  if (!output) {
    llvm::errs() << "moe-model: " << error << "\n";
    return 1;
  }
  if (listParameters) {
    int64_t total = 0;
    for (const moe::ModelParameter &p : moe::modelParameters(*config)) {
      int64_t n = 1;
      output->os() << p.name << " [";
      for (auto [i, d] : llvm::enumerate(p.shape)) {
        output->os() << (i ? ", " : "") << d;
        n *= d;
      }
      output->os() << "] " << (p.ones ? "ones" : "normal")
                   << (p.hfTransposed ? " hf_transposed" : "") << "\n";
      total += n;
    }
    output->os() << "total " << total << " parameters\n";
    output->keep();
    return 0;
  }

  MLIRContext context;
  OwningOpRef<ModuleOp> module =
      moe::buildLanguageModel(&context, *config, batch, seq, documentMask,
                              layerFunctions, expertRowPadding);
  if (failed(verify(*module))) {
    llvm::errs() << "moe-model: the built model does not verify\n";
    return 1;
  }
  if (trainStep) {
    PassManager pm(&context);
    pm.addPass(moe::createMoEAutodiff());
    if (failed(pm.run(*module)))
      return 1;
  }
  OpPrintingFlags flags;
  if (debugInfo)
    flags.enableDebugInfo();
  module->print(output->os(), flags);
  output->os() << "\n";
  output->keep();
  return 0;
}
