//===- moert-train.cpp - train with a precompiled train step --------------===//
//
//   moert-train train_step.so --data FILE [training options]
//
// The training loop of moe-train over an artifact that `moe-train
// --compile-only` (or moe-compile of a moe-model --train-step graph) made,
// for machines with the runtime and a GPU but no MLIR. A train step compiled
// for N ranks (moe-train --ep-size E --dp-size D, N = D * E) trains under a
// launcher of N ranks:
//
//   mpirun -np N moert-train train_step.so --data FILE [training options]
//
//===----------------------------------------------------------------------===//

#include "moert/Comm.h"
#include "moert/Trainer.h"

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  std::vector<std::string> args(argv + 1, argv + argc), rest;
  for (const std::string &a : args)
    if (a == "--help" || a == "-h") {
      std::printf(
          "moert-train: trains the model of a compiled train step\n\n"
          "usage: moert-train TRAIN_STEP.so --data FILE [options]\n"
          "       mpirun -np N moert-train TRAIN_STEP.so --data FILE "
          "[options]\n"
          "         (a step compiled with moe-train --ep-size E --dp-size "
          "D: N = D * E\n"
          "         ranks, one GPU each\n"
          "         or N CPU processes; --out a directory every rank "
          "sees)\n\n%s",
          moert::trainOptionsHelp().c_str());
      return 0;
    }
  moert::TrainOptions options;
  std::string error;
  if (!moert::parseTrainOptions(args, options, rest, error)) {
    std::fprintf(stderr, "moert-train: %s\n", error.c_str());
    return 1;
  }
  for (const std::string &a : rest)
    if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr,
                   "moert-train: unknown option '%s' (see --help; the model's "
                   "options, such as --batch and --seq, are the artifact's)\n",
                   a.c_str());
      return 1;
    }
  if (rest.size() != 1) {
    std::fprintf(stderr, "moert-train: expects one train step artifact (.so) "
                         "and training options (see --help)\n");
    return 1;
  }
  int status = moert::train(options, rest[0], "moert-train");
  // A rank that stops on an error stops the others (MPI_Abort under MPI),
  // which would otherwise wait for it at their next collective. Ranks that
  // stopped on a signal stopped together, after a checkpoint.
  if (status != 0 && status != 130 && status != 143)
    moert::comm::abortJob(status);
  return status;
}
