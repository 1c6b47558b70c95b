//===- moe-train.cpp - train an MoE language model on sequences -----------===//
//
//   moe-train --config config.json --data family.sto [--data more.fa ...]
//             [--batch 8] [--seq 128] [--target cpu|sm_90a] [--out DIR]
//             [--init-from HF_DIR] [--resume] [--compile-only] [options]
//
// Builds the model of a Qwen3-MoE-family config.json (moe-model), derives
// its train step (-moe-autodiff) with the optimizer update in it
// (-moe-adamw: the state stays where the step runs), compiles it for the CPU or
// a GPU into DIR/train_step-<target>.so, then trains (libmoert's training loop,
// see runtime/include/moert/Trainer.h). With --compile-only it stops after
// compiling: the artifact then trains with moert-train on a machine that
// has the runtime but no MLIR.
//
// With --ep-size N > 1 and/or --dp-size D > 1 the step is compiled for
// D x N ranks: D copies of a group of N expert-parallel ranks (each holds
// 1/N of the experts), every rank taking --batch rows of a step's D * N *
// --batch. moe-train then becomes the launcher (--launcher, by default
// `mpirun -np D*N`) running moert-train on the artifact with the training
// options.
//
//===----------------------------------------------------------------------===//

#include "moe/Compiler/Compiler.h"
#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Models/LanguageModel.h"
#include "moe/Pipelines/Pipelines.h"

#include "moert/HfWeights.h"
#include "moert/Trainer.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

#include "llvm/Support/Path.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

using namespace mlir;

static const char *kUsage =
    "moe-train: trains an MoE language model (a Qwen3-MoE family "
    "config.json) on protein or DNA sequences, on the CPU or a GPU\n\n"
    "usage: moe-train --config FILE --data FILE [options]\n\n"
    "model and compilation:\n"
    "  --config FILE          Hugging Face config.json (Qwen3-MoE family; "
    "required\n"
    "                         unless --init-from gives a directory holding "
    "one)\n"
    "  --batch N              rows per step (default 8)\n"
    "  --seq N                tokens per row (default 128)\n"
    "  --target NAME          cpu (default), or a GPU chip such as sm_90a\n"
    "  --recipe NAME          GEMM precision, forward and backward, f32 "
    "master\n"
    "                         weights: none (f32, default); bf16 (every "
    "matmul:\n"
    "                         experts, projections, router, LM head); mxfp8 "
    "(MXFP8\n"
    "                         expert GEMMs, the others as --dense says; "
    "hidden and\n"
    "                         expert FFN sizes multiples of 32); "
    "fp8-blockwise\n"
    "                         (E4M3 expert GEMMs, one power-of-two scale per "
    "1 x 128\n"
    "                         tile of activations and gradients and per 128 x "
    "128 of\n"
    "                         weights, the others as --dense says; any "
    "sizes)\n"
    "  --dense NAME           with a recipe: the dense GEMMs' precision, bf16 "
    "(default),\n"
    "                         mxfp8 or fp8-blockwise\n"
    "  --document-mask        each sequence packed into a row attends only "
    "to\n"
    "                         itself (attention masked where a <bos> starts "
    "the next)\n"
    "  --layer-functions      each kind of decoder layer compiled once, as a\n"
    "                         function called per layer (compile time "
    "follows the\n"
    "                         kinds of layers, not the depth; see README)\n"
    "  --ep-size N            expert parallelism over N ranks (default 1): "
    "each rank\n"
    "                         holds num_experts / N experts and trains "
    "--batch rows\n"
    "                         of each step's N * --batch; the replicated "
    "parameters'\n"
    "                         gradients are summed over the ranks. Trains "
    "under\n"
    "                         --launcher (N GPUs, one per rank, or N CPU "
    "processes)\n"
    "  --dp-size D            data parallelism over D copies of the "
    "--ep-size group\n"
    "                         (default 1): D * N ranks in all, rank d * N + "
    "e holding\n"
    "                         the experts of rank e; every gradient is "
    "summed over\n"
    "                         the ranks holding its parameter. --ep-size 1 "
    "--dp-size D\n"
    "                         is plain data parallelism\n"
    "  --ep-chunks C          with --ep-size: each MoE layer's tokens in C "
    "chunks,\n"
    "                         one chunk's exchange travelling while another's "
    "experts\n"
    "                         compute (default 1; the tokens of a step must "
    "divide)\n"
    "  --grad-bucket-mib M    on several ranks: the gradients are summed "
    "over the\n"
    "                         ranks M MiB at a time, each bucket as soon as "
    "the\n"
    "                         backward has computed it, while the rest of "
    "the\n"
    "                         backward runs (default 32; 0: one sum per "
    "gradient,\n"
    "                         at the end)\n"
    "  --launcher CMD         the command that starts the D * N ranks, "
    "followed by\n"
    "                         moert-train and its arguments (default "
    "'mpirun -np\n"
    "                         D*N'; split at spaces)\n"
    "  --recompute            with --layer-functions: each layer's forward "
    "runs again\n"
    "                         before its backward instead of its "
    "activations being held\n"
    "                         (one more forward a step; the memory of a "
    "layer's\n"
    "                         activations instead of all layers')\n"
    "  --loss-chunk-rows N    with a recipe: the LM head, the cross-entropy "
    "and their\n"
    "                         backward N tokens at a time, so that no "
    "[tokens, vocab]\n"
    "                         logits or gradient is held (default 0: all "
    "tokens at\n"
    "                         once; each further chunk adds one f32 LM-head "
    "weight\n"
    "                         gradient and its addition)\n"
    "  --compile-only         write DIR/train_step-<target>.so and stop "
    "(train\n"
    "                         it with moert-train where there is no MLIR)\n"
    "training:\n";

/// Replaces this process by `launcher` running moert-train (beside this
/// tool, else on PATH) on `artifact` with the training arguments.
template <typename Die>
static void launch(const std::string &launcher, const char *argv0,
                   const std::string &artifact,
                   const std::vector<std::string> &trainArgs, Die die) {
  std::vector<std::string> command;
  for (size_t at = 0; at < launcher.size();) {
    size_t end = launcher.find(' ', at);
    if (end == std::string::npos)
      end = launcher.size();
    if (end > at)
      command.push_back(launcher.substr(at, end - at));
    at = end + 1;
  }
  if (command.empty())
    die("--launcher is empty");
  std::string self = llvm::sys::fs::getMainExecutable(
      argv0, reinterpret_cast<void *>(&launch<Die>));
  std::string beside =
      llvm::sys::path::parent_path(self).str() + "/moert-train";
  command.push_back(llvm::sys::fs::can_execute(beside) ? beside
                                                       : "moert-train");
  command.push_back(artifact);
  command.insert(command.end(), trainArgs.begin(), trainArgs.end());
  std::string shown;
  for (const std::string &c : command)
    shown += (shown.empty() ? "" : " ") + c;
  llvm::errs() << "moe-train: " << shown << "\n";
  std::vector<char *> cargv;
  for (std::string &c : command)
    cargv.push_back(c.data());
  cargv.push_back(nullptr);
  ::execvp(cargv[0], cargv.data());
  die("cannot run " + command[0] + ": " + std::strerror(errno) +
      " (--launcher gives another launcher; or train with moert-train " +
      artifact + " under yours)");
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  auto die = [](const llvm::Twine &message) {
    llvm::errs() << "moe-train: " << message << "\n";
    std::exit(1);
  };
  std::vector<std::string> args(argv + 1, argv + argc), rest;
  for (const std::string &a : args)
    if (a == "--help" || a == "-h") {
      llvm::outs() << kUsage << moert::trainOptionsHelp();
      return 0;
    }
  moert::TrainOptions options;
  std::string error;
  std::vector<std::string> trainArgs; // for moert-train under --launcher
  if (!moert::parseTrainOptions(args, options, rest, error, &trainArgs))
    die(error);

  std::string configPath, target = "cpu", recipe = "none", dense = "bf16",
                          launcher;
  int64_t batch = 8, seq = 128, epSize = 1, dpSize = 1, bucketMiB = 32,
          epChunks = 1, lossChunkRows = 0;
  bool compileOnly = false, denseGiven = false, documentMask = false,
       layerFunctions = false, recompute = false;
  for (size_t i = 0; i < rest.size(); ++i) {
    std::string name = rest[i], value;
    bool inline_ = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_ = true;
    }
    auto next = [&]() {
      if (inline_)
        return;
      if (i + 1 >= rest.size())
        die(name + " expects a value");
      value = rest[++i];
    };
    auto integer = [&](int64_t &out, int64_t least = 1) {
      next();
      char *end = nullptr;
      long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end || v < least || v > (int64_t(1) << 30))
        die(name + " expects a " + (least == 1 ? "positive" : "non-negative") +
            " integer, got '" + value + "'");
      out = v;
    };
    if (name == "--config") {
      next();
      configPath = value;
    } else if (name == "--target") {
      next();
      target = value;
    } else if (name == "--recipe") {
      next();
      recipe = value;
      if (recipe != "none" && recipe != "bf16" && recipe != "mxfp8" &&
          recipe != "fp8-blockwise")
        die("--recipe must be none, bf16, mxfp8 or fp8-blockwise, got '" +
            recipe + "'");
    } else if (name == "--dense") {
      next();
      dense = value;
      denseGiven = true;
      if (dense != "bf16" && dense != "mxfp8" && dense != "fp8-blockwise")
        die("--dense must be bf16, mxfp8 or fp8-blockwise, got '" + dense +
            "'");
    } else if (name == "--batch") {
      integer(batch);
    } else if (name == "--seq") {
      integer(seq);
    } else if (name == "--ep-size") {
      integer(epSize);
    } else if (name == "--dp-size") {
      integer(dpSize);
    } else if (name == "--ep-chunks") {
      integer(epChunks);
    } else if (name == "--grad-bucket-mib") {
      integer(bucketMiB, /*least=*/0);
    } else if (name == "--loss-chunk-rows") {
      integer(lossChunkRows, /*least=*/0);
    } else if (name == "--launcher") {
      next();
      launcher = value;
    } else if (name == "--compile-only" && !inline_) {
      compileOnly = true;
    } else if (name == "--document-mask" && !inline_) {
      documentMask = true;
    } else if (name == "--layer-functions" && !inline_) {
      layerFunctions = true;
    } else if (name == "--recompute" && !inline_) {
      recompute = true;
    } else {
      die("unknown option '" + rest[i] + "' (see --help)");
    }
  }
  if (configPath.empty() && !options.initFrom.empty())
    configPath = options.initFrom + "/config.json";
  if (configPath.empty())
    die("no --config: give a Qwen3-MoE config.json (see --help)");
  if (recompute && !layerFunctions)
    die("--recompute recomputes the layer functions of --layer-functions: "
        "give both");
  const int64_t ranks = epSize * dpSize;
  if (!launcher.empty() && ranks == 1)
    die("--launcher starts the ranks of --ep-size N > 1 or --dp-size D > 1");
  if (!launcher.empty() && compileOnly)
    die("--launcher with --compile-only: nothing is launched (run moert-train "
        "on the artifact under the launcher)");
  // Launched as one of several ranks: each would compile.
  for (const char *var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"})
    if (const char *v = std::getenv(var); v && std::atoi(v) > 1)
      die(std::string("launched as one of several ranks (") + var + "=" + v +
          "): run moe-train once, it starts the ranks of --ep-size and "
          "--dp-size itself "
          "(or run moert-train under the launcher)");
  if (lossChunkRows > 0 && recipe == "none")
    die("--loss-chunk-rows needs --recipe bf16, mxfp8 or fp8-blockwise (the "
        "LM head is chunked on the grouped GEMMs a recipe puts it on)");
  // The LM head's weight gradient contracts over the tokens: chunks keep
  // a block-scaled dense recipe's scale blocks along them whole (the row
  // block that recipe pads expert groups to).
  if (int64_t block = moe::expertRowPadding(dense);
      lossChunkRows > 0 && lossChunkRows % block != 0)
    die("--loss-chunk-rows with --dense " + dense + ": a multiple of " +
        std::to_string(block) +
        " (the LM head's weight gradient keeps its scale blocks along the "
        "tokens whole), got " +
        std::to_string(lossChunkRows));
  if (denseGiven && recipe == "none")
    die("--dense needs --recipe bf16, mxfp8 or fp8-blockwise (under none "
        "every GEMM is f32)");
  // What the checkpoint records (a run resumes only under the same one).
  std::string precision =
      recipe + (recipe != "none" && dense != "bf16" ? "-dense-" + dense : "");
  if (!compileOnly && options.data.empty())
    die("no --data: give one or more FASTA or Stockholm files");
  llvm::Expected<moe::ModelConfig> config = moe::ModelConfig::load(configPath);
  if (!config)
    die(llvm::toString(config.takeError()));
  // MXFP8 blocks of 32 run along the expert GEMMs' hidden and FFN dims;
  // other sizes would silently stay in f32.
  if (recipe == "mxfp8" &&
      (config->hiddenSize % 32 || config->moeIntermediateSize % 32))
    die("--recipe mxfp8 needs 'hidden_size' and 'moe_intermediate_size' that "
        "are multiples of 32 (the MX block); " +
        configPath + " has " + std::to_string(config->hiddenSize) + " and " +
        std::to_string(config->moeIntermediateSize) +
        ": use --recipe bf16 or none");

  if (epChunks > 1 && epSize == 1)
    die("--ep-chunks splits the exchanges of --ep-size N > 1");
  if (epChunks > 1 && (batch * seq) % epChunks)
    die("--ep-chunks " + std::to_string(epChunks) + " must divide the " +
        std::to_string(batch * seq) +
        " tokens of a rank's step (--batch x "
        "--seq)");
  if (epSize > 1 && (config->numExperts < 1 || config->numExperts % epSize))
    die("--ep-size " + std::to_string(epSize) + " must divide the " +
        std::to_string(config->numExperts) + " experts of " + configPath +
        " ('num_experts')");

  // Before compiling: bad data and an --out that names a file fail here,
  // not after.
  if (!compileOnly &&
      !moert::checkTrainData(options, seq, config->vocabSize, error))
    die(error);
  if (!options.initFrom.empty()) {
    std::vector<moert::ModelParam> layout;
    for (const moe::ModelParameter &p : moe::modelParameters(*config))
      layout.push_back({p.name, p.shape, p.hfTransposed});
    std::vector<std::string> unused;
    if (!moert::readHfWeights(options.initFrom, layout, nullptr, unused, error))
      die("--init-from: " + error);
  }
  if (llvm::sys::fs::exists(options.out) &&
      !llvm::sys::fs::is_directory(options.out))
    die("--out '" + options.out + "' is not a directory");
  if (std::error_code ec = llvm::sys::fs::create_directories(options.out))
    die("cannot create '" + options.out + "': " + ec.message());
  std::string artifact = options.out + "/train_step-" + target +
                         (recipe == "none" ? "" : "-" + precision) +
                         (dpSize > 1 ? "-dp" + std::to_string(dpSize) : "") +
                         (epSize > 1 ? "-ep" + std::to_string(epSize) : "") +
                         ".so";
  {
    DialectRegistry registry;
    moe::registerCompilerDialects(registry);
    MLIRContext context(registry);
    OwningOpRef<ModuleOp> module =
        moe::buildLanguageModel(&context, *config, batch, seq, documentMask,
                                layerFunctions, moe::expertRowPadding(recipe));
    PassManager pm(&context);
    moe::TrainPipelineOptions train;
    train.autodiff = true;
    train.optimizer = moe::TrainPipelineOptions::Optimizer::AdamW;
    train.recipe = recipe;
    train.dense = dense;
    train.epSize = epSize;
    train.dpSize = dpSize;
    train.gradBucketMiB = bucketMiB;
    train.epChunks = epChunks;
    train.recompute = recompute;
    train.lossChunkRows = lossChunkRows;
    moe::buildTrainPipeline(pm, train);
    // A loss -moe-chunk-loss leaves whole (it says why in a remark) would
    // hold the [tokens, vocab] logits --loss-chunk-rows asked to avoid.
    std::string notChunked;
    ScopedDiagnosticHandler remarks(&context, [&](Diagnostic &d) {
      std::string message = d.str();
      if (d.getSeverity() != DiagnosticSeverity::Remark ||
          message.rfind("moe-chunk-loss: not chunked: ", 0) != 0)
        return failure(); // to the default handler
      notChunked = message;
      return success();
    });
    if (failed(verify(*module)) || failed(pm.run(*module)))
      die("the train step could not be derived" +
          (recipe == "none" ? std::string() : " with --recipe " + recipe));
    if (lossChunkRows > 0 && !notChunked.empty())
      die("--loss-chunk-rows: the LM head and loss could not be chunked (" +
          notChunked.substr(std::strlen("moe-chunk-loss: ")) + ")");
    // The recipe is part of the run: a checkpoint resumes only under it.
    // The ranks the step runs on: data-parallel copies, expert-parallel
    // ranks.
    module->walk([&](func::FuncOp f) {
      if (auto meta = f->getAttrOfType<DictionaryAttr>("moe.meta")) {
        NamedAttrList entries(meta);
        entries.set("recipe", StringAttr::get(&context, precision));
        entries.set("ranks",
                    StringAttr::get(&context, std::to_string(dpSize) + " " +
                                                  std::to_string(epSize)));
        f->setAttr("moe.meta", entries.getDictionary(&context));
      }
    });
    moe::CompileOptions compile;
    compile.target = target;
    if (failed(moe::compileToSharedObject(*module, artifact, compile,
                                          llvm::errs())))
      die("compiling the train step for " + target + " failed");
  }
  if (compileOnly) {
    llvm::errs() << "moe-train: wrote " << artifact << "\n";
    return 0;
  }
  if (ranks > 1)
    launch(launcher.empty() ? "mpirun -np " + std::to_string(ranks) : launcher,
           argv[0], artifact, trainArgs, die);
  return moert::train(options, artifact, "moe-train");
}
