//===- moert-check.cpp - run a compiled function on CPU and GPU, compare --===//
//
//   moert-check cpu.so gpu.so [--seed N] [--repeat N] [--only NAME]
//   moert-check --gpu-only gpu.so --repeat N      (timing, no reference)
//
// Both artifacts come from the same source (moe-compile --target=cpu and
// --target=sm_90a). For every function of the manifest: random inputs (ints,
// or the bits of 8-bit floats, in the range the function declares; a train
// step's optimizer scalars and moments as an update sees them), the CPU
// result as the reference, the GPU result on device buffers (new device buffers
// are poisoned first: MOERT_POISON), then a comparison: integer and 8-bit float
// results must be bit-identical, other floats within the function's declared
// tolerance
// (|gpu - cpu| <= atol + rtol * |cpu|; exact when none is declared; with a
// third value, ||gpu - cpu|| / ||cpu|| <= norm instead, for results where a
// rare rounding flip of a quantized intermediate moves single elements). Prints
// one line per result (and per argument the function updates in place) and
// a summary; exits 1 on any mismatch. With
// --repeat N it also times N GPU calls and prints the median.
//
//===----------------------------------------------------------------------===//

#include "moert/Gpu.h"
#include "moert/Tool.h"
#include "moert/Train.h"

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

namespace {

using moert::artifact::bf16ToFloat;
using moert::artifact::descriptor;
using moert::artifact::floatToBf16;
using moert::artifact::Function;
using moert::artifact::parseManifest;
using moert::artifact::resultOffset;
using moert::artifact::Tensor;

using moert::artifact::call;

double valueAt(const Tensor &t, const std::vector<uint8_t> &buf, int64_t i) {
  if (t.dtype == "f32") {
    float f;
    std::memcpy(&f, &buf[i * 4], 4);
    return f;
  }
  if (t.dtype == "f64") {
    double d;
    std::memcpy(&d, &buf[i * 8], 8);
    return d;
  }
  if (t.dtype == "bf16") {
    uint16_t b;
    std::memcpy(&b, &buf[i * 2], 2);
    return bf16ToFloat(b);
  }
  if (t.dtype == "i32") {
    int32_t v;
    std::memcpy(&v, &buf[i * 4], 4);
    return v;
  }
  if (t.dtype == "i64") {
    int64_t v;
    std::memcpy(&v, &buf[i * 8], 8);
    return double(v);
  }
  return buf[i];
}

void fillRandom(const Tensor &t, std::vector<uint8_t> &buf,
                std::mt19937_64 &rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // A train step's optimizer scalars and moments (-moe-adamw): values an
  // update sees (a second moment is not negative).
  if (t.input == "adamw" && t.dtype == "f32") {
    std::vector<float> s = moert::adamwScalars(3, 1e-3, 1.0, {});
    std::memcpy(buf.data(), s.data(), std::min(buf.size(), s.size() * 4));
    return;
  }
  float scale = t.state == "exp_avg" ? 0.1f : 1.0f;
  for (int64_t i = 0; i < t.elements(); ++i) {
    if (t.hasRange) {
      // The value's low bytes (little-endian): integers, or the bit
      // patterns of 8-bit floats and E8M0 scales.
      std::uniform_int_distribution<int64_t> u(t.lo, t.hi - 1);
      int64_t v = u(rng);
      std::memcpy(&buf[i * t.elementBytes()], &v, t.elementBytes());
    } else if (t.dtype == "f32") {
      float f = normal(rng) * scale;
      if (t.state == "exp_avg_sq")
        f = 0.01f * f * f;
      std::memcpy(&buf[i * 4], &f, 4);
    } else if (t.dtype == "bf16") {
      uint16_t b = floatToBf16(normal(rng));
      std::memcpy(&buf[i * 2], &b, 2);
    } else {
      for (size_t k = 0; k < t.elementBytes(); ++k)
        buf[i * t.elementBytes() + k] = uint8_t(rng());
    }
  }
}

void *open(const char *path, const char **manifest) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "moert-check: cannot load %s: %s\n", path, dlerror());
    std::exit(2);
  }
  *manifest = static_cast<const char *>(dlsym(h, "moe_manifest"));
  if (!*manifest) {
    std::fprintf(
        stderr, "moert-check: %s has no moe_manifest (not from moe-compile?)\n",
        path);
    std::exit(2);
  }
  return h;
}

} // namespace

int run(int argc, char **argv) {
  bool gpuOnly = argc > 1 && !std::strcmp(argv[1], "--gpu-only");
  if (gpuOnly) {
    ++argv;
    --argc;
  }
  if (argc < (gpuOnly ? 2 : 3)) {
    std::fprintf(
        stderr,
        "usage: moert-check cpu.so gpu.so [--seed N] [--repeat N] [--only "
        "NAME]\n"
        "       moert-check --gpu-only gpu.so --repeat N [--only NAME]\n");
    return 2;
  }
  uint64_t seed = 1;
  int repeat = 0;
  std::string only;
  for (int i = gpuOnly ? 2 : 3; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--seed"))
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--repeat"))
      repeat = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--only"))
      only = argv[i + 1];
  }
  moert_gpu_init();
  const char *cpuManifest = nullptr, *gpuManifest;
  void *cpu = gpuOnly ? nullptr : open(argv[1], &cpuManifest);
  void *gpu = open(argv[gpuOnly ? 1 : 2], &gpuManifest);
  std::vector<Function> fns =
      parseManifest(gpuOnly ? gpuManifest : cpuManifest);
  int checked = 0, failed = 0;
  std::mt19937_64 rng(seed);
  for (const Function &f : fns) {
    if (!only.empty() && f.name != only)
      continue;
    std::string sym = moert::artifact::packedSymbol(f.name);
    void *cf = cpu ? dlsym(cpu, sym.c_str()) : nullptr;
    void *gf = dlsym(gpu, sym.c_str());
    if ((!cf && !gpuOnly) || !gf) {
      std::fprintf(stderr, "moert-check: %s missing from an artifact\n",
                   sym.c_str());
      return 2;
    }
    // Inputs.
    std::vector<std::vector<uint8_t>> host;
    for (const Tensor &t : f.args) {
      host.emplace_back(t.bytes());
      fillRandom(t, host.back(), rng);
    }
    size_t resultBytes = resultOffset(f, f.results.size());
    // CPU reference.
    // (Arguments the function updates change: the GPU starts from `host`.)
    std::vector<std::vector<uint8_t>> cpuIn = host;
    std::vector<std::vector<int64_t>> cpuArgs;
    for (size_t i = 0; i < f.args.size(); ++i)
      cpuArgs.push_back(descriptor(cpuIn[i].data(), f.args[i]));
    std::vector<uint8_t> cpuResults(resultBytes);
    if (!gpuOnly)
      call(cf, f.results.empty() ? nullptr : cpuResults.data(), cpuArgs);
    // GPU.
    void *stream = mgpuStreamCreate();
    std::vector<void *> devIn;
    std::vector<std::vector<int64_t>> gpuArgs;
    for (size_t i = 0; i < f.args.size(); ++i) {
      void *d = mgpuMemAlloc(f.args[i].bytes(), stream, false);
      mgpuMemcpy(d, host[i].data(), f.args[i].bytes(), stream);
      devIn.push_back(d);
      gpuArgs.push_back(descriptor(d, f.args[i]));
    }
    mgpuStreamSynchronize(stream);
    std::vector<uint8_t> gpuResults(resultBytes);
    call(gf, f.results.empty() ? nullptr : gpuResults.data(), gpuArgs);
    moert_gpu_synchronize();
    // The updated arguments' new values, before timing runs update them again.
    std::vector<std::vector<uint8_t>> gpuUpdated(f.args.size());
    for (size_t i = 0; i < f.args.size(); ++i)
      if (f.args[i].updated) {
        gpuUpdated[i].resize(f.args[i].bytes());
        mgpuMemcpy(gpuUpdated[i].data(), devIn[i], f.args[i].bytes(), stream);
      }
    mgpuStreamSynchronize(stream);
    double medianMs = 0;
    if (repeat > 0) {
      std::vector<double> times;
      std::vector<uint8_t> scratch(resultBytes);
      for (int r = 0; r < repeat; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        call(gf, scratch.empty() ? nullptr : scratch.data(), gpuArgs);
        moert_gpu_synchronize();
        times.push_back(std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - t0)
                            .count());
        for (size_t i = 0; i < f.results.size(); ++i) {
          void *p;
          std::memcpy(&p, &scratch[resultOffset(f, i)], 8);
          mgpuMemFree(p, stream);
        }
      }
      std::sort(times.begin(), times.end());
      medianMs = times[times.size() / 2];
    }
    if (gpuOnly) {
      std::printf("%-28s gpu median %.3f ms over %d runs\n", f.name.c_str(),
                  medianMs, repeat);
      for (size_t i = 0; i < f.results.size(); ++i) {
        void *p;
        std::memcpy(&p, &gpuResults[resultOffset(f, i)], 8);
        mgpuMemFree(p, stream);
      }
    }
    // Compares the CPU's and the GPU's values of one result or updated
    // argument; prints one line.
    auto compare = [&](const Tensor &t, bool isResult, size_t i,
                       const std::vector<uint8_t> &want,
                       const std::vector<uint8_t> &got) {
      int64_t bad = 0, firstBad = -1;
      double maxAbs = 0, maxRel = 0, diffSq = 0, refSq = 0;
      bool exact = !t.isFloat() || (f.atol <= 0 && f.rtol <= 0);
      for (int64_t e = 0; e < t.elements(); ++e) {
        if (exact) {
          size_t w = t.elementBytes();
          if (std::memcmp(&want[e * w], &got[e * w], w) != 0) {
            // NaN == NaN for floats.
            double a = valueAt(t, want, e), b = valueAt(t, got, e);
            if (!(t.isFloat() && std::isnan(a) && std::isnan(b))) {
              ++bad;
              if (firstBad < 0)
                firstBad = e;
            }
          }
          continue;
        }
        double a = valueAt(t, want, e), b = valueAt(t, got, e);
        if (std::isnan(a) && std::isnan(b))
          continue;
        double diff = std::fabs(a - b);
        diffSq += diff * diff;
        refSq += a * a;
        maxAbs = std::max(maxAbs, diff);
        if (a != 0)
          maxRel = std::max(maxRel, diff / std::fabs(a));
        if (!(diff <= f.atol + f.rtol * std::fabs(a))) {
          ++bad;
          if (firstBad < 0)
            firstBad = e;
        }
      }
      double normErr =
          refSq > 0 ? std::sqrt(diffSq / refSq) : std::sqrt(diffSq);
      if (!exact && f.norm > 0)
        bad = normErr <= f.norm ? 0 : std::max<int64_t>(bad, 1);
      ++checked;
      failed += bad != 0;
      std::printf("%-28s %s %zu %-5s %9lld elems  %s", f.name.c_str(),
                  isResult ? "result" : "updates", i, t.dtype.c_str(),
                  (long long)t.elements(), bad ? "MISMATCH" : "ok");
      if (exact)
        std::printf("  bit-identical%s", bad ? "" : "");
      else
        std::printf(f.norm > 0
                        ? "  rel norm %.3g (bound %.3g), max abs %.3g"
                        : "  max abs %.3g, max rel %.3g (atol %.3g, rtol %.3g)",
                    f.norm > 0 ? normErr : maxAbs, f.norm > 0 ? f.norm : maxRel,
                    f.norm > 0 ? maxAbs : f.atol, f.rtol);
      if (bad && firstBad >= 0)
        std::printf("  %lld bad, first at %lld: cpu %g gpu %g", (long long)bad,
                    (long long)firstBad, valueAt(t, want, firstBad),
                    valueAt(t, got, firstBad));
      if (repeat > 0 && i == 0 && isResult)
        std::printf("  gpu median %.3f ms", medianMs);
      std::printf("\n");
    };
    for (size_t i = 0; !gpuOnly && i < f.results.size(); ++i) {
      const Tensor &t = f.results[i];
      // Descriptor fields: allocated pointer, aligned pointer, ...
      void *cp, *gp, *cpuAllocated, *gpuAllocated;
      std::memcpy(&cpuAllocated, &cpuResults[resultOffset(f, i)], 8);
      std::memcpy(&cp, &cpuResults[resultOffset(f, i) + 8], 8);
      std::memcpy(&gpuAllocated, &gpuResults[resultOffset(f, i)], 8);
      std::memcpy(&gp, &gpuResults[resultOffset(f, i) + 8], 8);
      std::vector<uint8_t> want(t.bytes()), got(t.bytes());
      std::memcpy(want.data(), cp, t.bytes());
      mgpuMemcpy(got.data(), gp, t.bytes(), stream);
      mgpuStreamSynchronize(stream);
      compare(t, /*isResult=*/true, i, want, got);
      mgpuMemFree(gpuAllocated, stream);
      std::free(cpuAllocated);
    }
    for (size_t i = 0; !gpuOnly && i < f.args.size(); ++i)
      if (f.args[i].updated)
        compare(f.args[i], /*isResult=*/false, i, cpuIn[i], gpuUpdated[i]);
    for (void *d : devIn)
      mgpuMemFree(d, stream);
    mgpuStreamSynchronize(stream);
    mgpuStreamDestroy(stream);
  }
  std::printf("%d results checked, %d mismatching\n", checked, failed);
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  return moert::runTool([&] { return run(argc, argv); });
}
