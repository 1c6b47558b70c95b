//===- Sequences.cpp - FASTA / Stockholm readers and tokenizer ------------===//

#include "moert/Sequences.h"

#include <cctype>
#include <cmath>
#include <fstream>
#ifdef MOERT_HAVE_ZLIB
#include <zlib.h>
#endif
#include <map>
#include <sstream>

using namespace moert;

Tokenizer::Tokenizer(Alphabet a) : alphabet(a) {
  letters = a == Alphabet::Protein ? "ACDEFGHIKLMNPQRSTVWYX" : "ACGTN";
}

bool Tokenizer::accepts(char c, char *mapped) const {
  char u = char(std::toupper(static_cast<unsigned char>(c)));
  char m = 0;
  if (letters.find(u) != std::string::npos)
    m = u;
  else if (alphabet == Alphabet::Protein &&
           std::string("BZUOJ*").find(u) != std::string::npos)
    m = 'X';
  else if (alphabet == Alphabet::DNA &&
           std::string("URYSWKMBDHV").find(u) != std::string::npos)
    m = u == 'U' ? 'T' : 'N';
  if (mapped)
    *mapped = m;
  return m != 0;
}

std::vector<int32_t> Tokenizer::encode(const std::string &residues) const {
  std::vector<int32_t> ids;
  ids.reserve(residues.size() + 2);
  ids.push_back(bos);
  for (char c : residues)
    ids.push_back(int32_t(letters.find(c)) + 3);
  ids.push_back(eos);
  return ids;
}

namespace {
bool isGap(char c) { return c == '-' || c == '.' || c == '~'; }

std::string trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

/// Appends the residues of `text` (gaps dropped) to `out`; on an unknown
/// character fills `error`.
bool addResidues(const std::string &text, const Tokenizer &tok,
                 std::string &out, const std::string &where,
                 SequenceError &error) {
  for (char c : text) {
    if (isGap(c) || c == ' ' || c == '\t' || c == '\r')
      continue;
    char mapped;
    if (!tok.accepts(c, &mapped)) {
      std::string shown = std::isprint(static_cast<unsigned char>(c))
                              ? std::string(1, c)
                              : "\\x" + std::to_string(int(uint8_t(c)));
      error.message =
          where + ": '" + shown + "' is not a " +
          (tok.alphabet == Alphabet::Protein ? "protein" : "nucleotide") +
          " residue";
      return false;
    }
    out.push_back(mapped);
  }
  return true;
}
} // namespace

/// The file's bytes; `.gz` files are decompressed (when the runtime has
/// zlib).
static bool readText(const std::string &path, std::string &text,
                     moert::SequenceError &error) {
  bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (gz) {
#ifdef MOERT_HAVE_ZLIB
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) {
      error.message = path + ": cannot open the file";
      return false;
    }
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0)
      text.append(buf, size_t(n));
    int code = 0;
    const char *what = gzerror(f, &code);
    bool ok = n == 0 && code == Z_OK;
    gzclose(f);
    if (!ok) {
      error.message = path + ": not a valid gzip file (" +
                      (code == Z_OK ? "truncated" : what) + ")";
      return false;
    }
    return true;
#else
    error.message = path + ": gzip files need a runtime built with zlib";
    return false;
#endif
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error.message = path + ": cannot open the file";
    return false;
  }
  std::ostringstream all;
  all << in.rdbuf();
  text = all.str();
  return true;
}

bool moert::readSequences(const std::string &path, Alphabet alphabet,
                          std::vector<Sequence> &out, SequenceError &error) {
  std::string text;
  if (!readText(path, text, error))
    return false;
  std::istringstream in(text);
  Tokenizer tok(alphabet);
  std::vector<Sequence> seqs;
  std::string line;
  int64_t lineNo = 0;
  auto where = [&] { return path + ":" + std::to_string(lineNo); };
  // Find the first non-empty line: it decides the format.
  std::string first;
  while (std::getline(in, line)) {
    ++lineNo;
    if (!trim(line).empty()) {
      first = trim(line);
      break;
    }
  }
  if (first.empty()) {
    error.message = path + ": the file is empty (expected FASTA or Stockholm)";
    return false;
  }
  if (first.rfind("# STOCKHOLM", 0) == 0) {
    // Stockholm: one or more alignments, each "# STOCKHOLM 1.0", then
    // "name  aligned-residues" lines (possibly in several blocks) and "#..."
    // annotation lines, and "//" at its end. A name names one sequence
    // within its alignment.
    std::map<std::string, size_t> index;
    bool inAlignment = true;
    size_t alignmentStart = 0; // the alignment's first sequence
    int64_t headerLine = lineNo;
    while (std::getline(in, line)) {
      ++lineNo;
      std::string t = trim(line);
      if (!inAlignment) {
        if (t.empty())
          continue;
        if (t.rfind("# STOCKHOLM", 0) != 0) {
          error.message = where() + ": expected '# STOCKHOLM 1.0' (the next "
                                    "alignment) after '//'";
          return false;
        }
        inAlignment = true;
        index.clear();
        alignmentStart = seqs.size();
        headerLine = lineNo;
        continue;
      }
      if (t.empty() || t[0] == '#')
        continue;
      if (t == "//") {
        if (seqs.size() == alignmentStart) {
          error.message = path + ":" + std::to_string(headerLine) +
                          ": the Stockholm alignment starting here has no "
                          "sequences";
          return false;
        }
        inAlignment = false;
        continue;
      }
      std::istringstream ls(t);
      std::string name, residues, extra;
      ls >> name >> residues;
      if (residues.empty() || (ls >> extra)) {
        error.message = where() + ": expected '<name> <aligned residues>'";
        return false;
      }
      auto it = index.find(name);
      if (it == index.end()) {
        it = index.emplace(name, seqs.size()).first;
        seqs.push_back({name, ""});
      }
      if (!addResidues(residues, tok, seqs[it->second].residues, where(),
                       error))
        return false;
    }
    if (inAlignment) {
      error.message = path + ": the Stockholm alignment has no '//' end line "
                             "(truncated file?)";
      return false;
    }
  } else if (first[0] == '>') {
    seqs.push_back({trim(first.substr(1)), ""});
    while (std::getline(in, line)) {
      ++lineNo;
      std::string t = trim(line);
      if (t.empty())
        continue;
      if (t[0] == '>') {
        if (seqs.back().residues.empty()) {
          error.message = where() + ": the record '" + seqs.back().name +
                          "' before this header has no residues";
          return false;
        }
        seqs.push_back({trim(t.substr(1)), ""});
        continue;
      }
      if (!addResidues(t, tok, seqs.back().residues, where(), error))
        return false;
    }
    if (seqs.back().residues.empty()) {
      error.message =
          path + ": the last record '" + seqs.back().name + "' has no residues";
      return false;
    }
  } else {
    error.message = path + ":" + std::to_string(lineNo) +
                    ": neither FASTA ('>' header) nor Stockholm ('# STOCKHOLM "
                    "1.0') input";
    return false;
  }
  for (auto &s : seqs)
    if (s.residues.empty()) {
      error.message = path + ": sequence '" + s.name + "' has no residues";
      return false;
    }
  out = std::move(seqs);
  return true;
}

Batches moert::makeBatches(const std::vector<Sequence> &sequences,
                           const Tokenizer &tokenizer, int64_t length,
                           int64_t every, int64_t heldOutPhase) {
  // All tokens in order, cut into rows; every `every`-th row is held out
  // (rows, not sequences: one long genome is split too).
  std::vector<int32_t> all;
  for (const Sequence &s : sequences) {
    std::vector<int32_t> ids = tokenizer.encode(s.residues);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  if (all.size() % length)
    all.resize((all.size() / length + 1) * length, Tokenizer::pad);
  Batches b;
  b.length = length;
  for (int64_t row = 0; row < int64_t(all.size()) / length; ++row) {
    auto &dst = every > 0 && row % every == heldOutPhase ? b.heldOut : b.train;
    dst.insert(dst.end(), all.begin() + row * length,
               all.begin() + (row + 1) * length);
  }
  return b;
}

double moert::unigramHeldOutLoss(const Batches &batches, int32_t vocabSize) {
  std::vector<double> counts(vocabSize, 1.0); // add-one smoothing
  double total = vocabSize - 1;               // <pad> gets no mass
  counts[Tokenizer::pad] = 0;
  for (int32_t t : batches.train)
    if (t != Tokenizer::pad) {
      counts[t] += 1;
      total += 1;
    }
  double loss = 0;
  int64_t n = 0;
  for (int32_t t : batches.heldOut)
    if (t != Tokenizer::pad) {
      loss -= std::log(counts[t] / total);
      ++n;
    }
  return n ? loss / double(n) : 0.0;
}
