//===- MoEOps.cpp - moe dialect operations --------------------------------===//
//
// Verifiers speak the user's terms (tokens, experts, hidden size), folders
// and canonicalization patterns keep the IR small.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/PatternMatch.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/Support/CheckedArithmetic.h"
#include <cmath>

using namespace mlir;
using namespace mlir::moe;

#include "moe/Dialect/MoE/IR/MoEEnums.cpp.inc"

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static ArrayRef<int64_t> shapeOf(Type type) {
  if (auto t = dyn_cast<RankedTensorType>(type))
    return t.getShape();
  return cast<BlockScaledType>(type).getShape();
}

/// Checks that dimension `got` of something called `what` equals `expected`
/// (dynamic sizes match anything).
static LogicalResult expectDim(Operation *op, const Twine &what, int64_t got,
                               int64_t expected) {
  if (ShapedType::isDynamic(got) || ShapedType::isDynamic(expected) ||
      got == expected)
    return success();
  return op->emitOpError("expects ")
         << what << " to be " << expected << ", got " << got;
}

static LogicalResult expectRank(Operation *op, const Twine &what, Type type,
                                int64_t rank) {
  int64_t got = shapeOf(type).size();
  if (got == rank)
    return success();
  return op->emitOpError("expects ")
         << what << " to have rank " << rank << ", got rank " << got << " ("
         << type << ")";
}

/// Checks that rows of `to` hold what rows of `from` hold: the same element
/// type, or (MX) the same element type and blocks, running along the row.
static LogicalResult expectSameRowFormat(Operation *op, const Twine &what,
                                         Type to, const Twine &like,
                                         Type from) {
  auto mxFrom = dyn_cast<MXTensorType>(from);
  auto mxTo = dyn_cast<MXTensorType>(to);
  if (mxFrom && mxFrom.getAxis() != 1)
    return op->emitOpError("moves whole rows; expects the blocks of ")
           << like << " (" << from
           << ") to run along the row (axis = 1), got axis = "
           << mxFrom.getAxis();
  if (mxFrom && mxTo && mxFrom.getElementType() == mxTo.getElementType() &&
      mxFrom.getAxis() == mxTo.getAxis() &&
      mxFrom.getBlockSize() == mxTo.getBlockSize())
    return success();
  if (!mxFrom && !mxTo &&
      cast<RankedTensorType>(from).getElementType() ==
          cast<RankedTensorType>(to).getElementType())
    return success();
  return op->emitOpError("expects ") << what << " to hold the rows of " << like
                                     << " (" << from << "), got " << to;
}

/// Checks an `offsets` operand: 1-d, E + 1 entries, E = `numExperts`.
static LogicalResult verifyOffsets(Operation *op, Type offsets,
                                   int64_t numExperts) {
  if (failed(expectRank(op, "offsets", offsets, 1)))
    return failure();
  int64_t n = shapeOf(offsets)[0];
  if (ShapedType::isDynamic(n))
    return op->emitOpError("expects a static number of offsets (experts + 1)");
  if (n < 1)
    return op->emitOpError("expects at least one offset (experts + 1), got ")
           << n;
  if (ShapedType::isDynamic(numExperts))
    return success();
  // Compare n - 1 (no overflow: n >= 1) so huge expert counts cannot wrap.
  if (n - 1 != numExperts)
    return op->emitOpError("expects ")
           << uint64_t(numExperts) + 1 << " offsets (one more than the "
           << numExperts << " experts), got " << n;
  return success();
}

/// Checks that a block-scaled operand has its blocks along `axis`.
static LogicalResult expectMXAxis(Operation *op, const Twine &what, Type type,
                                  unsigned axis, StringRef why) {
  auto mx = dyn_cast<MXTensorType>(type);
  if (!mx || mx.getAxis() == axis)
    return success();
  return op->emitOpError("expects the MX blocks of ")
         << what << " along dimension " << axis << " (" << why
         << "), got axis = " << mx.getAxis();
}

//===----------------------------------------------------------------------===//
// RouterOp
//===----------------------------------------------------------------------===//

/// The shapes moe.router and moe.router_grad share: logits [T, E], and
/// [T, k] tensors (`perToken`: indices and weights, or indices and grad).
static LogicalResult
verifyRouting(Operation *op, Type logitsType,
              ArrayRef<std::pair<StringRef, Type>> perToken, int64_t k,
              bool softmaxAfterTopk, ScoreFunction score) {
  if (failed(expectRank(op, "logits", logitsType, 2)))
    return failure();
  for (auto [name, type] : perToken)
    if (failed(expectRank(op, name, type, 2)))
      return failure();
  ArrayRef<int64_t> logits = shapeOf(logitsType);
  if (!ShapedType::isDynamic(logits[1]) && k > logits[1])
    return op->emitOpError("expects top_k <= number of experts, got top_k = ")
           << k << " with " << logits[1] << " experts";
  for (auto [name, type] : perToken) {
    ArrayRef<int64_t> s = shapeOf(type);
    if (failed(
            expectDim(op, Twine(name) + " dim 0 (tokens)", s[0], logits[0])) ||
        failed(expectDim(op, Twine(name) + " dim 1 (top_k)", s[1], k)))
      return failure();
  }
  if (softmaxAfterTopk && score != ScoreFunction::softmax)
    return op->emitOpError(
        "softmax_after_topk needs the softmax score function");
  return success();
}

LogicalResult RouterOp::verify() {
  if (failed(verifyRouting(getOperation(), getLogits().getType(),
                           {{"indices", getIndices().getType()},
                            {"weights", getWeights().getType()}},
                           getTopK(), getSoftmaxAfterTopk(), getScore())))
    return failure();
  if (!getBias())
    return success();
  if (failed(expectRank(getOperation(), "bias", getBias().getType(), 1)))
    return failure();
  return expectDim(getOperation(), "bias size (the number of experts)",
                   shapeOf(getBias().getType())[0],
                   shapeOf(getLogits().getType())[1]);
}

//===----------------------------------------------------------------------===//
// DispatchOp
//===----------------------------------------------------------------------===//

/// `x` rounded up to a multiple of `m` (m >= 1), or nullopt on overflow.
static std::optional<int64_t> checkedRoundUp(int64_t x, int64_t m) {
  std::optional<int64_t> sum = llvm::checkedAdd(x, m - 1);
  if (!sum)
    return std::nullopt;
  return *sum / m * m;
}

int64_t DispatchOp::getCapacity() {
  if (!getCapacityFactor())
    return -1;
  ArrayRef<int64_t> idx = shapeOf(getIndices().getType());
  if (ShapedType::isDynamic(idx[0]) || ShapedType::isDynamic(idx[1]))
    return -1;
  std::optional<int64_t> copies = llvm::checkedMul(idx[0], idx[1]);
  if (!copies)
    return -1;
  double c = getCapacityFactor()->convertToDouble() * double(*copies) /
             double(getNumExperts());
  // No expert can receive more than all T * k copies: a larger capacity
  // (a huge or infinite factor) behaves exactly like T * k, and clamping
  // keeps the conversion to int64_t defined.
  if (!(c < double(*copies)))
    return *copies;
  return int64_t(std::ceil(c));
}

/// The smallest row count `sorted` must have, kDynamic when the token count
/// or top_k is dynamic, or nullopt when it does not fit in int64_t.
static std::optional<int64_t> computeMinRows(DispatchOp op) {
  ArrayRef<int64_t> idx = shapeOf(op.getIndices().getType());
  if (ShapedType::isDynamic(idx[0]) || ShapedType::isDynamic(idx[1]))
    return ShapedType::kDynamic;
  int64_t e = op.getNumExperts(), m = op.getPadTo();
  std::optional<int64_t> copies = llvm::checkedMul(idx[0], idx[1]);
  if (!copies)
    return std::nullopt;
  std::optional<int64_t> droplessOr = DispatchOp::droplessRows(*copies, e, m);
  if (!droplessOr)
    return std::nullopt;
  int64_t dropless = *droplessOr;
  int64_t cap = op.getCapacity();
  if (cap < 0)
    return dropless;
  std::optional<int64_t> perExpert = checkedRoundUp(cap, m);
  std::optional<int64_t> capped =
      perExpert ? llvm::checkedMul(e, *perExpert) : std::nullopt;
  if (!capped)
    return dropless;
  return std::min(dropless, *capped);
}

std::optional<int64_t> DispatchOp::droplessRows(int64_t copies, int64_t experts,
                                                int64_t padTo) {
  std::optional<int64_t> padding = llvm::checkedMul(experts, padTo - 1);
  std::optional<int64_t> sum =
      padding ? llvm::checkedAdd(copies, *padding) : std::nullopt;
  if (!sum)
    return std::nullopt;
  return *sum / padTo * padTo;
}

int64_t DispatchOp::getMinRows() {
  return computeMinRows(*this).value_or(ShapedType::kDynamic);
}

LogicalResult DispatchOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "tokens", getTokens().getType(), 2)) ||
      failed(expectRank(op, "indices", getIndices().getType(), 2)) ||
      failed(expectRank(op, "sorted", getSorted().getType(), 2)) ||
      failed(expectRank(op, "counts", getCounts().getType(), 1)) ||
      failed(expectRank(op, "positions", getPositions().getType(), 2)))
    return failure();
  ArrayRef<int64_t> tokens = shapeOf(getTokens().getType());
  ArrayRef<int64_t> idx = shapeOf(getIndices().getType());
  ArrayRef<int64_t> sorted = shapeOf(getSorted().getType());
  ArrayRef<int64_t> pos = shapeOf(getPositions().getType());
  int64_t e = getNumExperts();
  if (failed(expectDim(op, "indices dim 0 (tokens)", idx[0], tokens[0])) ||
      failed(expectDim(op, "sorted dim 1 (hidden)", sorted[1], tokens[1])) ||
      failed(verifyOffsets(op, getOffsets().getType(), e)) ||
      failed(expectDim(op, "counts size (experts)",
                       shapeOf(getCounts().getType())[0], e)) ||
      failed(expectDim(op, "positions dim 0 (tokens)", pos[0], tokens[0])) ||
      failed(expectDim(op, "positions dim 1 (top_k)", pos[1], idx[1])))
    return failure();
  if (failed(expectSameRowFormat(op, "sorted", getSorted().getType(), "tokens",
                                 getTokens().getType())))
    return failure();
  if (getCapacityFactor() &&
      (ShapedType::isDynamic(idx[0]) || ShapedType::isDynamic(idx[1])))
    return emitOpError("capacity_factor needs a static number of tokens and "
                       "top_k");
  if (ShapedType::isDynamic(idx[0]) || ShapedType::isDynamic(idx[1]))
    return emitOpError("expects a static number of tokens and top_k "
                       "(indices dims 0 and 1), got ")
           << getIndices().getType();
  if (ShapedType::isDynamic(sorted[0]))
    return emitOpError("expects sorted to have a static number of rows, got ")
           << getSorted().getType();
  std::optional<int64_t> minRowsOr = computeMinRows(*this);
  if (!minRowsOr)
    return emitOpError("expects the worst-case row count (")
           << idx[0] << " tokens x " << idx[1] << " + " << e
           << " experts x (pad_to - 1), pad_to = " << getPadTo()
           << ") to fit in 64 bits";
  int64_t minRows = *minRowsOr;
  if (sorted[0] < minRows)
    return emitOpError("expects sorted to have at least ")
           << minRows << " rows (the worst case for " << idx[0] << " tokens x "
           << idx[1] << " experts each over " << e << " experts"
           << (getPadTo() > 1 ? ", padded to " + std::to_string(getPadTo())
                              : std::string())
           << "), got " << sorted[0];
  return success();
}

//===----------------------------------------------------------------------===//
// CombineOp
//===----------------------------------------------------------------------===//

LogicalResult CombineOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "expert_out", getExpertOut().getType(), 2)) ||
      failed(expectRank(op, "weights", getWeights().getType(), 2)) ||
      failed(expectRank(op, "positions", getPositions().getType(), 2)) ||
      failed(expectRank(op, "result", getResult().getType(), 2)))
    return failure();
  ArrayRef<int64_t> y = shapeOf(getExpertOut().getType());
  ArrayRef<int64_t> w = shapeOf(getWeights().getType());
  ArrayRef<int64_t> p = shapeOf(getPositions().getType());
  ArrayRef<int64_t> r = shapeOf(getResult().getType());
  return success(
      succeeded(expectDim(op, "positions dim 0 (tokens)", p[0], w[0])) &&
      succeeded(expectDim(op, "positions dim 1 (top_k)", p[1], w[1])) &&
      succeeded(expectDim(op, "result dim 0 (tokens)", r[0], w[0])) &&
      succeeded(expectDim(op, "result dim 1 (hidden)", r[1], y[1])));
}

//===----------------------------------------------------------------------===//
// ExpertsOp
//===----------------------------------------------------------------------===//

int64_t ExpertsOp::getNumExperts() {
  int64_t n = shapeOf(getOffsets().getType())[0];
  return ShapedType::isDynamic(n) ? n : n - 1;
}

LogicalResult ExpertsOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "tokens", getTokens().getType(), 2)) ||
      failed(expectRank(op, "result", getResult().getType(), 2)) ||
      failed(verifyOffsets(op, getOffsets().getType(), ShapedType::kDynamic)))
    return failure();
  int64_t e = getNumExperts();
  for (auto [i, w] : llvm::enumerate(getWeights())) {
    auto t = cast<RankedTensorType>(w.getType());
    if (t.getRank() < 1)
      return emitOpError("expects weight #") << i
                                             << " to have a leading "
                                                "expert dimension";
    if (failed(expectDim(op, "weight #" + Twine(i) + " dim 0 (experts)",
                         t.getDimSize(0), e)))
      return failure();
  }
  return expectDim(op, "result dim 0 (rows)", shapeOf(getResult().getType())[0],
                   shapeOf(getTokens().getType())[0]);
}

LogicalResult ExpertsOp::verifyRegions() {
  Block &body = getBody().front();
  unsigned want = 1 + getWeights().size();
  if (body.getNumArguments() != want)
    return emitOpError("expects the body to take ")
           << want << " arguments (the group's rows and one per weight), got "
           << body.getNumArguments();
  auto tokens = cast<RankedTensorType>(getTokens().getType());
  auto rowsType = RankedTensorType::get(
      {ShapedType::kDynamic, tokens.getDimSize(1)}, tokens.getElementType());
  if (body.getArgument(0).getType() != rowsType)
    return emitOpError("expects body argument #0 (the group's rows) to be ")
           << rowsType << ", got " << body.getArgument(0).getType();
  for (auto [i, w] : llvm::enumerate(getWeights())) {
    auto t = cast<RankedTensorType>(w.getType());
    auto slice =
        RankedTensorType::get(t.getShape().drop_front(), t.getElementType());
    if (body.getArgument(i + 1).getType() != slice)
      return emitOpError("expects body argument #")
             << i + 1 << " (one expert's slice of weight #" << i << ") to be "
             << slice << ", got " << body.getArgument(i + 1).getType();
  }
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError("expects the body to end with moe.yield");
  auto result = cast<RankedTensorType>(getResult().getType());
  auto want2 = RankedTensorType::get(
      {ShapedType::kDynamic, result.getDimSize(1)}, result.getElementType());
  if (yield.getValue().getType() != want2)
    return emitOpError("expects the body to yield ")
           << want2 << " (the group's output rows), got "
           << yield.getValue().getType();
  return success();
}

namespace {
/// Drops weights the body never reads: they cost a slice per expert and
/// hide the body's real operands from grouping.
struct DropUnusedExpertWeights : OpRewritePattern<ExpertsOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ExpertsOp op,
                                PatternRewriter &rewriter) const override {
    Block &body = op.getBody().front();
    SmallVector<Value> keep;
    llvm::BitVector drop(body.getNumArguments());
    for (auto [i, w] : llvm::enumerate(op.getWeights())) {
      if (body.getArgument(i + 1).use_empty())
        drop.set(i + 1);
      else
        keep.push_back(w);
    }
    if (drop.none())
      return failure();
    rewriter.modifyOpInPlace(op, [&] {
      op.getWeightsMutable().assign(keep);
      body.eraseArguments(drop);
    });
    return success();
  }
};
} // namespace

void ExpertsOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                            MLIRContext *context) {
  results.add<DropUnusedExpertWeights>(context);
}

//===----------------------------------------------------------------------===//
// GroupedMatmulOp
//===----------------------------------------------------------------------===//

LogicalResult GroupedMatmulOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "lhs", getLhs().getType(), 2)) ||
      failed(expectRank(op, "rhs (stacked expert weights)", getRhs().getType(),
                        3)) ||
      failed(expectRank(op, "result", getResult().getType(), 2)))
    return failure();
  ArrayRef<int64_t> a = shapeOf(getLhs().getType());
  ArrayRef<int64_t> b = shapeOf(getRhs().getType());
  ArrayRef<int64_t> r = shapeOf(getResult().getType());
  bool t = getTransposeRhs();
  int64_t bk = t ? b[2] : b[1], bn = t ? b[1] : b[2];
  if (failed(verifyOffsets(op, getOffsets().getType(), b[0])) ||
      failed(expectDim(op, "rhs contraction dim (K, lhs dim 1)", bk, a[1])) ||
      failed(expectDim(op, "result dim 0 (rows)", r[0], a[0])) ||
      failed(expectDim(op, "result dim 1 (N)", r[1], bn)) ||
      failed(expectMXAxis(op, "lhs", getLhs().getType(), 1,
                          "the contraction dimension")) ||
      failed(expectMXAxis(op, "rhs", getRhs().getType(), t ? 2 : 1,
                          "the contraction dimension")))
    return failure();
  return success();
}

namespace {
/// grouped_matmul(x, linalg.transpose(w, [0, 2, 1])) reads the untransposed
/// weights with `transpose_rhs` toggled: the same products, no copy.
struct FoldRhsTranspose : OpRewritePattern<GroupedMatmulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GroupedMatmulOp op,
                                PatternRewriter &rewriter) const override {
    auto transpose = op.getRhs().getDefiningOp<linalg::TransposeOp>();
    if (!transpose || !transpose.hasPureTensorSemantics() ||
        transpose.getPermutation() != ArrayRef<int64_t>{0, 2, 1})
      return failure();
    rewriter.modifyOpInPlace(op, [&] {
      op.getRhsMutable().assign(transpose.getInput());
      op.setTransposeRhs(!op.getTransposeRhs());
    });
    return success();
  }
};
} // namespace

void GroupedMatmulOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                                  MLIRContext *context) {
  results.add<FoldRhsTranspose>(context);
}

//===----------------------------------------------------------------------===//
// GroupedMatmulWgradOp
//===----------------------------------------------------------------------===//

LogicalResult GroupedMatmulWgradOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "lhs", getLhs().getType(), 2)) ||
      failed(expectRank(op, "rhs", getRhs().getType(), 2)) ||
      failed(expectRank(op, "result (stacked weight gradients)",
                        getResult().getType(), 3)))
    return failure();
  ArrayRef<int64_t> a = shapeOf(getLhs().getType());
  ArrayRef<int64_t> b = shapeOf(getRhs().getType());
  ArrayRef<int64_t> r = shapeOf(getResult().getType());
  return success(
      succeeded(verifyOffsets(op, getOffsets().getType(), r[0])) &&
      succeeded(expectDim(op, "rhs dim 0 (rows)", b[0], a[0])) &&
      succeeded(expectDim(op, "result dim 1 (K)", r[1], a[1])) &&
      succeeded(expectDim(op, "result dim 2 (N)", r[2], b[1])) &&
      succeeded(expectMXAxis(op, "lhs", getLhs().getType(), 0,
                             "the rows are contracted: columnwise")) &&
      succeeded(expectMXAxis(op, "rhs", getRhs().getType(), 0,
                             "the rows are contracted: columnwise")));
}

//===----------------------------------------------------------------------===//
// SwigluOp / SwigluGradOp
//===----------------------------------------------------------------------===//

/// Checks `full` [..., 2F] against `half` [..., F].
static LogicalResult verifyGluPair(Operation *op, RankedTensorType full,
                                   StringRef fullName, RankedTensorType half,
                                   StringRef halfName) {
  if (full.getRank() < 1 || full.getRank() != half.getRank())
    return op->emitOpError("expects ")
           << fullName << " and " << halfName
           << " to have the same rank (at least 1), got " << full.getRank()
           << " and " << half.getRank();
  int64_t last = full.getRank() - 1;
  for (int64_t i = 0; i < last; ++i)
    if (failed(expectDim(op, Twine(halfName) + " dim " + Twine(i),
                         half.getDimSize(i), full.getDimSize(i))))
      return failure();
  int64_t two = full.getDimSize(last);
  if (ShapedType::isDynamic(two))
    return op->emitOpError("expects a static last dimension (gate and up)");
  if (two % 2 != 0)
    return op->emitOpError("expects the last dimension of ")
           << fullName << " (gate and up) to be even, got " << two;
  return expectDim(op, Twine(halfName) + " last dim (half of " + fullName + ")",
                   half.getDimSize(last), two / 2);
}

LogicalResult SwigluOp::verify() {
  return verifyGluPair(getOperation(), getInput().getType(), "input",
                       getResult().getType(), "result");
}

LogicalResult SwigluGradOp::verify() {
  if (getInput().getType().getShape() != getResult().getType().getShape())
    return emitOpError("expects the result to have the input's shape ")
           << getInput().getType() << ", got " << getResult().getType();
  return verifyGluPair(getOperation(), getInput().getType(), "input",
                       getGrad().getType(), "grad");
}

//===----------------------------------------------------------------------===//
// Quantize / Dequantize / Pack / Unpack
//===----------------------------------------------------------------------===//

static LogicalResult verifySameShape(Operation *op, Type a, StringRef aName,
                                     Type b, StringRef bName) {
  ArrayRef<int64_t> sa = shapeOf(a), sb = shapeOf(b);
  if (sa.size() != sb.size())
    return op->emitOpError("expects ")
           << aName << " and " << bName << " to have the same rank, got "
           << sa.size() << " and " << sb.size();
  for (auto [i, p] : llvm::enumerate(llvm::zip(sa, sb)))
    if (failed(expectDim(
            op, Twine(bName) + " dim " + Twine(i) + " (from " + aName + ")",
            std::get<1>(p), std::get<0>(p))))
      return failure();
  return success();
}

LogicalResult QuantizeOp::verify() {
  if (isa<FP8BlockTensorType>(getResult().getType()) &&
      getScaleMode() != ScaleMode::rceil)
    return emitOpError("scale(")
           << stringifyScaleMode(getScaleMode())
           << ") applies to MX results; a blockwise FP8 result's scales are "
              "set by its type (pow2 or not)";
  return verifySameShape(getOperation(), getInput().getType(), "input",
                         getResult().getType(), "result");
}

LogicalResult DequantizeOp::verify() {
  return verifySameShape(getOperation(), getInput().getType(), "input",
                         getResult().getType(), "result");
}

static LogicalResult verifyPackTypes(Operation *op, Type packed, Type data,
                                     Type scales) {
  RankedTensorType wantData, wantScales;
  if (auto mx = dyn_cast<MXTensorType>(packed)) {
    wantData = mx.getDataType();
    wantScales = mx.getScalesType();
  } else {
    auto fp8 = cast<FP8BlockTensorType>(packed);
    wantData = fp8.getDataType();
    wantScales = fp8.getScalesType();
  }
  if (data != wantData)
    return op->emitOpError("expects the data of ")
           << packed << " to be " << wantData << ", got " << data;
  if (scales != wantScales)
    return op->emitOpError("expects the scales of ")
           << packed << " to be " << wantScales << ", got " << scales;
  return success();
}

LogicalResult MXPackOp::verify() {
  return verifyPackTypes(getOperation(), getResult().getType(),
                         getData().getType(), getScales().getType());
}

LogicalResult MXUnpackOp::verify() {
  return verifyPackTypes(getOperation(), getInput().getType(),
                         getData().getType(), getScales().getType());
}

/// mx_pack(mx_unpack(x)) is x.
OpFoldResult MXPackOp::fold(FoldAdaptor) {
  auto unpack = getData().getDefiningOp<MXUnpackOp>();
  if (unpack && getScales().getDefiningOp() == unpack &&
      unpack.getInput().getType() == getType())
    return unpack.getInput();
  return {};
}

/// mx_unpack(mx_pack(d, s)) is (d, s).
LogicalResult MXUnpackOp::fold(FoldAdaptor,
                               SmallVectorImpl<OpFoldResult> &results) {
  auto pack = getInput().getDefiningOp<MXPackOp>();
  if (!pack)
    return failure();
  results.push_back(pack.getData());
  results.push_back(pack.getScales());
  return success();
}

//===----------------------------------------------------------------------===//
// GroupedMlpOp
//===----------------------------------------------------------------------===//

LogicalResult GroupedMlpOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "input", getInput().getType(), 2)) ||
      failed(expectRank(op, "w1", getW1().getType(), 3)) ||
      failed(expectRank(op, "w2", getW2().getType(), 3)) ||
      failed(expectRank(op, "result", getResult().getType(), 2)))
    return failure();
  ArrayRef<int64_t> x = shapeOf(getInput().getType());
  ArrayRef<int64_t> w1 = shapeOf(getW1().getType());
  ArrayRef<int64_t> w2 = shapeOf(getW2().getType());
  ArrayRef<int64_t> r = shapeOf(getResult().getType());
  if (failed(verifyOffsets(op, getOffsets().getType(), w1[0])) ||
      failed(expectDim(op, "w2 dim 0 (experts)", w2[0], w1[0])) ||
      failed(expectDim(op, "w1 dim 1 (hidden, input dim 1)", w1[1], x[1])) ||
      failed(expectMXAxis(op, "input", getInput().getType(), 1,
                          "the contraction dimension")) ||
      failed(expectMXAxis(op, "w1", getW1().getType(), 1,
                          "the contraction dimension")) ||
      failed(expectMXAxis(op, "w2", getW2().getType(), 1,
                          "the contraction dimension")))
    return failure();
  if (!ShapedType::isDynamic(w1[2]) && w1[2] % 2 != 0)
    return emitOpError(
               "expects w1 dim 2 (gate and up, 2 x ffn) to be even, got ")
           << w1[2];
  if (!ShapedType::isDynamic(w1[2]) &&
      failed(
          expectDim(op, "w2 dim 1 (ffn, half of w1 dim 2)", w2[1], w1[2] / 2)))
    return failure();
  return success(
      succeeded(expectDim(op, "result dim 0 (rows)", r[0], x[0])) &&
      succeeded(expectDim(op, "result dim 1 (w2 dim 2)", r[1], w2[2])));
}

//===----------------------------------------------------------------------===//
// GroupedMlpBackwardOp
//===----------------------------------------------------------------------===//

LogicalResult GroupedMlpBackwardOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "x", getX().getType(), 2)) ||
      failed(expectRank(op, "w1", getW1().getType(), 3)) ||
      failed(expectRank(op, "w2", getW2().getType(), 3)) ||
      failed(expectRank(op, "dy", getDy().getType(), 2)))
    return failure();
  ArrayRef<int64_t> x = shapeOf(getX().getType());
  ArrayRef<int64_t> w1 = shapeOf(getW1().getType());
  ArrayRef<int64_t> w2 = shapeOf(getW2().getType());
  ArrayRef<int64_t> dy = shapeOf(getDy().getType());
  if (failed(verifyOffsets(op, getOffsets().getType(), w1[0])) ||
      failed(expectDim(op, "w2 dim 0 (experts)", w2[0], w1[0])) ||
      failed(expectDim(op, "w1 dim 1 (hidden, x dim 1)", w1[1], x[1])) ||
      failed(expectDim(op, "dy dim 0 (rows, x dim 0)", dy[0], x[0])) ||
      failed(expectDim(op, "dy dim 1 (w2 dim 2)", dy[1], w2[2])))
    return failure();
  if (ShapedType::isDynamic(w1[2]))
    return emitOpError("expects a static w1 dim 2 (gate and up, 2 x ffn)");
  if (w1[2] % 2 != 0)
    return emitOpError(
               "expects w1 dim 2 (gate and up, 2 x ffn) to be even, got ")
           << w1[2];
  if (failed(
          expectDim(op, "w2 dim 1 (ffn, half of w1 dim 2)", w2[1], w1[2] / 2)))
    return failure();
  // Every gradient has the shape of what it is the gradient of.
  for (auto [name, grad, of] : {std::tuple<StringRef, Type, Type>{
                                    "dx", getDx().getType(), getX().getType()},
                                {"dw1", getDw1().getType(), getW1().getType()},
                                {"dw2", getDw2().getType(), getW2().getType()}})
    if (failed(verifySameShape(op, of, name.drop_front(), grad, name)))
      return failure();
  std::optional<Type> gemmType = getGemmType();
  if (!gemmType)
    return success();
  if (isa<Float8E4M3FNType, Float8E5M2Type>(*gemmType)) {
    std::string typeName;
    llvm::raw_string_ostream(typeName) << *gemmType;
    // Every GEMM operand is quantized along its contraction dimension: R for
    // the weight gradients, H, 2F and N for the others.
    for (auto [what, size] :
         {std::pair<StringRef, int64_t>{"rows (x dim 0)", x[0]},
          {"hidden (x dim 1)", x[1]},
          {"gate and up (w1 dim 2)", w1[2]},
          {"output (w2 dim 2)", w2[2]}})
      if (ShapedType::isDynamic(size) || size % 32 != 0)
        return emitOpError("expects ")
               << what << " to be a static multiple of the MX block size 32 "
               << "with gemm_type(" << typeName << "), got "
               << (ShapedType::isDynamic(size) ? std::string("?")
                                               : std::to_string(size));
    return success();
  }
  if (!gemmType->isBF16())
    return emitOpError("expects gemm_type to be bf16, f8E4M3FN or f8E5M2, "
                       "got ")
           << *gemmType;
  return success();
}

//===----------------------------------------------------------------------===//
// AllToAllOp
//===----------------------------------------------------------------------===//

/// The number of ranks in the op's group, or kDynamic / -1 if unknown.
static int64_t groupSize(shard::GridOp grid, ArrayRef<int16_t> axes) {
  ArrayRef<int64_t> shape = grid.getShape();
  int64_t p = 1;
  if (axes.empty()) {
    for (int64_t d : shape) {
      if (ShapedType::isDynamic(d))
        return ShapedType::kDynamic;
      p *= d;
    }
    return p;
  }
  for (int16_t a : axes) {
    if (ShapedType::isDynamic(shape[a]))
      return ShapedType::kDynamic;
    p *= shape[a];
  }
  return p;
}

int64_t AllToAllOp::getGroupSize(SymbolTableCollection &symbols) {
  auto grid = shard::getGridOrNull(getOperation(), getGridAttr(), symbols);
  return grid ? groupSize(grid, getGridAxes()) : ShapedType::kDynamic;
}

LogicalResult AllToAllOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto grid = shard::getGridOrNull(getOperation(), getGridAttr(), symbolTable);
  if (!grid)
    return emitOpError("expects '@")
           << getGrid() << "' to name a shard.grid, found none";
  llvm::SmallSet<int16_t, 4> seen;
  for (int16_t a : getGridAxes()) {
    if (a < 0 || a >= grid.getRank())
      return emitOpError("grid axis ")
             << a << " is out of range for the " << grid.getRank()
             << "-d grid @" << getGrid();
    if (!seen.insert(a).second)
      return emitOpError("grid axis ") << a << " is listed twice";
  }
  int64_t p = groupSize(grid, getGridAxes());
  if (p == 0)
    return emitOpError("expects a group of one or more ranks, but the grid @")
           << getGrid() << " has size 0 along the exchange's axes";
  int64_t c = getSendCounts().getType().getDimSize(0);
  if (!ShapedType::isDynamic(p) && !ShapedType::isDynamic(c) && c % p != 0)
    return emitOpError("expects the number of send counts (")
           << c << ") to be a multiple of the group size (" << p
           << " ranks), one or more counts per destination rank";
  return success();
}

LogicalResult AllToAllOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "input", getInput().getType(), 2)) ||
      failed(expectRank(op, "result", getResult().getType(), 2)) ||
      failed(expectRank(op, "send_counts", getSendCounts().getType(), 1)))
    return failure();
  if (failed(expectSameRowFormat(op, "the result", getResult().getType(),
                                 "the input", getInput().getType())))
    return failure();
  if (getPadTo() > 1 && !getSlotMajorInput() && !getSlotMajorResult())
    return emitOpError("pads slots to ")
           << getPadTo()
           << " rows, but neither side is slot-major (pad_to applies to "
              "slot_major_input and slot_major_result)";
  if (getSendCounts().getType() != getRecvCounts().getType())
    return emitOpError("expects recv_counts to have the type of send_counts (")
           << getSendCounts().getType() << "), got "
           << getRecvCounts().getType();
  return expectDim(op, "result dim 1 (row size)",
                   shapeOf(getResult().getType())[1],
                   shapeOf(getInput().getType())[1]);
}

LogicalResult SlotOffsetsOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "counts", getCounts().getType(), 1)) ||
      failed(expectRank(op, "offsets", getOffsets().getType(), 1)))
    return failure();
  int64_t c = getCounts().getType().getDimSize(0);
  int64_t n = getOffsets().getType().getDimSize(0);
  if (ShapedType::isDynamic(c) || ShapedType::isDynamic(n))
    return emitOpError("expects static sizes, got ")
           << getCounts().getType() << " and " << getOffsets().getType();
  if (n < 2 || c % (n - 1) != 0)
    return emitOpError("expects offsets of S + 1 entries, S >= 1 slots "
                       "dividing the ")
           << c << " counts, got " << n << " entries";
  return success();
}

/// Over a group of one rank the exchange is the identity.
LogicalResult AllToAllOp::fold(FoldAdaptor,
                               SmallVectorImpl<OpFoldResult> &results) {
  // (Over one rank a slot-major side is the same rows, unless padded.)
  if (getInput().getType() != getResult().getType() || getPadTo() != 1)
    return failure();
  SymbolTableCollection symbols;
  if (getGroupSize(symbols) != 1)
    return failure();
  results.push_back(getInput());
  results.push_back(getSendCounts());
  return success();
}

//===----------------------------------------------------------------------===//
// Model ops
//===----------------------------------------------------------------------===//

/// Checks that `got` has exactly the shape of `expected` (dynamic sizes match
/// anything).
static LogicalResult expectSameShape(Operation *op, const Twine &what, Type got,
                                     const Twine &like, Type expected) {
  ArrayRef<int64_t> a = shapeOf(got), b = shapeOf(expected);
  if (a.size() == b.size() && llvm::all_of(llvm::zip(a, b), [](auto p) {
        auto [x, y] = p;
        return ShapedType::isDynamic(x) || ShapedType::isDynamic(y) || x == y;
      }))
    return success();
  return op->emitOpError("expects ") << what << " to have the shape of " << like
                                     << " (" << expected << "), got " << got;
}

/// ids `[...]`, rows `[..., H]`: the rows' leading dims are the ids' shape.
static LogicalResult verifyIdRows(Operation *op, Type ids, Type rows,
                                  StringRef rowsName, int64_t h) {
  ArrayRef<int64_t> i = shapeOf(ids), r = shapeOf(rows);
  if (r.size() != i.size() + 1)
    return op->emitOpError("expects ")
           << rowsName << " to have the ids' rank + 1 (" << i.size() + 1
           << "), got rank " << r.size() << " (" << rows << ")";
  for (auto [d, n] : llvm::enumerate(i))
    if (failed(expectDim(op,
                         Twine(rowsName) + " dim " + Twine(d) +
                             " (the ids' dim " + Twine(d) + ")",
                         r[d], n)))
      return failure();
  return expectDim(op, Twine(rowsName) + " last dim (the table's row size)",
                   r.back(), h);
}

LogicalResult EmbeddingOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "table", getTable().getType(), 2)))
    return failure();
  return verifyIdRows(op, getIds().getType(), getResult().getType(), "result",
                      getTable().getType().getDimSize(1));
}

LogicalResult EmbeddingGradOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "result (the table's gradient)",
                        getResult().getType(), 2)))
    return failure();
  if (getResult().getType().isDynamicDim(0))
    return emitOpError("expects a static vocabulary size (result dim 0)");
  return verifyIdRows(op, getIds().getType(), getGrad().getType(), "grad",
                      getResult().getType().getDimSize(1));
}

static LogicalResult verifyRMSNormShapes(Operation *op, Type input,
                                         Type weight) {
  if (shapeOf(input).empty())
    return op->emitOpError("expects an input of rank >= 1");
  if (failed(expectRank(op, "weight", weight, 1)))
    return failure();
  return expectDim(op, "weight size (the input's last dim)", shapeOf(weight)[0],
                   shapeOf(input).back());
}

LogicalResult RMSNormOp::verify() {
  Operation *op = getOperation();
  if (failed(
          verifyRMSNormShapes(op, getInput().getType(), getWeight().getType())))
    return failure();
  return expectSameShape(op, "the result", getResult().getType(), "the input",
                         getInput().getType());
}

LogicalResult RMSNormGradOp::verify() {
  Operation *op = getOperation();
  if (failed(
          verifyRMSNormShapes(op, getInput().getType(), getWeight().getType())))
    return failure();
  if (failed(expectSameShape(op, "grad", getGrad().getType(), "the input",
                             getInput().getType())) ||
      failed(expectSameShape(op, "input_grad", getInputGrad().getType(),
                             "the input", getInput().getType())))
    return failure();
  return expectSameShape(op, "weight_grad", getWeightGrad().getType(),
                         "the weight", getWeight().getType());
}

LogicalResult RotaryOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "input [batch, seq, heads, head_dim]",
                        getInput().getType(), 4)))
    return failure();
  int64_t d = getInput().getType().getDimSize(3);
  if (ShapedType::isDynamic(d))
    return emitOpError("expects a static head dim");
  if (d % 2)
    return emitOpError("expects an even head dim (pairs are rotated), got ")
           << d;
  return expectSameShape(op, "the result", getResult().getType(), "the input",
                         getInput().getType());
}

/// query [B, S, N, D], key/value [B, S, M, D], N a multiple of M.
static LogicalResult verifyAttentionShapes(Operation *op, Type q, Type k,
                                           Type v) {
  for (auto [name, t] :
       {std::pair<StringRef, Type>{"query", q}, {"key", k}, {"value", v}})
    if (failed(expectRank(op, Twine(name) + " [batch, seq, heads, head_dim]", t,
                          4)))
      return failure();
  ArrayRef<int64_t> qs = shapeOf(q), ks = shapeOf(k);
  if (ShapedType::isDynamic(qs[2]) || ShapedType::isDynamic(ks[2]) ||
      ShapedType::isDynamic(qs[3]))
    return op->emitOpError("expects static head counts and head dim");
  if (failed(expectSameShape(op, "value", v, "key", k)) ||
      failed(expectDim(op, "key dim 0 (batch)", ks[0], qs[0])) ||
      failed(expectDim(op, "key dim 1 (sequence)", ks[1], qs[1])) ||
      failed(expectDim(op, "key dim 3 (head dim)", ks[3], qs[3])))
    return failure();
  if (ks[2] < 1 || qs[2] % ks[2])
    return op->emitOpError("expects the query heads (")
           << qs[2] << ") to be a multiple of the key/value heads (" << ks[2]
           << ")";
  return success();
}

/// documents [B, S] of query [B, S, N, D], where given.
static LogicalResult verifyDocuments(Operation *op, Value documents, Type q) {
  if (!documents)
    return success();
  if (failed(expectRank(op, "documents [batch, seq]", documents.getType(), 2)))
    return failure();
  ArrayRef<int64_t> ds = shapeOf(documents.getType()), qs = shapeOf(q);
  if (failed(expectDim(op, "documents dim 0 (batch)", ds[0], qs[0])) ||
      failed(expectDim(op, "documents dim 1 (sequence)", ds[1], qs[1])))
    return failure();
  return success();
}

static double attentionScale(std::optional<APFloat> scale, Type query) {
  if (scale)
    return scale->convertToDouble();
  return 1.0 / std::sqrt(double(shapeOf(query)[3]));
}

double AttentionOp::getScaleOrDefault() {
  return attentionScale(getScale(), getQuery().getType());
}
double AttentionGradOp::getScaleOrDefault() {
  return attentionScale(getScale(), getQuery().getType());
}

LogicalResult AttentionOp::verify() {
  Operation *op = getOperation();
  if (failed(verifyAttentionShapes(op, getQuery().getType(), getKey().getType(),
                                   getValue().getType())) ||
      failed(verifyDocuments(op, getDocuments(), getQuery().getType())))
    return failure();
  return expectSameShape(op, "the result", getResult().getType(), "the query",
                         getQuery().getType());
}

LogicalResult AttentionGradOp::verify() {
  Operation *op = getOperation();
  if (failed(verifyAttentionShapes(op, getQuery().getType(), getKey().getType(),
                                   getValue().getType())) ||
      failed(verifyDocuments(op, getDocuments(), getQuery().getType())))
    return failure();
  if (failed(expectSameShape(op, "grad", getGrad().getType(), "the query",
                             getQuery().getType())) ||
      failed(expectSameShape(op, "query_grad", getQueryGrad().getType(),
                             "the query", getQuery().getType())) ||
      failed(expectSameShape(op, "key_grad", getKeyGrad().getType(), "the key",
                             getKey().getType())))
    return failure();
  return expectSameShape(op, "value_grad", getValueGrad().getType(),
                         "the value", getValue().getType());
}

static LogicalResult verifyLossShapes(Operation *op, Type logits, Type labels) {
  if (failed(expectRank(op, "logits [rows, vocab]", logits, 2)) ||
      failed(expectRank(op, "labels", labels, 1)))
    return failure();
  return expectDim(op, "labels size (the logits' rows)", shapeOf(labels)[0],
                   shapeOf(logits)[0]);
}

LogicalResult CrossEntropyOp::verify() {
  if (failed(verifyLossShapes(getOperation(), getLogits().getType(),
                              getLabels().getType())))
    return failure();
  return expectRank(getOperation(), "loss", getLoss().getType(), 0);
}

LogicalResult CrossEntropyGradOp::verify() {
  Operation *op = getOperation();
  if (failed(
          verifyLossShapes(op, getLogits().getType(), getLabels().getType())) ||
      failed(expectRank(op, "grad (of the 0-d loss)", getGrad().getType(), 0)))
    return failure();
  return expectSameShape(op, "the result", getResult().getType(), "the logits",
                         getLogits().getType());
}

/// moe.router_loss(_grad): one [T, E] logits and one [E] counts per layer,
/// every layer with the same E; finite, non-negative coefficients.
static LogicalResult verifyRouterLoss(Operation *op, TypeRange logits,
                                      TypeRange counts, double auxCoef,
                                      double zCoef) {
  if (logits.empty())
    return op->emitOpError("expects the logits of at least one layer");
  if (logits.size() != counts.size())
    return op->emitOpError("expects one counts per logits, got ")
           << logits.size() << " logits and " << counts.size() << " counts";
  int64_t experts = ShapedType::kDynamic;
  for (auto [i, l] : llvm::enumerate(logits)) {
    if (failed(expectRank(op, "logits #" + Twine(i), l, 2)) ||
        failed(expectRank(op, "counts #" + Twine(i), counts[i], 1)))
      return failure();
    for (int64_t e : {shapeOf(l)[1], shapeOf(counts[i])[0]}) {
      if (ShapedType::isDynamic(e))
        continue;
      if (!ShapedType::isDynamic(experts) && e != experts)
        return op->emitOpError("expects every layer to have the same number "
                               "of experts, got ")
               << experts << " and " << e << " (layer " << i << ")";
      experts = e;
    }
  }
  for (auto [name, v] : {std::pair<const char *, double>{"aux_coef", auxCoef},
                         {"z_coef", zCoef}})
    if (!std::isfinite(v) || v < 0)
      return op->emitOpError("expects ")
             << name << " to be a finite non-negative number, got " << v;
  return success();
}

LogicalResult RouterLossOp::verify() {
  if (failed(verifyRouterLoss(
          getOperation(), getLogits().getTypes(), getCounts().getTypes(),
          getAuxCoef().convertToDouble(), getZCoef().convertToDouble())))
    return failure();
  return expectRank(getOperation(), "loss", getLoss().getType(), 0);
}

LogicalResult RouterLossGradOp::verify() {
  Operation *op = getOperation();
  if (failed(verifyRouterLoss(
          op, getLogits().getTypes(), getCounts().getTypes(),
          getAuxCoef().convertToDouble(), getZCoef().convertToDouble())) ||
      failed(expectRank(op, "grad (of the 0-d loss)", getGrad().getType(), 0)))
    return failure();
  if (getResults().size() != getLogits().size())
    return emitOpError("expects one result per logits, got ")
           << getResults().size() << " for " << getLogits().size();
  for (auto [i, r] : llvm::enumerate(getResults()))
    if (failed(expectSameShape(op, "result #" + Twine(i), r.getType(),
                               "logits #" + Twine(i),
                               getLogits()[i].getType())))
      return failure();
  return success();
}

LogicalResult RouterGradOp::verify() {
  if (failed(verifyRouting(
          getOperation(), getLogits().getType(),
          {{"indices", getIndices().getType()}, {"grad", getGrad().getType()}},
          getTopK(), getSoftmaxAfterTopk(), getScore())))
    return failure();
  return expectSameShape(getOperation(), "the result", getResult().getType(),
                         "the logits", getLogits().getType());
}

LogicalResult CombineGradOp::verify() {
  Operation *op = getOperation();
  if (failed(expectRank(op, "expert_out", getExpertOut().getType(), 2)) ||
      failed(expectRank(op, "positions", getPositions().getType(), 2)) ||
      failed(expectRank(op, "grad", getGrad().getType(), 2)))
    return failure();
  ArrayRef<int64_t> pos = shapeOf(getPositions().getType());
  if (failed(expectDim(op, "grad dim 0 (tokens)",
                       getGrad().getType().getDimSize(0), pos[0])) ||
      failed(expectDim(op, "grad dim 1 (row size)",
                       getGrad().getType().getDimSize(1),
                       getExpertOut().getType().getDimSize(1))))
    return failure();
  return expectSameShape(op, "the result", getResult().getType(),
                         "the positions", getPositions().getType());
}

#define GET_OP_CLASSES
#include "moe/Dialect/MoE/IR/MoEOps.cpp.inc"
