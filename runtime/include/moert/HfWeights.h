//===- HfWeights.h - weights of a transformers model directory --*- C++ -*-===//
//
// Reads the weights of a Hugging Face transformers model directory (what
// `save_pretrained` writes and the Hub serves): `model.safetensors`, or the
// shards named by `model.safetensors.index.json`; F32, BF16, F16 or F64
// tensors, converted to f32. Experts are read in either layout transformers
// uses: one tensor per expert and projection (`mlp.experts.<e>.gate_proj
// .weight`, `up_proj`, `down_proj`: the Hub's and save_pretrained's) or
// fused (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`).
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_HFWEIGHTS_H
#define MOERT_HFWEIGHTS_H

#include <cstdint>
#include <string>
#include <vector>

namespace moert {

/// A parameter of a model: its transformers name, its shape in our layout,
/// and whether transformers stores it with the last two dims swapped.
struct ModelParam {
  std::string name;
  std::vector<int64_t> shape;
  bool hfTransposed = false;
  /// The rows of the first dimension read (an expert-parallel rank's
  /// experts of a [experts, ...] tensor): [rowBegin, rowEnd), rowEnd -1 for
  /// all. The value read then holds only those rows.
  int64_t rowBegin = 0, rowEnd = -1;
};

/// Reads `params` from the transformers model directory `dir` into
/// `values` (one f32 vector per parameter, in our layout). With `values`
/// null, checks everything but the data (files, headers, names, dtypes,
/// shapes). Tensors of the directory that no parameter uses are listed in
/// `unused`. Errors name the file and the tensor: a missing one, another
/// shape, a dtype that is not a float, NaN or infinite values, a corrupt
/// or truncated file.
bool readHfWeights(const std::string &dir,
                   const std::vector<ModelParam> &params,
                   std::vector<std::vector<float>> *values,
                   std::vector<std::string> &unused, std::string &error);

} // namespace moert

#endif
