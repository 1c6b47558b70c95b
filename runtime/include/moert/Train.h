//===- Train.h - optimizer, schedule, checkpoints, metrics ------*- C++ -*-===//
//
// The parts of a training loop that do not depend on the model: the
// per-step scalars of the compiled AdamW update (-moe-adamw), the warmup +
// cosine learning-rate schedule, safetensors checkpoints (written
// atomically, read with every field checked) and the loss-curve PNG.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_TRAIN_H
#define MOERT_TRAIN_H

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace moert {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weightDecay = 0.1;
};

/// The scalars of one optimizer step of a compiled train step (the
/// `tensor<8xf32>` argument with role `adamw`, see -moe-adamw), computed in
/// double: lr / (1 - b1^t), sqrt(1 - b2^t), 1 - lr * wd, b1, b2, eps, the
/// clipping norm `clip` (0: none), lr. `t` is the 1-based step count. The
/// update is torch.optim.AdamW's after clip_grad_norm_.
std::vector<float> adamwScalars(int64_t t, double lr, double clip,
                                const AdamWOptions &options);

/// Linear warmup over `warmup` steps to `peak`, then a cosine decay to
/// `peak * minRatio` at `total` steps (constant after). `step` is 0-based.
double learningRate(int64_t step, int64_t warmup, int64_t total, double peak,
                    double minRatio);

/// A named f32 tensor of a checkpoint.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

/// Writes a safetensors file (F32 tensors, string metadata) atomically: a
/// temporary file in the same directory, flushed to disk, then renamed over
/// `path`. On failure `path` is untouched and `error` says why.
bool writeSafetensors(const std::string &path,
                      const std::vector<NamedTensor> &tensors,
                      const std::map<std::string, std::string> &metadata,
                      std::string &error);

/// A tensor of a checkpoint written without holding it: `fill` writes its
/// values (as many as its shape has) to the buffer it is given.
struct TensorSource {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(float *)> fill;
};

/// writeSafetensors from sources, one tensor in host memory at a time; with
/// `crcKey`, the metadata also records under it the CRC-32 of the data
/// section (its tensors' bytes in file order; what readCheckpoint checks).
bool writeSafetensors(const std::string &path,
                      const std::vector<TensorSource> &tensors,
                      std::map<std::string, std::string> metadata,
                      const std::string &crcKey, std::string &error);

/// The bytes of the file at `path`; empty if it cannot be read.
std::string readWholeFile(const std::string &path);

/// Writes `bytes` to `path` atomically, as writeSafetensors does.
bool writeFileAtomically(const std::string &path, const std::string &bytes,
                         std::string &error);

/// The temporary file an atomic write of `path` goes through (same directory,
/// `<path>.tmp.<pid>`), renamed over `path` once complete.
std::string temporaryPathFor(const std::string &path);

/// Removes the temporaries of atomic writes of `path` whose writer no longer
/// runs (killed between write and rename); a live writer's are left alone.
void removeAbandonedTemporaries(const std::string &path);

/// Reads a safetensors file of F32 tensors. Every structural problem (short
/// file, bad header, offsets outside the data or overlapping, a size that
/// does not match the shape, another dtype) is an error naming the file.
bool readSafetensors(const std::string &path, std::vector<NamedTensor> &tensors,
                     std::map<std::string, std::string> &metadata,
                     std::string &error);

/// A run's checkpoint in its directory `out` (see Checkpoint.cpp): the path
/// of checkpoint.safetensors (one rank) or checkpoint.index.json (one file
/// per rank), whichever holds the later step; empty when there is none.
std::string findCheckpoint(const std::string &out);

/// The file rank `rank` of `ranks` writes for the checkpoint at `step`:
/// out/checkpoint-<step>-<rank + 1>-of-<ranks>.safetensors.
std::string checkpointShardPath(const std::string &out, int64_t step, int rank,
                                int ranks);

/// Once every rank has written its checkpointShardPath file of `step`:
/// replaces out/checkpoint.index.json (atomically) by one naming them, and
/// removes the files no index names any more (with `keep` > 1 the last
/// `keep` indices stay, as checkpoint-<step>.index.json) and a one-rank
/// checkpoint.safetensors.
bool writeCheckpointIndex(const std::string &out, int64_t step, int ranks,
                          int64_t keep, std::string &error);

/// Removes the temporaries of checkpoint files (one file, a rank's file, an
/// index) whose writer no longer runs (removeAbandonedTemporaries).
void removeAbandonedCheckpointTemporaries(const std::string &out);

/// After a one-rank checkpoint.safetensors is written: the index of an
/// earlier run on several ranks, and its files no kept index names, go.
void retireShardedCheckpoint(const std::string &out);

/// The rows [first, last) of a checkpoint tensor's first dimension to
/// read; last -1: all of them.
using RowsOf =
    std::function<std::pair<int64_t, int64_t>(const std::string &name)>;

/// Reads the checkpoint at `path` (findCheckpoint): one file, or the files
/// of an index merged (a tensor in several files is split along its first
/// dimension, in file order), each checked against its CRC-32 when
/// `verifyChecksum`; the data are read in pieces. Errors name the file.
/// With `rowsOf` (an expert-parallel rank's rows), each tensor keeps the
/// whole shape but only those rows' values, and files holding none of the
/// rows are neither read nor checked.
bool readCheckpoint(const std::string &path, bool verifyChecksum,
                    std::vector<NamedTensor> &tensors,
                    std::map<std::string, std::string> &metadata,
                    std::string &error, const RowsOf &rowsOf = nullptr);

/// A tensor of a safetensors header: its dtype ("F32", "BF16", ...), shape
/// and byte range in the data section.
struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

/// Parses a safetensors header (the `length` bytes of JSON after the length
/// field) of a file with `dataSize` bytes after the header, checking every
/// entry: a known dtype, a shape whose size matches its byte range, ranges
/// inside the data and not overlapping. Errors do not name the file.
bool parseSafetensorsHeader(const char *header, uint64_t length,
                            uint64_t dataSize,
                            std::vector<SafetensorsEntry> &entries,
                            std::map<std::string, std::string> &metadata,
                            std::string &error);

/// Bytes per element of a safetensors dtype; 0 for an unknown one.
int64_t safetensorsDtypeBytes(const std::string &dtype);

/// A loss curve: train losses by step, held-out losses by step and a
/// horizontal reference line (e.g. the unigram baseline; NaN for none),
/// drawn to a PNG (axes with tick labels, legend). Returns false with `error`
/// set if the file cannot be written.
bool writeLossPlot(const std::string &path,
                   const std::vector<std::pair<int64_t, double>> &train,
                   const std::vector<std::pair<int64_t, double>> &heldOut,
                   double reference, std::string &error);

} // namespace moert

#endif
