//===- Nesting.h - bound the bracket nesting of textual IR ------*- C++ -*-===//
//
// MLIR's parser descends recursively into every region, attribute and type,
// so a few thousand nested brackets (`module {` thousands of times, an
// array attribute nested as deep) overflow the stack. The tools check the
// text first and refuse such input with a located error.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_SUPPORT_NESTING_H
#define MOE_SUPPORT_NESTING_H

#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/LLVM.h"
#include "llvm/Support/MemoryBufferRef.h"

#include <cstddef>
#include <optional>

namespace mlir::moe {

/// The deepest nesting of ( [ { < the tools accept: far beyond any program
/// (the models nest a few levels), far below where the parser's stack runs
/// out (about 5,000 levels of `module {` in a release build).
constexpr unsigned kMaxNestingDepth = 256;

/// The offset of the first bracket in `text` nested deeper than `limit`
/// (strings and `//` comments skipped; `->` and `>=` are not brackets), or
/// nothing when the text stays within it.
std::optional<size_t> findExcessiveNesting(StringRef text,
                                           unsigned limit = kMaxNestingDepth);

/// Emits "brackets nested deeper than N" at the line and column of the
/// first such bracket of `buffer` (named by its identifier) and fails, or
/// succeeds when the nesting stays within the limit.
LogicalResult verifyNestingDepth(llvm::MemoryBufferRef buffer,
                                 MLIRContext *context,
                                 unsigned limit = kMaxNestingDepth);

} // namespace mlir::moe

#endif
