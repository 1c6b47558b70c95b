//===- FuseElementwise.cpp - one kernel for an elementwise chain ----------===//
//
// On GPUs every linalg op becomes a kernel and a pass through memory. An
// elementwise producer whose result has one use is fused into its consumer
// (linalg's elementwise fusion): quantizing a GEMM operand to MX and
// dequantizing it to bf16 becomes one f32 -> bf16 pass, the 8-bit tensor
// between them never written. Only reads that take every produced element
// once are fused (a broadcasting read would recompute the producer per
// reader), only ops of static shapes (the live rows of an expert
// computation, sized on the device, stay as they are), and reshapes are left
// alone (folding them into generics would create tensors sized on the
// host). A gather of a cheap elementwise result used only there computes the
// elements it reads instead (FuseIntoExtract). Rounding a widened tensor back
// to its own type is the tensor itself (DropRoundTrip). A fusion that would
// raise the block's peak of live tensors is not made (raisesPeak), nor one
// whose kernel would take more parameters than PTX allows.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/Utils/TensorLiveness.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUFUSEELEMENTWISE
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

bool staticShapes(Operation *op) {
  auto isStatic = [](Type t) {
    auto shaped = dyn_cast<ShapedType>(t);
    return !shaped || shaped.hasStaticShape();
  };
  return llvm::all_of(op->getOperandTypes(), isStatic) &&
         llvm::all_of(op->getResultTypes(), isStatic);
}

/// Whether moving `producer`'s reads to `consumer` (which fusing does: the
/// fused op runs where the consumer ran) raises the most tensor bytes its
/// block holds at once while the ops between them run. The values it reads
/// (operands and values its body uses) live on to the consumer; its own
/// result is never made. The fused op itself is not counted: reading the
/// inputs of a quantization instead of its 8-bit result is what fusing it
/// into its dequantization is for. A combine fused into the rounding of its
/// sum that the backward runs last would otherwise hold the expert rows'
/// gradients, [tokens x top-k, hidden] in f32, across the weight-gradient
/// GEMMs that -moe-place-weight-gradients put after it to keep them apart.
bool raisesPeak(Operation *producer, Operation *consumer) {
  Block *block = producer->getBlock();
  if (consumer->getBlock() != block || !producer->isBeforeInBlock(consumer))
    return false;
  moe::BlockLiveness live(*block);
  int64_t before = live.peak();
  unsigned p = live.position(producer), c = live.position(consumer);
  // The buffers of the block it reads (not the caller's arguments, nor a
  // reshape of one), each made live on to the consumer.
  llvm::SmallDenseSet<Value> read;
  producer->walk([&](Operation *inner) {
    for (Value v : inner->getOperands())
      read.insert(moe::bufferOf(v));
  });
  for (Value v : read)
    if (std::optional<unsigned> last = live.lastUse(v); last && *last < c)
      live.add(*last + 1, c, moe::tensorBytes(v));
  // Its result, where it is a buffer of its own (not written into one the
  // block holds anyway).
  for (Value r : producer->getResults())
    if (moe::bufferOf(r) == r)
      live.add(p, c, -moe::tensorBytes(r));
  return live.peak() > before;
}

/// Whether the op fusing `producer` into `consumer` would take more buffers
/// than a kernel's parameters hold: each is a memref descriptor of
/// (3 + 2 x rank) words, and PTX ISA below 8.1 allows 4352 bytes in all
/// (a sum of a thousand 0-d tensors, fused one by one, would not compile).
bool exceedsKernelParameters(Operation *producer, Operation *consumer) {
  constexpr int64_t kMaxParameterBytes = 4096;
  int64_t bytes = 0;
  auto add = [&](ValueRange values) {
    for (Value v : values)
      if (auto shaped = dyn_cast<ShapedType>(v.getType()))
        bytes += (3 + 2 * shaped.getRank()) * 8;
  };
  add(producer->getOperands());
  add(consumer->getOperands());
  return bytes > kMaxParameterBytes;
}

/// Fuses into a generic the single-use, static-shape generic producing one of
/// its inputs (linalg::fuseElementwiseOps, which also checks the maps).
/// Only this: the other patterns of linalg's elementwise fusion would also
/// replace unread `outs` with new tensors, dropping the storage the live-row
/// lowering computes into.
struct FuseProducer : OpRewritePattern<linalg::GenericOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(linalg::GenericOp consumer,
                                PatternRewriter &rewriter) const override {
    if (!staticShapes(consumer))
      return failure();
    for (OpOperand *operand : consumer.getDpsInputOperands()) {
      auto producer = operand->get().getDefiningOp<linalg::GenericOp>();
      // In the same region: fused into a loop's body, a producer outside
      // the loop would be recomputed on every iteration.
      if (!producer || !producer->hasOneUse() || !staticShapes(producer) ||
          producer->getParentRegion() != consumer->getParentRegion() ||
          !linalg::areElementwiseOpsFusable(operand))
        continue;
      // Each produced element read by exactly one consumer iteration: a
      // broadcasting read (a row's source index read by every element of
      // the row) would recompute the producer's body that many times.
      // (Checked before the peak, which takes a pass over the block.)
      auto result = cast<OpResult>(operand->get());
      if (!consumer.getMatchingIndexingMap(operand).isPermutation() ||
          !producer.getIndexingMapMatchingResult(result).isPermutation() ||
          exceedsKernelParameters(producer, consumer) ||
          raisesPeak(producer, consumer))
        continue;
      FailureOr<linalg::ElementwiseOpFusionResult> fused =
          linalg::fuseElementwiseOps(rewriter, operand);
      if (failed(fused))
        continue;
      for (auto [original, replacement] : fused->replacements)
        rewriter.replaceAllUsesExcept(original, replacement, fused->fusedOp);
      rewriter.eraseOp(consumer);
      return success();
    }
    return failure();
  }
};

/// A gather (a generic reading `tensor.extract %p[...]`, or of a
/// collapse_shape of %p) of a cheap all-parallel generic's result %p, used
/// nowhere else: the extract becomes the producer's body computed at that
/// index from extracts of its inputs, so %p is never materialized. (The
/// combine's gradient, weights[t, k] * grad[t] over [T, K, H], re-sorted by
/// the backward dispatch, was written and read once, 2 x 537 MB at 8192
/// tokens.) Each element of %p computed as often as it is read: only
/// producers of at most two inputs and a few ops (no loops), whose inputs
/// are no larger than their result.
struct FuseIntoExtract : OpRewritePattern<tensor::ExtractOp> {
  using OpRewritePattern::OpRewritePattern;
  static constexpr int64_t kMaxBodyOps = 8;

  LogicalResult matchAndRewrite(tensor::ExtractOp extract,
                                PatternRewriter &rewriter) const override {
    auto consumer = extract->getParentOfType<linalg::GenericOp>();
    if (!consumer)
      return failure();
    Value source = extract.getTensor();
    SmallVector<Value> at(extract.getIndices());
    Location loc = extract.getLoc();
    auto collapse = source.getDefiningOp<tensor::CollapseShapeOp>();
    if (collapse) {
      if (!collapse->hasOneUse() || !collapse.getSrcType().hasStaticShape())
        return failure();
      source = collapse.getSrc();
    }
    auto producer = source.getDefiningOp<linalg::GenericOp>();
    if (!producer || producer->getNumResults() != 1 || !producer->hasOneUse() ||
        !staticShapes(producer) ||
        producer->getParentRegion() != consumer->getParentRegion() ||
        producer.getNumParallelLoops() != producer.getNumLoops() ||
        producer.getNumDpsInputs() > 2 ||
        !producer.getIndexingMapMatchingResult(producer->getResult(0))
             .isIdentity() ||
        producer.getBody()->getOperations().size() > kMaxBodyOps ||
        !producer.getRegionOutputArgs()[0].use_empty())
      return failure();
    // A loop in the body is not a few ops (an index found by a scan).
    if (llvm::any_of(producer.getBody()->getOperations(),
                     [](Operation &op) { return op.getNumRegions() != 0; }))
      return failure();
    auto resultType = cast<RankedTensorType>(producer->getResultTypes()[0]);
    for (OpOperand *input : producer.getDpsInputOperands()) {
      auto type = dyn_cast<RankedTensorType>(input->get().getType());
      if (!type ||
          !producer.getMatchingIndexingMap(input).isProjectedPermutation() ||
          type.getNumElements() > resultType.getNumElements())
        return failure();
    }
    if (producer.getBody()
            ->walk([](Operation *op) {
              return op->getNumRegions() ? WalkResult::interrupt()
                                         : WalkResult::advance();
            })
            .wasInterrupted())
      return failure();
    if (raisesPeak(producer, consumer))
      return failure();

    rewriter.setInsertionPoint(extract);
    // Indices into the producer's result: a collapsed index delinearized
    // over the static sizes of its group.
    if (collapse) {
      SmallVector<Value> expanded;
      ArrayRef<int64_t> sizes = collapse.getSrcType().getShape();
      for (auto [group, index] :
           llvm::zip(collapse.getReassociationIndices(), at)) {
        Value rest = index;
        SmallVector<Value> parts(group.size());
        for (int64_t i = int64_t(group.size()) - 1; i >= 0; --i) {
          if (i == 0) {
            parts[i] = rest;
            break;
          }
          Value size =
              arith::ConstantIndexOp::create(rewriter, loc, sizes[group[i]]);
          parts[i] = arith::RemUIOp::create(rewriter, loc, rest, size);
          rest = arith::DivUIOp::create(rewriter, loc, rest, size);
        }
        expanded.append(parts);
      }
      at = expanded;
    }
    IRMapping map;
    Block *body = producer.getBody();
    for (OpOperand *input : producer.getDpsInputOperands()) {
      AffineMap m = producer.getMatchingIndexingMap(input);
      SmallVector<Value> indices;
      for (unsigned r = 0; r < m.getNumResults(); ++r)
        indices.push_back(at[m.getDimPosition(r)]);
      Value v = tensor::ExtractOp::create(rewriter, loc, input->get(), indices);
      map.map(body->getArgument(input->getOperandNumber()), v);
    }
    for (Operation &op : body->without_terminator()) {
      if (auto index = dyn_cast<linalg::IndexOp>(op)) {
        map.map(index.getResult(), at[index.getDim()]);
        continue;
      }
      rewriter.clone(op, map);
    }
    Value value = map.lookupOrDefault(
        cast<linalg::YieldOp>(body->getTerminator()).getOperand(0));
    rewriter.replaceOp(extract, value);
    if (collapse)
      rewriter.eraseOp(collapse);
    rewriter.eraseOp(producer);
    return success();
  }
};

/// The one op of an all-parallel, identity-map generic with one input and
/// one output whose body applies one op of type OpTy to its input, or null.
template <typename OpTy> OpTy singleCast(linalg::GenericOp g) {
  if (!g || g.getNumDpsInputs() != 1 || g.getNumDpsInits() != 1 ||
      g.getNumParallelLoops() != g.getNumLoops() ||
      !llvm::all_of(g.getIndexingMapsArray(),
                    [](AffineMap m) { return m.isIdentity(); }))
    return nullptr;
  Block *body = g.getBody();
  if (body->getOperations().size() != 2)
    return nullptr;
  auto op = dyn_cast<OpTy>(body->front());
  auto yield = cast<linalg::YieldOp>(body->getTerminator());
  if (!op || op->getOperand(0) != body->getArgument(0) ||
      yield->getOperand(0) != op->getResult(0))
    return nullptr;
  return op;
}

/// Rounding a widened tensor back to its own type gives the tensor itself:
/// truncf(extf(x)) == x elementwise for any x (a bf16 argument widened to
/// f32 and rounded to bf16 for a GEMM, as the bf16 recipe does to a bf16
/// weight). The rounding pass then reads nothing: the GEMM reads x.
struct DropRoundTrip : OpRewritePattern<linalg::GenericOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(linalg::GenericOp round,
                                PatternRewriter &rewriter) const override {
    if (!singleCast<arith::TruncFOp>(round))
      return failure();
    Value wide = round.getDpsInputOperand(0)->get();
    Value narrow;
    if (auto ext = wide.getDefiningOp<arith::ExtFOp>())
      narrow = ext.getIn();
    else if (auto g = wide.getDefiningOp<linalg::GenericOp>();
             g && singleCast<arith::ExtFOp>(g))
      narrow = g.getDpsInputOperand(0)->get();
    if (!narrow || narrow.getType() != round.getResult(0).getType())
      return failure();
    rewriter.replaceOp(round, narrow);
    return success();
  }
};

struct MoEGPUFuseElementwisePass
    : moe::impl::MoEGPUFuseElementwiseBase<MoEGPUFuseElementwisePass> {
  using MoEGPUFuseElementwiseBase::MoEGPUFuseElementwiseBase;

  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    RewritePatternSet patterns(ctx);
    patterns.add<FuseProducer, FuseIntoExtract>(ctx);
    patterns.add<DropRoundTrip>(ctx, /*benefit=*/2);
    // Fusion leaves expand_shape(collapse_shape(x)) pairs between what it
    // fuses; these fold away.
    tensor::ExpandShapeOp::getCanonicalizationPatterns(patterns, ctx);
    tensor::CollapseShapeOp::getCanonicalizationPatterns(patterns, ctx);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
  }
};

} // namespace
