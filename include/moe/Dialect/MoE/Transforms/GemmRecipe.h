//===- GemmRecipe.h - bringing GEMM operands to a recipe's precision -*- C++
//-*-===//
//
// The operand conversions of the training recipes, shared by -moe-quantize
// (which inserts them), -moe-fuse-grouped-mlp (which recognizes them) and the
// definition of moe.grouped_mlp_backward (its `gemm_type`).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DIALECT_MOE_TRANSFORMS_GEMMRECIPE_H
#define MOE_DIALECT_MOE_TRANSFORMS_GEMMRECIPE_H

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/IR/Builders.h"

namespace mlir::moe {

/// The MX block size of every recipe.
constexpr unsigned kMXBlock = 32;

/// The tile size of the fp8-blockwise recipe: activations and gradients in
/// 1 x 128 tiles along K, weights in 128 x 128, weight-gradient operands in
/// 128 x 1 along the rows.
constexpr int64_t kFP8BlockTile = 128;

/// The multiple every expert's group of rows is padded to (moe.dispatch
/// pad_to) for the recipe named `recipe`, so that the scale blocks along the
/// rows of the weight gradients' operands (fp8-blockwise's 128 x 1 tiles,
/// MXFP8's blocks of 32) hold one expert's rows each, as when each expert's
/// rows are quantized on their own (Transformer Engine's grouped GEMMs): 128
/// for fp8-blockwise, 32 for mxfp8, 1 for the others.
int64_t expertRowPadding(llvm::StringRef recipe);

/// `v` (an f32 tensor) rounded to bf16, to nearest even: a `linalg.generic`
/// around `arith.truncf`.
Value createRoundToBF16(OpBuilder &b, Location loc, Value v);

/// The f32 input of `v` if `v` is the result of createRoundToBF16's op, else
/// a null value.
Value getRoundToBF16Input(Value v);

/// Whether every use of `v` (through reshapes) rounds it to bf16
/// (getRoundToBF16Input): a kernel computing `v` can then write bf16 itself,
/// and `v` never exists in f32.
bool onlyRoundedToBF16(Value v);

/// Whether `gemmType` names an MX element type (f8E4M3FN, f8E5M2).
bool isMXElementType(Type gemmType);

/// The MX type `v` (a ranked float tensor) quantizes to with blocks along
/// `axis`, or null when that dimension is dynamic or not a multiple of 32.
MXTensorType getMXTypeFor(Value v, Type elementType, unsigned axis);

/// `Q(v, axis)` of moe.grouped_mlp_backward's definition: `v` as it is when
/// `gemmType` is null; rounded to bf16 when `gemmType` is bf16 and `v` is
/// f32; quantized to `!moe.mx<..xgemmType, axis>` with `mode` when
/// `gemmType` is an MX element type.
Value createGemmOperand(OpBuilder &b, Location loc, Value v, Type gemmType,
                        unsigned axis, ScaleMode mode);

/// Whether `operand` holds exactly createGemmOperand(source, gemmType, axis,
/// mode): `source` itself, or an op that computes that from `source`.
bool isGemmOperandOf(Value operand, Value source, Type gemmType, unsigned axis,
                     ScaleMode mode);

} // namespace mlir::moe

#endif
