//===- SeqInfo.cpp - what a sequence file holds, as the trainer sees it ---===//
//
//   moert-seq-info FILE (protein|dna) [LENGTH]
//
// Prints the number of sequences and residues, the vocabulary size, the
// number of training and held-out rows of LENGTH tokens, the first tokens of
// the first sequence, and the held-out unigram loss (the baseline a model
// must beat). Bad input: a message naming the file and line, exit 1.
//
//===----------------------------------------------------------------------===//

#include "moert/Sequences.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char **argv) {
  if (argc < 3 ||
      (std::strcmp(argv[2], "protein") && std::strcmp(argv[2], "dna"))) {
    std::fprintf(stderr, "usage: moert-seq-info FILE (protein|dna) [LENGTH]\n");
    return 2;
  }
  moert::Alphabet alphabet = std::strcmp(argv[2], "dna")
                                 ? moert::Alphabet::Protein
                                 : moert::Alphabet::DNA;
  long length = argc > 3 ? std::strtol(argv[3], nullptr, 10) : 128;
  if (length < 2) {
    std::fprintf(stderr, "moert-seq-info: LENGTH must be at least 2\n");
    return 2;
  }
  std::vector<moert::Sequence> seqs;
  moert::SequenceError error;
  if (!moert::readSequences(argv[1], alphabet, seqs, error)) {
    std::fprintf(stderr, "error: %s\n", error.message.c_str());
    return 1;
  }
  moert::Tokenizer tok(alphabet);
  size_t residues = 0;
  for (auto &s : seqs)
    residues += s.residues.size();
  moert::Batches b = moert::makeBatches(seqs, tok, length);
  std::printf("sequences: %zu\nresidues: %zu\nvocabulary: %d\n", seqs.size(),
              residues, tok.vocabSize());
  std::printf("rows of %ld tokens: %lld train, %lld held out\n", length,
              (long long)b.trainRows(), (long long)b.heldOutRows());
  std::printf("first: %s:", seqs[0].name.c_str());
  std::vector<int32_t> ids = tok.encode(seqs[0].residues.substr(0, 8));
  for (int32_t id : ids)
    std::printf(" %d", id);
  std::printf("\nunigram held-out loss: %.4f nats\n",
              moert::unigramHeldOutLoss(b, tok.vocabSize()));
  return 0;
}
