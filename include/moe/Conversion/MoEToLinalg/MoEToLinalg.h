//===- MoEToLinalg.h - moe to linalg/tensor/scf conversion ------*- C++ -*-===//
#ifndef MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H
#define MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H

#include "mlir/Transforms/DialectConversion.h"

namespace mlir::moe {

/// Adds `!moe.mx<...>` -> (data tensor, scale tensor) to `converter`.
void populateMXTypeConversion(TypeConverter &converter);

/// Adds the patterns that lower moe ops (other than moe.experts and
/// moe.grouped_mlp, which are expanded first) to upstream ops.
void populateMoEToLinalgConversionPatterns(const TypeConverter &converter,
                                           RewritePatternSet &patterns);

/// Adds data-parallel lowerings of the ops whose reference lowering loops on
/// the host (router, dispatch, grouped matmuls), with a higher benefit than
/// the reference patterns: same results, every output element independent.
void populateMoEToParallelLinalgPatterns(const TypeConverter &converter,
                                         RewritePatternSet &patterns);

/// Rewrites every moe.experts op under `root` into an scf.for over experts
/// running the body on each expert's rows.
LogicalResult lowerExpertsToLoops(Operation *root);

} // namespace mlir::moe

#endif
