//===- moe-compile.cpp - moe programs to loadable shared objects ----------===//
//
//   moe-compile model.mlir -o model.so --target=cpu|sm_90a
//
// Runs the CPU or GPU pipeline, translates to LLVM IR, compiles for the host
// and links one shared object holding the host code and, for GPU targets,
// the kernels (PTX, plus a cubin in a fatbin when ptxas is found). See
// include/moe/Compiler/Compiler.h for the artifact's interface.
//
//===----------------------------------------------------------------------===//

#include "moe/Compiler/Compiler.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
namespace cl = llvm::cl;

/// The options --help lists (LLVM's own stay available, unlisted).
static cl::OptionCategory moeCompileOptions("moe-compile options");

static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<model.mlir>"),
                                      cl::Required, cl::cat(moeCompileOptions));
static cl::opt<std::string> outputFile("o", cl::desc("Output shared object"),
                                       cl::value_desc("file.so"), cl::Required,
                                       cl::cat(moeCompileOptions));
static cl::opt<std::string>
    target("target", cl::desc("cpu (default), or a GPU chip such as sm_90a"),
           cl::init("cpu"), cl::cat(moeCompileOptions));
static cl::opt<std::string>
    kernelFormat("kernel-format",
                 cl::desc("GPU kernels as: auto (fatbin with cubin and PTX "
                          "when ptxas is found, else PTX), isa (PTX), fatbin"),
                 cl::init("auto"), cl::cat(moeCompileOptions));
static cl::opt<std::string>
    emitLLVM("emit-llvm", cl::desc("Also write the LLVM IR to this file"),
             cl::value_desc("file.ll"), cl::init(""),
             cl::cat(moeCompileOptions));
static cl::opt<std::string>
    emitKernels("emit-ptx",
                cl::desc("Also write the GPU kernels' PTX to this file (the "
                         "artifact then embeds PTX only)"),
                cl::value_desc("file.ptx"), cl::init(""),
                cl::cat(moeCompileOptions));
static cl::opt<bool> verifyPTX(
    "verify-ptx",
    cl::desc("Assemble every kernel module with ptxas for the target chip and "
             "fail if ptxas rejects one (the artifact then embeds PTX only)"),
    cl::init(false), cl::cat(moeCompileOptions));
static cl::opt<bool> mxfp8FP8MMA(
    "mxfp8-fp8-mma",
    cl::desc("Hopper: run MXFP8 grouped GEMMs on FP8 wgmma per 32-wide K "
             "slice instead of the exact default (bf16 wgmma on the exactly "
             "dequantized operands). Not exact: the tensor core sums each "
             "slice's FP8 products at reduced precision (about 5e-5 "
             "relative); and today slower: its kernel has no TMA pipeline"),
    cl::init(false), cl::cat(moeCompileOptions));
static cl::opt<bool> bufferReport(
    "buffer-report",
    cl::desc("Print each function's peak of live buffers (bytes allocated "
             "and not yet freed, in program order) and the largest of them"),
    cl::init(false), cl::cat(moeCompileOptions));
static cl::opt<std::string> pairRoundTrips(
    "pair-round-trips",
    cl::desc("Hopper: when the two MX round trips of a weight or of an "
             "expert's rows share one kernel: 'peak' (default: unless holding "
             "the second result longer raises the step's peak memory) or "
             "'always' (each tensor read once: faster, more memory)"),
    cl::init("peak"), cl::cat(moeCompileOptions));
static cl::opt<std::string> mxActivations(
    "mx-activations",
    cl::desc("Hopper: where the expert GEMMs read the activations their "
             "SwiGLU epilogues quantize as 8-bit MX elements and scales "
             "instead of bf16: 'peak' (default: where that lowers the step's "
             "peak memory) or 'always' (the least memory; those GEMMs run "
             "10-18% slower)"),
    cl::init("peak"), cl::cat(moeCompileOptions));
static cl::opt<std::string> linker("linker",
                                   cl::desc("The C compiler used to link"),
                                   cl::init("cc"), cl::cat(moeCompileOptions));

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  registerAllPasses();
  moe::registerMoEPasses();
  moe::registerMoEConversionPasses();
  cl::HideUnrelatedOptions({moeCompileOptions});
  cl::ParseCommandLineOptions(
      argc, argv,
      "moe-compile: compile a moe program to a shared object\n\n"
      "  moe-compile model.mlir -o model.so --target=cpu|sm_90a\n");

  DialectRegistry registry;
  moe::registerCompilerDialects(registry);
  MLIRContext context(registry);

  std::string error;
  auto file = openInputFile(inputFile, &error);
  if (!file) {
    llvm::errs() << "moe-compile: " << error << "\n";
    return 1;
  }
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  SourceMgrDiagnosticHandler handler(sourceMgr, &context);
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  if (!module)
    return 1;

  moe::CompileOptions options;
  options.target = target;
  options.kernelFormat = kernelFormat;
  options.verifyPTX = verifyPTX;
  options.emitPTX = emitKernels;
  options.emitLLVM = emitLLVM;
  options.linker = linker;
  options.mxfp8FP8MMA = mxfp8FP8MMA;
  options.bufferReport = bufferReport;
  for (const cl::opt<std::string> *mode : {&pairRoundTrips, &mxActivations})
    if (*mode != "peak" && *mode != "always") {
      llvm::errs() << "moe-compile: --" << mode->ArgStr
                   << " must be 'peak' or 'always', got '" << *mode << "'\n";
      return 1;
    }
  options.pairRoundTrips = pairRoundTrips;
  options.mxActivations = mxActivations;
  return failed(moe::compileToSharedObject(*module, outputFile, options,
                                           llvm::outs()));
}
