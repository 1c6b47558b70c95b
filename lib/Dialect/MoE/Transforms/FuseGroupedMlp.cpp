//===- FuseGroupedMlp.cpp - -moe-fuse-grouped-mlp -------------------------===//
//
// Fuses the grouped GEMMs and SwiGLU of an expert MLP into moe.grouped_mlp
// (forward) and moe.grouped_mlp_backward (backward). A sequence is fused only
// when it is exactly the fused op's definition (same values, same numerics),
// so the rewrite never changes a result bit.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/IR/Dominance.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEFUSEGROUPEDMLP
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

constexpr StringLiteral kLayerAttr = "moe.layer";

bool isF32Tensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getElementType().isF32();
}

/// Carries the model builder's layer index over to the fused op.
void copyLayer(Operation *from, Operation *to) {
  if (Attribute layer = from->getAttr(kLayerAttr))
    to->setAttr(kLayerAttr, layer);
}

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

/// Matches, rooted at the second GEMM,
///   h  = grouped_matmul(x, w1, off) : f32           (h used once)
///   a  = swiglu(h) {layout}                         (a used once)
///   a' = quantize(a : f32) {mode} : w2's MX type, rowwise   if w2 is MX
///        a itself, of w2's element type                     otherwise
///   y  = grouped_matmul(a', w2, off)
/// and replaces it by grouped_mlp(x, w1, w2, off) {layout, mode}: this is
/// word for word moe.grouped_mlp's definition, so every bit of y is kept.
struct FuseGroupedMlpForward : OpRewritePattern<GroupedMatmulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GroupedMatmulOp g2,
                                PatternRewriter &rewriter) const override {
    if (g2.getTransposeRhs())
      return failure();
    Value act = g2.getLhs(), w2 = g2.getRhs();
    if (!act.hasOneUse())
      return failure();
    SwigluOp swiglu;
    ScaleMode mode = ScaleMode::rceil;
    if (auto w2MX = dyn_cast<MXTensorType>(w2.getType())) {
      auto q = act.getDefiningOp<QuantizeOp>();
      if (!q)
        return failure();
      Value a = q.getInput();
      // The definition's quantize: rowwise, w2's elements and block size,
      // from the f32 SwiGLU result.
      auto want = MXTensorType::get(
          getContext(), cast<RankedTensorType>(a.getType()).getShape(),
          w2MX.getElementType(), /*axis=*/1, w2MX.getBlockSize());
      swiglu = a.getDefiningOp<SwigluOp>();
      if (q.getType() != want || !swiglu || !a.hasOneUse() || !isF32Tensor(a))
        return failure();
      mode = q.getScaleMode();
    } else if (auto w2Tensor = dyn_cast<RankedTensorType>(w2.getType())) {
      Type w2Elt = w2Tensor.getElementType();
      swiglu = act.getDefiningOp<SwigluOp>();
      if (Value a = getRoundToBF16Input(act); a && w2Elt.isBF16()) {
        // An f32 SwiGLU rounded to bf16 by the bf16 recipe: SwiGLU computes
        // in f32 and rounds once (to nearest even), the same bits.
        swiglu = a.getDefiningOp<SwigluOp>();
        if (!swiglu || !a.hasOneUse())
          return failure();
      } else if (!swiglu || swiglu.getType().getElementType() != w2Elt) {
        return failure();
      }
    } else {
      return failure(); // blockwise FP8: grouped_mlp has no such recipe
    }
    Value h = swiglu.getInput();
    auto g1 = h.getDefiningOp<GroupedMatmulOp>();
    if (!g1 || g1.getTransposeRhs() || !h.hasOneUse() || !isF32Tensor(h) ||
        g1.getOffsets() != g2.getOffsets())
      return failure();
    auto fused = rewriter.replaceOpWithNewOp<GroupedMlpOp>(
        g2, g2.getType(), g1.getLhs(), g1.getRhs(), w2, g2.getOffsets(),
        swiglu.getLayout(), mode);
    copyLayer(g1, fused);
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

/// How a recipe brought the GEMM operands to their precision (see
/// moe.grouped_mlp_backward's gemm_type).
struct GemmRecipe {
  Type gemmType; // null: operands used as they are
  ScaleMode mode = ScaleMode::rceil;

  bool isBF16() const { return gemmType && gemmType.isBF16(); }
  bool isOperand(Value operand, Value source, unsigned axis) const {
    return isGemmOperandOf(operand, source, gemmType, axis, mode);
  }
  /// The value `operand` was brought from: the input of its quantize or
  /// bf16 rounding, or `operand` itself (no conversion, or a bf16 recipe
  /// operand that was not f32). Checked afterwards with isOperand.
  Value sourceOf(Value operand) const {
    if (!gemmType)
      return operand;
    if (isMXElementType(gemmType)) {
      auto q = operand.getDefiningOp<QuantizeOp>();
      return q ? q.getInput() : Value();
    }
    if (Value in = getRoundToBF16Input(operand))
      return in;
    return operand;
  }
};

/// Whether `user` converts `v` for a GEMM (quantize or bf16 rounding).
bool isConversionOf(Operation *user, Value v) {
  if (auto q = dyn_cast<QuantizeOp>(user))
    return q.getInput() == v;
  return isa<linalg::GenericOp>(user) && user->getNumResults() == 1 &&
         getRoundToBF16Input(user->getResult(0)) == v;
}

/// The uses of `v` by ops other than its conversions, and the uses of its
/// conversions.
SmallVector<OpOperand *> gemmUses(Value v) {
  SmallVector<OpOperand *> uses;
  for (OpOperand &use : v.getUses()) {
    if (!isConversionOf(use.getOwner(), v)) {
      uses.push_back(&use);
      continue;
    }
    for (OpOperand &use2 : use.getOwner()->getResult(0).getUses())
      uses.push_back(&use2);
  }
  return uses;
}

/// Matches, rooted at the SwiGLU gradient, the backward of one expert MLP:
///   h   = grouped_matmul(Q(x, 1), Q(w1, 1), off) : f32
///   da  = grouped_matmul(Q(dy, 1), Q(w2, 2), off) transpose_rhs : f32
///   dh  = swiglu_grad(h, da) {layout} : f32
///   dx  = grouped_matmul(Q(dh, 1), Q(w1, 2), off) transpose_rhs
///   dw1 = grouped_matmul_wgrad(Q(x, 0), Q(dh, 0), off)
///   dw2 = grouped_matmul_wgrad(Q(a, 0), Q(dy, 0), off), a = swiglu(h) {layout}
/// with one Q for all (none, bf16 rounding, or one MX type and scale mode;
/// read off how dh feeds dx) and replaces dx, dw1, dw2 by
/// grouped_mlp_backward(x, w1, w2, off, dy) {layout, gemm_type, scale}: its
/// definition, so the same bits. da and dh feed nothing else (they are not
/// materialized any more); h and a may have other users (the forward pass),
/// which keep them: the fused op recomputes its own.
struct FuseGroupedMlpBackward : OpRewritePattern<SwigluGradOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(SwigluGradOp sg,
                                PatternRewriter &rewriter) const override {
    Value h = sg.getInput(), da = sg.getGrad(), dh = sg.getResult();
    SwigluLayout layout = sg.getLayout();
    if (!isF32Tensor(h) || !isF32Tensor(da) || !isF32Tensor(dh) ||
        !da.hasOneUse())
      return failure();
    auto g1 = h.getDefiningOp<GroupedMatmulOp>();
    auto gda = da.getDefiningOp<GroupedMatmulOp>();
    if (!g1 || g1.getTransposeRhs() || !gda || !gda.getTransposeRhs())
      return failure();
    Value off = g1.getOffsets();

    // dh feeds exactly the data-gradient GEMM (as lhs) and the w1 gradient
    // (as rhs), directly or through its conversions.
    GroupedMatmulOp gdx;
    GroupedMatmulWgradOp gdw1;
    SmallVector<OpOperand *> dhUses = gemmUses(dh);
    if (dhUses.size() != 2)
      return failure();
    for (OpOperand *use : dhUses) {
      Operation *user = use->getOwner();
      if (auto g = dyn_cast<GroupedMatmulOp>(user);
          g && !gdx && use->getOperandNumber() == 0 && g.getTransposeRhs())
        gdx = g;
      else if (auto w = dyn_cast<GroupedMatmulWgradOp>(user);
               w && !gdw1 && use->getOperandNumber() == 1)
        gdw1 = w;
      else
        return failure();
    }
    if (!gdx || !gdw1)
      return failure();

    // The recipe, read off dx's lhs; everything else must agree with it.
    GemmRecipe recipe;
    if (auto q = gdx.getLhs().getDefiningOp<QuantizeOp>()) {
      // The fused backward quantizes to MX only.
      auto mx = dyn_cast<MXTensorType>(q.getType());
      if (!mx)
        return failure();
      recipe.gemmType = mx.getElementType();
      recipe.mode = q.getScaleMode();
    } else if (getRoundToBF16Input(gdx.getLhs())) {
      recipe.gemmType = rewriter.getBF16Type();
    }
    Value x = recipe.sourceOf(g1.getLhs());
    Value w1 = recipe.sourceOf(g1.getRhs());
    Value dy = recipe.sourceOf(gda.getLhs());
    Value w2 = recipe.sourceOf(gda.getRhs());
    for (Value v : {x, w1, w2, dy})
      if (!v || !isa<RankedTensorType>(v.getType()))
        return failure();
    if (!recipe.isOperand(g1.getLhs(), x, 1) ||
        !recipe.isOperand(g1.getRhs(), w1, 1) ||
        !recipe.isOperand(gda.getLhs(), dy, 1) ||
        !recipe.isOperand(gda.getRhs(), w2, 2) ||
        !recipe.isOperand(gdx.getLhs(), dh, 1) ||
        !recipe.isOperand(gdx.getRhs(), w1, 2) ||
        !recipe.isOperand(gdw1.getLhs(), x, 0) ||
        !recipe.isOperand(gdw1.getRhs(), dh, 0) || gda.getOffsets() != off ||
        gdx.getOffsets() != off || gdw1.getOffsets() != off)
      return failure();
    // The op needs the gate/up width statically (so does swiglu_grad).
    if (ShapedType::isDynamic(
            cast<RankedTensorType>(w1.getType()).getDimSize(2)))
      return failure();

    // The w2 gradient: wgrad(Q(a, 0), Q(dy, 0)) with a = swiglu(h) of the
    // definition (f32 before an MX quantize, bf16 under bf16, else w2's
    // element type).
    Type aElt = isMXElementType(recipe.gemmType)
                    ? rewriter.getF32Type()
                    : cast<RankedTensorType>(w2.getType()).getElementType();
    GroupedMatmulWgradOp gdw2;
    for (Operation *user : h.getUsers()) {
      auto s = dyn_cast<SwigluOp>(user);
      // Under bf16, a bf16 SwiGLU is the rounded f32 one (it rounds once).
      Type sElt = s ? s.getType().getElementType() : Type();
      if (!s || s.getLayout() != layout ||
          (sElt != aElt && !(recipe.isBF16() && sElt.isBF16())))
        continue;
      for (OpOperand *use : gemmUses(s.getResult())) {
        auto w = dyn_cast<GroupedMatmulWgradOp>(use->getOwner());
        if (w && use->getOperandNumber() == 0 &&
            recipe.isOperand(w.getLhs(), s.getResult(), 0) &&
            recipe.isOperand(w.getRhs(), dy, 0) && w.getOffsets() == off) {
          gdw2 = w;
          break;
        }
      }
      if (gdw2)
        break;
    }
    if (!gdw2)
      return failure();

    // The fused op replaces three ops: it goes before the first of them, in
    // their block, where its operands must already be defined.
    Block *block = sg->getBlock();
    for (Operation *op :
         {g1.getOperation(), gda.getOperation(), gdx.getOperation(),
          gdw1.getOperation(), gdw2.getOperation()})
      if (op->getBlock() != block)
        return failure();
    Operation *first = gdx;
    for (Operation *op : {gdw1.getOperation(), gdw2.getOperation()})
      if (op->isBeforeInBlock(first))
        first = op;
    DominanceInfo dom(block->getParentOp());
    for (Value v : {x, w1, w2, dy, off})
      if (!dom.properlyDominates(v, first))
        return failure();

    rewriter.setInsertionPoint(first);
    auto fused = GroupedMlpBackwardOp::create(
        rewriter, sg.getLoc(),
        TypeRange{gdx.getType(), gdw1.getType(), gdw2.getType()}, x, w1, w2,
        off, dy, layout, recipe.mode,
        recipe.gemmType ? TypeAttr::get(recipe.gemmType) : TypeAttr());
    copyLayer(g1, fused);
    rewriter.replaceOp(gdx, fused.getDx());
    rewriter.replaceOp(gdw1, fused.getDw1());
    rewriter.replaceOp(gdw2, fused.getDw2());
    return success();
  }
};

struct MoEFuseGroupedMlpPass
    : moe::impl::MoEFuseGroupedMlpBase<MoEFuseGroupedMlpPass> {
  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    // Only these rewrites (and erasing what they leave dead): no folding.
    GreedyRewriteConfig config;
    config.enableFolding(false)
        .enableConstantCSE(false)
        .setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
    // Backward first: until it is fused, h and the activation also feed the
    // backward, which keeps the forward from fusing.
    RewritePatternSet backward(ctx);
    backward.add<FuseGroupedMlpBackward>(ctx);
    RewritePatternSet forward(ctx);
    forward.add<FuseGroupedMlpForward>(ctx);
    if (failed(applyPatternsGreedily(getOperation(), std::move(backward),
                                     config)) ||
        failed(
            applyPatternsGreedily(getOperation(), std::move(forward), config)))
      signalPassFailure();
  }
};

} // namespace
