//===- Artifact.h - calling moe-compile'd functions from C++ ----*- C++ -*-===//
//
// What the runtime and its tools need to call an artifact's entry points
// (`_mlir_ciface_<name>`, `_mlir_packed_<name>`): the manifest's functions
// and tensors, ranked memref descriptors of contiguous buffers, the call with
// a results buffer and descriptor pointers, where each result sits in the
// results buffer, and bf16 conversions for filling and reading tensors.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_ARTIFACT_H
#define MOERT_ARTIFACT_H

#include "moert/Error.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace moert::artifact {

/// One `arg` or `result` line of a manifest:
///   arg|result DTYPE RANK DIMS... [range LO HI] [shard E L] [gradient_of I]
///              [output NAME]
///              [param NAME init normal|ones [hf_transposed]] [input ROLE]
///              [state exp_avg|exp_avg_sq I] [updated]
struct Tensor {
  std::string dtype;
  std::string param;         ///< `param NAME`: a model parameter's name
  std::string init;          ///< its initialization (normal or ones)
  bool hfTransposed = false; ///< last two dims swapped vs Hugging Face
  std::string input;         ///< `input ROLE`: a data input (ids, labels)
  std::vector<int64_t> shape;
  int64_t lo = 0, hi = 0; ///< `range LO HI`: integers drawn from [lo, hi)
  bool hasRange = false;
  int64_t experts = 0, local = 0; ///< `shard E L`
  int64_t gradientOf = -1;        ///< `gradient_of I` (results)
  std::string output;             ///< `output NAME` (results: moe.output)
  std::string state;              ///< `state KIND I`: optimizer state ...
  int64_t stateOf = -1;           ///< ... of argument I
  bool updated = false;           ///< `updated`: written in place by the call

  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  size_t elementBytes() const {
    if (dtype == "f64" || dtype == "i64" || dtype == "index")
      return 8;
    if (dtype == "f32" || dtype == "i32")
      return 4;
    if (dtype == "bf16" || dtype == "f16" || dtype == "i16")
      return 2;
    return 1; // i8, i1 and the 8-bit floats
  }
  size_t bytes() const { return size_t(elements()) * elementBytes(); }
  /// Compared within a tolerance (8-bit floats are compared bit for bit).
  bool isFloat() const {
    return dtype == "f32" || dtype == "f64" || dtype == "bf16" ||
           dtype == "f16";
  }
  std::string str() const {
    std::string s;
    for (int64_t d : shape)
      s += std::to_string(d) + "x";
    return s + dtype;
  }
};

/// One `function NAME` of a manifest with its arguments, results and
/// `tolerance ATOL RTOL [NORM]` line (atol and rtol stay -1 without one).
struct Function {
  std::string name;
  std::vector<Tensor> args, results;
  double atol = -1, rtol = -1, norm = 0;
  std::map<std::string, std::string> meta; ///< `meta KEY VALUE...` lines
};

inline std::vector<Function> parseManifest(const char *text) {
  std::vector<Function> fns;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "function") {
      fns.emplace_back();
      ls >> fns.back().name;
    } else if ((kind == "arg" || kind == "result") && !fns.empty()) {
      Tensor t;
      int rank = 0;
      ls >> t.dtype >> rank;
      t.shape.resize(size_t(rank < 0 ? 0 : rank));
      for (auto &d : t.shape)
        ls >> d;
      std::string word;
      while (ls >> word) {
        if (word == "range") {
          ls >> t.lo >> t.hi;
          t.hasRange = true;
        } else if (word == "shard") {
          ls >> t.experts >> t.local;
        } else if (word == "gradient_of") {
          ls >> t.gradientOf;
        } else if (word == "output") {
          ls >> t.output;
        } else if (word == "param") {
          ls >> t.param;
        } else if (word == "init") {
          ls >> t.init;
        } else if (word == "hf_transposed") {
          t.hfTransposed = true;
        } else if (word == "input") {
          ls >> t.input;
        } else if (word == "state") {
          ls >> t.state >> t.stateOf;
        } else if (word == "updated") {
          t.updated = true;
        }
      }
      (kind == "arg" ? fns.back().args : fns.back().results).push_back(t);
    } else if (kind == "meta" && !fns.empty()) {
      std::string key, value;
      ls >> key;
      std::getline(ls >> std::ws, value);
      fns.back().meta[key] = value;
    } else if (kind == "tolerance" && !fns.empty()) {
      Function &f = fns.back();
      ls >> f.atol >> f.rtol;
      if (!(ls >> f.norm))
        f.norm = 0;
    }
  }
  return fns;
}

/// The manifest's `target` line: cpu, or a GPU chip.
inline std::string targetOf(const char *text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind, target;
    ls >> kind >> target;
    if (kind == "target")
      return target;
  }
  return "cpu";
}

/// A ranked memref descriptor (allocated, aligned, offset, sizes, strides) of
/// a contiguous row-major buffer.
inline std::vector<int64_t> descriptor(void *data,
                                       const std::vector<int64_t> &shape) {
  std::vector<int64_t> d = {int64_t(reinterpret_cast<intptr_t>(data)),
                            int64_t(reinterpret_cast<intptr_t>(data)), 0};
  d.insert(d.end(), shape.begin(), shape.end());
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    strides[size_t(i)] = stride;
    stride *= shape[size_t(i)];
  }
  d.insert(d.end(), strides.begin(), strides.end());
  return d;
}

inline std::vector<int64_t> descriptor(void *data, const Tensor &t) {
  return descriptor(data, t.shape);
}

/// The byte offset of result `i` in the results buffer: descriptors of the
/// given ranks, one after the other (8-byte fields).
inline size_t resultOffset(const std::vector<size_t> &resultRanks, size_t i) {
  size_t off = 0;
  for (size_t k = 0; k < i; ++k)
    off += (3 + 2 * resultRanks[k]) * 8;
  return off;
}

/// The byte offset of `f`'s result `i` in its results buffer.
inline size_t resultOffset(const Function &f, size_t i) {
  std::vector<size_t> ranks;
  for (const Tensor &r : f.results)
    ranks.push_back(r.shape.size());
  return resultOffset(ranks, i);
}

/// The symbol of `name`'s packed entry point (one array of pointers, any
/// number of arguments).
inline std::string packedSymbol(const std::string &name) {
  return "_mlir_packed_" + name;
}

/// Calls a packed entry point `_mlir_packed_<name>(void **)`: the results
/// buffer (if the function has results) then each argument's descriptor.
/// An error of the runtime calls the program made (the sticky error of
/// moert/Error.h) is thrown as moert::Error, and cleared.
inline void call(void *packed, void *results,
                 std::vector<std::vector<int64_t>> &args) {
  std::vector<void *> p;
  if (results)
    p.push_back(results);
  for (auto &a : args)
    p.push_back(a.data());
  reinterpret_cast<void (*)(void **)>(packed)(p.data());
  throwStickyError();
}

inline float bf16ToFloat(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// f32 -> bf16, rounding to nearest even.
inline uint16_t floatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return uint16_t(bits >> 16);
}

} // namespace moert::artifact

#endif
