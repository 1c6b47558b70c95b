//===- ChunkLoss.cpp - the LM head and its loss in chunks of tokens -------===//
//
// -moe-chunk-loss: a train step's LM head (a one-group moe.grouped_matmul
// over all N tokens), its moe.cross_entropy and the backward of both (the
// logits' gradient and the two GEMMs that read it) become the same ops on
// chunks of `rows` tokens, so that no [N, V] tensor (the logits, their
// gradient) is held: each chunk's logits and gradient are freed before the
// next chunk's are made. See the pass description in Passes.td.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/CountedRows.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOECHUNKLOSS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

constexpr int64_t kMaxChunks = 64;

/// The LM head and loss of a train step, as -moe-autodiff derives them.
struct LossHead {
  GroupedMatmulOp logits;          ///< h [N, H] x w [1, H, V]
  CrossEntropyOp loss;             ///< of the logits
  CrossEntropyGradOp grad;         ///< of the logits
  GroupedMatmulOp dataGrad;        ///< grad x w^T (or null)
  GroupedMatmulWgradOp weightGrad; ///< h^T x grad (or null)
  /// Ops between the loss and its gradient that depend on the loss, in
  /// order: they move after the chunks.
  SmallVector<Operation *> sink;
};

/// The head `grad` belongs to, or why not.
FailureOr<LossHead> matchHead(CrossEntropyGradOp grad, std::string &why) {
  LossHead head;
  head.grad = grad;
  head.logits = grad.getLogits().getDefiningOp<GroupedMatmulOp>();
  if (!head.logits)
    return why = "the logits are not a moe.grouped_matmul", failure();
  if (head.logits.getTransposeRhs())
    return why = "the LM head's weight is read transposed", failure();
  // (Block-scaled operands, after -moe-quantize, are not tensors.)
  auto rhs = dyn_cast<RankedTensorType>(head.logits.getRhs().getType());
  auto lhs = dyn_cast<RankedTensorType>(head.logits.getLhs().getType());
  auto result = dyn_cast<RankedTensorType>(head.logits.getType());
  if (!rhs || !lhs || !result || rhs.getDimSize(0) != 1 ||
      !lhs.hasStaticShape() || !rhs.hasStaticShape() ||
      !result.hasStaticShape() || !isa<FloatType>(lhs.getElementType()) ||
      !isa<FloatType>(rhs.getElementType()))
    return why = "the logits are not one dense GEMM of static float tensors "
                 "(run before -moe-quantize)",
           failure();
  // Offsets [0, N]: every row is in the one group.
  DenseIntElementsAttr offsets;
  if (!matchPattern(head.logits.getOffsets(), m_Constant(&offsets)) ||
      offsets.getNumElements() != 2 ||
      !offsets.getValues<APInt>()[0].isZero() ||
      offsets.getValues<APInt>()[1].getSExtValue() != lhs.getDimSize(0))
    return why = "the LM head's rows are not one group of every row", failure();
  if (!cast<ShapedType>(grad.getType()).getElementType().isF32())
    return why = "the logits' gradient is not f32", failure();
  for (Operation *user : head.logits->getUsers()) {
    if (auto ce = dyn_cast<CrossEntropyOp>(user);
        ce && ce.getLabels() == grad.getLabels() && !head.loss)
      head.loss = ce;
    else if (user != grad.getOperation())
      return why = "the logits have a user other than the loss and its "
                   "gradient",
             failure();
  }
  if (!head.loss)
    return why = "no moe.cross_entropy of the same logits and labels",
           failure();
  if (head.loss->getBlock() != grad->getBlock() ||
      !head.loss->isBeforeInBlock(grad))
    return why = "the loss does not come before its gradient in one block",
           failure();
  // What reads the loss before its gradient (over several ranks, its
  // scaling by the rank's share of the counted rows) moves after the
  // chunks, which compute the loss where the gradient is: every op of the
  // block before the gradient that depends on the loss.
  for (Operation *user : head.loss->getUsers())
    if (user->getBlock() != grad->getBlock())
      return why = "the loss is read in another block", failure();
  llvm::SmallPtrSet<Operation *, 8> dependent = {head.loss.getOperation()};
  for (Operation *op = head.loss->getNextNode(); op != grad.getOperation();
       op = op->getNextNode()) {
    bool reads = false;
    op->walk([&](Operation *inner) {
      for (Value v : inner->getOperands())
        if (Operation *def = v.getDefiningOp(); def && dependent.count(def))
          reads = true;
    });
    if (!reads)
      continue;
    // It moves over the ops after it: only what has no effects.
    if (!isMemoryEffectFree(op))
      return why = "an op with memory effects reads the loss before its "
                   "gradient is computed",
             failure();
    dependent.insert(op);
    head.sink.push_back(op);
  }
  for (Value v : grad->getOperands())
    if (Operation *def = v.getDefiningOp(); def && dependent.count(def))
      return why = "the loss's gradient depends on the loss", failure();
  Value h = head.logits.getLhs(), w = head.logits.getRhs();
  for (Operation *user : grad->getUsers()) {
    if (auto mm = dyn_cast<GroupedMatmulOp>(user);
        mm && !head.dataGrad && mm.getLhs() == grad.getResult() &&
        mm.getRhs() == w && mm.getTransposeRhs() &&
        mm.getOffsets() == head.logits.getOffsets()) {
      head.dataGrad = mm;
      continue;
    }
    if (auto wg = dyn_cast<GroupedMatmulWgradOp>(user);
        wg && !head.weightGrad && wg.getLhs() == h &&
        wg.getRhs() == grad.getResult() &&
        wg.getOffsets() == head.logits.getOffsets()) {
      head.weightGrad = wg;
      continue;
    }
    return why = "the logits' gradient has a user other than the LM head's "
                 "two gradient GEMMs",
           failure();
  }
  return head;
}

struct Builder {
  OpBuilder &b;
  Location loc;

  Type f32() { return b.getF32Type(); }
  /// fn of 0-d f32 tensors, as a 0-d f32 tensor: a one-iteration loop (a
  /// 0-d generic would be host code, and on the GPU these tensors live in
  /// device memory).
  Value scalar(ValueRange inputs,
               function_ref<Value(OpBuilder &, Location, ValueRange)> fn) {
    MLIRContext *ctx = b.getContext();
    Value out = tensor::EmptyOp::create(b, loc, ArrayRef<int64_t>{1}, f32());
    SmallVector<AffineMap> maps(inputs.size(), AffineMap::get(1, 0, {}, ctx));
    maps.push_back(AffineMap::getMultiDimIdentityMap(1, ctx));
    Value one = linalg::GenericOp::create(
                    b, loc, TypeRange{out.getType()}, inputs, out, maps,
                    {utils::IteratorType::parallel},
                    [&](OpBuilder &nb, Location l, ValueRange a) {
                      linalg::YieldOp::create(nb, l, fn(nb, l, a.drop_back()));
                    })
                    .getResult(0);
    return tensor::CollapseShapeOp::create(
        b, loc, RankedTensorType::get({}, f32()), one,
        SmallVector<ReassociationIndices>{});
  }
  /// rows [at, at + n) of `x` (dim 0).
  Value rows(Value x, int64_t at, int64_t n) {
    auto type = cast<RankedTensorType>(x.getType());
    SmallVector<OpFoldResult> offsets(type.getRank(), b.getIndexAttr(0)), sizes,
        strides(type.getRank(), b.getIndexAttr(1));
    offsets[0] = b.getIndexAttr(at);
    for (int64_t d = 0; d < type.getRank(); ++d)
      sizes.push_back(b.getIndexAttr(d == 0 ? n : type.getDimSize(d)));
    return tensor::ExtractSliceOp::create(b, loc, x, offsets, sizes, strides);
  }
};

/// Rewrites `head` in chunks of `chunk` rows, at the position of its
/// gradient (where every operand is defined).
void chunkHead(LossHead &head, int64_t chunk) {
  OpBuilder b(head.grad);
  Location loc = head.grad.getLoc();
  Builder e{b, loc};
  Value h = head.logits.getLhs(), w = head.logits.getRhs(),
        labels = head.grad.getLabels(), g = head.grad.getGrad();
  auto hType = cast<RankedTensorType>(h.getType());
  auto logitsType = cast<RankedTensorType>(head.logits.getType());
  int64_t n = hType.getDimSize(0),
          vocab = cast<RankedTensorType>(w.getType()).getDimSize(2);
  auto offsetsType = cast<RankedTensorType>(head.logits.getOffsets().getType());
  Value count = buildCountedRows(b, loc, labels, vocab);
  auto share = [&](Value part) {
    // part / count: this chunk's share of the counted rows (0 with none).
    return e.scalar(
        {part, count}, [](OpBuilder &nb, Location l, ValueRange a) -> Value {
          Value zero = arith::ConstantOp::create(nb, l, nb.getF32FloatAttr(0));
          Value any = arith::CmpFOp::create(nb, l, arith::CmpFPredicate::OGT,
                                            a[1], zero);
          return arith::SelectOp::create(
              nb, l, any, arith::DivFOp::create(nb, l, a[0], a[1]), zero);
        });
  };
  Value dataGrad, weightGrad, loss;
  if (head.dataGrad) {
    auto type = cast<RankedTensorType>(head.dataGrad.getType());
    dataGrad =
        tensor::EmptyOp::create(b, loc, type.getShape(), type.getElementType());
  }
  for (int64_t at = 0; at < n; at += chunk) {
    int64_t rows = std::min(chunk, n - at);
    Value hc = e.rows(h, at, rows), lc = e.rows(labels, at, rows);
    Value offsets = arith::ConstantOp::create(
        b, loc,
        DenseIntElementsAttr::get(
            offsetsType,
            ArrayRef<APInt>{
                APInt(offsetsType.getElementTypeBitWidth(), 0),
                APInt(offsetsType.getElementTypeBitWidth(), rows)}));
    auto logits = GroupedMatmulOp::create(
        b, loc,
        RankedTensorType::get({rows, vocab}, logitsType.getElementType()), hc,
        w, offsets, /*transpose_rhs=*/false);
    logits->setDiscardableAttrs(head.logits->getDiscardableAttrDictionary());
    // The chunk's mean loss times its share of the counted rows: the
    // chunks' terms add up to the mean over all rows.
    Value s = share(buildCountedRows(b, loc, lc, vocab));
    auto part = CrossEntropyOp::create(b, loc, head.loss.getType(),
                                       logits.getResult(), lc);
    part->setDiscardableAttrs(head.loss->getDiscardableAttrDictionary());
    Value term = e.scalar({part.getResult(), s},
                          [](OpBuilder &nb, Location l, ValueRange a) -> Value {
                            return arith::MulFOp::create(nb, l, a[0], a[1]);
                          });
    loss = loss
               ? e.scalar({loss, term},
                          [](OpBuilder &nb, Location l, ValueRange a) -> Value {
                            return arith::AddFOp::create(nb, l, a[0], a[1]);
                          })
               : term;
    // d(term)/d(logits): the gradient of the chunk's mean times g * share.
    Value gc =
        e.scalar({g, s}, [](OpBuilder &nb, Location l, ValueRange a) -> Value {
          return arith::MulFOp::create(nb, l, a[0], a[1]);
        });
    auto grad = CrossEntropyGradOp::create(
        b, loc, RankedTensorType::get({rows, vocab}, b.getF32Type()),
        logits.getResult(), lc, gc);
    grad->setDiscardableAttrs(head.grad->getDiscardableAttrDictionary());
    if (head.dataGrad) {
      auto type = cast<RankedTensorType>(head.dataGrad.getType());
      auto dh = GroupedMatmulOp::create(
          b, loc,
          RankedTensorType::get({rows, type.getDimSize(1)},
                                type.getElementType()),
          grad.getResult(), w, offsets, /*transpose_rhs=*/true);
      dh->setDiscardableAttrs(head.dataGrad->getDiscardableAttrDictionary());
      SmallVector<OpFoldResult> offs = {b.getIndexAttr(at), b.getIndexAttr(0)},
                                sizes = {b.getIndexAttr(rows),
                                         b.getIndexAttr(type.getDimSize(1))},
                                strides(2, b.getIndexAttr(1));
      dataGrad = tensor::InsertSliceOp::create(b, loc, dh.getResult(), dataGrad,
                                               offs, sizes, strides);
    }
    if (head.weightGrad) {
      auto dw = GroupedMatmulWgradOp::create(b, loc, head.weightGrad.getType(),
                                             hc, grad.getResult(), offsets);
      dw->setDiscardableAttrs(head.weightGrad->getDiscardableAttrDictionary());
      weightGrad =
          weightGrad ? arith::AddFOp::create(b, loc, weightGrad, dw.getResult())
                           .getResult()
                     : dw.getResult();
    }
  }
  if (head.dataGrad) {
    head.dataGrad.getResult().replaceAllUsesWith(dataGrad);
    head.dataGrad->erase();
  }
  if (head.weightGrad) {
    head.weightGrad.getResult().replaceAllUsesWith(weightGrad);
    head.weightGrad->erase();
  }
  head.loss.getResult().replaceAllUsesWith(loss);
  for (Operation *op : head.sink)
    op->moveBefore(head.grad);
  head.grad->erase();
  head.loss->erase();
  head.logits->erase();
}

struct MoEChunkLossPass : moe::impl::MoEChunkLossBase<MoEChunkLossPass> {
  using MoEChunkLossBase::MoEChunkLossBase;
  void runOnOperation() override {
    if (rows < 1) {
      getOperation()->emitError("moe-chunk-loss: rows must be at least 1, got ")
          << int64_t(rows);
      return signalPassFailure();
    }
    SmallVector<CrossEntropyGradOp> grads;
    getOperation()->walk([&](CrossEntropyGradOp op) { grads.push_back(op); });
    for (CrossEntropyGradOp grad : grads) {
      std::string why;
      FailureOr<LossHead> head = matchHead(grad, why);
      if (failed(head)) {
        grad->emitRemark("moe-chunk-loss: not chunked: ") << why;
        continue;
      }
      int64_t n =
          cast<ShapedType>(head->logits.getLhs().getType()).getDimSize(0);
      if (n <= rows)
        continue; // one chunk already
      // Each chunk after the first adds an f32 weight gradient of the LM
      // head's size: more than a few dozen would cost more than they save.
      if ((n + rows - 1) / rows > kMaxChunks) {
        grad->emitError("moe-chunk-loss: rows=")
            << int64_t(rows) << " makes " << (n + rows - 1) / rows
            << " chunks of the " << n << " tokens; at most " << kMaxChunks
            << " (each adds an LM-head-sized weight gradient)";
        return signalPassFailure();
      }
      chunkHead(*head, rows);
    }
  }
};

} // namespace
