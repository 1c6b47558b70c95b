//===- TrainTest.cpp - the training loop's parts, printed for checking ----===//
//
//   moert-train-test OUT_DIR
//
// Prints (JSON) what test/Runtime/train-parts.py compares with PyTorch:
// five AdamW steps on fixed values (with and without weight decay), the
// learning-rate schedule, gradient clipping; writes a safetensors file and a
// loss plot into OUT_DIR for the test to read with other readers.
//
//===----------------------------------------------------------------------===//

#include "moert/Train.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: moert-train-test OUT_DIR\n");
    return 2;
  }
  std::string dir = argv[1];
  const int n = 7;
  auto printArray = [](const char *name, const std::vector<float> &v) {
    std::printf("\"%s\": [", name);
    for (size_t i = 0; i < v.size(); ++i)
      std::printf("%s%.9g", i ? ", " : "", v[i]);
    std::printf("],\n");
  };
  std::printf("{\n");
  for (bool decay : {false, true}) {
    std::vector<float> p(n), m(n, 0), v(n, 0), g(n);
    for (int i = 0; i < n; ++i)
      p[i] = std::sin(1.0 + i);
    moert::AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
    for (int t = 1; t <= 5; ++t) {
      for (int i = 0; i < n; ++i)
        g[i] = float(std::cos(0.3 * t + i) * (i + 1) * 0.1);
      moert::adamwStep(p.data(), g.data(), m.data(), v.data(), n, t, 1e-2,
                       decay, o);
    }
    printArray(decay ? "adamw_decay" : "adamw", p);
  }
  std::vector<float> lrs;
  for (int s = 0; s < 12; ++s)
    lrs.push_back(float(moert::learningRate(s, 3, 10, 1.0, 0.1)));
  printArray("lr", lrs);
  std::vector<float> a = {3, 0, 0}, b = {0, 4};
  std::vector<std::pair<float *, int64_t>> grads = {{a.data(), 3},
                                                    {b.data(), 2}};
  double norm = moert::clipGradients(grads, 1.0);
  std::printf("\"norm\": %.9g,\n", norm);
  printArray("clipped", {a[0], b[1]});

  std::vector<moert::NamedTensor> tensors = {{"w", {2, 3}, {1, 2, 3, 4, 5, 6}},
                                             {"b", {3}, {-1, 0.5f, 1e-3f}}};
  std::string error;
  bool ok =
      moert::writeSafetensors(dir + "/t.safetensors", tensors,
                              {{"step", "7"}, {"q\"uote", "a\\b"}}, error);
  std::vector<moert::NamedTensor> back;
  std::map<std::string, std::string> meta;
  ok = ok && moert::readSafetensors(dir + "/t.safetensors", back, meta, error);
  ok = ok && back.size() == 2 && back[0].data == tensors[0].data &&
       back[1].shape == tensors[1].shape && meta["q\"uote"] == "a\\b";
  ok = ok &&
       moert::writeLossPlot(dir + "/plot.png", {{1, 3.0}, {2, 2.5}, {3, 2.0}},
                            {{2, 2.6}}, 2.8, error);
  std::printf("\"roundtrip\": %s\n}\n", ok ? "true" : "false");
  if (!ok)
    std::fprintf(stderr, "%s\n", error.c_str());
  return ok ? 0 : 1;
}
