//===- moe-train.cpp - train an MoE language model on sequences -----------===//
//
//   moe-train --config config.json --data family.sto [--data more.fa ...]
//             [--alphabet protein|dna] [--steps 300] [--batch 8] [--seq 128]
//             [--target cpu|sm_90a] [--out DIR] [--resume]
//
// Builds the model of a Qwen3-MoE-family config.json (moe-model), derives
// its train step (-moe-autodiff), compiles it for the CPU or a GPU, then
// trains on protein or DNA sequences (FASTA or Stockholm): packed
// fixed-length rows, every 10th row held out; AdamW with warmup + cosine
// schedule and gradient clipping. Writes to DIR: checkpoint.safetensors
// (parameters with their Hugging Face names plus the optimizer state,
// replaced atomically), metrics.jsonl, loss.png, and the compiled step.
// --resume continues a checkpoint exactly where it stopped: the same loss
// curve as an uninterrupted run.
//
//===----------------------------------------------------------------------===//

#include "moe/Compiler/Compiler.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Models/LanguageModel.h"

#include "moert/Gpu.h"
#include "moert/Sequences.h"
#include "moert/Train.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <dlfcn.h>
#include <map>
#include <random>
#include <sys/resource.h>
#include <unistd.h>

using namespace mlir;
namespace cl = llvm::cl;

static cl::OptionCategory category("moe-train options");
static cl::opt<std::string> configPath("config", cl::desc("Model config.json (Qwen3-MoE family)"),
                                       cl::value_desc("file"), cl::Required, cl::cat(category));
static cl::list<std::string> dataPaths("data", cl::desc("Sequences: FASTA or Stockholm (repeatable)"),
                                       cl::value_desc("file"), cl::OneOrMore, cl::cat(category));
static cl::opt<std::string> alphabetName("alphabet", cl::desc("protein (default) or dna"),
                                         cl::init("protein"), cl::cat(category));
static cl::opt<std::string> outDir("out", cl::desc("Output directory (default: moe-train-out)"),
                                   cl::init("moe-train-out"), cl::cat(category));
static cl::opt<bool> resume("resume", cl::desc("Continue the checkpoint in --out"),
                            cl::init(false), cl::cat(category));
static cl::opt<std::string> target("target", cl::desc("cpu (default), or a GPU chip such as sm_90a"),
                                   cl::init("cpu"), cl::cat(category));
static cl::opt<int64_t> steps("steps", cl::desc("Optimizer steps in all (default 300)"),
                              cl::init(300), cl::cat(category));
static cl::opt<int64_t> batch("batch", cl::desc("Rows per step (default 8)"), cl::init(8),
                              cl::cat(category));
static cl::opt<int64_t> seqLen("seq", cl::desc("Tokens per row (default 128)"), cl::init(128),
                               cl::cat(category));
static cl::opt<double> peakLR("lr", cl::desc("Peak learning rate (default 3e-3)"), cl::init(3e-3),
                              cl::cat(category));
static cl::opt<double> minLRRatio("min-lr-ratio",
                                  cl::desc("Final learning rate / peak (default 0.1)"),
                                  cl::init(0.1), cl::cat(category));
static cl::opt<int64_t> warmup("warmup", cl::desc("Linear warmup steps (default 30)"), cl::init(30),
                               cl::cat(category));
static cl::opt<double> weightDecay("weight-decay",
                                   cl::desc("AdamW decoupled weight decay of matrices (default 0.1)"),
                                   cl::init(0.1), cl::cat(category));
static cl::opt<double> beta1("beta1", cl::desc("AdamW beta1 (default 0.9)"), cl::init(0.9),
                             cl::cat(category));
static cl::opt<double> beta2("beta2", cl::desc("AdamW beta2 (default 0.95)"), cl::init(0.95),
                             cl::cat(category));
static cl::opt<double> clipNorm("clip", cl::desc("Gradient clipping by global norm; 0 = off (default 1)"),
                                cl::init(1.0), cl::cat(category));
static cl::opt<int64_t> evalEvery("eval-every",
                                  cl::desc("Held-out loss every N steps (default 50; 0 = at the end only)"),
                                  cl::init(50), cl::cat(category));
static cl::opt<int64_t> evalBatches("eval-batches",
                                    cl::desc("Held-out batches per evaluation (default 8; 0 = all)"),
                                    cl::init(8), cl::cat(category));
static cl::opt<int64_t> checkpointEvery("checkpoint-every",
                                        cl::desc("Checkpoint every N steps (default 100; always at the end)"),
                                        cl::init(100), cl::cat(category));
static cl::opt<int64_t> stopAfter("stop-after-steps",
                                  cl::desc("Stop (with a checkpoint) after this many steps of this run"),
                                  cl::init(0), cl::cat(category));
static cl::opt<uint64_t> seed("seed", cl::desc("Initialization and data order (default 0)"),
                              cl::init(0), cl::cat(category));
static cl::opt<std::string> progress("progress", cl::desc("auto (default: a bar on a terminal), bar, lines, none"),
                                     cl::init("auto"), cl::cat(category));

namespace {

[[noreturn]] void die(const llvm::Twine &message) {
  llvm::errs() << "moe-train: " << message << "\n";
  std::exit(1);
}

/// Normal(0, std) values from a seeded generator (Box-Muller: the same
/// values on every platform, unlike std::normal_distribution).
struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t s) : gen(s) {}
  double uniform() { return (double(gen() >> 11) + 0.5) / 9007199254740992.0; }
  double normal() {
    double u = uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
  }
};

/// A compiled function: `_mlir_packed_<name>` and its manifest signature.
struct Entry {
  void (*fn)(void **) = nullptr;
};

/// Where the artifact's tensors live: host memory (CPU artifacts) or device
/// memory staged from and to the host (GPU artifacts).
struct Memory {
  bool gpu = false;
  void *stream = nullptr;

  void *upload(const void *host, size_t bytes) {
    if (!gpu)
      return const_cast<void *>(host);
    void *d = mgpuMemAlloc(std::max<size_t>(bytes, 1), stream, false);
    mgpuMemcpy(d, const_cast<void *>(host), bytes, stream);
    return d;
  }
  void download(void *host, const void *src, size_t bytes) {
    if (!gpu) {
      std::memcpy(host, src, bytes);
      return;
    }
    mgpuMemcpy(host, const_cast<void *>(src), bytes, stream);
    mgpuStreamSynchronize(stream);
  }
  void release(void *p) {
    if (gpu)
      mgpuMemFree(p, stream);
    else
      std::free(p);
  }
};

struct Descriptor {
  std::vector<int64_t> fields;
  Descriptor(void *data, const std::vector<int64_t> &shape) {
    fields = {int64_t(intptr_t(data)), int64_t(intptr_t(data)), 0};
    fields.insert(fields.end(), shape.begin(), shape.end());
    std::vector<int64_t> strides(shape.size());
    int64_t s = 1;
    for (int i = int(shape.size()) - 1; i >= 0; --i) {
      strides[size_t(i)] = s;
      s *= shape[size_t(i)];
    }
    fields.insert(fields.end(), strides.begin(), strides.end());
  }
};

struct Trainer {
  moe::ModelConfig config;
  std::vector<moe::ModelParameter> params;
  std::vector<std::vector<float>> values, adamM, adamV;
  int64_t step = 0;
  Memory memory;
  Entry lossGrad, lossOnly;
  void *library = nullptr;

  int64_t elements(size_t i) const {
    int64_t n = 1;
    for (int64_t d : params[i].shape)
      n *= d;
    return n;
  }

  /// Calls `entry` with the parameters and one batch; returns the loss and,
  /// for the train step, fills `grads`.
  double run(Entry entry, const std::vector<int32_t> &ids,
             const std::vector<int32_t> &labels,
             std::vector<std::vector<float>> *grads) {
    std::vector<Descriptor> descs;
    std::vector<void *> staged;
    for (size_t i = 0; i < params.size(); ++i) {
      void *p = memory.upload(values[i].data(), values[i].size() * 4);
      if (memory.gpu)
        staged.push_back(p);
      descs.emplace_back(p, params[i].shape);
    }
    std::vector<int64_t> bs = {batch, seqLen};
    for (const std::vector<int32_t> *t : {&ids, &labels}) {
      void *p = memory.upload(t->data(), t->size() * 4);
      if (memory.gpu)
        staged.push_back(p);
      descs.emplace_back(p, bs);
    }
    // Results: the 0-d loss, then one ranked descriptor per gradient.
    size_t resultWords = 3;
    if (grads)
      for (const moe::ModelParameter &p : params)
        resultWords += 3 + 2 * p.shape.size();
    std::vector<int64_t> results(resultWords, 0);
    std::vector<void *> pointers = {results.data()};
    for (Descriptor &d : descs)
      pointers.push_back(d.fields.data());
    entry.fn(pointers.data());
    if (memory.gpu)
      mgpuStreamSynchronize(memory.stream);

    std::vector<void *> allocated;
    auto take = [&](size_t word, void *host, size_t bytes) {
      void *alloc = reinterpret_cast<void *>(results[word]);
      void *aligned = reinterpret_cast<void *>(results[word + 1]);
      int64_t offset = results[word + 2];
      memory.download(host, static_cast<char *>(aligned) + offset * 4, bytes);
      if (alloc && std::find(allocated.begin(), allocated.end(), alloc) ==
                       allocated.end())
        allocated.push_back(alloc);
    };
    float loss = 0;
    take(0, &loss, 4);
    if (grads) {
      size_t word = 3;
      grads->resize(params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        (*grads)[i].resize(size_t(elements(i)));
        take(word, (*grads)[i].data(), (*grads)[i].size() * 4);
        word += 3 + 2 * params[i].shape.size();
      }
    }
    for (void *p : allocated)
      memory.release(p);
    for (void *p : staged)
      memory.release(p);
    return loss;
  }
};

std::string configFingerprint(const moe::ModelConfig &c) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "hidden=" << c.hiddenSize << " moe_ffn=" << c.moeIntermediateSize
     << " experts=" << c.numExperts << " top_k=" << c.numExpertsPerTok
     << " layers=" << c.numHiddenLayers << " heads=" << c.numAttentionHeads
     << "/" << c.numKeyValueHeads << " head_dim=" << c.headDim
     << " vocab=" << c.vocabSize << " ffn=" << c.intermediateSize
     << " sparse_step=" << c.decoderSparseStep
     << " shared=" << c.sharedExpertIntermediateSize
     << " norm_topk=" << c.normTopkProb << " tie=" << c.tieWordEmbeddings
     << " eps=" << c.rmsNormEps << " theta=" << c.ropeTheta;
  return s;
}

/// Model FLOPs of one step (forward + backward): 6 x active parameters x
/// tokens (the embedding lookup excluded) plus attention's score and value
/// products (3 x 4 x B x S^2 x heads x head_dim per layer).
double stepFlops(const moe::ModelConfig &c, int64_t b, int64_t s) {
  double h = double(c.hiddenSize), d = double(c.headDim);
  double active = 0;
  for (int64_t l = 0; l < c.numHiddenLayers; ++l) {
    active += h * d * double(c.numAttentionHeads + 2 * c.numKeyValueHeads) +
              double(c.numAttentionHeads) * d * h;
    if (c.isMoELayer(l))
      active += h * double(c.numExperts) +
                double(c.numExpertsPerTok) * 3 * h * double(c.moeIntermediateSize) +
                3 * h * double(c.sharedExpertIntermediateSize);
    else
      active += 3 * h * double(c.intermediateSize);
  }
  active += h * double(c.vocabSize);
  double tokens = double(b * s);
  double attention = 12.0 * double(b) * double(s) * double(s) *
                     double(c.numAttentionHeads) * d * double(c.numHiddenLayers);
  return 6.0 * active * tokens + attention;
}

double peakMemoryMiB(const Memory &memory) {
  if (memory.gpu) {
    moert_gpu_memory_stats stats{};
    moert_gpu_get_memory_stats(&stats);
    return double(stats.peak_bytes_in_use) / (1 << 20);
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "moe-train: trains an MoE language model (Qwen3-MoE family config.json) "
      "on protein or DNA sequences, on the CPU or a GPU\n");

  // --- options ---
  for (auto [name, v] : {std::pair<const char *, int64_t>{"--steps", steps},
                         {"--batch", batch},
                         {"--seq", seqLen}})
    if (v < 1 || v > (int64_t(1) << 30))
      die(llvm::Twine(name) + " must be a positive integer, got " + llvm::Twine(v));
  if (warmup < 0 || evalEvery < 0 || evalBatches < 0 || checkpointEvery < 0 ||
      stopAfter < 0)
    die("--warmup, --eval-every, --eval-batches, --checkpoint-every and "
        "--stop-after-steps must not be negative");
  if (!(peakLR > 0) || !(minLRRatio >= 0 && minLRRatio <= 1) ||
      !(weightDecay >= 0) || !(beta1 >= 0 && beta1 < 1) ||
      !(beta2 >= 0 && beta2 < 1) || !(clipNorm >= 0))
    die("--lr must be positive, --min-lr-ratio in [0, 1], --beta1/--beta2 in "
        "[0, 1), --weight-decay and --clip not negative");
  moert::Alphabet alphabet;
  if (alphabetName == "protein")
    alphabet = moert::Alphabet::Protein;
  else if (alphabetName == "dna")
    alphabet = moert::Alphabet::DNA;
  else
    die("--alphabet must be protein or dna, got '" + alphabetName + "'");
  if (progress != "auto" && progress != "bar" && progress != "lines" &&
      progress != "none")
    die("--progress must be auto, bar, lines or none, got '" + progress + "'");
  bool bar = progress == "bar" || (progress == "auto" && isatty(2));

  Trainer t;
  {
    llvm::Expected<moe::ModelConfig> c = moe::ModelConfig::load(configPath);
    if (!c)
      die(llvm::toString(c.takeError()));
    t.config = *c;
  }
  moert::Tokenizer tokenizer(alphabet);
  if (t.config.vocabSize < tokenizer.vocabSize())
    die(configPath + ": 'vocab_size' (" + llvm::Twine(t.config.vocabSize) +
        ") is smaller than the " + alphabetName + " tokenizer's " +
        llvm::Twine(tokenizer.vocabSize()) + " tokens");

  // --- data ---
  std::vector<moert::Sequence> sequences;
  for (const std::string &path : dataPaths) {
    moert::SequenceError error;
    if (!moert::readSequences(path, alphabet, sequences, error))
      die(error.message);
  }
  moert::Batches data =
      moert::makeBatches(sequences, tokenizer, seqLen + 1, /*every=*/10);
  if (data.trainRows() < 1 || data.heldOutRows() < 1)
    die("the data give " + llvm::Twine(data.trainRows()) + " training and " +
        llvm::Twine(data.heldOutRows()) + " held-out rows of " +
        llvm::Twine(seqLen + 1) +
        " tokens: give more sequences or a smaller --seq");
  double unigram = moert::unigramHeldOutLoss(data, tokenizer.vocabSize());

  // --- output directory, checkpoint ---
  std::string checkpoint = outDir + "/checkpoint.safetensors";
  if (std::error_code ec = llvm::sys::fs::create_directories(outDir))
    die("cannot create '" + outDir + "': " + ec.message());
  bool exists = llvm::sys::fs::exists(checkpoint);
  if (exists && !resume)
    die(checkpoint + " exists: pass --resume to continue it, or choose "
                     "another --out");
  if (!exists && resume)
    die("--resume: no checkpoint at " + checkpoint);

  t.params = moe::modelParameters(t.config);
  t.values.resize(t.params.size());
  t.adamM.resize(t.params.size());
  t.adamV.resize(t.params.size());
  std::map<std::string, std::string> meta = {
      {"format", "moe-train/1"},
      {"config", configFingerprint(t.config)},
      {"batch", std::to_string(batch)},
      {"seq", std::to_string(seqLen)},
      {"seed", std::to_string(seed)},
      {"alphabet", alphabetName}};
  if (resume) {
    std::vector<moert::NamedTensor> tensors;
    std::map<std::string, std::string> saved;
    std::string error;
    if (!moert::readSafetensors(checkpoint, tensors, saved, error))
      die(error);
    if (saved["format"] != "moe-train/1")
      die(checkpoint + ": not a moe-train checkpoint");
    for (const char *key : {"config", "batch", "seq", "seed", "alphabet"})
      if (saved[key] != meta[key])
        die(checkpoint + ": made with " + key + " '" + saved[key] +
            "', this run has '" + meta[key] +
            "' (a checkpoint continues only the run that wrote it)");
    std::map<std::string, moert::NamedTensor *> byName;
    for (moert::NamedTensor &x : tensors)
      byName[x.name] = &x;
    for (size_t i = 0; i < t.params.size(); ++i) {
      const moe::ModelParameter &p = t.params[i];
      for (auto [prefix, dst] :
           {std::pair<std::string, std::vector<float> *>{"", &t.values[i]},
            {"optimizer.exp_avg.", &t.adamM[i]},
            {"optimizer.exp_avg_sq.", &t.adamV[i]}}) {
        auto it = byName.find(prefix + p.name);
        if (it == byName.end())
          die(checkpoint + ": no tensor '" + prefix + p.name +
              "' (a checkpoint of another model?)");
        if (it->second->shape != p.shape)
          die(checkpoint + ": tensor '" + prefix + p.name +
              "' has another shape than this config's");
        *dst = std::move(it->second->data);
      }
    }
    char *end = nullptr;
    t.step = std::strtoll(saved["step"].c_str(), &end, 10);
    if (saved["step"].empty() || *end || t.step < 0)
      die(checkpoint + ": bad 'step' metadata");
  } else {
    Rng rng(seed);
    for (size_t i = 0; i < t.params.size(); ++i) {
      t.values[i].resize(size_t(t.elements(i)));
      for (float &v : t.values[i])
        v = t.params[i].ones ? 1.0f
                             : float(rng.normal() * t.config.initializerRange);
    }
    for (size_t i = 0; i < t.params.size(); ++i) {
      t.adamM[i].assign(size_t(t.elements(i)), 0.0f);
      t.adamV[i].assign(size_t(t.elements(i)), 0.0f);
    }
  }

  // --- compile the train step ---
  std::string artifact = outDir + "/train_step-" + target + ".so";
  {
    DialectRegistry registry;
    moe::registerCompilerDialects(registry);
    MLIRContext context(registry);
    OwningOpRef<ModuleOp> module =
        moe::buildLanguageModel(&context, t.config, batch, seqLen);
    PassManager pm(&context);
    pm.addPass(moe::createMoEAutodiff());
    if (failed(verify(*module)) || failed(pm.run(*module)))
      die("the train step could not be derived");
    moe::CompileOptions options;
    options.target = target;
    if (failed(moe::compileToSharedObject(*module, artifact, options,
                                          llvm::errs())))
      die("compiling the train step for " + target + " failed");
  }
  t.memory.gpu = target != "cpu";
  if (t.memory.gpu) {
    moert_gpu_init();
    t.memory.stream = mgpuStreamCreate();
  }
  llvm::SmallString<256> absolute(artifact);
  llvm::sys::fs::make_absolute(absolute);
  t.library = dlopen(absolute.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!t.library)
    die(llvm::Twine("cannot load ") + artifact + ": " + dlerror());
  t.lossGrad.fn = reinterpret_cast<void (*)(void **)>(
      dlsym(t.library, "_mlir_packed_loss_grad"));
  t.lossOnly.fn =
      reinterpret_cast<void (*)(void **)>(dlsym(t.library, "_mlir_packed_loss"));
  if (!t.lossGrad.fn || !t.lossOnly.fn)
    die(artifact + ": no loss / loss_grad entry points");

  // --- data order: a seeded permutation of the training rows per epoch ---
  int64_t rows = data.trainRows(), len = data.length;
  auto epochOrder = [&](int64_t epoch) {
    std::vector<int64_t> order(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i)
      order[size_t(i)] = i;
    Rng rng(seed * 1000003 + uint64_t(epoch) + 1);
    for (int64_t i = rows - 1; i > 0; --i)
      std::swap(order[size_t(i)], order[size_t(rng.gen() % uint64_t(i + 1))]);
    return order;
  };
  auto fill = [&](const std::vector<int32_t> &source, int64_t row,
                  std::vector<int32_t> &ids, std::vector<int32_t> &labels,
                  int64_t at) {
    const int32_t *r = &source[size_t(row * len)];
    for (int64_t j = 0; j < seqLen; ++j) {
      ids[size_t(at * seqLen + j)] = r[j];
      int32_t next = r[j + 1];
      labels[size_t(at * seqLen + j)] =
          next == moert::Tokenizer::pad ? -100 : next;
    }
  };
  auto heldOutLoss = [&]() {
    int64_t n = data.heldOutRows() / batch;
    if (n == 0)
      n = 1;
    if (evalBatches > 0)
      n = std::min<int64_t>(n, evalBatches);
    std::vector<int32_t> ids(size_t(batch * seqLen)), labels(ids.size());
    double sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t i = 0; i < batch; ++i)
        fill(data.heldOut, (k * batch + i) % data.heldOutRows(), ids, labels, i);
      sum += t.run(t.lossOnly, ids, labels, nullptr);
    }
    return sum / double(n);
  };

  // --- metrics: kept in the JSONL file, re-read on resume for the plot ---
  std::string metricsPath = outDir + "/metrics.jsonl";
  std::vector<std::pair<int64_t, double>> trainCurve, evalCurve;
  if (resume) {
    // Lines beyond the checkpoint's step belong to an interrupted run.
    std::vector<std::string> keep;
    if (FILE *f = std::fopen(metricsPath.c_str(), "r")) {
      char line[4096];
      while (std::fgets(line, sizeof line, f)) {
        long long s = -1;
        double v = 0;
        if (std::sscanf(line, "{\"step\": %lld", &s) != 1 || s > t.step)
          continue;
        keep.push_back(line);
        if (const char *p = std::strstr(line, "\"held_out_loss\": "))
          evalCurve.push_back({s, std::atof(p + 17)});
        else if (const char *p = std::strstr(line, "\"loss\": "))
          if (std::sscanf(p + 8, "%lf", &v) == 1)
            trainCurve.push_back({s, v});
      }
      std::fclose(f);
    }
    FILE *f = std::fopen(metricsPath.c_str(), "w");
    if (!f)
      die("cannot write " + metricsPath);
    for (const std::string &l : keep)
      std::fputs(l.c_str(), f);
    std::fclose(f);
  }
  FILE *metrics = std::fopen(metricsPath.c_str(), resume ? "a" : "w");
  if (!metrics)
    die("cannot write " + metricsPath);

  auto save = [&]() {
    std::vector<moert::NamedTensor> tensors;
    for (size_t i = 0; i < t.params.size(); ++i) {
      tensors.push_back({t.params[i].name, t.params[i].shape, t.values[i]});
      tensors.push_back({"optimizer.exp_avg." + t.params[i].name,
                         t.params[i].shape, t.adamM[i]});
      tensors.push_back({"optimizer.exp_avg_sq." + t.params[i].name,
                         t.params[i].shape, t.adamV[i]});
    }
    std::map<std::string, std::string> m = meta;
    m["step"] = std::to_string(t.step);
    std::string error;
    if (!moert::writeSafetensors(checkpoint, tensors, m, error))
      die(error);
  };
  auto plot = [&]() {
    std::string error;
    if (!moert::writeLossPlot(outDir + "/loss.png", trainCurve, evalCurve,
                              unigram, error))
      die(error);
  };

  llvm::errs() << "moe-train: " << t.params.size() << " parameter tensors, "
               << rows << " training / " << data.heldOutRows()
               << " held-out rows of " << seqLen << " tokens; unigram "
               << "held-out loss " << llvm::format("%.4f", unigram) << "; "
               << target << "\n";
  moert::AdamWOptions adam{beta1, beta2, 1e-8, weightDecay};
  double flops = stepFlops(t.config, batch, seqLen);
  std::vector<int32_t> ids(size_t(batch * seqLen)), labels(ids.size());
  std::vector<std::vector<float>> grads;
  int64_t epochCached = -1;
  std::vector<int64_t> order;
  double lastEval = NAN;
  int64_t firstStep = t.step;
  while (t.step < steps) {
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < batch; ++i) {
      int64_t k = t.step * batch + i;
      if (k / rows != epochCached) {
        epochCached = k / rows;
        order = epochOrder(epochCached);
      }
      fill(data.train, order[size_t(k % rows)], ids, labels, i);
    }
    double loss = t.run(t.lossGrad, ids, labels, &grads);
    if (!std::isfinite(loss))
      die("step " + llvm::Twine(t.step) + ": the loss is " +
          std::to_string(loss) + " (lower --lr?)");
    std::vector<std::pair<float *, int64_t>> gs;
    for (size_t i = 0; i < grads.size(); ++i)
      gs.push_back({grads[i].data(), int64_t(grads[i].size())});
    double norm = moert::clipGradients(gs, clipNorm);
    double lr = moert::learningRate(t.step, warmup, steps, peakLR, minLRRatio);
    for (size_t i = 0; i < t.params.size(); ++i)
      moert::adamwStep(t.values[i].data(), grads[i].data(), t.adamM[i].data(),
                       t.adamV[i].data(), t.elements(i), t.step + 1, lr,
                       t.params[i].shape.size() >= 2, adam);
    ++t.step;
    double seconds = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start)
                         .count();
    double tokensPerS = double(batch * seqLen) / seconds;
    trainCurve.push_back({t.step, loss});
    std::fprintf(metrics,
                 "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, "
                 "\"grad_norm\": %.6g, \"tokens_per_s\": %.1f, "
                 "\"tflops\": %.4f, \"memory_mib\": %.1f}\n",
                 (long long)t.step, loss, lr, norm, tokensPerS,
                 flops / seconds / 1e12, peakMemoryMiB(t.memory));
    bool evalNow = (evalEvery > 0 && t.step % evalEvery == 0) || t.step == steps;
    if (evalNow) {
      lastEval = heldOutLoss();
      evalCurve.push_back({t.step, lastEval});
      std::fprintf(metrics,
                   "{\"step\": %lld, \"held_out_loss\": %.6f, "
                   "\"unigram_loss\": %.6f}\n",
                   (long long)t.step, lastEval, unigram);
    }
    std::fflush(metrics);
    bool stop = stopAfter > 0 && t.step - firstStep >= stopAfter;
    if ((checkpointEvery > 0 && t.step % checkpointEvery == 0) ||
        t.step == steps || stop) {
      save();
      plot();
    }
    if (bar) {
      int width = 30, done = int(width * t.step / steps);
      std::fprintf(stderr,
                   "\r[%.*s%*s] %lld/%lld  loss %.4f  held-out %.4f  "
                   "%.0f tok/s ",
                   done, "==============================", width - done, "",
                   (long long)t.step, (long long)(long long)steps, loss,
                   lastEval, tokensPerS);
      if (t.step == steps || stop)
        std::fprintf(stderr, "\n");
    } else if (progress != "none" && (evalNow || t.step == steps)) {
      std::fprintf(stderr,
                   "step %lld/%lld  loss %.4f  held-out %.4f (unigram %.4f)  "
                   "%.0f tok/s\n",
                   (long long)t.step, (long long)steps, loss, lastEval,
                   unigram, tokensPerS);
    }
    if (stop)
      break;
  }
  std::fclose(metrics);
  if (t.step == steps && std::isfinite(lastEval))
    llvm::errs() << "moe-train: held-out loss "
                 << llvm::format("%.4f", lastEval) << " vs unigram "
                 << llvm::format("%.4f", unigram) << "; wrote " << checkpoint
                 << ", " << metricsPath << ", " << outDir << "/loss.png\n";
  return 0;
}
