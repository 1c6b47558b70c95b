//===- MoEToLinalg.h - moe to linalg/tensor/scf conversion ------*- C++ -*-===//
#ifndef MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H
#define MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Utils/LiveRows.h"

#include "mlir/Transforms/DialectConversion.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::moe {

/// Adds `!moe.mx<...>` and `!moe.fp8block<...>` -> (data tensor, scale
/// tensor) to `converter`.
void populateBlockScaledTypeConversion(TypeConverter &converter);

/// Ops whose lowering computes only the rows before their bound (a
/// dispatch's offsets[E], or the sum of an exchange's counts), leaving the
/// rest unspecified (nothing reads them: moe/Dialect/MoE/Utils/LiveRows.h).
using LiveRowBounds = llvm::DenseMap<Operation *, RowBound>;

/// Adds the patterns that lower moe ops (other than moe.experts and
/// moe.grouped_mlp, which are expanded first) to upstream ops; the row-wise
/// ops in `live` over their live rows only.
void populateMoEToLinalgConversionPatterns(const TypeConverter &converter,
                                           RewritePatternSet &patterns,
                                           const LiveRowBounds *live = nullptr);

/// Adds data-parallel lowerings of the ops whose reference lowering loops on
/// the host (router, dispatch, grouped matmuls), with a higher benefit than
/// the reference patterns: same results, every output element independent
/// (a dispatch in `live` gathers its live rows only).
void populateMoEToParallelLinalgPatterns(const TypeConverter &converter,
                                         RewritePatternSet &patterns,
                                         const LiveRowBounds *live = nullptr);

/// Marks the `linalg.generic` a dispatch gathers its rows with (one input,
/// the [R] index tensor of source rows; row r is row source[r] of the
/// tokens the body extracts from, zeros outside them), so that a consumer
/// kernel can read the tokens itself (-moe-gpu-fuse-row-gathers).
constexpr llvm::StringLiteral kGatheredRowsAttr = "moe.gathered_rows";

/// Rewrites every moe.experts op under `root` into an scf.for over experts
/// running the body on each expert's rows.
LogicalResult lowerExpertsToLoops(Operation *root);

} // namespace mlir::moe

#endif
