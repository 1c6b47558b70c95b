//===- ReaderFuzzer.cpp - the readers of config, checkpoint and data files ===//
//
// libFuzzer target over the file readers users feed: an input is one byte
// choosing the reader (its value modulo 4), then the file's bytes.
//   0  config.json: ModelConfig::parse, then (when it parses and is small)
//      the model built from it must verify
//   1  safetensors: moert::readSafetensors (a checkpoint), then
//      moert::readHfWeights (the file as a transformers model directory's
//      model.safetensors, read for a few parameters of both expert layouts)
//   2  protein FASTA or Stockholm: moert::readSequences, then makeBatches
//   3  DNA, the same
// Errors are expected; a crash, a sanitizer report, or a built model that
// does not verify is a finding.
//
//===----------------------------------------------------------------------===//

#include "moe/Models/LanguageModel.h"
#include "moert/HfWeights.h"
#include "moert/Sequences.h"
#include "moert/Train.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace {

/// The readers take paths: the input is written to this process's file.
std::string writeInput(const uint8_t *data, size_t size) {
  static const std::string path =
      "/tmp/moe-reader-fuzzer." + std::to_string(getpid());
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
  return path;
}

void config(const uint8_t *data, size_t size) {
  llvm::StringRef json(reinterpret_cast<const char *>(data), size);
  llvm::Expected<mlir::moe::ModelConfig> parsed =
      mlir::moe::ModelConfig::parse(json, "config.json");
  if (!parsed) {
    llvm::consumeError(parsed.takeError());
    return;
  }
  // Building is linear in the layers and independent of the sizes; a few
  // layers cover every kind.
  if (parsed->numHiddenLayers > 4)
    return;
  mlir::MLIRContext context(mlir::MLIRContext::Threading::DISABLED);
  mlir::ScopedDiagnosticHandler quiet(
      &context, [](mlir::Diagnostic &) { return mlir::success(); });
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::moe::buildLanguageModel(&context, *parsed, /*batch=*/1,
                                    /*seq=*/8);
  if (!module || failed(mlir::verify(*module))) {
    llvm::errs() << "moe-reader-fuzzer: a config that parses built a model "
                    "that does not verify\n";
    std::abort();
  }
}

void checkpoint(const uint8_t *data, size_t size) {
  std::vector<moert::NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string error;
  std::string input = writeInput(data, size);
  (void)moert::readSafetensors(input, tensors, metadata, error);
  // The same file, moved into a model directory.
  static const std::string dir =
      "/tmp/moe-reader-fuzzer." + std::to_string(getpid()) + ".d";
  ::mkdir(dir.c_str(), 0755);
  std::string file = dir + "/model.safetensors";
  if (std::rename(input.c_str(), file.c_str()) != 0) {
    std::perror(file.c_str());
    std::abort();
  }
  static const std::vector<moert::ModelParam> params = {
      {"w", {3, 2}, true},
      {"norm", {4}, false},
      {"l.mlp.experts.gate_up_proj", {2, 4, 6}, true},
      {"l.mlp.experts.down_proj", {2, 3, 4}, true}};
  std::vector<std::vector<float>> values;
  std::vector<std::string> unused;
  (void)moert::readHfWeights(dir, params, &values, unused, error);
}

void sequences(const uint8_t *data, size_t size, moert::Alphabet alphabet) {
  std::vector<moert::Sequence> read;
  moert::SequenceError error;
  if (!moert::readSequences(writeInput(data, size), alphabet, read, error))
    return;
  moert::Tokenizer tokenizer(alphabet);
  moert::Batches batches = moert::makeBatches(read, tokenizer, /*length=*/16);
  (void)moert::unigramHeldOutLoss(batches, tokenizer.vocabSize());
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  switch (data[0] % 4) {
  case 0:
    config(data + 1, size - 1);
    break;
  case 1:
    checkpoint(data + 1, size - 1);
    break;
  case 2:
    sequences(data + 1, size - 1, moert::Alphabet::Protein);
    break;
  default:
    sequences(data + 1, size - 1, moert::Alphabet::DNA);
    break;
  }
  return 0;
}
