//===- Trainer.cpp - the training loop over a compiled train step ---------===//

#include "moert/Trainer.h"

#include "moert/Artifact.h"
#include "moert/Comm.h"
#include "moert/Error.h"
#include "moert/Gpu.h"
#include "moert/HfWeights.h"
#include "moert/Sequences.h"
#include "moert/Train.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <dlfcn.h>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sys/resource.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace moert {

//===----------------------------------------------------------------------===//
// Options
//===----------------------------------------------------------------------===//

std::string trainOptionsHelp() {
  return "  --data FILE            sequences, FASTA or Stockholm (repeatable; "
         "required)\n"
         "  --alphabet NAME        protein (default) or dna\n"
         "  --out DIR              checkpoint, metrics.jsonl, loss.png "
         "(default moe-train-out)\n"
         "  --init-from DIR        start from the weights of a transformers "
         "model directory\n"
         "                         (model.safetensors or sharded; F32, BF16 or "
         "F16)\n"
         "  --resume               continue the checkpoint in --out\n"
         "  --no-checksum          resume without checking the checkpoint's "
         "data\n"
         "                         against the CRC-32 it was written with\n"
         "  --steps N              optimizer steps in all (default 300)\n"
         "  --lr X                 peak learning rate (default 3e-3)\n"
         "  --min-lr-ratio X       final learning rate / peak (default 0.1)\n"
         "  --warmup N             linear warmup steps (default 30)\n"
         "  --weight-decay X       AdamW decoupled weight decay of matrices "
         "(default 0.1)\n"
         "  --beta1 X, --beta2 X   AdamW betas (default 0.9, 0.95)\n"
         "  --clip X               clip gradients to this global norm; 0 = off "
         "(default 1)\n"
         "  --eval-every N         held-out loss every N steps (default 50; "
         "always at the end)\n"
         "  --eval-batches N       held-out batches per evaluation (default 8; "
         "0 = all)\n"
         "  --checkpoint-every N   checkpoint every N steps (default 100; "
         "always at the end)\n"
         "  --keep-checkpoints N   keep the last N checkpoints as "
         "checkpoint-<step>.safetensors\n"
         "                         beside checkpoint.safetensors, the latest "
         "(default 1:\n"
         "                         the latest only; on several ranks "
         "checkpoint-<step>.index.json\n"
         "                         and its files beside "
         "checkpoint.index.json)\n"
         "  --stop-after-steps N   stop (with a checkpoint) after N steps of "
         "this run\n"
         "  --seed N               initialization and data order (default 0)\n"
         "  --progress MODE        auto (a bar on a terminal), bar, lines or "
         "none\n"
         "SIGINT or SIGTERM: the step under way finishes, a checkpoint is "
         "written,\n"
         "and the run exits with 130 or 143 (--resume continues it).\n"
         "A checkpoint becomes a transformers model directory with\n"
         "  python -m moe_mlir export-hf OUT_DIR HF_DIR [--dtype bfloat16]\n";
}

bool parseTrainOptions(const std::vector<std::string> &args, TrainOptions &o,
                       std::vector<std::string> &rest, std::string &error,
                       std::vector<std::string> *consumed) {
  auto integer = [&](const std::string &name, const std::string &v,
                     int64_t &out, int64_t lo) {
    char *end = nullptr;
    errno = 0;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || errno || x < lo || x > (int64_t(1) << 40)) {
      error = name + " expects an integer >= " + std::to_string(lo) +
              ", got '" + v + "'";
      return false;
    }
    out = x;
    return true;
  };
  auto real = [&](const std::string &name, const std::string &v, double &out,
                  double lo, double hi, bool openHi) {
    char *end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !std::isfinite(x) || x < lo ||
        (openHi ? x >= hi : x > hi)) {
      error = name + " expects a number in [" + std::to_string(lo) + ", " +
              std::to_string(hi) + (openHi ? ")" : "]") + ", got '" + v + "'";
      return false;
    }
    out = x;
    return true;
  };
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    bool hasValue = false;
    size_t begin = i;
    if (size_t eq = name.find('=');
        name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      hasValue = true;
    }
    auto next = [&]() -> bool {
      if (hasValue)
        return true;
      if (i + 1 >= args.size()) {
        error = name + " expects a value";
        return false;
      }
      value = args[++i];
      return true;
    };
    int64_t n = 0;
    if (name == "--resume") {
      o.resume = true;
    } else if (name == "--no-checksum") {
      o.verifyChecksum = false;
    } else if (name == "--data") {
      if (!next())
        return false;
      o.data.push_back(value);
    } else if (name == "--alphabet" || name == "--out" ||
               name == "--progress" || name == "--init-from") {
      if (!next())
        return false;
      (name == "--alphabet"    ? o.alphabet
       : name == "--out"       ? o.out
       : name == "--init-from" ? o.initFrom
                               : o.progress) = value;
    } else if (name == "--steps") {
      if (!next() || !integer(name, value, o.steps, 1))
        return false;
    } else if (name == "--warmup") {
      if (!next() || !integer(name, value, o.warmup, 0))
        return false;
    } else if (name == "--eval-every") {
      if (!next() || !integer(name, value, o.evalEvery, 0))
        return false;
    } else if (name == "--eval-batches") {
      if (!next() || !integer(name, value, o.evalBatches, 0))
        return false;
    } else if (name == "--checkpoint-every") {
      if (!next() || !integer(name, value, o.checkpointEvery, 0))
        return false;
    } else if (name == "--keep-checkpoints") {
      if (!next() || !integer(name, value, o.keepCheckpoints, 1))
        return false;
    } else if (name == "--stop-after-steps") {
      if (!next() || !integer(name, value, o.stopAfterSteps, 0))
        return false;
    } else if (name == "--seed") {
      if (!next() || !integer(name, value, n, 0))
        return false;
      o.seed = uint64_t(n);
    } else if (name == "--lr") {
      if (!next() || !real(name, value, o.lr, 1e-12, inf, false))
        return false;
    } else if (name == "--min-lr-ratio") {
      if (!next() || !real(name, value, o.minLRRatio, 0, 1, false))
        return false;
    } else if (name == "--weight-decay") {
      if (!next() || !real(name, value, o.weightDecay, 0, inf, false))
        return false;
    } else if (name == "--beta1" || name == "--beta2") {
      if (!next() ||
          !real(name, value, name == "--beta1" ? o.beta1 : o.beta2, 0, 1, true))
        return false;
    } else if (name == "--clip") {
      if (!next() || !real(name, value, o.clip, 0, inf, false))
        return false;
    } else {
      rest.push_back(args[i]);
      continue;
    }
    if (consumed)
      consumed->insert(consumed->end(), args.begin() + long(begin),
                       args.begin() + long(i) + 1);
  }
  if (o.alphabet != "protein" && o.alphabet != "dna") {
    error = "--alphabet must be protein or dna, got '" + o.alphabet + "'";
    return false;
  }
  if (o.resume && !o.initFrom.empty()) {
    error = "--init-from starts a run from a transformers model, --resume "
            "continues the checkpoint in --out: give one of them";
    return false;
  }
  if (o.progress != "auto" && o.progress != "bar" && o.progress != "lines" &&
      o.progress != "none") {
    error =
        "--progress must be auto, bar, lines or none, got '" + o.progress + "'";
    return false;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// The loop
//===----------------------------------------------------------------------===//

namespace {

/// The splitmix64 finalizer: a bijective mix of 64 bits.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The seeded initialization of element `index` of parameter `param`: a
/// standard normal draw (Box-Muller on two uniforms) that depends on the
/// seed, the parameter and the element only -- not on who draws it or in
/// which order -- so that every rank draws just its rows of a sharded
/// tensor, on every core, and gets what one rank would.
double initialNormal(uint64_t seed, uint64_t param, uint64_t index) {
  uint64_t key = mix64(seed ^ mix64(param));
  auto uniform = [](uint64_t bits) {
    return (double(bits >> 11) + 0.5) / 9007199254740992.0;
  };
  double u = uniform(mix64(key + 2 * index)),
         v = uniform(mix64(key + 2 * index + 1));
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
}

/// out[k] = float(initialNormal(seed, param, first + k) * scale), on the
/// cores of the machine (pieces of at least a million values).
void drawNormal(std::vector<float> &out, uint64_t seed, uint64_t param,
                uint64_t first, double scale) {
  const size_t n = out.size(), piece = size_t(1) << 20;
  size_t threads =
      std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()),
                       (n + piece - 1) / piece);
  auto fill = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k)
      out[k] = float(initialNormal(seed, param, first + k) * scale);
  };
  if (threads <= 1)
    return fill(0, n);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back(fill, n * t / threads, n * (t + 1) / threads);
  for (std::thread &th : pool)
    th.join();
}

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
  /// The metrics' memory entries: "memory_mib", the peak of the buffers in
  /// use (on the CPU, the process's peak resident memory), and on a GPU
  /// "memory_reserved_mib", the peak of the device memory the allocator
  /// holds (in use and cached).
  std::string entries() const {
    char buf[96];
    if (gpu) {
      moert_gpu_memory_stats stats{};
      moert_gpu_get_memory_stats(&stats);
      std::snprintf(buf, sizeof buf,
                    "\"memory_mib\": %.1f, \"memory_reserved_mib\": %.1f",
                    double(stats.peak_bytes_in_use) / (1 << 20),
                    double(stats.peak_bytes_reserved) / (1 << 20));
      return buf;
    }
    struct rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    std::snprintf(buf, sizeof buf, "\"memory_mib\": %.1f",
                  double(usage.ru_maxrss) / 1024.0);
    return buf;
  }
};

using Entry = void *; // a packed entry point (moert::artifact::call)

/// The document of each token of `ids` (rows of `seq` tokens): the number
/// of <bos> tokens at or before it in its row. Every sequence starts with
/// one, so the tokens of one sequence share a number, and the tail of a
/// sequence begun in the row before has 0.
std::vector<int32_t> documentsOf(const std::vector<int32_t> &ids, int64_t seq) {
  std::vector<int32_t> documents(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    documents[i] =
        (i % size_t(seq) ? documents[i - 1] : 0) + (ids[i] == Tokenizer::bos);
  return documents;
}

struct Param {
  std::string name;
  /// What the step takes: the whole tensor, or this rank's rows of an
  /// expert tensor sharded over the ranks (`shard E L`: L of E experts).
  std::vector<int64_t> shape;
  bool ones = false;
  int64_t experts = 0, local = 0;
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  /// The whole tensor's shape (every rank's rows of a shard).
  std::vector<int64_t> fullShape() const {
    std::vector<int64_t> full = shape;
    if (experts)
      full[0] = experts;
    return full;
  }
};

/// Why training stops early (Loop::die): a message for the user, printed
/// after the tool's name.
struct Stop {
  std::string message;
};

struct Loop {
  const TrainOptions &o;
  const char *tool;
  std::vector<Param> params;
  /// The train state on the host: where a CPU artifact updates it, and what
  /// checkpoints read and write.
  std::vector<std::vector<float>> values, adamM, adamV;
  /// Where the artifact finds it: the host vectors' data (CPU), or device
  /// buffers kept across steps (GPU), uploaded once and downloaded on demand.
  std::vector<void *> dValues, dM, dV;
  int64_t step = 0, batch = 0, seq = 0;
  /// The ranks of a step (one for a one-rank step): each takes `batch` rows
  /// of a step's ranks * batch. They are dpSize copies of a group of epSize
  /// expert-parallel ranks (rank = d * epSize + epRank); a rank holds the
  /// experts' rows of its place epRank in its group.
  comm::Communicator *comm = nullptr;
  int rank = 0, ranks = 1, epRank = 0, epSize = 1;
  Memory memory;
  Entry stepEntry = nullptr, lossOnly = nullptr;
  const artifact::Function *stepFn = nullptr, *lossFn = nullptr;

  /// Stops training: train() reports `message` and returns 1.
  [[noreturn]] void die(const std::string &message) {
    throw Stop{ranks > 1 ? "rank " + std::to_string(rank) + ": " + message
                         : message};
  }

  /// The sum of `x` over the ranks (the ranks' shares of a loss).
  double sumOverRanks(double x) {
    if (ranks > 1)
      comm->allReduceSum(&x, &x, 1, comm::DType::F64);
    return x;
  }

  /// Puts parameter i's state where the artifact reads it: the host
  /// vectors values[i], adamM[i] and adamV[i] (moments left empty are
  /// zeros). CPU artifacts read the host vectors; GPU artifacts device
  /// copies, and the host vectors are dropped (checkpoints read the device).
  void place(size_t i) {
    size_t n = values[i].size();
    if (!memory.gpu) {
      for (auto *moment : {&adamM[i], &adamV[i]})
        if (moment->empty())
          moment->assign(n, 0.0f);
      dValues[i] = values[i].data();
      dM[i] = adamM[i].data();
      dV[i] = adamV[i].data();
      return;
    }
    for (auto [host, where] : {std::pair{&values[i], &dValues[i]},
                               {&adamM[i], &dM[i]},
                               {&adamV[i], &dV[i]}}) {
      *where = mgpuMemAlloc(std::max<size_t>(n * 4, 1), memory.stream, false);
      if (host->empty())
        mgpuMemset32(*where, 0, n, memory.stream);
      else
        mgpuMemcpy(*where, host->data(), n * 4, memory.stream);
      mgpuStreamSynchronize(memory.stream);
      std::vector<float>().swap(*host);
    }
  }
  /// A checkpoint's source of state tensor `where[i]` (dValues, dM or
  /// dV): a copy from wherever the step keeps it.
  std::function<void(float *)> stateSource(const std::vector<void *> &where,
                                           size_t i) {
    size_t bytes = size_t(params[i].elements()) * 4;
    void *at = where[i];
    return [this, at, bytes](float *to) { memory.download(to, at, bytes); };
  }
  void releaseState() {
    if (!memory.gpu)
      return;
    for (auto *where : {&dValues, &dM, &dV})
      for (void *p : *where)
        mgpuMemFree(p, memory.stream);
  }

  /// The last call's `expert_load` output: top-k assignments per MoE layer
  /// and expert (row-major [layers, experts]).
  std::vector<int32_t> expertLoad;
  int64_t loadExperts = 0;
  /// The routers' selection bias ([MoE layers, experts], the `router_bias`
  /// input; empty without one) and its update rate.
  std::vector<float> routerBias;
  std::vector<int64_t> routerBiasShape;
  double routerBiasRate = 0;

  /// Auxiliary-loss-free balancing: after a step with expert load `load`,
  /// each expert's bias moves by the rate toward an even split (up below
  /// the layer's mean load, down above it).
  void updateRouterBias(const std::vector<int32_t> &load) {
    if (routerBias.empty() || load.size() != routerBias.size())
      return;
    size_t e = size_t(routerBiasShape[1]);
    for (size_t l = 0; l * e < load.size(); ++l) {
      double mean = 0;
      for (size_t x = 0; x < e; ++x)
        mean += load[l * e + x];
      mean /= double(e);
      for (size_t x = 0; x < e; ++x) {
        double d = mean - load[l * e + x];
        routerBias[l * e + x] += float(routerBiasRate * (d > 0   ? 1
                                                         : d < 0 ? -1
                                                                 : 0));
      }
    }
  }

  /// Calls `fn` (the train step or the loss) on one batch: the arguments
  /// come from the state by role; returns the 0-d results (the loss, and
  /// for the step the gradient norm; 0 in the places of outputs) and keeps
  /// the expert load.
  std::vector<float> run(Entry entry, const artifact::Function &fn,
                         const std::vector<int32_t> &ids,
                         const std::vector<int32_t> &labels,
                         const std::vector<float> &scalars) {
    std::vector<std::vector<int64_t>> descs;
    std::vector<void *> staged;
    auto upload = [&](const void *host, size_t bytes) {
      void *p = memory.upload(host, bytes);
      if (memory.gpu)
        staged.push_back(p);
      return p;
    };
    // Parameters and each kind of moment come in the parameters' order
    // (checked at load).
    size_t param = 0, m = 0, v = 0;
    // Host inputs made here live until the call returns: on the CPU the
    // step reads them where they are.
    std::vector<int32_t> documents;
    for (const artifact::Tensor &a : fn.args) {
      void *p = nullptr;
      if (!a.param.empty()) {
        p = dValues[param++];
      } else if (a.input == "ids" || a.input == "labels") {
        const std::vector<int32_t> &x = a.input == "ids" ? ids : labels;
        p = upload(x.data(), x.size() * 4);
      } else if (a.input == "documents") {
        documents = documentsOf(ids, a.shape.back());
        p = upload(documents.data(), documents.size() * 4);
      } else if (a.input == "adamw") {
        p = upload(scalars.data(), scalars.size() * 4);
      } else if (a.input == "router_bias") {
        p = upload(routerBias.data(), routerBias.size() * 4);
      } else if (a.state == "exp_avg") {
        p = dM[m++];
      } else if (a.state == "exp_avg_sq") {
        p = dV[v++];
      }
      descs.push_back(artifact::descriptor(p, a.shape));
    }
    std::vector<size_t> ranks;
    for (const artifact::Tensor &r : fn.results)
      ranks.push_back(r.shape.size());
    std::vector<int64_t> results(
        artifact::resultOffset(ranks, ranks.size()) / 8, 0);
    artifact::call(entry, results.data(), descs);
    std::vector<float> out(fn.results.size());
    std::vector<void *> allocated;
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t *d = &results[artifact::resultOffset(ranks, i) / 8];
      void *alloc = reinterpret_cast<void *>(d[0]);
      auto *aligned = reinterpret_cast<char *>(d[1]);
      const artifact::Tensor &r = fn.results[i];
      if (r.output == "expert_load") { // [MoE layers, experts] i32, dense
        expertLoad.resize(size_t(r.elements()));
        memory.download(expertLoad.data(), aligned + d[2] * 4,
                        expertLoad.size() * 4);
      } else if (ranks[i] == 0) {
        memory.download(&out[i], aligned + d[2] * 4, 4);
      }
      if (alloc && std::find(allocated.begin(), allocated.end(), alloc) ==
                       allocated.end())
        allocated.push_back(alloc);
    }
    for (void *p : allocated)
      memory.release(p);
    for (void *p : staged)
      memory.release(p);
    return out;
  }
};

/// The data of a run: every --data file's sequences, packed into rows of
/// `seq + 1` tokens, every 10th held out. False, with `error` set, when a
/// file is unreadable or malformed, the model's vocabulary is smaller than
/// the tokenizer's, or too few rows come out.
bool loadData(const TrainOptions &o, int64_t seq, int64_t vocab, Batches &data,
              std::string &error) {
  if (o.data.empty()) {
    error = "no --data: give one or more FASTA or Stockholm files";
    return false;
  }
  Alphabet alphabet = o.alphabet == "dna" ? Alphabet::DNA : Alphabet::Protein;
  Tokenizer tokenizer(alphabet);
  if (vocab < tokenizer.vocabSize()) {
    error = "the model's 'vocab_size' (" + std::to_string(vocab) +
            ") is smaller than the " + o.alphabet + " tokenizer's " +
            std::to_string(tokenizer.vocabSize()) + " tokens";
    return false;
  }
  std::vector<Sequence> sequences;
  for (const std::string &path : o.data) {
    // Every file's sequences (readSequences returns one file's).
    std::vector<Sequence> file;
    SequenceError fileError;
    if (!readSequences(path, alphabet, file, fileError)) {
      error = fileError.message;
      return false;
    }
    sequences.insert(sequences.end(), std::make_move_iterator(file.begin()),
                     std::make_move_iterator(file.end()));
  }
  data = makeBatches(sequences, tokenizer, seq + 1, /*every=*/10);
  if (data.trainRows() < 1 || data.heldOutRows() < 1) {
    error = "the data give " + std::to_string(data.trainRows()) +
            " training and " + std::to_string(data.heldOutRows()) +
            " held-out rows of " + std::to_string(seq + 1) +
            " tokens: give more sequences or a smaller --seq";
    return false;
  }
  return true;
}

/// checkpoint-<step, 8 digits>.safetensors in `path`'s directory: a second
/// name of the checkpoint just written (a hard link: no copy; the next
/// write renames a new file over `path`, and this name keeps the old one),
/// and the oldest of those names removed beyond `keep`. Throws Stop on a
/// failure.
void keepCheckpoint(const std::string &path, int64_t step, int64_t keep) {
  std::string dir = path.substr(0, path.rfind('/'));
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-%08lld.safetensors",
                (long long)step);
  std::string numbered = dir + "/" + name;
  ::unlink(numbered.c_str()); // (the same step written again)
  if (::link(path.c_str(), numbered.c_str()) != 0)
    throw Stop{"cannot keep " + numbered + ": " + std::strerror(errno)};
  std::vector<std::string> kept;
  if (DIR *d = ::opendir(dir.c_str())) {
    while (dirent *e = ::readdir(d)) {
      long long s;
      char tail[32];
      if (std::sscanf(e->d_name, "checkpoint-%lld.%31s", &s, tail) == 2 &&
          std::string(tail) == "safetensors" &&
          std::strlen(e->d_name) == std::strlen(name))
        kept.push_back(e->d_name);
    }
    ::closedir(d);
  }
  std::sort(kept.begin(), kept.end()); // zero-padded: by step
  for (size_t i = 0; i + size_t(keep) < kept.size(); ++i)
    ::unlink((dir + "/" + kept[i]).c_str());
}

/// SIGINT or SIGTERM while training: the step under way finishes, a
/// checkpoint is written, and train() returns 128 + the signal (130, 143),
/// as a shell reports a process those signals ended.
volatile std::sig_atomic_t stopSignal = 0;
extern "C" void onStopSignal(int signal) { stopSignal = signal; }

/// The handlers of SIGINT and SIGTERM for the training loop; the previous
/// ones come back when it ends.
struct StopSignals {
  struct sigaction oldInt{}, oldTerm{};
  StopSignals() {
    stopSignal = 0;
    struct sigaction action{};
    action.sa_handler = onStopSignal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &oldInt);
    sigaction(SIGTERM, &action, &oldTerm);
  }
  ~StopSignals() {
    sigaction(SIGINT, &oldInt, nullptr);
    sigaction(SIGTERM, &oldTerm, nullptr);
  }
};

/// Seconds since the Unix epoch, for the metrics' "time".
double unixTime() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int trainOrThrow(const TrainOptions &o, const std::string &artifactPath,
                 const char *tool) {
  Loop t{o, tool};
  if (o.data.empty())
    t.die("no --data: give one or more FASTA or Stockholm files");
  bool bar = o.progress == "bar" || (o.progress == "auto" && isatty(2));
  Alphabet alphabet = o.alphabet == "dna" ? Alphabet::DNA : Alphabet::Protein;

  // --- the artifact and its model ---
  std::string absolute = artifactPath;
  if (!absolute.empty() && absolute[0] != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd))
      absolute = std::string(cwd) + "/" + absolute;
  }
  void *library = dlopen(absolute.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library)
    t.die("cannot load " + artifactPath + ": " + dlerror());
  auto *manifestText =
      static_cast<const char *>(dlsym(library, "moe_manifest"));
  t.stepEntry = dlsym(library, artifact::packedSymbol("loss_step").c_str());
  t.lossOnly = dlsym(library, artifact::packedSymbol("loss").c_str());
  if (!manifestText || !t.stepEntry || !t.lossOnly)
    t.die(artifactPath + " has no train step (loss and loss_step of a "
                         "moe-model graph, compiled by moe-train)");
  std::string target = artifact::targetOf(manifestText);
  std::vector<artifact::Function> fns = artifact::parseManifest(manifestText);
  for (const artifact::Function &f : fns) {
    if (f.name == "loss_step")
      t.stepFn = &f;
    if (f.name == "loss")
      t.lossFn = &f;
  }
  if (!t.stepFn || !t.lossFn)
    t.die(artifactPath + ": no loss_step and loss in the manifest");
  const artifact::Function *step = t.stepFn;
  std::string hfTransposed; // names whose last two dims transformers swaps
  std::vector<ModelParam> layout; // for --init-from
  // The step's arguments: parameters, ids, labels, the moments of every
  // parameter in the parameters' order, the optimizer's scalars (and the
  // router biases and the documents where the model has them).
  size_t moments[2] = {0, 0};
  bool scalars = false, documents = false;
  for (const artifact::Tensor &a : step->args) {
    if (!a.param.empty()) {
      if (a.dtype != "f32" || !a.updated)
        t.die(artifactPath + ": parameter " + a.param +
              " is not an f32 tensor the step updates");
      Param p{a.param, a.shape, a.init == "ones", a.experts, a.local};
      if (a.experts && (a.local < 1 || a.shape.empty() ||
                        a.shape[0] != a.local || a.experts % a.local))
        t.die(artifactPath + ": parameter " + a.param +
              " is not a shard of whole experts");
      t.params.push_back(p);
      layout.push_back({a.param, p.fullShape(), a.hfTransposed});
      if (a.hfTransposed)
        hfTransposed += (hfTransposed.empty() ? "" : ",") + a.param;
    } else if (a.input == "ids") {
      if (a.shape.size() != 2)
        t.die(artifactPath + ": ids are not [batch, seq]");
      t.batch = a.shape[0];
      t.seq = a.shape[1];
    } else if (a.state == "exp_avg" || a.state == "exp_avg_sq") {
      size_t &k = moments[a.state == "exp_avg_sq"];
      size_t of = size_t(a.stateOf);
      if (k >= t.params.size() || a.stateOf < 0 || of >= step->args.size() ||
          step->args[of].param != t.params[k].name ||
          a.shape != step->args[of].shape || !a.updated)
        t.die(artifactPath + ": its loss_step's optimizer state is not in the "
                             "parameters' order");
      ++k;
    } else if (a.input == "adamw") {
      scalars = a.shape == std::vector<int64_t>{8} && a.dtype == "f32";
    } else if (a.input == "router_bias") {
      if (a.shape.size() != 2 || a.dtype != "f32")
        t.die(artifactPath + ": its router_bias is not an f32 [layers, "
                             "experts] tensor");
      t.routerBiasShape = a.shape;
    } else if (a.input == "documents") {
      if (a.shape.size() != 2 || a.dtype != "i32")
        t.die(artifactPath + ": its documents are not an i32 [batch, seq] "
                             "tensor");
      documents = true;
    } else if (a.input != "labels") {
      t.die(artifactPath + ": loss_step has an argument of no known role");
    }
  }
  auto meta = [&](const char *key) {
    auto it = step->meta.find(key);
    if (it == step->meta.end())
      t.die(artifactPath + ": no '" + key + "' in the manifest's meta data");
    return it->second;
  };
  std::string configText = meta("config");
  std::string recipe =
      step->meta.count("recipe") ? step->meta.at("recipe") : "none";
  int64_t vocab = std::atoll(meta("vocab_size").c_str());
  double initStd = std::atof(meta("init_std").c_str());
  double flops = std::atof(meta("step_flops").c_str());
  if (!t.routerBiasShape.empty()) {
    t.routerBiasRate = std::atof(meta("router_bias_update_rate").c_str());
    t.routerBias.assign(size_t(t.routerBiasShape[0] * t.routerBiasShape[1]),
                        0.0f);
  }
  // Outputs besides the loss (and the step's gradient norm): the expert
  // load, an i32 [MoE layers, experts], in both functions or neither.
  auto outputs = [&](const artifact::Function &f) {
    size_t n = 0;
    for (const artifact::Tensor &r : f.results)
      if (!r.output.empty()) {
        if (r.output != "expert_load" || r.dtype != "i32" ||
            r.shape.size() != 2)
          t.die(artifactPath + ": " + f.name + " has an output '" + r.output +
                "' this trainer does not know");
        t.loadExperts = r.shape[1];
        ++n;
      }
    return n;
  };
  size_t stepOutputs = outputs(*step), lossOutputs = outputs(*t.lossFn);
  if (t.params.empty() || t.batch < 1 || t.seq < 1 || !scalars ||
      moments[0] != t.params.size() || moments[1] != t.params.size() ||
      3 * t.params.size() + 3 + !t.routerBiasShape.empty() + documents !=
          step->args.size() ||
      stepOutputs != lossOutputs || step->results.size() != 2 + stepOutputs ||
      t.lossFn->args.size() !=
          t.params.size() + 2 + !t.routerBiasShape.empty() + documents ||
      (!t.routerBiasShape.empty() && !stepOutputs) ||
      t.lossFn->results.size() != 1 + lossOutputs)
    t.die(artifactPath + ": its loss_step is not a moe-model train step "
                         "with AdamW (compile it with moe-train)");

  // --- the ranks: data-parallel copies of the expert-parallel group ---
  int64_t epSize = 0;
  for (const Param &p : t.params)
    if (p.experts) {
      if (epSize && p.experts / p.local != epSize)
        t.die(artifactPath + ": its expert shards do not split the experts "
                             "over one number of ranks");
      epSize = p.experts / p.local;
    }
  epSize = std::max<int64_t>(epSize, 1);
  // `meta ranks D E` (moe-train --dp-size D --ep-size E); older steps name
  // none: the expert-parallel ranks alone.
  int64_t dpSize = 1;
  if (auto it = step->meta.find("ranks"); it != step->meta.end()) {
    long long d = 0, e = 0;
    char extra = 0;
    if (std::sscanf(it->second.c_str(), "%lld %lld %c", &d, &e, &extra) != 2 ||
        d < 1 || e != epSize)
      t.die(artifactPath + ": its meta 'ranks' is '" + it->second +
            "', not data-parallel copies and the " + std::to_string(epSize) +
            " expert-parallel ranks its shards split the experts over");
    dpSize = d;
  }
  t.comm = &comm::world();
  t.rank = t.comm->rank();
  t.ranks = t.comm->size();
  t.epSize = int(epSize);
  t.epRank = t.rank % t.epSize;
  const int64_t expected = dpSize * epSize;
  auto layoutText = [](int64_t d, int64_t e) {
    return d > 1   ? std::to_string(d) + " x " + std::to_string(e) +
                         " ranks (--dp-size " + std::to_string(d) +
                         " --ep-size " + std::to_string(e) + ")"
           : e > 1 ? std::to_string(e) + " ranks (--ep-size " +
                         std::to_string(e) + ")"
                   : std::string("1 rank");
  };
  if (t.ranks != expected)
    t.die(artifactPath + " was compiled for " + layoutText(dpSize, epSize) +
          ", but " + std::to_string(t.ranks) + " were launched (" +
          (expected == 1
               ? "compile it with moe-train --ep-size or --dp-size to train "
                 "on several ranks"
               : "launch " + std::to_string(expected) + ", e.g. mpirun -np " +
                     std::to_string(expected)) +
          ")");
  const std::string layoutName = layoutText(dpSize, epSize);

  Tokenizer tokenizer(alphabet);
  Batches data;
  std::string dataError;
  if (!loadData(o, t.seq, vocab, data, dataError))
    t.die(dataError);
  double unigram = unigramHeldOutLoss(data, tokenizer.vocabSize());

  // --- output directory, checkpoint ---
  std::string checkpoint = o.out + "/checkpoint.safetensors";
  if (::mkdir(o.out.c_str(), 0755) != 0 && errno != EEXIST)
    t.die("cannot create '" + o.out + "': " + std::strerror(errno));
  if (struct stat dir{};
      ::stat(o.out.c_str(), &dir) != 0 || !S_ISDIR(dir.st_mode))
    t.die("--out '" + o.out + "' is not a directory");
  // Partial files of writers that died between write and rename.
  removeAbandonedCheckpointTemporaries(o.out);
  removeAbandonedTemporaries(o.out + "/loss.png");
  // One rank's file, or the index of one file per rank: whichever is newer.
  std::string found = findCheckpoint(o.out);
  if (!found.empty() && !o.resume)
    t.die(found + " exists: pass --resume to continue it, or choose "
                  "another --out");
  if (found.empty() && o.resume)
    t.die("--resume: no checkpoint at " + checkpoint + " (nor " + o.out +
          "/checkpoint.index.json)");
  // What this run writes: one file, or one per expert-parallel rank.
  if (t.epSize > 1)
    checkpoint = o.out + "/checkpoint.index.json";

  t.memory.gpu = target != "cpu";
  if (t.memory.gpu) {
    moert_gpu_init();
    t.memory.stream = mgpuStreamCreate();
    throwStickyError(); // no usable GPU
  }
  size_t np = t.params.size();
  for (auto *state : {&t.values, &t.adamM, &t.adamV})
    state->resize(np);
  for (auto *where : {&t.dValues, &t.dM, &t.dV})
    where->assign(np, nullptr);
  std::map<std::string, std::string> runMeta = {
      {"format", "moe-train/1"},
      {"config", configText},
      // The rows of a step on all ranks: a run resumes on another number
      // of ranks with the same rows a step.
      {"batch", std::to_string(t.batch * t.ranks)},
      {"seq", std::to_string(t.seq)},
      {"seed", std::to_string(o.seed)},
      {"alphabet", o.alphabet},
      {"recipe", recipe}};
  // Where the weights came from (kept by resumed runs; not compared).
  if (!o.initFrom.empty()) {
    char *absolute = ::realpath(o.initFrom.c_str(), nullptr);
    runMeta["init_from"] = absolute ? absolute : o.initFrom;
    std::free(absolute);
  }
  if (o.resume) {
    std::vector<NamedTensor> tensors;
    std::map<std::string, std::string> saved;
    std::string error;
    // Each file's data against its CRC-32; a checkpoint of several ranks'
    // files merged. On several ranks each reads its experts' rows only (the
    // tensors keep their whole shapes).
    std::map<std::string, std::pair<int64_t, int64_t>> rows;
    for (const Param &p : t.params)
      if (p.experts && t.epSize > 1)
        for (const char *prefix :
             {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."})
          rows[prefix + p.name] = {t.epRank * p.local,
                                   (t.epRank + 1) * p.local};
    RowsOf rowsOf = nullptr;
    if (t.epSize > 1)
      rowsOf = [&](const std::string &name) {
        auto it = rows.find(name);
        return it == rows.end() ? std::pair<int64_t, int64_t>{0, -1}
                                : it->second;
      };
    if (!readCheckpoint(found, o.verifyChecksum, tensors, saved, error, rowsOf))
      t.die(error);
    if (saved["format"] != "moe-train/1")
      t.die(found + ": not a moe-train checkpoint");
    if (!saved.count("recipe"))
      saved["recipe"] = "none";
    if (saved.count("init_from"))
      runMeta["init_from"] = saved["init_from"];
    for (const char *key :
         {"config", "batch", "seq", "seed", "alphabet", "recipe"})
      if (saved[key] != runMeta[key])
        t.die(found + ": made with " + key + " '" + saved[key] +
              "', this run has '" + runMeta[key] +
              "' (a checkpoint continues only the run that wrote it)");
    std::map<std::string, NamedTensor *> byName;
    for (NamedTensor &x : tensors)
      byName[x.name] = &x;
    for (size_t i = 0; i < np; ++i) {
      const Param &p = t.params[i];
      for (auto [prefix, dst] :
           {std::pair<std::string, std::vector<float> *>{"", &t.values[i]},
            {"optimizer.exp_avg.", &t.adamM[i]},
            {"optimizer.exp_avg_sq.", &t.adamV[i]}}) {
        auto it = byName.find(prefix + p.name);
        if (it == byName.end())
          t.die(found + ": no tensor '" + prefix + p.name +
                "' (a checkpoint of another model?)");
        if (it->second->shape != p.fullShape())
          t.die(found + ": tensor '" + prefix + p.name +
                "' has another shape than this model's");
        // Training never writes NaN or Inf into its state: such values are
        // corruption (or a run that had already diverged).
        const std::vector<float> &v = it->second->data;
        if (auto bad = std::find_if(v.begin(), v.end(),
                                    [](float x) { return !std::isfinite(x); });
            bad != v.end())
          t.die(found + ": tensor '" + prefix + p.name + "' holds " +
                (std::isnan(*bad) ? "NaN" : "an infinity") + " at element " +
                std::to_string(bad - v.begin()) +
                " (a corrupt or diverged checkpoint)");
        *dst = std::move(it->second->data); // this rank's rows (rowsOf)
      }
      t.place(i);
    }
    if (!t.routerBias.empty()) {
      auto it = byName.find("router.selection_bias");
      if (it == byName.end() || it->second->shape != t.routerBiasShape)
        t.die(found + ": no router.selection_bias of this model's shape "
                      "(the routers' balancing state)");
      t.routerBias = it->second->data;
    }
    char *end = nullptr;
    t.step = std::strtoll(saved["step"].c_str(), &end, 10);
    if (saved["step"].empty() || *end || t.step < 0)
      t.die(found + ": bad 'step' metadata");
  } else if (!o.initFrom.empty()) {
    // Each rank reads its experts only.
    for (size_t i = 0; i < np; ++i)
      if (t.params[i].experts) {
        layout[i].rowBegin = t.epRank * t.params[i].local;
        layout[i].rowEnd = (t.epRank + 1) * t.params[i].local;
      }
    std::vector<std::string> unused;
    std::string error;
    if (!readHfWeights(o.initFrom, layout, &t.values, unused, error))
      t.die("--init-from: " + error);
    if (!unused.empty() && t.rank == 0)
      std::fprintf(stderr,
                   "%s: note: %zu tensors of %s are not parameters of this "
                   "model (the first: %s)\n",
                   tool, unused.size(), o.initFrom.c_str(), unused[0].c_str());
    for (size_t i = 0; i < np; ++i)
      t.place(i);
  } else {
    // Each rank draws its part only: the values one rank would draw there.
    for (size_t i = 0; i < np; ++i) {
      const Param &p = t.params[i];
      std::vector<float> &v = t.values[i];
      v.assign(size_t(p.elements()), 1.0f);
      if (!p.ones)
        drawNormal(v, o.seed, i,
                   p.experts ? uint64_t(p.elements()) * uint64_t(t.epRank) : 0,
                   initStd);
      t.place(i);
    }
  }
  // The ranks start from the same step of the same data: each reads the
  // files itself (a directory or data that differ between hosts would
  // otherwise make them call different collectives).
  if (t.ranks > 1)
    for (auto [value, what] :
         {std::pair<int64_t, const char *>{t.step, "the checkpoint's step"},
          {data.trainRows(), "the training rows of --data"},
          {data.heldOutRows(), "the held-out rows of --data"}}) {
      double x = double(value), sum = t.sumOverRanks(x),
             squares = t.sumOverRanks(x * x);
      if (sum * sum != squares * t.ranks)
        t.die(std::string("the ranks disagree on ") + what +
              " (this rank: " + std::to_string(value) +
              "): --out and --data must be the same files on every rank");
    }

  // --- data order: a seeded permutation of the training rows per epoch ---
  int64_t rows = data.trainRows(), len = data.length;
  auto epochOrder = [&](int64_t epoch) {
    std::vector<int64_t> order(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i)
      order[size_t(i)] = i;
    // (mt19937_64's sequence is fixed by the standard: the same order on
    // every platform.)
    std::mt19937_64 gen(o.seed * 1000003 + uint64_t(epoch) + 1);
    for (int64_t i = rows - 1; i > 0; --i)
      std::swap(order[size_t(i)], order[size_t(gen() % uint64_t(i + 1))]);
    return order;
  };
  auto fill = [&](const std::vector<int32_t> &source, int64_t row,
                  std::vector<int32_t> &ids, std::vector<int32_t> &labels,
                  int64_t at) {
    const int32_t *r = &source[size_t(row * len)];
    for (int64_t j = 0; j < t.seq; ++j) {
      ids[size_t(at * t.seq + j)] = r[j];
      int32_t next = r[j + 1];
      labels[size_t(at * t.seq + j)] = next == Tokenizer::pad ? -100 : next;
    }
  };
  // A step's rows on all ranks; this rank's are the rank-th `t.batch`.
  const int64_t global = t.batch * t.ranks, first = t.batch * t.rank;
  auto heldOutLoss = [&]() {
    int64_t n = std::max<int64_t>(1, data.heldOutRows() / global);
    if (o.evalBatches > 0)
      n = std::min<int64_t>(n, o.evalBatches);
    std::vector<int32_t> ids(size_t(t.batch * t.seq)), labels(ids.size());
    double sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t i = 0; i < t.batch; ++i)
        fill(data.heldOut, (k * global + first + i) % data.heldOutRows(), ids,
             labels, i);
      // Each rank's loss is its share of the mean over all ranks' tokens.
      sum += t.sumOverRanks(t.run(t.lossOnly, *t.lossFn, ids, labels, {})[0]);
    }
    return sum / double(n);
  };

  // --- metrics: kept in the JSONL file, re-read on resume for the plot ---
  std::string metricsPath = o.out + "/metrics.jsonl";
  std::vector<std::pair<int64_t, double>> trainCurve, evalCurve;
  // The first rank writes the metrics, the plot and the messages.
  const bool lead = t.rank == 0;
  if (o.resume) {
    // Lines beyond the checkpoint's step belong to an interrupted run.
    std::string keep, text = readWholeFile(metricsPath);
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      std::string line =
          text.substr(pos, nl == std::string::npos ? nl : nl - pos);
      pos = nl == std::string::npos ? text.size() : nl + 1;
      long long s = -1;
      if (std::sscanf(line.c_str(), "{\"step\": %lld", &s) != 1 || s > t.step)
        continue;
      keep += line + "\n";
      if (const char *p = std::strstr(line.c_str(), "\"held_out_loss\": "))
        evalCurve.push_back({s, std::atof(p + 17)});
      else if (const char *p = std::strstr(line.c_str(), "\"loss\": "))
        trainCurve.push_back({s, std::atof(p + 8)});
    }
    FILE *f = lead ? std::fopen(metricsPath.c_str(), "w") : nullptr;
    if (lead && (!f || std::fputs(keep.c_str(), f) < 0 || std::fclose(f) != 0))
      t.die("cannot write " + metricsPath);
  }
  // Another rank's lines go nowhere.
  FILE *metrics = std::fopen(lead ? metricsPath.c_str() : "/dev/null",
                             o.resume ? "a" : "w");
  // Closed on every way out, an error included.
  std::unique_ptr<FILE, int (*)(FILE *)> closeMetrics(metrics, std::fclose);
  if (!metrics)
    t.die("cannot write " + metricsPath);

  auto save = [&]() {
    // Tensor by tensor from where the step keeps them (device memory for
    // GPU artifacts): no copy of the whole state on the host.
    std::vector<TensorSource> tensors;
    for (size_t i = 0; i < np; ++i) {
      // Several ranks: each of the first expert-parallel group writes its
      // rows of the expert tensors, the first also the replicated ones (the
      // same on every rank); the data-parallel copies write nothing.
      if (!lead && !t.params[i].experts)
        continue;
      const std::vector<int64_t> &shape = t.params[i].shape;
      tensors.push_back({t.params[i].name, shape, t.stateSource(t.dValues, i)});
      tensors.push_back({"optimizer.exp_avg." + t.params[i].name, shape,
                         t.stateSource(t.dM, i)});
      tensors.push_back({"optimizer.exp_avg_sq." + t.params[i].name, shape,
                         t.stateSource(t.dV, i)});
    }
    if (!t.routerBias.empty() && lead)
      tensors.push_back(
          {"router.selection_bias", t.routerBiasShape, [&](float *to) {
             std::memcpy(to, t.routerBias.data(), t.routerBias.size() * 4);
           }});
    std::map<std::string, std::string> m = runMeta;
    m["step"] = std::to_string(t.step);
    // What moe_mlir.models.export_hf needs to write transformers' layout.
    m["hf_transposed"] = hfTransposed;
    std::string error;
    if (t.epSize == 1) {
      // One file, written by the first rank (the others hold copies).
      if (!lead)
        return;
      if (!writeSafetensors(checkpoint, tensors, m, "data_crc32", error))
        t.die(error);
      if (o.keepCheckpoints > 1)
        keepCheckpoint(checkpoint, t.step, o.keepCheckpoints);
      retireShardedCheckpoint(o.out);
      return;
    }
    bool written = true;
    if (t.rank < t.epSize) {
      m["shard"] =
          std::to_string(t.epRank + 1) + " of " + std::to_string(t.epSize);
      written = writeSafetensors(
          checkpointShardPath(o.out, t.step, t.epRank, t.epSize), tensors, m,
          "data_crc32", error);
    }
    // The index names the files once every rank's is on disk.
    if (int failed = int(t.sumOverRanks(written ? 0 : 1)))
      t.die(written ? std::to_string(failed) +
                          " of the ranks could not "
                          "write their checkpoint file (their messages say why)"
                    : error);
    if (lead && !writeCheckpointIndex(o.out, t.step, t.epSize,
                                      o.keepCheckpoints, error))
      t.die(error);
  };
  auto plot = [&]() {
    if (!lead)
      return;
    std::string error;
    if (!writeLossPlot(o.out + "/loss.png", trainCurve, evalCurve, unigram,
                       error))
      t.die(error);
  };

  if (lead)
    std::fprintf(
        stderr,
        "%s: %zu parameter tensors, %lld training / %lld held-out rows "
        "of %lld tokens; unigram held-out loss %.4f; %s%s%s\n",
        tool, np, (long long)rows, (long long)data.heldOutRows(),
        (long long)t.seq, unigram, target.c_str(),
        recipe == "none" ? "" : (", " + recipe + " GEMMs").c_str(),
        t.ranks == 1 ? ""
                     : (", " + layoutName + " (" + t.comm->backend() + "), " +
                        std::to_string(t.batch) + " rows each")
                           .c_str());
  AdamWOptions adam{o.beta1, o.beta2, 1e-8, o.weightDecay};
  std::vector<int32_t> ids(size_t(t.batch * t.seq)), labels(ids.size());
  int64_t epochCached = -1;
  std::vector<int64_t> order;
  double lastEval = NAN;
  int64_t firstStep = t.step;
  if (t.step >= o.steps && lead)
    std::fprintf(stderr,
                 "%s: the checkpoint is at step %lld, which reaches --steps "
                 "%lld: nothing to train (raise --steps to continue)\n",
                 tool, (long long)t.step, (long long)o.steps);
  StopSignals signals;
  int stoppedBy = 0;
  while (t.step < o.steps) {
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < t.batch; ++i) {
      int64_t k = t.step * global + first + i;
      if (k / rows != epochCached) {
        epochCached = k / rows;
        order = epochOrder(epochCached);
      }
      fill(data.train, order[size_t(k % rows)], ids, labels, i);
    }
    double lr = learningRate(t.step, o.warmup, o.steps, o.lr, o.minLRRatio);
    std::vector<float> out = t.run(t.stepEntry, *t.stepFn, ids, labels,
                                   adamwScalars(t.step + 1, lr, o.clip, adam));
    double loss = t.sumOverRanks(out[0]), norm = out[1];
    // The step has updated the state already: a step that diverged leaves
    // the last checkpoint as it was.
    if (!std::isfinite(loss) || !std::isfinite(norm))
      t.die("step " + std::to_string(t.step + 1) + ": the " +
            (std::isfinite(loss) ? "gradient norm" : "loss") + " is " +
            std::to_string(std::isfinite(loss) ? norm : loss) +
            " (a lower --lr?)");
    ++t.step;
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    double tokensPerS = double(global * t.seq) / seconds;
    trainCurve.push_back({t.step, loss});
    // Per MoE layer, the busiest expert's load against an even split.
    std::string loadMax;
    std::vector<int32_t> stepLoad = t.expertLoad;
    t.updateRouterBias(stepLoad);
    if (t.loadExperts > 0 && !stepLoad.empty()) {
      loadMax = ", \"load_max\": [";
      size_t e = size_t(t.loadExperts);
      for (size_t l = 0; l * e < stepLoad.size(); ++l) {
        double total = 0, most = 0;
        for (size_t x = 0; x < e; ++x) {
          total += stepLoad[l * e + x];
          most = std::max<double>(most, stepLoad[l * e + x]);
        }
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.3f", l ? ", " : "",
                      total > 0 ? most * double(e) / total : 0.0);
        loadMax += buf;
      }
      loadMax += "]";
    }
    std::fprintf(metrics,
                 "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, "
                 "\"grad_norm\": %.6g, \"tokens_per_s\": %.1f, "
                 "\"tflops\": %.4f, %s%s, \"time\": "
                 "%.3f}\n",
                 (long long)t.step, loss, lr, norm, tokensPerS,
                 flops * t.ranks / seconds / 1e12, t.memory.entries().c_str(),
                 loadMax.c_str(), unixTime());
    bool evalNow =
        (o.evalEvery > 0 && t.step % o.evalEvery == 0) || t.step == o.steps;
    if (evalNow) {
      lastEval = heldOutLoss();
      evalCurve.push_back({t.step, lastEval});
      // The train step's expert load, in full.
      std::string load;
      if (t.loadExperts > 0 && !stepLoad.empty()) {
        load = ", \"expert_load\": [";
        size_t e = size_t(t.loadExperts);
        for (size_t i = 0; i < stepLoad.size(); ++i)
          load += std::string(i % e == 0 ? (i ? "], [" : "[") : ", ") +
                  std::to_string(stepLoad[i]);
        load += "]]";
      }
      std::fprintf(metrics,
                   "{\"step\": %lld, \"held_out_loss\": %.6f, "
                   "\"unigram_loss\": %.6f%s, \"time\": %.3f}\n",
                   (long long)t.step, lastEval, unigram, load.c_str(),
                   unixTime());
    }
    std::fflush(metrics);
    // The ranks stop after the same step: a signal to one stops them all.
    int signal = stopSignal;
    if (t.ranks > 1 && t.sumOverRanks(signal != 0) > 0 && !signal)
      signal = SIGTERM;
    stoppedBy = signal;
    bool stop =
        (o.stopAfterSteps > 0 && t.step - firstStep >= o.stopAfterSteps) ||
        signal != 0;
    if ((o.checkpointEvery > 0 && t.step % o.checkpointEvery == 0) ||
        t.step == o.steps || stop) {
      save();
      plot();
    }
    if (bar && lead) {
      int width = 30, done = int(width * t.step / o.steps);
      std::fprintf(stderr,
                   "\r[%.*s%*s] %lld/%lld  loss %.4f  held-out %.4f  "
                   "%.0f tok/s ",
                   done, "==============================", width - done, "",
                   (long long)t.step, (long long)o.steps, loss, lastEval,
                   tokensPerS);
      if (t.step == o.steps || stop)
        std::fprintf(stderr, "\n");
    } else if (o.progress != "none" && lead && (evalNow || t.step == o.steps)) {
      std::fprintf(stderr,
                   "step %lld/%lld  loss %.4f  held-out %.4f (unigram %.4f)  "
                   "%.0f tok/s\n",
                   (long long)t.step, (long long)o.steps, loss, lastEval,
                   unigram, tokensPerS);
    }
    if (stop)
      break;
  }
  closeMetrics.reset();
  if (int signal = stoppedBy) {
    if (lead)
      std::fprintf(stderr, "%s: %s: stopped after step %lld; wrote %s\n", tool,
                   signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)t.step,
                   checkpoint.c_str());
    t.releaseState();
    if (t.memory.gpu)
      mgpuStreamDestroy(t.memory.stream);
    return 128 + signal;
  }
  if (t.step == o.steps && std::isfinite(lastEval) && lead)
    std::fprintf(stderr,
                 "%s: held-out loss %.4f vs unigram %.4f; wrote %s, %s, "
                 "%s/loss.png\n",
                 tool, lastEval, unigram, checkpoint.c_str(),
                 metricsPath.c_str(), o.out.c_str());
  t.releaseState();
  if (t.memory.gpu)
    mgpuStreamDestroy(t.memory.stream);
  return 0;
}

} // namespace

bool checkTrainData(const TrainOptions &options, int64_t seq, int64_t vocab,
                    std::string &error) {
  Batches data;
  return loadData(options, seq, vocab, data, error);
}

int train(const TrainOptions &o, const std::string &artifactPath,
          const char *tool) {
  try {
    int status = trainOrThrow(o, artifactPath, tool);
    throwStickyError();
    return status;
  } catch (const Stop &stop) {
    std::fprintf(stderr, "%s: %s\n", tool, stop.message.c_str());
    return 1;
  } catch (const Error &e) {
    // What the runtime reported (a failed GPU call, a collective).
    std::fflush(stdout);
    std::fprintf(stderr, "moert: %s\n", e.what());
    return e.status();
  }
}

} // namespace moert
