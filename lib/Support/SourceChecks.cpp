//===- SourceChecks.cpp - refuse text the MLIR parser crashes on ----------===//

#include "moe/Support/SourceChecks.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using moe::SourceProblem;

namespace {

bool isIdentifierChar(char c) {
  return llvm::isAlnum(c) || c == '_' || c == '.' || c == '$';
}

/// Whether `text` at `i` starts a dense i64 array the linalg parsers take:
/// [ ], or [ integers separated by commas ], every one within int64.
bool isIntegerArray(StringRef text, size_t i) {
  auto skipSpace = [&] {
    while (i < text.size() && llvm::isSpace(text[i]))
      ++i;
  };
  if (i >= text.size() || text[i] != '[')
    return false;
  ++i;
  skipSpace();
  if (i < text.size() && text[i] == ']')
    return true;
  while (true) {
    size_t start = i;
    if (i < text.size() && text[i] == '-')
      ++i;
    size_t digits = i;
    while (i < text.size() && llvm::isDigit(text[i]))
      ++i;
    int64_t value;
    if (i == digits || text.slice(start, i).getAsInteger(10, value))
      return false;
    skipSpace();
    if (i < text.size() && text[i] == ']')
      return true;
    if (i >= text.size() || text[i] != ',')
      return false;
    ++i;
    skipSpace();
  }
}

} // namespace

std::optional<SourceProblem> mlir::moe::findParserCrash(StringRef text,
                                                        unsigned maxNesting) {
  unsigned depth = 0;
  // After linalg.transpose, linalg.reduce or linalg.broadcast: the keyword
  // its array follows.
  StringRef pending;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    char c = text[i];
    if (c == '"') { // a string: up to the closing quote, \x escapes skipped
      for (++i; i < n && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
      continue;
    }
    if (c == '/' && i + 1 < n && text[i + 1] == '/') { // a comment
      i = text.find('\n', i);
      if (i == StringRef::npos)
        break;
      continue;
    }
    if (isIdentifierChar(c) && (i == 0 || !isIdentifierChar(text[i - 1]))) {
      size_t end = i;
      while (end < n && isIdentifierChar(text[end]))
        ++end;
      StringRef word = text.slice(i, end);
      if (word == "linalg.transpose") {
        pending = "permutation";
      } else if (word == "linalg.reduce" || word == "linalg.broadcast") {
        pending = "dimensions";
      } else if (!pending.empty() && word == pending) {
        pending = StringRef();
        size_t at = end;
        while (at < n && llvm::isSpace(text[at]))
          ++at;
        if (at < n && text[at] == '=') {
          ++at;
          while (at < n && llvm::isSpace(text[at]))
            ++at;
          if (!isIntegerArray(text, at))
            return SourceProblem{
                at,
                ("expected a list of 64-bit integers in [ ] after '" + word +
                 " =': refused before parsing (the linalg "
                 "parser would crash)")
                    .str()};
        }
      }
      i = end - 1;
      continue;
    }
    switch (c) {
    case '(':
    case '[':
    case '{':
    case '<':
      if (++depth > maxNesting)
        return SourceProblem{
            i, "brackets nested deeper than " + std::to_string(maxNesting) +
                   " levels: refused before parsing (the parser would run "
                   "out of stack)"};
      break;
    case '>':
      // `->` (function types, affine maps) and `>=` (integer sets).
      if ((i > 0 && text[i - 1] == '-') || (i + 1 < n && text[i + 1] == '='))
        break;
      [[fallthrough]];
    case ')':
    case ']':
    case '}':
      if (depth > 0)
        --depth;
      break;
    default:
      break;
    }
  }
  return std::nullopt;
}

LogicalResult mlir::moe::verifyParsable(llvm::MemoryBufferRef buffer,
                                        MLIRContext *context,
                                        unsigned maxNesting) {
  StringRef text = buffer.getBuffer();
  std::optional<SourceProblem> problem = findParserCrash(text, maxNesting);
  if (!problem)
    return success();
  StringRef before = text.take_front(problem->offset);
  unsigned line = before.count('\n') + 1;
  size_t lineStart = before.rfind('\n');
  unsigned column =
      problem->offset - (lineStart == StringRef::npos ? 0 : lineStart + 1) + 1;
  return emitError(FileLineColLoc::get(context, buffer.getBufferIdentifier(),
                                       line, column))
         << problem->message;
}
