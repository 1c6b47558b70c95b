//===- SplitBackward.h - a train step as a forward and a backward -*- C++ -*-//
//
// Shared by -moe-split-backward (the pair an autograd framework calls) and
// -moe-autodiff (the pair a differentiated func.call becomes).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DIALECT_MOE_TRANSFORMS_SPLITBACKWARD_H
#define MOE_DIALECT_MOE_TRANSFORMS_SPLITBACKWARD_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"

#include <utility>

namespace mlir::moe {

/// Splits `step`, a differentiated function whose arguments marked
/// `moe.cotangent` seed its backward and whose results are marked
/// `moe.output`, `moe.gradient_of` or `moe.loss`, into
///
///   @fwdName(args) -> (outputs, residuals)
///   @bwdName(args, residuals, cotangents) -> gradients
///
/// inserted before `step`, which is erased. The residuals are the values of
/// the forward that the backward reads, but for cheap ones (casts, reshapes,
/// dispatches, fused expert MLPs) which the backward recomputes. Fails with
/// a diagnostic (and leaves `step` alone) when the outputs depend on a
/// cotangent or an op with side effects would be split.
FailureOr<std::pair<func::FuncOp, func::FuncOp>>
splitForwardBackward(func::FuncOp step, SymbolTable &symbols, StringRef fwdName,
                     StringRef bwdName);

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_TRANSFORMS_SPLITBACKWARD_H
