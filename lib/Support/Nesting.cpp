//===- Nesting.cpp - bound the bracket nesting of textual IR --------------===//

#include "moe/Support/Nesting.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"

using namespace mlir;

std::optional<size_t> mlir::moe::findExcessiveNesting(StringRef text,
                                                      unsigned limit) {
  unsigned depth = 0;
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
    switch (c) {
    case '(':
    case '[':
    case '{':
    case '<':
      if (++depth > limit)
        return i;
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

LogicalResult mlir::moe::verifyNestingDepth(llvm::MemoryBufferRef buffer,
                                            MLIRContext *context,
                                            unsigned limit) {
  StringRef text = buffer.getBuffer();
  std::optional<size_t> at = findExcessiveNesting(text, limit);
  if (!at)
    return success();
  StringRef before = text.take_front(*at);
  unsigned line = before.count('\n') + 1;
  size_t lineStart = before.rfind('\n');
  unsigned column =
      *at - (lineStart == StringRef::npos ? 0 : lineStart + 1) + 1;
  return emitError(FileLineColLoc::get(context, buffer.getBufferIdentifier(),
                                       line, column))
         << "brackets nested deeper than " << limit
         << " levels: refused before parsing (the parser would run out of "
            "stack)";
}
