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
#include "moe/Pipelines/Pipelines.h"
#include "moe/Support/SourceChecks.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
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
static cl::opt<bool> bufferReport(
    "buffer-report",
    cl::desc("Print each function's peak of live buffers (bytes allocated "
             "and not yet freed, in program order) and the largest of them"),
    cl::init(false), cl::cat(moeCompileOptions));
static cl::opt<std::string> linker("linker",
                                   cl::desc("The C compiler used to link"),
                                   cl::init("cc"), cl::cat(moeCompileOptions));
/// Every other --name[=value] flag: an option of the GPU pipeline
/// (GPUPipelineOptions, listed by --help), passed on to it.
static cl::list<std::string> gpuOptions(cl::Sink);

/// --help's part on the GPU pipeline's options (declared once, in
/// GPUPipelineOptions) and MLIR's pass-manager flags.
static std::string gpuOptionsHelp() {
  moe::GPUPipelineOptions options;
  return "\nGPU targets: the GPU pipeline's options, as flags "
         "(--pair-round-trips=always; the chip\nand format come from "
         "--target and --kernel-format):\n\n" +
         options.flagsHelp({"chip", "format", "buffer-report"}) +
         "\nPass manager (as in mlir-opt): --mlir-print-ir-before=<pass>,\n"
         "  --mlir-print-ir-after=<pass>, --mlir-print-ir-after-all,\n"
         "  --mlir-print-ir-after-change, --mlir-print-ir-after-failure,\n"
         "  --mlir-print-ir-module-scope, --mlir-timing,\n"
         "  --mlir-timing-display=list|tree, --mlir-pass-statistics,\n"
         "  --mlir-disable-threading\n";
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  registerAllPasses();
  moe::registerMoEPasses();
  moe::registerMoEConversionPasses();
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();
  registerMLIRContextCLOptions();
  registerAsmPrinterCLOptions();
  cl::HideUnrelatedOptions({moeCompileOptions});
  static const std::string gpuHelp = gpuOptionsHelp();
  static cl::extrahelp gpuHelpText(gpuHelp.c_str());
  const char *overview =
      "moe-compile: compile a moe program to a shared object\n\n"
      "  moe-compile model.mlir -o model.so --target=cpu|sm_90a\n";
  cl::ParseCommandLineOptions(argc, argv, overview);

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
  if (failed(moe::verifyParsable(
          sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID())
              ->getMemBufferRef(),
          &context)))
    return 1;
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  if (!module)
    return 1;

  moe::CompileOptions options;
  options.target = target;
  // The GPU pipeline's flags, in its option syntax (name=value).
  for (const std::string &flag : gpuOptions) {
    StringRef option = StringRef(flag).ltrim('-');
    if (option.size() == flag.size()) {
      llvm::errs() << "moe-compile: unexpected argument '" << flag << "'\n";
      return 1;
    }
    options.gpuOptions +=
        (options.gpuOptions.empty() ? "" : " ") + option.str();
  }
  options.kernelFormat = kernelFormat;
  options.verifyPTX = verifyPTX;
  options.emitPTX = emitKernels;
  options.emitLLVM = emitLLVM;
  options.linker = linker;
  options.bufferReport = bufferReport;
  options.configurePassManager = [](PassManager &pm) -> LogicalResult {
    if (failed(applyPassManagerCLOptions(pm)))
      return failure();
    applyDefaultTimingPassManagerCLOptions(pm);
    return success();
  };
  return failed(
      moe::compileToSharedObject(*module, outputFile, options, llvm::outs()));
}
