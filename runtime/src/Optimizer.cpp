//===- Optimizer.cpp - the optimizer's scalars, the learning-rate schedule ===//
//
// The update itself is compiled into the train step (-moe-adamw); the host
// computes what changes from step to step, in double.
//
//===----------------------------------------------------------------------===//

#include "moert/Train.h"

#include <algorithm>
#include <cmath>

namespace moert {

std::vector<float> adamwScalars(int64_t t, double lr, double clip,
                                const AdamWOptions &o) {
  const double c1 = 1.0 - std::pow(o.beta1, double(t));
  const double c2 = 1.0 - std::pow(o.beta2, double(t));
  return {float(lr / c1),
          float(std::sqrt(c2)),
          float(1.0 - lr * o.weightDecay),
          float(o.beta1),
          float(o.beta2),
          float(o.eps),
          float(clip),
          float(lr)};
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

} // namespace moert
