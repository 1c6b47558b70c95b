//===- Trainer.h - the training loop over a compiled train step -*- C++ -*-===//
//
// Trains the model of an artifact holding `loss_step` (and `loss`) as built
// by moe-train (parameters, optimizer state and data inputs named in the
// manifest): sequences from FASTA/Stockholm files, packed rows with every
// 10th held out; the compiled step clips and applies AdamW on the state,
// which stays where the step runs (GPU memory for GPU artifacts) and is
// copied to the host only for checkpoints; warmup + cosine schedule, held-out
// loss against the unigram baseline, JSONL metrics, a loss plot and an
// atomically replaced safetensors checkpoint that --resume continues bit
// for bit. Used by moe-train (after compiling) and by moert-train (with an
// artifact compiled elsewhere, on a machine without MLIR).
//
// A step compiled for D data-parallel copies of N expert-parallel ranks
// (manifest meta `ranks D N`; D = 1 when absent) trains on D * N ranks (a
// launcher such as mpirun): each rank takes its rows of a step's D * N *
// batch (the same rows, in the same order, as one rank with D * N times the
// batch) and its experts' rows of the state (those of its place in its
// group of N, rank mod N: it draws, or reads from --init-from and a
// checkpoint, those rows only). The first group writes one checkpoint
// file per rank (Train.h: writeCheckpointIndex; one file when N = 1); the
// first rank writes the metrics, the plot and the messages. --out must be a
// directory every rank sees.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_TRAINER_H
#define MOERT_TRAINER_H

#include <cstdint>
#include <string>
#include <vector>

namespace moert {

struct TrainOptions {
  std::vector<std::string> data;
  std::string alphabet = "protein";
  std::string out = "moe-train-out";
  bool resume = false;
  /// A transformers model directory whose weights start the run (instead
  /// of the seeded initialization).
  std::string initFrom;
  bool verifyChecksum = true; ///< --resume checks the data against its CRC-32
  int64_t steps = 300, warmup = 30, evalEvery = 50, evalBatches = 8;
  int64_t checkpointEvery = 100, stopAfterSteps = 0;
  /// Checkpoints kept as checkpoint-<step>.safetensors (1: only the
  /// latest, checkpoint.safetensors).
  int64_t keepCheckpoints = 1;
  double lr = 3e-3, minLRRatio = 0.1, weightDecay = 0.1, beta1 = 0.9,
         beta2 = 0.95, clip = 1.0;
  uint64_t seed = 0;
  std::string progress = "auto";
};

/// The options' help text, one per line.
std::string trainOptionsHelp();

/// Parses `--name value`, `--name=value` and flags into `options`. Options
/// not known here are returned in `rest` (for the calling tool), those
/// known (with their values) in `consumed` if given; errors name the option.
bool parseTrainOptions(const std::vector<std::string> &args,
                       TrainOptions &options, std::vector<std::string> &rest,
                       std::string &error,
                       std::vector<std::string> *consumed = nullptr);

/// Whether `options`' data make a run of rows of `seq` tokens for a model of
/// `vocab` tokens (what train() checks before training): false with a
/// message naming the file or the shortfall otherwise. Tools call it
/// before compiling, so bad data fail in seconds.
bool checkTrainData(const TrainOptions &options, int64_t seq, int64_t vocab,
                    std::string &error);

/// Trains with the artifact at `artifact`; messages start with `tool`.
/// Returns the process exit code (0 on success, else that of the error,
/// reported on stderr); never exits. While it trains, SIGINT and SIGTERM
/// stop the run after the step under way, with a checkpoint: it returns
/// 130 or 143 (128 + the signal). Their previous handlers are restored.
int train(const TrainOptions &options, const std::string &artifact,
          const char *tool);

} // namespace moert

#endif
