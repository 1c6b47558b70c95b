//===- moert-ep-check.cpp - an expert-parallel layer equals one rank's ----===//
//
//   mpirun -np N moert-ep-check single.so ep.so [--seed S] [--function F]
//                               [--replicate I,J,...] [--atol A] [--rtol R]
//
// single.so and ep.so are the same program compiled by moe-compile
// --target=cpu, ep.so after `moe-opt --moe-expert-parallel=ep-size=N`. Every
// rank draws the same random inputs (seed S) for the whole job:
//
//   - expert weights (arguments whose manifest line says `shard E L`): the
//     full stack [E, ...]; the rank passes rows [r*L, (r+1)*L) to ep.so and
//     all of them to single.so;
//   - every other argument is data-parallel: a batch of N times its shape
//     along the first dimension, of which rank r takes slice r (tokens,
//     router logits); --replicate lists arguments that are the same on every
//     rank instead (e.g. a router weight).
//
// Rank r then runs single.so on its slice with all experts, and ep.so on its
// slice with its expert shard (its rows travel to the ranks owning their
// experts and back), and compares the results: bit for bit by default
// (an exact zero may differ in sign), else |ep - single| <= atol + rtol *
// |single| (the manifest's tolerance or --atol/--rtol). Prints `rank r: ok`
// or the first mismatches; exits 1 on every rank when any rank failed.
//
// Results marked `gradient_of I` in the manifest (moe.gradient_of) are
// gradients of parameters: the reference is the sum over ranks of the
// single-rank results (what the program's shard.all_reduce computes), and
// for an expert shard's gradient this rank's rows of it (summed in another
// order than the program does: within 1e-5 relative norm unless told).
//
// --global-batch (CPU artifacts; a train step of a moe-model graph, the
// expert-parallel one compiled with -moe-train-pipeline{ep-size=N}): the
// single-rank program holds the whole batch, N times the expert-parallel
// one's rows, and every rank runs it on all of them. Rank r runs ep.so on
// rows [r*B, (r+1)*B) of the ids and labels (drawn in [0, vocab), one label
// in 8 ignored: -100) and of the documents if any (two a row), its shard of the
// expert weights and of their AdamW moments (zero), every other parameter the
// same, the AdamW scalars of a first step (lr 1e-3, clip 1). Compared: the sum
// over the ranks of the losses against the single loss, the other 0-d results
// (the gradient norm), the outputs (the expert load, exactly), the gradients
// and the arguments the call updates (parameters and moments; expert shards
// against their rows), each as ||ep - single|| / ||single|| <= 1e-5 (the sums
// over tokens run in another order; the parameters after the step 1e-4, see
// globalBatchCheck) unless --atol/--rtol say otherwise.
//
// GPU artifacts (moe-compile --target=sm_90a, ...: the manifest's target)
// run on this rank's GPU (LOCAL_RANK, or the MPI launcher's local rank:
// one GPU per rank) with every input in device memory; the expert-parallel
// one exchanges device buffers (NCCL under MOERT_COMM_BACKEND=auto). Then
// [--repeat N] (default 10 on GPUs, 0 on CPUs) times N calls of each after
// [--warmup W] (default 2) and prints the median per call, single-rank and
// expert-parallel (the slowest rank's), and each rank's expert-weight
// memory in both. Tensors of more than 2^20 elements are drawn from a fast
// generator (uniform, unit variance) instead of the normal distribution.
//
//===----------------------------------------------------------------------===//

#include "moert/Comm.h"
#include "moert/Gpu.h"
#include "moert/Tool.h"

#include "moert/Artifact.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using moert::comm::Communicator;

namespace {

/// Stops this rank with `message`; runTool reports it and ends the job.
[[noreturn]] void stop(Communicator &comm, const std::string &message) {
  throw moert::Error("rank " + std::to_string(comm.rank()) +
                         ": moert-ep-check: " + message,
                     2);
}

using moert::artifact::bf16ToFloat;
using moert::artifact::descriptor;
using moert::artifact::floatToBf16;
using moert::artifact::Function;
using moert::artifact::parseManifest;
using moert::artifact::resultOffset;
using moert::artifact::targetOf;
using moert::artifact::Tensor;

using moert::artifact::call;

double valueAt(const Tensor &t, const uint8_t *buf, int64_t i) {
  if (t.dtype == "f32") {
    float f;
    std::memcpy(&f, buf + i * 4, 4);
    return f;
  }
  if (t.dtype == "f64") {
    double f;
    std::memcpy(&f, buf + i * 8, 8);
    return f;
  }
  if (t.dtype == "bf16") {
    uint16_t b;
    std::memcpy(&b, buf + i * 2, 2);
    return bf16ToFloat(b);
  }
  if (t.dtype == "i32") {
    int32_t v;
    std::memcpy(&v, buf + i * 4, 4);
    return v;
  }
  if (t.dtype == "i64") {
    int64_t v;
    std::memcpy(&v, buf + i * 8, 8);
    return double(v);
  }
  return buf[i];
}

void fillRandom(const Tensor &t, int64_t elements, std::vector<uint8_t> &buf,
                std::mt19937_64 &rng) {
  buf.assign(size_t(elements) * t.elementBytes(), 0);
  if (elements > (int64_t(1) << 20) && !t.hasRange &&
      (t.dtype == "f32" || t.dtype == "bf16")) {
    // Large tensors (a real layer's expert weights): uniform on
    // [-sqrt(3), sqrt(3)) (unit variance) from splitmix64, seeded by `rng`.
    uint64_t state = rng();
    for (int64_t i = 0; i < elements; ++i) {
      uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      float f =
          (float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * 1.7320508f;
      if (t.dtype == "f32") {
        std::memcpy(&buf[size_t(i) * 4], &f, 4);
      } else {
        uint16_t b = floatToBf16(f);
        std::memcpy(&buf[size_t(i) * 2], &b, 2);
      }
    }
    return;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < elements; ++i) {
    if (t.hasRange) {
      std::uniform_int_distribution<int64_t> u(t.lo, t.hi - 1);
      int64_t v = u(rng);
      if (t.elementBytes() == 8)
        std::memcpy(&buf[size_t(i) * 8], &v, 8);
      else {
        int32_t w = int32_t(v);
        std::memcpy(&buf[size_t(i) * 4], &w, 4);
      }
    } else if (t.dtype == "f32") {
      float f = normal(rng);
      std::memcpy(&buf[size_t(i) * 4], &f, 4);
    } else if (t.dtype == "f64") {
      double f = normal(rng);
      std::memcpy(&buf[size_t(i) * 8], &f, 8);
    } else if (t.dtype == "bf16") {
      uint16_t b = floatToBf16(normal(rng));
      std::memcpy(&buf[size_t(i) * 2], &b, 2);
    } else {
      for (size_t k = 0; k < t.elementBytes(); ++k)
        buf[size_t(i) * t.elementBytes() + k] = uint8_t(rng());
    }
  }
}

/// What running a function gave: its results (on the host) and, when
/// timed, the median time per call.
struct Run {
  std::vector<std::vector<uint8_t>> results;
  double medianMs = 0;
  size_t deviceBytes = 0;  ///< device memory the inputs took (GPU)
  moert_comm_stats comm{}; ///< the collectives of the timed calls
};

/// Calls `fn` and copies its results out; on a GPU artifact, with every
/// input in device memory. With `repeat`, times that many further calls
/// (after `warmup` untimed ones and a barrier of `comm`).
Run run(void *handle, const Function &f,
        std::vector<std::vector<uint8_t>> &inputs,
        const std::vector<Tensor> &argTypes, bool gpu, int warmup, int repeat,
        Communicator &comm) {
  std::string sym = moert::artifact::packedSymbol(f.name);
  void *fn = dlsym(handle, sym.c_str());
  if (!fn)
    stop(comm, "no " + sym);
  void *stream = gpu ? mgpuStreamCreate() : nullptr;
  std::vector<void *> deviceIn;
  std::vector<std::vector<int64_t>> descs;
  Run r;
  for (size_t i = 0; i < inputs.size(); ++i) {
    void *data = inputs[i].data();
    if (gpu) {
      data = mgpuMemAlloc(inputs[i].size(), stream, false);
      mgpuMemcpy(data, inputs[i].data(), inputs[i].size(), stream);
      deviceIn.push_back(data);
      r.deviceBytes += inputs[i].size();
    }
    descs.push_back(descriptor(data, argTypes[i]));
  }
  if (gpu)
    mgpuStreamSynchronize(stream);
  size_t resultBytes = resultOffset(f, f.results.size());
  std::vector<uint8_t> results(resultBytes + 8);
  // Frees what a call returned (the program allocated it).
  auto release = [&](std::vector<uint8_t> &res) {
    for (size_t i = 0; i < f.results.size(); ++i) {
      void *allocated;
      std::memcpy(&allocated, res.data() + resultOffset(f, i), 8);
      bool isInput = false; // a result that is an argument's buffer
      for (auto &d : descs)
        isInput |= reinterpret_cast<void *>(intptr_t(d[0])) == allocated;
      if (isInput || !allocated)
        continue;
      if (gpu)
        mgpuMemFree(allocated, stream);
      else
        std::free(allocated);
    }
  };
  call(fn, f.results.empty() ? nullptr : results.data(), descs);
  if (gpu)
    moert_gpu_synchronize();
  for (size_t i = 0; i < f.results.size(); ++i) {
    int64_t *d =
        reinterpret_cast<int64_t *>(results.data() + resultOffset(f, i));
    const Tensor &t = f.results[i];
    size_t n = size_t(t.elements()) * t.elementBytes();
    auto *aligned = reinterpret_cast<uint8_t *>(intptr_t(d[1]));
    int64_t offset = d[2];
    const uint8_t *at = aligned + offset * int64_t(t.elementBytes());
    if (gpu) {
      r.results.emplace_back(n);
      mgpuMemcpy(r.results.back().data(), const_cast<uint8_t *>(at), n, stream);
      mgpuStreamSynchronize(stream);
    } else {
      r.results.emplace_back(at, at + n);
    }
  }
  if (gpu)
    release(results);
  if (repeat > 0) {
    std::vector<uint8_t> scratch(resultBytes + 8);
    for (int w = 0; w < warmup; ++w) {
      call(fn, f.results.empty() ? nullptr : scratch.data(), descs);
      release(scratch);
    }
    if (gpu)
      moert_gpu_synchronize();
    comm.barrier();
    moert_comm_reset_stats();
    std::vector<double> times;
    for (int k = 0; k < repeat; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      call(fn, f.results.empty() ? nullptr : scratch.data(), descs);
      if (gpu)
        moert_gpu_synchronize();
      times.push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - t0)
                          .count());
      release(scratch);
    }
    std::sort(times.begin(), times.end());
    r.medianMs = times[times.size() / 2];
    moert_comm_get_stats(&r.comm);
  }
  if (gpu) {
    for (void *d : deviceIn)
      mgpuMemFree(d, stream);
    mgpuStreamSynchronize(stream);
    mgpuStreamDestroy(stream);
  }
  return r;
}

void *load(const char *path, const char **manifest) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h)
    stop(moert::comm::world(),
         std::string("cannot load ") + path + ": " + dlerror());
  *manifest = static_cast<const char *>(dlsym(h, "moe_manifest"));
  if (!*manifest)
    stop(moert::comm::world(),
         std::string(path) + " has no moe_manifest (not from moe-compile?)");
  return h;
}

bool dtypeOf(const std::string &s, moert::comm::DType &type) {
  using moert::comm::DType;
  if (s == "f32")
    type = DType::F32;
  else if (s == "f64")
    type = DType::F64;
  else if (s == "bf16")
    type = DType::BF16;
  else if (s == "f16")
    type = DType::F16;
  else if (s == "i32")
    type = DType::I32;
  else if (s == "i64")
    type = DType::I64;
  else
    return false;
  return true;
}

std::string fmt(double v) {
  char s[64];
  std::snprintf(s, sizeof(s), "%.9g", v);
  return s;
}

} // namespace

/// How `got` deviates from `ref` (`n` values of type `t`): ||got - ref|| /
/// ||ref|| (||got - ref|| when ref is 0) and the largest |got - ref| over
/// the values that are numbers on both sides; the values NaN on one side
/// only and on both.
struct Deviation {
  double rel = 0, maxDiff = 0;
  int64_t nanOnOne = 0, nanOnBoth = 0;
};
Deviation deviation(const Tensor &t, const uint8_t *ref, const uint8_t *got,
                    int64_t n) {
  Deviation d;
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    double a = valueAt(t, ref, i), b = valueAt(t, got, i);
    if (std::isnan(a) || std::isnan(b)) {
      ++(std::isnan(a) && std::isnan(b) ? d.nanOnBoth : d.nanOnOne);
      continue;
    }
    diff2 += (a - b) * (a - b);
    ref2 += a * a;
    d.maxDiff = std::max(d.maxDiff, std::fabs(a - b));
  }
  d.rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return d;
}

/// ||got - ref|| / ||ref|| <= bound (or the elementwise atol/rtol when
/// given) for `t`-typed buffers; appends a line to `report`, returns
/// whether it held.
bool compareNorm(const Tensor &t, const std::vector<uint8_t> &ref,
                 const std::vector<uint8_t> &got, double bound, double atol,
                 double rtol, const std::string &what, int rank,
                 std::string &report) {
  std::string head = "rank " + std::to_string(rank) + ": ";
  if (ref.size() != got.size()) {
    report += head + "MISMATCH " + what + ": " + std::to_string(got.size()) +
              " bytes, single-rank " + std::to_string(ref.size()) + "\n";
    return false;
  }
  int64_t n = int64_t(ref.size() / t.elementBytes());
  Deviation d = deviation(t, ref.data(), got.data(), n);
  int64_t bad = d.nanOnOne;
  bool elementwise = !t.isFloat() || atol >= 0 || rtol >= 0;
  if (elementwise)
    for (int64_t i = 0; i < n; ++i) {
      double a = valueAt(t, ref.data(), i), b = valueAt(t, got.data(), i);
      bad += std::fabs(a - b) >
             std::max(atol, 0.0) + std::max(rtol, 0.0) * std::fabs(a);
    }
  bool ok = !bad && (elementwise || d.rel <= bound);
  report += head + (ok ? "" : "MISMATCH ") + what + " (" + t.str() +
            "): rel norm " + fmt(d.rel) + ", max |diff| " + fmt(d.maxDiff) +
            (bad ? ", " + std::to_string(bad) + " values off" : "") + "\n";
  return ok;
}

/// --global-batch: one function of a train step, the single-rank program
/// on the whole batch against this rank's expert-parallel share (see the
/// file comment). Returns the number of mismatches.
int globalBatchCheck(void *single, void *ep, const Function &fs,
                     const Function &fe, uint64_t seed, double atol,
                     double rtol, Communicator &comm, std::string &report) {
  const int rank = comm.rank(), ranks = comm.size();
  auto fail = [&](const std::string &m) { stop(comm, m); };
  auto where = [&](size_t i) {
    return "@" + fe.name + " argument #" + std::to_string(i) + " (" +
           fe.args[i].str() + ")";
  };
  int64_t vocab = 0;
  if (auto it = fe.meta.find("vocab_size"); it != fe.meta.end())
    vocab = std::atoll(it->second.c_str());
  // Whether argument i is sharded over the experts: a shard, or an AdamW
  // moment of one.
  auto sharded = [&](size_t i) {
    const Tensor &a = fe.args[i];
    if (a.experts)
      return true;
    return !a.state.empty() && a.stateOf >= 0 &&
           size_t(a.stateOf) < fe.args.size() &&
           fe.args[size_t(a.stateOf)].experts != 0;
  };
  auto rowsOf = [&](const std::vector<uint8_t> &all) {
    size_t per = all.size() / size_t(ranks);
    return std::vector<uint8_t>(all.begin() + long(per * size_t(rank)),
                                all.begin() + long(per * size_t(rank + 1)));
  };
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> singleIn, epIn;
  for (size_t i = 0; i < fe.args.size(); ++i) {
    const Tensor &ts = fs.args[i], &te = fe.args[i];
    std::vector<uint8_t> all;
    if (sharded(i)) {
      if (ts.shape.empty() || te.shape.empty() || te.shape[0] == 0 ||
          ts.shape[0] % te.shape[0] != 0)
        fail(where(i) + " is no shard of the single-rank " + ts.str());
      if (ts.shape[0] != te.shape[0] * ranks)
        fail("@" + fe.name + " was compiled for " +
             std::to_string(ts.shape[0] / te.shape[0]) +
             " ranks (ep-size), but " + std::to_string(ranks) +
             " were launched");
      if (te.state.empty())
        fillRandom(ts, ts.elements(), all, rng);
      else
        all.assign(ts.bytes(), 0); // the moments of a first step
      epIn.push_back(rowsOf(all));
      singleIn.push_back(std::move(all));
      continue;
    }
    if (te.input == "ids" || te.input == "labels") {
      if (ts.shape.empty() || te.shape.empty() ||
          ts.shape[0] != te.shape[0] * ranks || te.dtype != "i32" || vocab <= 0)
        fail(where(i) + ": " + std::to_string(ranks) +
             " ranks' rows of i32 tokens expected in " + ts.str() +
             " (and a vocab_size)");
      std::uniform_int_distribution<int32_t> token(0, int32_t(vocab - 1));
      std::uniform_int_distribution<int> eighth(0, 7);
      all.resize(ts.bytes());
      for (int64_t k = 0; k < ts.elements(); ++k) {
        int32_t v = token(rng);
        if (te.input == "labels" && eighth(rng) == 0)
          v = -100;
        std::memcpy(&all[size_t(k) * 4], &v, 4);
      }
      epIn.push_back(rowsOf(all));
      singleIn.push_back(std::move(all));
      continue;
    }
    if (te.input == "documents") {
      // Packed rows: each row of [rows, seq] two documents, split at a
      // random position (ids non-decreasing along the row).
      if (ts.shape.size() != 2 || te.shape.size() != 2 ||
          ts.shape[0] != te.shape[0] * ranks || te.dtype != "i32")
        fail(where(i) + ": " + std::to_string(ranks) +
             " ranks' rows of i32 documents expected in " + ts.str());
      int64_t seq = ts.shape[1];
      std::uniform_int_distribution<int64_t> split(
          1, std::max<int64_t>(seq - 1, 1));
      all.resize(ts.bytes());
      for (int64_t r = 0; r < ts.shape[0]; ++r) {
        int64_t at = split(rng);
        for (int64_t c = 0; c < seq; ++c) {
          int32_t d = c < at ? 0 : 1;
          std::memcpy(&all[size_t(r * seq + c) * 4], &d, 4);
        }
      }
      epIn.push_back(rowsOf(all));
      singleIn.push_back(std::move(all));
      continue;
    }
    if (ts.shape != te.shape || ts.dtype != te.dtype)
      fail(where(i) + " is " + ts.str() + " in the single-rank program");
    if (te.input == "adamw") {
      // A first step: lr 1e-3, betas 0.9 / 0.95, weight decay 0.1, eps
      // 1e-8, clip 1 (the layout of -moe-adamw's scalars).
      const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f;
      float v[8] = {lr / (1 - b1),
                    std::sqrt(1 - b2),
                    1 - lr * 0.1f,
                    b1,
                    b2,
                    1e-8f,
                    1.0f,
                    lr};
      if (te.elements() != 8 || te.dtype != "f32")
        fail(where(i) + ": the 8 AdamW scalars expected");
      all.assign(reinterpret_cast<uint8_t *>(v),
                 reinterpret_cast<uint8_t *>(v) + sizeof v);
    } else if (!te.state.empty()) {
      all.assign(te.bytes(), 0);
    } else if (te.param.empty() && te.input != "router_bias") {
      fail(where(i) + ": an argument of no role --global-batch knows");
    } else {
      fillRandom(te, te.elements(), all, rng); // the same on every rank
    }
    singleIn.push_back(all);
    epIn.push_back(std::move(all));
  }

  Run singleRun = run(single, fs, singleIn, fs.args, false, 0, 0, comm);
  Run epRun = run(ep, fe, epIn, fe.args, false, 0, 0, comm);
  std::vector<std::vector<uint8_t>> &ref = singleRun.results;
  std::vector<std::vector<uint8_t>> &got = epRun.results;
  const double bound = 1e-5;
  int failures = 0;
  for (size_t k = 0; k < fe.results.size(); ++k) {
    const Tensor &t = fe.results[k];
    std::string what = "@" + fe.name + " result #" + std::to_string(k);
    if (k == 0 && t.shape.empty() && t.gradientOf < 0 && t.output.empty()) {
      // The loss: this rank's share; the ranks' shares add up to it.
      moert::comm::DType type;
      if (!dtypeOf(t.dtype, type))
        fail(what + ": cannot sum " + t.dtype);
      comm.allReduceSum(got[k].data(), got[k].data(), 1, type);
      what += " (the loss, summed over the ranks)";
    } else if (t.gradientOf >= 0 && size_t(t.gradientOf) < fe.args.size() &&
               sharded(size_t(t.gradientOf))) {
      ref[k] = rowsOf(ref[k]);
    }
    failures +=
        !compareNorm(t, ref[k], got[k], bound, atol, rtol, what, rank, report);
  }
  for (size_t i = 0; i < fe.args.size(); ++i) {
    if (!fe.args[i].updated)
      continue;
    std::vector<uint8_t> want = sharded(i) ? rowsOf(singleIn[i]) : singleIn[i];
    // A first AdamW step moves an element by about lr * g / (|g| + eps):
    // where a gradient nearly cancels, the other order of its sum changes
    // the step by up to 2 lr. The moments hold the gradients themselves
    // (within `bound`); the parameters get 10 x `bound`.
    double argBound = fe.args[i].param.empty() ? bound : 10 * bound;
    failures += !compareNorm(fe.args[i], want, epIn[i], argBound, atol, rtol,
                             where(i) + " as updated", rank, report);
  }
  return failures;
}

int run(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(
        stderr, "usage: mpirun -np N moert-ep-check single.so ep.so [--seed S] "
                "[--function F] [--replicate I,J] [--atol A] [--rtol R] "
                "[--global-batch]\n");
    return 2;
  }
  uint64_t seed = 1;
  std::string only;
  bool globalBatch = false;
  std::vector<bool> replicated(64, false);
  double atolFlag = -1, rtolFlag = -1;
  int repeat = -1, warmup = 2;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--global-batch") {
      globalBatch = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "moert-ep-check: %s needs a value\n", a.c_str());
      return 2;
    }
    std::string v = argv[++i];
    if (a == "--seed")
      seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--function")
      only = v;
    else if (a == "--atol")
      atolFlag = std::atof(v.c_str());
    else if (a == "--rtol")
      rtolFlag = std::atof(v.c_str());
    else if (a == "--repeat")
      repeat = std::atoi(v.c_str());
    else if (a == "--warmup")
      warmup = std::atoi(v.c_str());
    else if (a == "--replicate") {
      std::istringstream s(v);
      std::string item;
      while (std::getline(s, item, ','))
        if (int k = std::atoi(item.c_str()); k >= 0 && k < 64)
          replicated[size_t(k)] = true;
    } else {
      std::fprintf(stderr, "moert-ep-check: unknown option %s\n", a.c_str());
      return 2;
    }
  }

  Communicator &comm = moert::comm::world();
  const int rank = comm.rank(), ranks = comm.size();
  auto fail = [&](const std::string &m) { stop(comm, m); };

  const char *singleManifest, *epManifest;
  void *single = load(argv[1], &singleManifest);
  void *ep = load(argv[2], &epManifest);
  std::vector<Function> singleFns = parseManifest(singleManifest);
  std::vector<Function> epFns = parseManifest(epManifest);
  const std::string singleTarget = targetOf(singleManifest),
                    epTarget = targetOf(epManifest);
  const bool singleGpu = singleTarget != "cpu", epGpu = epTarget != "cpu";
  const bool anyGpu = singleGpu || epGpu;
  if (repeat < 0)
    repeat = anyGpu ? 10 : 0;
  std::string deviceBackend;
  if (anyGpu) {
    moert_gpu_init(); // this rank's GPU: LOCAL_RANK or the launcher's
    std::printf("rank %d: GPU %d of %d\n", rank, moert_gpu_device(),
                moert_gpu_device_count());
    std::fflush(stdout);
  }
  if (epGpu) {
    // The communicator of device buffers, now (NCCL's setup is not timed).
    deviceBackend = moert::comm::deviceWorld().backend();
  }
  // Per function: [single ms, EP ms] per rank, and the weights' bytes.
  std::vector<std::string> timed;
  std::vector<double> times;
  std::vector<double> weightBytes;

  int failures = 0, checked = 0;
  std::string report;
  for (const Function &fe : epFns) {
    if (!only.empty() && fe.name != only)
      continue;
    const Function *fs = nullptr;
    for (const Function &f : singleFns)
      if (f.name == fe.name)
        fs = &f;
    if (!fs)
      fail("@" + fe.name + " is in " + argv[2] + " but not in " + argv[1]);
    if (fs->args.size() != fe.args.size() ||
        fs->results.size() != fe.results.size())
      fail("@" + fe.name + " has different signatures in the two artifacts");
    ++checked;
    if (globalBatch) {
      if (singleGpu || epGpu)
        fail("--global-batch compares CPU artifacts");
      failures += globalBatchCheck(single, ep, *fs, fe, seed, atolFlag,
                                   rtolFlag, comm, report);
      continue;
    }

    // The whole job's inputs, drawn in argument order on every rank.
    std::mt19937_64 rng(seed);
    std::vector<std::vector<uint8_t>> singleIn, epIn;
    for (size_t i = 0; i < fe.args.size(); ++i) {
      const Tensor &ts = fs->args[i], &te = fe.args[i];
      std::vector<uint8_t> global;
      if (te.experts) {
        // Stacked expert weights: all on the single rank, a shard here.
        if (ts.shape.empty() || ts.shape[0] != te.experts ||
            te.shape[0] != te.local)
          fail("@" + fe.name + " argument #" + std::to_string(i) + ": " +
               te.str() + " shard of " + std::to_string(te.experts) +
               " experts does not match " + ts.str());
        if (te.local * ranks != te.experts)
          fail("@" + fe.name + " was compiled for " +
               std::to_string(te.experts / te.local) +
               " ranks (ep-size), but " + std::to_string(ranks) +
               " were launched");
        fillRandom(ts, ts.elements(), global, rng);
        size_t per = size_t(te.elements()) * te.elementBytes();
        epIn.emplace_back(global.begin() + long(per * size_t(rank)),
                          global.begin() + long(per * size_t(rank + 1)));
        singleIn.push_back(std::move(global));
        continue;
      }
      if (ts.shape != te.shape || ts.dtype != te.dtype)
        fail("@" + fe.name + " argument #" + std::to_string(i) + " is " +
             ts.str() + " in " + argv[1] + " but " + te.str() + " in " +
             argv[2]);
      if (replicated[i] || ts.shape.empty()) {
        fillRandom(ts, ts.elements(), global, rng);
        singleIn.push_back(global);
        epIn.push_back(global);
        continue;
      }
      // Data-parallel: rank r's slice of a batch of `ranks` such tensors.
      fillRandom(ts, ts.elements() * ranks, global, rng);
      size_t per = size_t(ts.elements()) * ts.elementBytes();
      std::vector<uint8_t> mine(global.begin() + long(per * size_t(rank)),
                                global.begin() + long(per * size_t(rank + 1)));
      singleIn.push_back(mine);
      epIn.push_back(mine);
    }

    double singleWeights = 0, epWeights = 0;
    for (size_t i = 0; i < fe.args.size(); ++i)
      if (fe.args[i].experts) {
        singleWeights += double(singleIn[i].size());
        epWeights += double(epIn[i].size());
      }
    Run singleRun =
        run(single, *fs, singleIn, fs->args, singleGpu, warmup, repeat, comm);
    singleIn.clear();
    singleIn.shrink_to_fit();
    Run epRun = run(ep, fe, epIn, fe.args, epGpu, warmup, repeat, comm);
    std::vector<std::vector<uint8_t>> &ref = singleRun.results;
    std::vector<std::vector<uint8_t>> &got = epRun.results;
    if (repeat > 0 &&
        epRun.comm.all_to_all_calls + epRun.comm.all_reduce_calls) {
      const moert_comm_stats &c = epRun.comm;
      double perCall = 1.0 / repeat;
      std::string line = "rank " + std::to_string(rank) + ": @" + fe.name +
                         " collectives per expert-parallel call: ";
      char buf[256];
      if (c.all_to_all_calls) {
        double s = c.all_to_all_seconds;
        std::snprintf(buf, sizeof(buf),
                      "%.3g all_to_all, %.3f ms in all, %.2f MiB to other "
                      "ranks (%.1f GB/s over the time in all_to_all)",
                      double(c.all_to_all_calls) * perCall, 1e3 * s * perCall,
                      double(c.all_to_all_bytes_to_peers) * perCall / 1048576.0,
                      s > 0 ? double(c.all_to_all_bytes_to_peers) / s / 1e9
                            : 0.0);
        line += buf;
      }
      if (c.all_reduce_calls) {
        std::snprintf(buf, sizeof(buf), "%s%.3g all_reduce, %.3f ms",
                      c.all_to_all_calls ? "; " : "",
                      double(c.all_reduce_calls) * perCall,
                      1e3 * c.all_reduce_seconds * perCall);
        line += buf;
      }
      report += line + "\n";
    }
    if (repeat > 0) {
      timed.push_back(fe.name);
      times.push_back(singleRun.medianMs);
      times.push_back(epRun.medianMs);
      weightBytes.push_back(singleWeights);
      weightBytes.push_back(epWeights);
    }

    double atol = atolFlag >= 0 ? atolFlag : fe.atol >= 0 ? fe.atol : 0;
    double rtol = rtolFlag >= 0 ? rtolFlag : fe.rtol >= 0 ? fe.rtol : 0;
    for (size_t k = 0; k < fe.results.size(); ++k) {
      const Tensor &t = fe.results[k];
      const Tensor &ts = fs->results[k];
      double resultAtol = atol, resultRtol = rtol;
      // ||ep - single|| / ||single|| <= normBound instead of elementwise
      // (the function's third tolerance value, or the default for expert
      // gradients below).
      double normBound = atolFlag < 0 && rtolFlag < 0 ? fe.norm : 0;
      // Gradients (`moe.gradient_of`, parameters replicated or sharded):
      // what one rank computes from its tokens is a partial sum.
      if (t.gradientOf >= 0 && size_t(t.gradientOf) < fe.args.size() &&
          ts.gradientOf == t.gradientOf) {
        moert::comm::DType type;
        if (!dtypeOf(ts.dtype, type))
          fail("@" + fe.name + " result #" + std::to_string(k) +
               ": cannot sum " + ts.dtype + " gradients");
        // The whole batch's gradient: the sum of every rank's.
        comm.allReduceSum(ref[k].data(), ref[k].data(), ts.elements(), type);
        const Tensor &arg = fe.args[size_t(t.gradientOf)];
        if (arg.experts) {
          // An expert shard's gradient: this rank's experts' rows, summed
          // over every rank's tokens in another order than the reference.
          size_t per = ref[k].size() / size_t(ranks);
          ref[k] = std::vector<uint8_t>(
              ref[k].begin() + long(per * size_t(rank)),
              ref[k].begin() + long(per * size_t(rank + 1)));
          // Every element is a sum over the tokens of all ranks, in another
          // order than the reference's: elements that cancel to near zero
          // differ by more than their own size allows, so the shard is
          // compared as a whole (f32 reordering: ~1e-6 measured).
          if (atolFlag < 0 && rtolFlag < 0 && fe.atol < 0)
            normBound = 1e-5;
          Tensor shardOf = ts;
          shardOf.shape[0] /= ranks;
          if (shardOf.shape != t.shape) {
            report += "rank " + std::to_string(rank) + ": @" + fe.name +
                      " result #" + std::to_string(k) + " is " + t.str() +
                      ", expected this rank's " + shardOf.str() + "\n";
            ++failures;
            continue;
          }
        }
      }
      if (ref[k].size() != size_t(t.elements()) * t.elementBytes() ||
          t.dtype != ts.dtype) {
        report += "rank " + std::to_string(rank) + ": @" + fe.name +
                  " result #" + std::to_string(k) + " is " + t.str() +
                  ", single-rank " + fs->results[k].str() + "\n";
        ++failures;
        continue;
      }
      int64_t bad = 0;
      double maxDiff = 0;
      std::string first;
      if (normBound > 0 && t.isFloat()) {
        Deviation d = deviation(t, ref[k].data(), got[k].data(), t.elements());
        bool ok = d.rel <= normBound && !d.nanOnOne && !d.nanOnBoth;
        report += "rank " + std::to_string(rank) + ": " +
                  (ok ? "" : "MISMATCH ") + "@" + fe.name + " result #" +
                  std::to_string(k) + " (" + t.str() + "): rel norm " +
                  fmt(d.rel) + " (bound " + fmt(normBound) + "), max |diff| " +
                  fmt(d.maxDiff) + "\n";
        failures += !ok;
        continue;
      }
      for (int64_t i = 0; i < t.elements(); ++i) {
        double a = valueAt(t, ref[k].data(), i),
               b = valueAt(t, got[k].data(), i);
        bool same;
        if (t.isFloat() && resultAtol == 0 && resultRtol == 0)
          same = a == b || (std::isnan(a) && std::isnan(b)); // +0 == -0
        else
          same = std::fabs(a - b) <= resultAtol + resultRtol * std::fabs(a) ||
                 (std::isnan(a) && std::isnan(b));
        if (!std::isnan(a - b))
          maxDiff = std::max(maxDiff, std::fabs(a - b));
        if (!same && bad++ < 3)
          first += "  at " + std::to_string(i) + ": single " + fmt(a) +
                   ", expert-parallel " + fmt(b) + "\n";
      }
      if (bad) {
        ++failures;
        report += "rank " + std::to_string(rank) + ": MISMATCH @" + fe.name +
                  " result #" + std::to_string(k) + ": " + std::to_string(bad) +
                  " of " + std::to_string(t.elements()) + " values differ\n" +
                  first;
      } else {
        report += "rank " + std::to_string(rank) + ": @" + fe.name +
                  " result #" + std::to_string(k) + " (" + t.str() +
                  "): max |diff| " + fmt(maxDiff) + "\n";
      }
    }
  }
  if (!checked)
    fail(only.empty() ? std::string("no functions in ") + argv[2]
                      : "no function @" + only + " in " + argv[2]);

  std::fputs(report.c_str(), stdout);
  std::printf("rank %d: %s\n", rank, failures ? "MISMATCH" : "ok");
  std::fflush(stdout);
  int32_t total = failures;
  comm.allReduceSum(&total, &total, 1, moert::comm::DType::I32);

  // Timing and memory: every rank's numbers to rank 0 (a sum of vectors that
  // are zero except for the rank's own entries).
  const size_t nf = timed.size();
  std::vector<double> all(nf * 2 * size_t(ranks), 0.0);
  for (size_t k = 0; k < nf; ++k)
    for (size_t j = 0; j < 2; ++j)
      all[(k * 2 + j) * size_t(ranks) + size_t(rank)] = times[k * 2 + j];
  if (nf)
    comm.allReduceSum(all.data(), all.data(), int64_t(all.size()),
                      moert::comm::DType::F64);
  for (size_t k = 0; k < nf; ++k) {
    std::printf("rank %d: @%s expert weights in %s memory: %.1f MiB with "
                "expert parallelism, %.1f MiB with every expert (%.0f%%)\n",
                rank, timed[k].c_str(), epGpu ? "GPU" : "host",
                weightBytes[k * 2 + 1] / 1048576.0,
                weightBytes[k * 2] / 1048576.0,
                weightBytes[k * 2] > 0
                    ? 100.0 * weightBytes[k * 2 + 1] / weightBytes[k * 2]
                    : 0.0);
    std::printf("rank %d: @%s time per call (median of %d): %.3f ms single "
                "(%s), %.3f ms expert-parallel (%s)\n",
                rank, timed[k].c_str(), repeat, times[k * 2],
                singleGpu ? "1 GPU" : "CPU", times[k * 2 + 1],
                epGpu ? "GPUs" : "CPUs");
  }
  std::fflush(stdout);
  comm.barrier();
  if (rank == 0) {
    for (size_t k = 0; k < nf; ++k) {
      double worstSingle = 0, worstEp = 0;
      for (int r = 0; r < ranks; ++r) {
        worstSingle =
            std::max(worstSingle, all[(k * 2) * size_t(ranks) + size_t(r)]);
        worstEp =
            std::max(worstEp, all[(k * 2 + 1) * size_t(ranks) + size_t(r)]);
      }
      // Each rank handles its own tokens in both: EP=N takes N times the
      // tokens of one device in the slowest rank's time.
      std::printf("@%s time per layer call, slowest rank: %.3f ms on %s with "
                  "every expert, %.3f ms at EP=%d; throughput at EP=%d: "
                  "%.2fx one %s's\n",
                  timed[k].c_str(), worstSingle, singleGpu ? "1 GPU" : "1 CPU",
                  worstEp, ranks, ranks,
                  worstEp > 0 ? ranks * worstSingle / worstEp : 0.0,
                  singleGpu ? "GPU" : "CPU");
    }
    if (epGpu)
      std::printf("expert-parallel check on %d ranks (%s, device buffers: "
                  "%s): %s\n",
                  ranks, comm.backend(), deviceBackend.c_str(),
                  total ? "FAILED" : "all ranks ok");
    else
      std::printf("expert-parallel check on %d ranks (%s): %s\n", ranks,
                  comm.backend(), total ? "FAILED" : "all ranks ok");
    std::fflush(stdout);
  }
  return total ? 1 : 0;
}

int main(int argc, char **argv) {
  return moert::runTool([&] { return run(argc, argv); });
}
