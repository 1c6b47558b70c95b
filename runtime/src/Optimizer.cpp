//===- Optimizer.cpp - AdamW, the learning-rate schedule, clipping --------===//
//
// Elementwise over the train state on the host's cores (OpenMP when the
// runtime is built with it). Work is split in fixed chunks whose partial sums
// are combined in chunk order, so results do not depend on the number of
// threads.
//
//===----------------------------------------------------------------------===//

#include "moert/Train.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moert {
namespace {

/// Chunk size of the parallel loops: large enough that a chunk is worth a
/// thread, fixed so that per-chunk sums are the same on every machine.
constexpr int64_t kChunk = 1 << 18;

int64_t chunksOf(int64_t n) { return (n + kChunk - 1) / kChunk; }

void adamwRange(float *p, const float *g, float *m, float *v, int64_t begin,
                int64_t end, int64_t t, double lr, bool decay,
                const AdamWOptions &o) {
  const double c1 = 1.0 - std::pow(o.beta1, double(t));
  const double c2 = 1.0 - std::pow(o.beta2, double(t));
  const float b1 = float(o.beta1), b2 = float(o.beta2);
  const float stepSize = float(lr / c1);
  const float c2Sqrt = float(std::sqrt(c2));
  const float eps = float(o.eps);
  const float keep = decay ? float(1.0 - lr * o.weightDecay) : 1.0f;
  for (int64_t i = begin; i < end; ++i) {
    float gi = g[i];
    p[i] *= keep;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    float denom = std::sqrt(v[i]) / c2Sqrt + eps;
    p[i] -= stepSize * (m[i] / denom);
  }
}
} // namespace

void adamwStep(float *p, const float *g, float *m, float *v, int64_t n,
               int64_t t, double lr, bool decay, const AdamWOptions &o) {
  // Elementwise: the same values whichever thread computes them.
  const int64_t chunks = chunksOf(n);
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c)
    adamwRange(p, g, m, v, c * kChunk, std::min(n, (c + 1) * kChunk), t, lr,
               decay, o);
}

double learningRate(int64_t step, int64_t warmup, int64_t total, double peak,
                    double minRatio) {
  if (warmup > 0 && step < warmup)
    return peak * double(step + 1) / double(warmup);
  if (step >= total)
    return peak * minRatio;
  double span = double(std::max<int64_t>(1, total - warmup));
  double progress = double(step - warmup) / span;
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak * (minRatio + (1.0 - minRatio) * cosine);
}
double clipGradients(std::vector<std::pair<float *, int64_t>> &grads,
                     double maxNorm) {
  // Sums of fixed chunks, added in order: the same norm on any core count.
  double sum = 0;
  for (auto &[g, n] : grads) {
    const float *data = g;
    const int64_t size = n, chunks = chunksOf(size);
    std::vector<double> partial(size_t(chunks), 0.0);
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0;
      for (int64_t i = c * kChunk, end = std::min(size, (c + 1) * kChunk);
           i < end; ++i)
        s += double(data[i]) * double(data[i]);
      partial[size_t(c)] = s;
    }
    for (double s : partial)
      sum += s;
  }
  double norm = std::sqrt(sum);
  if (maxNorm > 0 && norm > maxNorm && std::isfinite(norm)) {
    const float scale = float(maxNorm / (norm + 1e-6));
    for (auto &[g, n] : grads) {
      float *data = g;
      const int64_t size = n, chunks = chunksOf(size);
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
      for (int64_t c = 0; c < chunks; ++c)
        for (int64_t i = c * kChunk, end = std::min(size, (c + 1) * kChunk);
             i < end; ++i)
          data[i] *= scale;
    }
  }
  return norm;
}

} // namespace moert
