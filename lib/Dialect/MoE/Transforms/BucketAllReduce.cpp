//===- BucketAllReduce.cpp - sums of many tensors as sums of buckets ------===//
//
// The shard.all_reduce sums a function returns (the data-parallel gradients
// -moe-expert-parallel sums) become the sums of a few buckets: in the order
// their inputs are computed, up to `bucket-mib` of each grid, axes and
// element type are flattened into one tensor right after the last of them
// is computed, summed once, and sliced back. Once -convert-moe-to-runtime
// has split each sum into a start and a wait, a bucket's sum travels while
// the rest of the backward computes.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEBUCKETALLREDUCE
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// Where a sum's input is ready in `block`: its defining op, or null for
/// the block's start (an argument, or a value from outside).
Operation *readyAt(shard::AllReduceOp op, Block *block) {
  Operation *def = op.getInput().getDefiningOp();
  return def ? block->findAncestorOpInBlock(*def) : nullptr;
}

bool before(Operation *a, Operation *b) {
  if (!a)
    return b != nullptr;
  return b && a->isBeforeInBlock(b);
}

/// `v` (a static tensor) as a 1-d tensor.
Value flatten(OpBuilder &b, Location loc, Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  auto flat = RankedTensorType::get({t.getNumElements()}, t.getElementType());
  if (t.getRank() == 1)
    return v;
  if (t.getRank() == 0)
    return tensor::ExpandShapeOp::create(
        b, loc, flat, v, ArrayRef<ReassociationIndices>{},
        ArrayRef<OpFoldResult>{b.getIndexAttr(1)});
  ReassociationIndices all =
      llvm::to_vector(llvm::seq<int64_t>(0, t.getRank()));
  return tensor::CollapseShapeOp::create(b, loc, v,
                                         ArrayRef<ReassociationIndices>{all});
}

/// The 1-d tensor `v` in the shape `t`.
Value unflatten(OpBuilder &b, Location loc, Value v, RankedTensorType t) {
  if (t.getRank() == 1)
    return v;
  if (t.getRank() == 0)
    return tensor::CollapseShapeOp::create(b, loc, t, v,
                                           ArrayRef<ReassociationIndices>{});
  ReassociationIndices all =
      llvm::to_vector(llvm::seq<int64_t>(0, t.getRank()));
  return tensor::ExpandShapeOp::create(b, loc, t, v,
                                       ArrayRef<ReassociationIndices>{all});
}

struct MoEBucketAllReducePass
    : moe::impl::MoEBucketAllReduceBase<MoEBucketAllReducePass> {
  using MoEBucketAllReduceBase::MoEBucketAllReduceBase;

  /// One sum of several: the members' inputs flattened and placed one after
  /// another, after the last of them is computed.
  void emit(ArrayRef<shard::AllReduceOp> bucket, Block *block) {
    Operation *last = nullptr;
    for (shard::AllReduceOp op : bucket)
      if (before(last, readyAt(op, block)))
        last = readyAt(op, block);
    OpBuilder b(block, block->begin());
    if (last)
      b.setInsertionPointAfter(last);
    shard::AllReduceOp first = bucket.front();
    Location loc = first.getLoc();
    auto elt = cast<RankedTensorType>(first.getType()).getElementType();
    int64_t total = 0;
    for (shard::AllReduceOp op : bucket)
      total += cast<RankedTensorType>(op.getType()).getNumElements();
    auto bucketType = RankedTensorType::get({total}, elt);
    Value joined = tensor::EmptyOp::create(b, loc, bucketType.getShape(), elt);
    int64_t at = 0;
    for (shard::AllReduceOp op : bucket) {
      Value part = flatten(b, loc, op.getInput());
      int64_t n = cast<RankedTensorType>(part.getType()).getDimSize(0);
      joined = tensor::InsertSliceOp::create(
          b, loc, part, joined, ArrayRef<OpFoldResult>{b.getIndexAttr(at)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(n)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1)});
      at += n;
    }
    Value sum = shard::AllReduceOp::create(
                    b, loc, joined, first.getGridAttr().getValue(),
                    first.getGridAxes(), shard::ReductionKind::Sum)
                    .getResult();
    at = 0;
    for (shard::AllReduceOp op : bucket) {
      auto t = cast<RankedTensorType>(op.getType());
      int64_t n = t.getNumElements();
      Value part = tensor::ExtractSliceOp::create(
          b, op.getLoc(), RankedTensorType::get({n}, elt), sum,
          ArrayRef<OpFoldResult>{b.getIndexAttr(at)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(n)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1)});
      op.getResult().replaceAllUsesWith(unflatten(b, op.getLoc(), part, t));
      at += n;
    }
    // (Erased last: the builder inserts before the op after `last`, which
    // may be one of them.)
    for (shard::AllReduceOp op : bucket)
      op.erase();
  }

  void runOnOperation() override {
    if (bucketMiB < 0) {
      getOperation().emitError("-moe-bucket-all-reduce: bucket-mib must be "
                               "0 or more, got ")
          << int64_t(bucketMiB);
      return signalPassFailure();
    }
    if (bucketMiB == 0)
      return; // one sum per tensor
    const int64_t limit = int64_t(bucketMiB) << 20;
    for (Block &block : getOperation().getBody()) {
      Operation *terminator = block.getTerminator();
      // The sums whose only readers are the block's terminator, in the
      // order their inputs are ready, by grid, axes and element type.
      SmallVector<shard::AllReduceOp> sums;
      for (Operation &op : block) {
        auto sum = dyn_cast<shard::AllReduceOp>(op);
        if (!sum || sum.getReduction() != shard::ReductionKind::Sum)
          continue;
        auto in = dyn_cast<RankedTensorType>(sum.getInput().getType());
        auto out = dyn_cast<RankedTensorType>(sum.getType());
        if (!in || !out || !in.hasStaticShape() ||
            in.getElementType() != out.getElementType() ||
            !llvm::all_of(sum->getUsers(),
                          [&](Operation *u) { return u == terminator; }))
          continue;
        sums.push_back(sum);
      }
      llvm::stable_sort(sums, [&](shard::AllReduceOp a, shard::AllReduceOp b) {
        return before(readyAt(a, &block), readyAt(b, &block));
      });
      // The bucket being filled for each grid, axes and element type.
      struct Filling {
        SmallVector<shard::AllReduceOp> sums;
        int64_t bytes = 0;
      };
      llvm::MapVector<std::tuple<StringRef, ArrayRef<int16_t>, Type>, Filling>
          open;
      SmallVector<SmallVector<shard::AllReduceOp>> buckets;
      for (shard::AllReduceOp sum : sums) {
        auto t = cast<RankedTensorType>(sum.getType());
        Filling &f =
            open[std::make_tuple(sum.getGridAttr().getValue(),
                                 sum.getGridAxes(), t.getElementType())];
        f.sums.push_back(sum);
        f.bytes += t.getNumElements() * int64_t(t.getElementTypeBitWidth() / 8);
        if (f.bytes >= limit) {
          buckets.push_back(std::move(f.sums));
          f = Filling();
        }
      }
      for (auto &[key, f] : open)
        if (!f.sums.empty())
          buckets.push_back(std::move(f.sums));
      for (SmallVector<shard::AllReduceOp> &bucket : buckets)
        if (bucket.size() > 1)
          emit(bucket, &block);
    }
  }
};

} // namespace
