//===- TrainTest.cpp - the training loop's parts, printed for checking ----===//
//
//   moert-train-test OUT_DIR
//
// Prints (JSON) what test/Runtime/train-parts.py compares with formulas:
// the compiled AdamW update's per-step scalars, the learning-rate schedule;
// writes a safetensors file and a
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
  moert::AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  printArray("adamw_scalars_t1", moert::adamwScalars(1, 1e-2, 1.0, o));
  printArray("adamw_scalars_t5", moert::adamwScalars(5, 3e-4, 0.0, o));
  std::vector<float> lrs;
  for (int s = 0; s < 12; ++s)
    lrs.push_back(float(moert::learningRate(s, 3, 10, 1.0, 0.1)));
  printArray("lr", lrs);
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
