//===- Quantize.cpp - -moe-quantize: a training recipe's quantization -----===//
//
// Brings the operands of expert GEMMs to the precision of a training recipe:
// MXFP8 (E4M3 elements, one E8M0 scale per 32 values along the contraction
// dimension), blockwise FP8 (E4M3 elements, one f32 scale per 1 x 128 or
// 128 x 128 tile) or bf16, and attention's inputs to bf16. Every rewrite only
// changes operands (or the recipe attribute of the fused backward op);
// results keep their types.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/WalkPatternRewriteDriver.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEQUANTIZE
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

constexpr StringLiteral kLayerAttr = "moe.layer";
constexpr StringLiteral kDenseAttr = "moe.dense";

/// The precision of a GEMM's operands.
struct Precision {
  /// bf16, or the 8-bit element type (f8E4M3FN).
  Type type;
  /// With an 8-bit type: blockwise FP8 tiles instead of MX blocks.
  bool blockwise = false;
};

/// The tile of a blockwise FP8 operand quantized for a GEMM that contracts
/// dimension `axis`: stacked weights ([E, ., .]) 128 x 128 per expert,
/// others 128 along `axis`.
SmallVector<int64_t> blockwiseTile(int64_t rank, unsigned axis) {
  SmallVector<int64_t> block(rank, 1);
  if (rank >= 3) {
    for (int64_t d = 1; d < rank; ++d)
      block[d] = kFP8BlockTile;
    return block;
  }
  block[axis] = kFP8BlockTile;
  return block;
}

/// What the pass's options say, parsed.
struct Recipe {
  /// Of expert GEMMs, and of dense ones (moe.dense).
  Precision gemm, dense;
  ScaleMode scale;
  /// Blockwise FP8 scales are powers of two.
  bool pow2 = true;
  /// moe.layer values whose GEMMs stay in high precision.
  llvm::DenseSet<int64_t> keptLayers;

  /// The precision of `op`'s operands.
  const Precision &precisionFor(Operation *op) const {
    return op->hasAttr(kDenseAttr) ? dense : gemm;
  }
  bool keeps(Operation *op) const {
    auto layer = op->getAttrOfType<IntegerAttr>(kLayerAttr);
    return layer && keptLayers.contains(layer.getInt());
  }
};

/// One GEMM operand: where it is, the dimension its GEMM contracts (the MX
/// blocks run along it) and how to name that dimension in a warning.
struct OperandSpec {
  OpOperand *operand;
  unsigned axis;
  StringRef what;
};

/// Rewrites the float operands of `op` to the recipe's precision, all of
/// them or none: under MXFP8, a contraction dimension that is dynamic or not
/// a multiple of 32 leaves the GEMM as it is, with a warning. Block-scaled
/// operands (and, under bf16, operands that are not f32) are left alone.
/// Returns whether anything changed.
LogicalResult rewriteOperands(Operation *op, ArrayRef<OperandSpec> specs,
                              const Recipe &recipe, PatternRewriter &rewriter) {
  const Precision &precision = recipe.precisionFor(op);
  Type gemmType = precision.type;
  bool mx = !precision.blockwise && isMXElementType(gemmType);
  SmallVector<const OperandSpec *> todo;
  for (const OperandSpec &spec : specs) {
    auto type = dyn_cast<RankedTensorType>(spec.operand->get().getType());
    if (!type)
      continue; // already block-scaled
    if (precision.blockwise) {
      todo.push_back(&spec); // any size: the last tile may be partial
      continue;
    }
    if (!mx) {
      if (type.getElementType().isF32())
        todo.push_back(&spec);
      continue;
    }
    if (!getMXTypeFor(spec.operand->get(), gemmType, spec.axis)) {
      int64_t size = type.getDimSize(spec.axis);
      InFlightDiagnostic diag = op->emitWarning()
                                << "moe-quantize: '" << op->getName()
                                << "' left in high precision: " << spec.what;
      if (ShapedType::isDynamic(size))
        diag << " is dynamic, an MX block dimension must be static";
      else
        diag << " is " << size << ", not a multiple of the MX block size "
             << kMXBlock;
      return failure();
    }
    todo.push_back(&spec);
  }
  if (todo.empty())
    return failure();
  SmallVector<Value> replacements;
  for (const OperandSpec *spec : todo) {
    Value v = spec->operand->get();
    Value q;
    if (precision.blockwise) {
      auto type = cast<RankedTensorType>(v.getType());
      q = QuantizeOp::create(
          rewriter, op->getLoc(),
          FP8BlockTensorType::get(op->getContext(), type.getShape(), gemmType,
                                  blockwiseTile(type.getRank(), spec->axis),
                                  recipe.pow2),
          v, ScaleMode::rceil);
    } else {
      q = createGemmOperand(rewriter, op->getLoc(), v, gemmType, spec->axis,
                            recipe.scale);
    }
    // The conversion belongs to the GEMM's layer.
    if (Attribute layer = op->getAttr(kLayerAttr))
      q.getDefiningOp()->setAttr(kLayerAttr, layer);
    replacements.push_back(q);
  }
  rewriter.modifyOpInPlace(op, [&] {
    for (auto [spec, q] : llvm::zip(todo, replacements))
      spec->operand->set(q);
  });
  return success();
}

/// grouped_matmul: lhs [R, K] and rhs [E, K, N] (or [E, N, K] with
/// transpose_rhs) contract along K, so both are quantized rowwise along K;
/// the result is, by the op's definition, that of the dequantized operands.
struct QuantizeGroupedMatmul : OpRewritePattern<GroupedMatmulOp> {
  QuantizeGroupedMatmul(MLIRContext *ctx, const Recipe &recipe)
      : OpRewritePattern(ctx), recipe(recipe) {}
  LogicalResult matchAndRewrite(GroupedMatmulOp op,
                                PatternRewriter &rewriter) const override {
    if (recipe.keeps(op))
      return failure();
    bool t = op.getTransposeRhs();
    OperandSpec specs[] = {
        {&op.getLhsMutable(), 1, "lhs dim 1 (K)"},
        {&op.getRhsMutable(), t ? 2u : 1u,
         t ? "rhs dim 2 (K, transpose_rhs)" : "rhs dim 1 (K)"}};
    return rewriteOperands(op, specs, recipe, rewriter);
  }
  const Recipe &recipe;
};

/// grouped_matmul_wgrad contracts each group's rows: both operands are
/// quantized columnwise (axis 0), as the op requires of MX operands.
struct QuantizeGroupedMatmulWgrad : OpRewritePattern<GroupedMatmulWgradOp> {
  QuantizeGroupedMatmulWgrad(MLIRContext *ctx, const Recipe &recipe)
      : OpRewritePattern(ctx), recipe(recipe) {}
  LogicalResult matchAndRewrite(GroupedMatmulWgradOp op,
                                PatternRewriter &rewriter) const override {
    if (recipe.keeps(op))
      return failure();
    OperandSpec specs[] = {{&op.getLhsMutable(), 0, "lhs dim 0 (rows)"},
                           {&op.getRhsMutable(), 0, "rhs dim 0 (rows)"}};
    return rewriteOperands(op, specs, recipe, rewriter);
  }
  const Recipe &recipe;
};

/// attention and attention_grad: f32 query, key, value (and the result's
/// gradient) are rounded to bf16 under either recipe, the precision the
/// flash kernels read; the results stay f32.
template <typename AttentionLike>
struct QuantizeAttention : OpRewritePattern<AttentionLike> {
  QuantizeAttention(MLIRContext *ctx, const Recipe &recipe)
      : OpRewritePattern<AttentionLike>(ctx), recipe(recipe) {}
  LogicalResult matchAndRewrite(AttentionLike op,
                                PatternRewriter &rewriter) const override {
    if (recipe.keeps(op))
      return failure();
    Type bf16 = rewriter.getBF16Type();
    bool changed = false;
    for (OpOperand &operand : op->getOpOperands()) {
      auto type = dyn_cast<RankedTensorType>(operand.get().getType());
      if (!type || !type.getElementType().isF32())
        continue;
      Value rounded = createGemmOperand(rewriter, op.getLoc(), operand.get(),
                                        bf16, /*axis=*/0, recipe.scale);
      if (Attribute layer = op->getAttr(kLayerAttr))
        rounded.getDefiningOp()->setAttr(kLayerAttr, layer);
      rewriter.modifyOpInPlace(op, [&] { operand.set(rounded); });
      changed = true;
    }
    return success(changed);
  }
  const Recipe &recipe;
};

/// grouped_mlp: input, w1 and w2 are quantized along their K dimension
/// (axis 1, what the op requires). A block-scaled w2 makes the op quantize
/// its SwiGLU activation rowwise too (its definition), with the recipe's
/// scale mode; a bf16 w2 makes it round the activation to bf16.
struct QuantizeGroupedMlp : OpRewritePattern<GroupedMlpOp> {
  QuantizeGroupedMlp(MLIRContext *ctx, const Recipe &recipe)
      : OpRewritePattern(ctx), recipe(recipe) {}
  LogicalResult matchAndRewrite(GroupedMlpOp op,
                                PatternRewriter &rewriter) const override {
    if (recipe.keeps(op))
      return failure();
    bool w2WasMX = isa<MXTensorType>(op.getW2().getType());
    OperandSpec specs[] = {{&op.getInputMutable(), 1, "input dim 1 (hidden)"},
                           {&op.getW1Mutable(), 1, "w1 dim 1 (hidden)"},
                           {&op.getW2Mutable(), 1, "w2 dim 1 (ffn)"}};
    if (failed(rewriteOperands(op, specs, recipe, rewriter)))
      return failure();
    const Precision &precision = recipe.precisionFor(op);
    if (!precision.blockwise && isMXElementType(precision.type) && !w2WasMX)
      rewriter.modifyOpInPlace(op, [&] { op.setScaleMode(recipe.scale); });
    return success();
  }
  const Recipe &recipe;
};

/// grouped_mlp_backward quantizes its operands itself (x feeds GEMMs along
/// two dimensions): the recipe becomes its gemm_type. An op that already
/// has one is left alone. Under MXFP8 the rows, hidden, gate/up and output
/// sizes must be multiples of 32 (the op's verifier says so too).
struct QuantizeGroupedMlpBackward : OpRewritePattern<GroupedMlpBackwardOp> {
  QuantizeGroupedMlpBackward(MLIRContext *ctx, const Recipe &recipe)
      : OpRewritePattern(ctx), recipe(recipe) {}
  LogicalResult matchAndRewrite(GroupedMlpBackwardOp op,
                                PatternRewriter &rewriter) const override {
    if (recipe.keeps(op) || op.getGemmType())
      return failure();
    if (isMXElementType(recipe.gemm.type)) {
      // The dimensions its GEMMs contract (see its definition).
      ArrayRef<int64_t> x = op.getX().getType().getShape();
      ArrayRef<int64_t> w1 = op.getW1().getType().getShape();
      ArrayRef<int64_t> w2 = op.getW2().getType().getShape();
      for (auto [what, size] :
           {std::pair<StringRef, int64_t>{"x dim 0 (rows)", x[0]},
            {"x dim 1 (hidden)", x[1]},
            {"w1 dim 2 (gate and up)", w1[2]},
            {"w2 dim 2 (output)", w2[2]}}) {
        if (!ShapedType::isDynamic(size) && size % kMXBlock == 0)
          continue;
        InFlightDiagnostic diag = op->emitWarning()
                                  << "moe-quantize: '" << op->getName()
                                  << "' left in high precision: " << what;
        if (ShapedType::isDynamic(size))
          diag << " is dynamic, an MX block dimension must be static";
        else
          diag << " is " << size << ", not a multiple of the MX block size "
               << kMXBlock;
        return failure();
      }
    }
    rewriter.modifyOpInPlace(op, [&] {
      op.setGemmType(recipe.gemm.type);
      if (isMXElementType(recipe.gemm.type))
        op.setScaleMode(recipe.scale);
    });
    return success();
  }
  const Recipe &recipe;
};

struct MoEQuantizePass : moe::impl::MoEQuantizeBase<MoEQuantizePass> {
  using MoEQuantizeBase::MoEQuantizeBase;

  /// Checks the option values where the pipeline is parsed, so that a bad
  /// one is an error naming the choices, not a crash later.
  LogicalResult initializeOptions(
      StringRef options,
      function_ref<LogicalResult(const Twine &)> errorHandler) override {
    if (failed(MoEQuantizeBase::initializeOptions(options, errorHandler)))
      return failure();
    if (std::optional<std::string> error = checkOptions())
      return errorHandler(*error);
    return success();
  }

  std::optional<std::string> checkOptions() const {
    auto known = [](StringRef name) {
      return name == "mxfp8" || name == "bf16" || name == "fp8-blockwise";
    };
    if (!known(recipe))
      return "moe-quantize: unknown recipe '" + recipe +
             "' (expected 'mxfp8', 'bf16' or 'fp8-blockwise')";
    if (scale != "rceil" && scale != "floor")
      return "moe-quantize: unknown scale '" + scale +
             "' (expected 'rceil' or 'floor')";
    if (blockScales != "pow2" && blockScales != "f32")
      return "moe-quantize: unknown block-scales '" + blockScales +
             "' (expected 'pow2' or 'f32')";
    if (!known(dense))
      return "moe-quantize: unknown dense precision '" + dense +
             "' (expected 'bf16', 'mxfp8' or 'fp8-blockwise')";
    return std::nullopt;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    // Options set from C++ never went through initializeOptions.
    if (std::optional<std::string> error = checkOptions()) {
      module.emitError(*error);
      return signalPassFailure();
    }
    Recipe r;
    auto precisionOf = [&](StringRef name) {
      if (name == "bf16")
        return Precision{BFloat16Type::get(ctx)};
      return Precision{Float8E4M3FNType::get(ctx), name == "fp8-blockwise"};
    };
    r.gemm = precisionOf(recipe);
    r.dense = precisionOf(dense);
    r.scale = scale == "floor" ? ScaleMode::floor : ScaleMode::rceil;
    r.pow2 = blockScales == "pow2";
    r.keptLayers.insert(keepLayers.begin(), keepLayers.end());
    if (keepFirstLast) {
      std::optional<int64_t> lo, hi;
      module.walk([&](Operation *op) {
        if (auto layer = op->getAttrOfType<IntegerAttr>(kLayerAttr)) {
          int64_t l = layer.getInt();
          lo = lo ? std::min(*lo, l) : l;
          hi = hi ? std::max(*hi, l) : l;
        }
      });
      if (lo) {
        r.keptLayers.insert(*lo);
        r.keptLayers.insert(*hi);
      }
    }

    // The fused expert MLPs have no blockwise FP8 form: their grouped GEMMs,
    // quantized below, take their place.
    if (r.gemm.blockwise || r.dense.blockwise) {
      SmallVector<Operation *> fused;
      module.walk([&](Operation *op) {
        if (!r.precisionFor(op).blockwise || r.keeps(op))
          return;
        if (isa<GroupedMlpOp>(op))
          fused.push_back(op);
        auto backward = dyn_cast<GroupedMlpBackwardOp>(op);
        if (backward && !backward.getGemmType())
          fused.push_back(op);
      });
      RewritePatternSet expand(ctx);
      populateExpandGroupedMlpPatterns(expand);
      if (failed(applyOpPatternsGreedily(
              fused, std::move(expand),
              GreedyRewriteConfig().setStrictness(
                  GreedyRewriteStrictness::ExistingOps))))
        return signalPassFailure();
    }

    RewritePatternSet patterns(ctx);
    patterns.add<QuantizeGroupedMatmul, QuantizeGroupedMatmulWgrad,
                 QuantizeGroupedMlp, QuantizeGroupedMlpBackward,
                 QuantizeAttention<AttentionOp>,
                 QuantizeAttention<AttentionGradOp>>(ctx, r);
    // One walk: every GEMM is visited once (a refused one warns once), and
    // the conversions it inserts are not GEMMs.
    walkAndApplyPatterns(module, std::move(patterns));
  }
};

} // namespace
