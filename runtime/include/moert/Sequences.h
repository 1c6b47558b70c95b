//===- Sequences.h - biological sequences for training ----------*- C++ -*-===//
//
// Reads protein or DNA sequences from FASTA and Stockholm files, checks them
// (empty files, malformed records, unknown residues are errors naming the
// file and line), and turns them into token ids for a language model:
//
//   vocabulary  <pad>=0 <bos>=1 <eos>=2, then the alphabet's letters:
//               protein: ACDEFGHIKLMNPQRSTVWY + X (unknown/rare: BZUOJ*)
//               dna:     ACGT + N (IUPAC ambiguity codes RYSWKMBDHV)
//
// Alignment gaps (- . ~) are removed; lower case is accepted.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_SEQUENCES_H
#define MOERT_SEQUENCES_H

#include <cstdint>
#include <string>
#include <vector>

namespace moert {

enum class Alphabet { Protein, DNA };

struct Sequence {
  std::string name;
  std::string residues; ///< upper case, gaps removed
};

/// A problem with an input file, with where it is.
struct SequenceError {
  std::string message; ///< "file:line: what is wrong"
};

/// Reads a FASTA (">name" headers) or Stockholm ("# STOCKHOLM 1.0") file;
/// the format is recognized from the content. Returns false and fills
/// `error` on any problem; nothing is returned partially.
bool readSequences(const std::string &path, Alphabet alphabet,
                   std::vector<Sequence> &out, SequenceError &error);

/// The alphabet's token table.
struct Tokenizer {
  explicit Tokenizer(Alphabet alphabet);
  static constexpr int32_t pad = 0, bos = 1, eos = 2;
  int32_t vocabSize() const { return int32_t(letters.size()) + 3; }
  /// Token ids of one sequence: <bos> residues <eos>.
  std::vector<int32_t> encode(const std::string &residues) const;
  /// Whether `c` (any case) is a residue of the alphabet; `mapped` is the
  /// letter it stands for (e.g. B -> X for proteins).
  bool accepts(char c, char *mapped = nullptr) const;
  std::string letters;
  Alphabet alphabet;
};

/// Fixed-length training windows: every sequence's tokens, concatenated and
/// cut into rows of `length` tokens (the last row padded with <pad>). Rows
/// whose index % every == heldOutPhase go to the held-out set.
struct Batches {
  int64_t length = 0;
  std::vector<int32_t> train, heldOut; ///< row-major [rows, length]
  int64_t trainRows() const { return int64_t(train.size()) / length; }
  int64_t heldOutRows() const { return int64_t(heldOut.size()) / length; }
};
Batches makeBatches(const std::vector<Sequence> &sequences,
                    const Tokenizer &tokenizer, int64_t length,
                    int64_t every = 10, int64_t heldOutPhase = 0);

/// Entropy (nats per token) of the unigram distribution of the training
/// tokens (padding excluded): the loss a model must beat to have learned
/// anything beyond residue frequencies, measured on the held-out tokens
/// (cross-entropy of held-out tokens under the training unigram, with
/// add-one smoothing).
double unigramHeldOutLoss(const Batches &batches, int32_t vocabSize);

} // namespace moert

#endif
