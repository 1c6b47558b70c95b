//===- ArtifactCall.h - calling moe-compile'd functions from C++ -*- C++ -*-===//
//
// What the runtime's tools share to call an artifact's `_mlir_ciface_<name>`
// entry points: ranked memref descriptors of contiguous buffers, the call with
// a results buffer and descriptor pointers, where each result sits in the
// results buffer, and bf16 conversions for filling and reading tensors.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_TOOLS_ARTIFACTCALL_H
#define MOERT_TOOLS_ARTIFACTCALL_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace moert::artifact {

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

/// The byte offset of result `i` in the results buffer: descriptors of the
/// given ranks, one after the other (8-byte fields).
inline size_t resultOffset(const std::vector<size_t> &resultRanks, size_t i) {
  size_t off = 0;
  for (size_t k = 0; k < i; ++k)
    off += (3 + 2 * resultRanks[k]) * 8;
  return off;
}

/// The most pointers call() passes (results buffer included).
constexpr size_t kMaxCallPointers = 12;

/// Calls `_mlir_ciface_<name>(results*, descriptor*...)`; false if there are
/// more than kMaxCallPointers pointers (nothing is called then).
inline bool call(void *fn, void *results,
                 std::vector<std::vector<int64_t>> &args) {
  using Entry = void (*)(...);
  std::vector<void *> p;
  if (results)
    p.push_back(results);
  for (auto &a : args)
    p.push_back(a.data());
  auto f = reinterpret_cast<Entry>(fn);
  switch (p.size()) {
  case 1: f(p[0]); break;
  case 2: f(p[0], p[1]); break;
  case 3: f(p[0], p[1], p[2]); break;
  case 4: f(p[0], p[1], p[2], p[3]); break;
  case 5: f(p[0], p[1], p[2], p[3], p[4]); break;
  case 6: f(p[0], p[1], p[2], p[3], p[4], p[5]); break;
  case 7: f(p[0], p[1], p[2], p[3], p[4], p[5], p[6]); break;
  case 8: f(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]); break;
  case 9: f(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]); break;
  case 10: f(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]); break;
  case 11:
    f(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10]);
    break;
  case 12:
    f(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]);
    break;
  default:
    return false;
  }
  return true;
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
