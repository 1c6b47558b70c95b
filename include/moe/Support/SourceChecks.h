//===- SourceChecks.h - refuse text the MLIR parser crashes on --*- C++ -*-===//
//
// Two kinds of textual IR crash upstream MLIR's parser instead of giving an
// error, so the tools check the text first and refuse it with a located
// error:
//  - deep nesting: the parser descends recursively into every region,
//    attribute and type, so a few thousand nested brackets (`module {`
//    thousands of times, an array attribute nested as deep) overflow the
//    stack;
//  - a malformed array after `permutation =` (linalg.transpose) or
//    `dimensions =` (linalg.reduce, linalg.broadcast) in their custom
//    syntax: an integer out of range, a non-integer, `empty()`... makes
//    their parsers add a null attribute and crash (LLVM 22).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_SUPPORT_SOURCECHECKS_H
#define MOE_SUPPORT_SOURCECHECKS_H

#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/LLVM.h"
#include "llvm/Support/MemoryBufferRef.h"

#include <cstddef>
#include <optional>
#include <string>

namespace mlir::moe {

/// The deepest nesting of ( [ { < the tools accept: far beyond any program
/// (the models nest a few levels), far below where the parser's stack runs
/// out (about 5,000 levels of `module {` in a release build).
constexpr unsigned kMaxNestingDepth = 256;

/// A problem found in the text: where (an offset) and what.
struct SourceProblem {
  size_t offset;
  std::string message;
};

/// The first place in `text` the parser would crash on (strings and `//`
/// comments skipped), or nothing.
std::optional<SourceProblem>
findParserCrash(StringRef text, unsigned maxNesting = kMaxNestingDepth);

/// Emits the problem findParserCrash finds in `buffer` as an error at its
/// line and column (the buffer named by its identifier) and fails, or
/// succeeds when there is none.
LogicalResult verifyParsable(llvm::MemoryBufferRef buffer, MLIRContext *context,
                             unsigned maxNesting = kMaxNestingDepth);

} // namespace mlir::moe

#endif
