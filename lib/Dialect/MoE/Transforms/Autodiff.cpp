//===- Autodiff.cpp - reverse-mode differentiation of a loss function -----===//
//
// -moe-autodiff turns a function computing a loss (a 0-d f32 tensor) into a
// train step returning the loss and the gradient of every float argument.
// The forward ops are kept as they are; the backward ops are appended in
// reverse order, one vector-Jacobian product per forward op, from a table of
// rules (the moe ops, their model-level companions, and the upstream ops
// model graphs use: linalg.matmul, linalg.transpose, linalg.softmax,
// elementwise arith/math on tensors, reshapes). Gradients reaching a value
// from several uses are summed. A call of a function (a decoder layer called
// once per layer) becomes a call of the function's forward, which also
// returns the residuals, and its vector-Jacobian product a call of the
// function's backward: each called function is differentiated once.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Transforms/SplitBackward.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/ScopeExit.h"

#include <deque>

namespace mlir::moe {
#define GEN_PASS_DEF_MOEAUTODIFF
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

using utils::IteratorType;

bool isFloatTensor(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  return rt && isa<FloatType>(rt.getElementType());
}

/// The backward pass of one function: adjoints by value, built at the end of
/// the function body.
class Differentiator {
public:
  Differentiator(OpBuilder &b, bool recompute = false)
      : b(b), recompute(recompute) {}

  /// Adds `g` to the adjoint of `v` (nothing for inactive values).
  void accumulate(Value v, Value g) {
    if (!g || !active.contains(v))
      return;
    if (g.getType() != v.getType())
      g = castTo(g, cast<RankedTensorType>(v.getType()));
    auto it = adjoints.find(v);
    if (it == adjoints.end()) {
      adjoints[v] = g;
      return;
    }
    it->second = arith::AddFOp::create(b, g.getLoc(), it->second, g);
  }
  Value adjoint(Value v) const { return adjoints.lookup(v); }

  /// Marks the float values depending on the differentiated arguments.
  void markActive(Block &body, ArrayRef<BlockArgument> wrt) {
    for (BlockArgument a : wrt)
      active.insert(a);
    for (Operation &op : body.without_terminator()) {
      bool any = llvm::any_of(op.getOperands(),
                              [&](Value v) { return active.contains(v); });
      if (!any)
        continue;
      for (Value r : op.getResults())
        if (isFloatTensor(r.getType()))
          active.insert(r);
    }
  }
  bool isActive(Value v) const { return active.contains(v); }

  /// The vector-Jacobian product of `op`: adds its operands' adjoints given
  /// its results'. Fails (with a diagnostic) on an op without a rule.
  LogicalResult backprop(Operation *op);

private:
  OpBuilder &b;
  /// Calls recompute their forward before their backward (recompute).
  bool recompute;
  DenseMap<Value, Value> adjoints;
  llvm::DenseSet<Value> active;

  Location loc(Operation *op) { return op->getLoc(); }

  Value castTo(Value g, RankedTensorType type) {
    auto gt = cast<RankedTensorType>(g.getType());
    if (gt.getElementType() == type.getElementType())
      return g;
    Location l = g.getLoc();
    Value init = tensor::EmptyOp::create(b, l, tensor::getMixedSizes(b, l, g),
                                         type.getElementType());
    int64_t rank = gt.getRank();
    SmallVector<AffineMap> maps(2, b.getMultiDimIdentityMap(rank));
    SmallVector<IteratorType> its(rank, IteratorType::parallel);
    return linalg::GenericOp::create(
               b, l, init.getType(), g, init, maps, its,
               [&](OpBuilder &nb, Location nl, ValueRange a) {
                 // Through f32 (bf16 <-> f16 have the same width).
                 Value v = a[0];
                 Type f32 = nb.getF32Type(), to = type.getElementType();
                 if (!v.getType().isF32())
                   v = arith::ExtFOp::create(nb, nl, f32, v);
                 if (!to.isF32())
                   v = arith::TruncFOp::create(nb, nl, to, v);
                 linalg::YieldOp::create(nb, nl, v);
               })
        .getResult(0);
  }

  /// A tensor shaped like `like` (or of `type`) filled with `value`.
  Value filled(Location l, Value like, Type elt, double value) {
    Value init =
        tensor::EmptyOp::create(b, l, tensor::getMixedSizes(b, l, like), elt);
    Value c = arith::ConstantOp::create(b, l, b.getFloatAttr(elt, value));
    return linalg::FillOp::create(b, l, c, init).getResult(0);
  }
  Value zerosOf(Location l, ArrayRef<OpFoldResult> sizes, Type elt) {
    Value init = tensor::EmptyOp::create(b, l, sizes, elt);
    Value c = arith::ConstantOp::create(b, l, b.getZeroAttr(elt));
    return linalg::FillOp::create(b, l, c, init).getResult(0);
  }

  Value transpose2d(Location l, Value m) {
    auto t = cast<RankedTensorType>(m.getType());
    SmallVector<OpFoldResult> s = tensor::getMixedSizes(b, l, m);
    Value init =
        tensor::EmptyOp::create(b, l, {s[1], s[0]}, t.getElementType());
    return linalg::TransposeOp::create(b, l, m, init, ArrayRef<int64_t>{1, 0})
        .getResult()[0];
  }
  /// a [M, K] @ c [K, N] in f32-accumulating linalg.matmul into zeros of `elt`.
  Value matmul(Location l, Value a, Value c, Type elt) {
    SmallVector<OpFoldResult> sa = tensor::getMixedSizes(b, l, a),
                              sc = tensor::getMixedSizes(b, l, c);
    Value init = zerosOf(l, {sa[0], sc[1]}, elt);
    return linalg::MatmulOp::create(b, l, ValueRange{a, c}, ValueRange{init})
        .getResult(0);
  }

public:
  /// A called function split into forward and backward.
  struct Pullback {
    func::FuncOp forward, backward;
    /// The callee's results (the forward's first results; the rest are
    /// residuals).
    unsigned numOutputs = 0;
    /// Per backward result, the argument it is the gradient of.
    SmallVector<unsigned> gradientOf;
  };
  /// `call` calls `pullback.forward` (or, recomputing, the function it was
  /// split from): its VJP calls `pullback.backward`.
  void addCall(func::CallOp call, const Pullback *pullback) {
    calls[call] = pullback;
  }

private:
  DenseMap<Operation *, const Pullback *> calls;

  LogicalResult callRule(func::CallOp call);
  LogicalResult elementwise(Operation *op, Value g);
  LogicalResult matmulRule(linalg::MatmulOp op, Value g);
  LogicalResult softmaxRule(linalg::SoftmaxOp op, Value g);
  LogicalResult combineRule(CombineOp op, Value g);
};

LogicalResult Differentiator::elementwise(Operation *op, Value g) {
  Location l = loc(op);
  auto neg = [&](Value v) { return arith::NegFOp::create(b, l, v); };
  auto mul = [&](Value x, Value y) {
    return arith::MulFOp::create(b, l, x, y);
  };
  auto div = [&](Value x, Value y) {
    return arith::DivFOp::create(b, l, x, y);
  };
  if (isa<arith::AddFOp>(op)) {
    accumulate(op->getOperand(0), g);
    accumulate(op->getOperand(1), g);
  } else if (isa<arith::SubFOp>(op)) {
    accumulate(op->getOperand(0), g);
    if (isActive(op->getOperand(1)))
      accumulate(op->getOperand(1), neg(g));
  } else if (isa<arith::MulFOp>(op)) {
    Value x = op->getOperand(0), y = op->getOperand(1);
    if (isActive(x))
      accumulate(x, mul(g, y));
    if (isActive(y))
      accumulate(y, mul(g, x));
  } else if (isa<arith::DivFOp>(op)) {
    Value x = op->getOperand(0), y = op->getOperand(1);
    if (isActive(x))
      accumulate(x, div(g, y));
    if (isActive(y)) // d(x / y)/dy = -(x / y) / y
      accumulate(y, neg(div(mul(g, op->getResult(0)), y)));
  } else if (isa<arith::NegFOp>(op)) {
    accumulate(op->getOperand(0), neg(g));
  } else if (isa<arith::ExtFOp, arith::TruncFOp>(op)) {
    // A precision change: the gradient changes back (accumulate casts it
    // to the operand's element type).
    accumulate(op->getOperand(0), g);
  } else if (isa<math::ExpOp>(op)) {
    accumulate(op->getOperand(0), mul(g, op->getResult(0)));
  } else if (isa<math::TanhOp>(op)) {
    Value y = op->getResult(0);
    Value one = filled(l, y, getElementTypeOrSelf(y.getType()), 1.0);
    accumulate(op->getOperand(0),
               mul(g, arith::SubFOp::create(b, l, one, mul(y, y))));
  } else {
    return failure();
  }
  return success();
}

LogicalResult Differentiator::matmulRule(linalg::MatmulOp op, Value g) {
  Location l = loc(op);
  if (op.getIndexingMaps() !=
      b.getAffineMapArrayAttr(
          linalg::MatmulOp::getDefaultIndexingMaps(b.getContext())))
    return op.emitOpError("-moe-autodiff: only the plain A[M, K] @ B[K, N] "
                          "form of linalg.matmul is differentiated");
  Value a = op.getInputs()[0], c = op.getInputs()[1];
  Type elt = getElementTypeOrSelf(op.getResult(0).getType());
  // C_out = C_in + A @ B.
  accumulate(op.getOutputs()[0], g);
  if (isActive(a))
    accumulate(a, matmul(l, g, transpose2d(l, c), elt));
  if (isActive(c))
    accumulate(c, matmul(l, transpose2d(l, a), g, elt));
  return success();
}

LogicalResult Differentiator::softmaxRule(linalg::SoftmaxOp op, Value g) {
  // dx = y * (g - sum_dim(g * y)).
  Location l = loc(op);
  Value y = op.getResult()[0];
  auto type = cast<RankedTensorType>(y.getType());
  int64_t rank = type.getRank(), dim = op.getDimension();
  MLIRContext *ctx = b.getContext();
  SmallVector<AffineExpr> all, reduced;
  SmallVector<OpFoldResult> sizes = tensor::getMixedSizes(b, l, y), rsizes;
  SmallVector<int64_t> rshape;
  for (int64_t i = 0; i < rank; ++i) {
    all.push_back(getAffineDimExpr(i, ctx));
    if (i != dim) {
      reduced.push_back(getAffineDimExpr(i, ctx));
      rsizes.push_back(sizes[i]);
      rshape.push_back(type.getDimSize(i));
    }
  }
  AffineMap full = AffineMap::get(rank, 0, all, ctx);
  AffineMap part = AffineMap::get(rank, 0, reduced, ctx);
  SmallVector<IteratorType> its(rank, IteratorType::parallel);
  its[dim] = IteratorType::reduction;
  Type elt = type.getElementType();
  Value dot =
      linalg::GenericOp::create(
          b, l, RankedTensorType::get(rshape, elt), ValueRange{g, y},
          zerosOf(l, rsizes, elt), ArrayRef<AffineMap>{full, full, part}, its,
          [&](OpBuilder &nb, Location nl, ValueRange a) {
            Value p = arith::MulFOp::create(nb, nl, a[0], a[1]);
            linalg::YieldOp::create(
                nb, nl, ValueRange{arith::AddFOp::create(nb, nl, a[2], p)});
          })
          .getResult(0);
  SmallVector<IteratorType> par(rank, IteratorType::parallel);
  Value init = tensor::EmptyOp::create(b, l, sizes, elt);
  Value dx =
      linalg::GenericOp::create(
          b, l, type, ValueRange{g, y, dot}, init,
          ArrayRef<AffineMap>{full, full, part, full}, par,
          [&](OpBuilder &nb, Location nl, ValueRange a) {
            Value d = arith::SubFOp::create(nb, nl, a[0], a[2]);
            linalg::YieldOp::create(
                nb, nl, ValueRange{arith::MulFOp::create(nb, nl, a[1], d)});
          })
          .getResult(0);
  accumulate(op.getInput(), dx);
  return success();
}

/// out[t] = sum_j w[t, j] y[pos[t, j]]: the expert outputs' gradient is
/// w[t, j] * g[t] placed at row pos[t, j] - the rows (t, j) in token-then-slot
/// order dispatched again with the original indices and attributes (as one
/// slot each) land exactly there; the weights' gradient is moe.combine_grad.
LogicalResult Differentiator::combineRule(CombineOp op, Value g) {
  Location l = loc(op);
  Value y = op.getExpertOut(), w = op.getWeights(), pos = op.getPositions();
  if (isActive(w))
    accumulate(w, CombineGradOp::create(b, l, w.getType(), y, pos, g));
  if (!isActive(y))
    return success();
  auto dispatch = pos.getDefiningOp<DispatchOp>();
  if (!dispatch || dispatch.getPositions() != pos)
    return op.emitOpError(
        "-moe-autodiff: the gradient of the expert outputs needs the "
        "positions of a moe.dispatch in the same function");
  auto wt = cast<RankedTensorType>(w.getType());
  auto yt = cast<RankedTensorType>(y.getType());
  int64_t t = wt.getDimSize(0), k = wt.getDimSize(1), h = yt.getDimSize(1);
  if (ShapedType::isDynamic(t) || ShapedType::isDynamic(k) ||
      ShapedType::isDynamic(h))
    return op.emitOpError("-moe-autodiff: differentiating moe.combine needs "
                          "static token, top_k and row sizes");
  MLIRContext *ctx = b.getContext();
  AffineExpr i, j, c;
  bindDims(ctx, i, j, c);
  Type f32 = b.getF32Type();
  auto scaledType = RankedTensorType::get({t, k, h}, f32);
  Value init = tensor::EmptyOp::create(b, l, scaledType.getShape(), f32);
  Value scaled =
      linalg::GenericOp::create(
          b, l, scaledType, ValueRange{w, g}, init,
          ArrayRef<AffineMap>{AffineMap::get(3, 0, {i, j}, ctx),
                              AffineMap::get(3, 0, {i, c}, ctx),
                              AffineMap::get(3, 0, {i, j, c}, ctx)},
          SmallVector<IteratorType>(3, IteratorType::parallel),
          [&](OpBuilder &nb, Location nl, ValueRange a) {
            Value gv = a[1];
            if (!gv.getType().isF32())
              gv = arith::ExtFOp::create(nb, nl, f32, gv);
            linalg::YieldOp::create(
                nb, nl, ValueRange{arith::MulFOp::create(nb, nl, a[0], gv)});
          })
          .getResult(0);
  auto rowsType = RankedTensorType::get({t * k, h}, f32);
  Value rows = tensor::CollapseShapeOp::create(
      b, l, rowsType, scaled, SmallVector<ReassociationIndices>{{0, 1}, {2}});
  Value idx = dispatch.getIndices();
  auto idxType = cast<RankedTensorType>(idx.getType());
  Value flat = tensor::CollapseShapeOp::create(
      b, l, RankedTensorType::get({t * k}, idxType.getElementType()), idx,
      SmallVector<ReassociationIndices>{{0, 1}});
  Value single = tensor::ExpandShapeOp::create(
      b, l, RankedTensorType::get({t * k, 1}, idxType.getElementType()), flat,
      SmallVector<ReassociationIndices>{{0, 1}});
  auto again = DispatchOp::create(
      b, l, RankedTensorType::get(yt.getShape(), f32),
      dispatch.getOffsets().getType(), dispatch.getCounts().getType(),
      single.getType(), rows, single, dispatch.getNumExpertsAttr(),
      dispatch.getCapacityFactorAttr(), dispatch.getPadToAttr());
  accumulate(y, again.getSorted());
  return success();
}

LogicalResult Differentiator::callRule(func::CallOp call) {
  const Pullback *p = calls.lookup(call);
  if (!p)
    return call.emitOpError("-moe-autodiff: no gradient for this call (only "
                            "calls of functions with a body are "
                            "differentiated)");
  Location l = call.getLoc();
  // backward(args, residuals, cotangents): a cotangent per float output,
  // zeros for those the loss does not read.
  SmallVector<Value> operands(call.getOperands());
  if (recompute) {
    // The residuals made again, here: only the arguments were kept.
    auto again = func::CallOp::create(b, l, p->forward, call.getOperands());
    if (call.getNoInline())
      again.setNoInline(true);
    llvm::append_range(operands, again.getResults().drop_front(p->numOutputs));
  } else {
    llvm::append_range(operands, call.getResults().drop_front(p->numOutputs));
  }
  for (Value r : call.getResults().take_front(p->numOutputs)) {
    if (!isFloatTensor(r.getType()))
      continue;
    Value g = adjoint(r);
    if (!g)
      g = filled(l, r, getElementTypeOrSelf(r.getType()), 0.0);
    operands.push_back(g);
  }
  auto back = func::CallOp::create(b, l, p->backward, operands);
  if (call.getNoInline())
    back.setNoInline(true);
  for (auto [g, arg] : llvm::zip_equal(back.getResults(), p->gradientOf))
    accumulate(call.getOperand(arg), g);
  return success();
}

LogicalResult Differentiator::backprop(Operation *op) {
  // Only the first float result of most ops carries a gradient.
  auto gradOf = [&](unsigned i) { return adjoint(op->getResult(i)); };
  bool any = llvm::any_of(op->getResults(),
                          [&](Value r) { return adjoints.count(r); });
  if (!any)
    return success();
  Location l = loc(op);

  if (isa<arith::AddFOp, arith::SubFOp, arith::MulFOp, arith::DivFOp,
          arith::NegFOp, arith::ExtFOp, arith::TruncFOp, math::ExpOp,
          math::TanhOp>(op)) {
    if (!isa<RankedTensorType>(op->getResult(0).getType()))
      return op->emitOpError("-moe-autodiff: scalar arithmetic that the loss "
                             "depends on must be on tensors");
    return elementwise(op, gradOf(0));
  }
  if (auto call = dyn_cast<func::CallOp>(op))
    return callRule(call);
  if (auto mm = dyn_cast<linalg::MatmulOp>(op))
    return matmulRule(mm, gradOf(0));
  if (auto sm = dyn_cast<linalg::SoftmaxOp>(op))
    return softmaxRule(sm, gradOf(0));
  if (auto tr = dyn_cast<linalg::TransposeOp>(op)) {
    ArrayRef<int64_t> perm = tr.getPermutation();
    SmallVector<int64_t> inverse(perm.size());
    for (auto [i, p] : llvm::enumerate(perm))
      inverse[p] = i;
    Value g = gradOf(0);
    auto it = cast<RankedTensorType>(tr.getInput().getType());
    Value init = tensor::EmptyOp::create(
        b, l, tensor::getMixedSizes(b, l, tr.getInput()), it.getElementType());
    accumulate(
        tr.getInput(),
        linalg::TransposeOp::create(b, l, g, init, inverse).getResult()[0]);
    return success();
  }
  if (auto c = dyn_cast<tensor::CollapseShapeOp>(op)) {
    accumulate(c.getSrc(),
               tensor::ExpandShapeOp::create(
                   b, l, c.getSrcType(), gradOf(0), c.getReassociationIndices(),
                   tensor::getMixedSizes(b, l, c.getSrc())));
    return success();
  }
  if (auto ex = dyn_cast<tensor::ExtractSliceOp>(op)) {
    // The slice's gradient in its place, zeros elsewhere.
    auto st = ex.getSourceType();
    Value z = zerosOf(l, tensor::getMixedSizes(b, l, ex.getSource()),
                      st.getElementType());
    accumulate(ex.getSource(), tensor::InsertSliceOp::create(
                                   b, l, gradOf(0), z, ex.getMixedOffsets(),
                                   ex.getMixedSizes(), ex.getMixedStrides()));
    return success();
  }
  if (auto ins = dyn_cast<tensor::InsertSliceOp>(op)) {
    Value g = gradOf(0);
    // The inserted tensor: its slice of the gradient; the destination: the
    // gradient with that slice zeroed (it was overwritten).
    if (isActive(ins.getSource()))
      accumulate(ins.getSource(),
                 tensor::ExtractSliceOp::create(
                     b, l, ins.getSourceType(), g, ins.getMixedOffsets(),
                     ins.getMixedSizes(), ins.getMixedStrides()));
    if (isActive(ins.getDest())) {
      auto st = ins.getSourceType();
      Value z = zerosOf(l, tensor::getMixedSizes(b, l, ins.getSource()),
                        st.getElementType());
      accumulate(ins.getDest(),
                 tensor::InsertSliceOp::create(
                     b, l, z, g, ins.getMixedOffsets(), ins.getMixedSizes(),
                     ins.getMixedStrides()));
    }
    return success();
  }
  if (auto e = dyn_cast<tensor::ExpandShapeOp>(op)) {
    accumulate(e.getSrc(),
               tensor::CollapseShapeOp::create(b, l, e.getSrcType(), gradOf(0),
                                               e.getReassociationIndices()));
    return success();
  }

  if (auto emb = dyn_cast<EmbeddingOp>(op)) {
    accumulate(emb.getTable(),
               EmbeddingGradOp::create(b, l, emb.getTable().getType(),
                                       emb.getIds(), gradOf(0)));
    return success();
  }
  if (auto n = dyn_cast<RMSNormOp>(op)) {
    auto grad = RMSNormGradOp::create(b, l, n.getInput().getType(),
                                      n.getWeight().getType(), n.getInput(),
                                      n.getWeight(), gradOf(0), n.getEpsAttr());
    accumulate(n.getInput(), grad.getInputGrad());
    accumulate(n.getWeight(), grad.getWeightGrad());
    return success();
  }
  if (auto r = dyn_cast<RotaryOp>(op)) {
    accumulate(r.getInput(),
               RotaryOp::create(b, l, r.getInput().getType(), gradOf(0),
                                r.getThetaAttr(),
                                r.getInverse() ? UnitAttr() : b.getUnitAttr()));
    return success();
  }
  if (auto a = dyn_cast<AttentionOp>(op)) {
    auto grad = AttentionGradOp::create(
        b, l, a.getQuery().getType(), a.getKey().getType(),
        a.getValue().getType(), a.getQuery(), a.getKey(), a.getValue(),
        gradOf(0), a.getDocuments(), a.getCausal(), a.getScaleAttr());
    accumulate(a.getQuery(), grad.getQueryGrad());
    accumulate(a.getKey(), grad.getKeyGrad());
    accumulate(a.getValue(), grad.getValueGrad());
    return success();
  }
  if (auto ce = dyn_cast<CrossEntropyOp>(op)) {
    accumulate(ce.getLogits(), CrossEntropyGradOp::create(
                                   b, l, ce.getLogits().getType(),
                                   ce.getLogits(), ce.getLabels(), gradOf(0)));
    return success();
  }
  if (auto rl = dyn_cast<RouterLossOp>(op)) {
    if (!gradOf(0))
      return success();
    auto grad = RouterLossGradOp::create(
        b, l, rl.getLogits().getTypes(), gradOf(0), rl.getLogits(),
        rl.getCounts(), rl.getAuxCoefAttr(), rl.getZCoefAttr());
    for (auto [logits, g] : llvm::zip(rl.getLogits(), grad.getResults()))
      accumulate(logits, g);
    return success();
  }
  if (auto r = dyn_cast<RouterOp>(op)) {
    accumulate(r.getLogits(),
               RouterGradOp::create(
                   b, l, r.getLogits().getType(), r.getLogits(), r.getIndices(),
                   gradOf(1), r.getTopKAttr(), r.getScoreAttr(),
                   r.getSoftmaxAfterTopkAttr(), r.getNormTopkProbAttr()));
    return success();
  }
  if (isa<DispatchOp, AllToAllOp>(op) &&
      !isa<RankedTensorType>(op->getOperand(0).getType()))
    return op->emitOpError("-moe-autodiff: block-scaled rows have no "
                           "gradient; differentiate before -moe-quantize");
  if (auto d = dyn_cast<DispatchOp>(op)) {
    // x[t] went to rows pos[t, j]: its gradient sums theirs.
    Value g = gradOf(0);
    if (!g)
      return success();
    SmallVector<OpFoldResult> s = tensor::getMixedSizes(b, l, d.getIndices());
    Value init = tensor::EmptyOp::create(b, l, s, b.getF32Type());
    Value one = arith::ConstantOp::create(b, l, b.getF32FloatAttr(1.0));
    Value ones = linalg::FillOp::create(b, l, one, init).getResult(0);
    accumulate(d.getTokens(), CombineOp::create(b, l, d.getTokens().getType(),
                                                g, ones, d.getPositions()));
    return success();
  }
  if (auto c = dyn_cast<CombineOp>(op))
    return combineRule(c, gradOf(0));
  if (auto mm = dyn_cast<GroupedMatmulOp>(op)) {
    if (isa<BlockScaledType>(mm.getLhs().getType()) ||
        isa<BlockScaledType>(mm.getRhs().getType()))
      return op->emitOpError("-moe-autodiff: block-scaled operands have no "
                             "gradient; differentiate before -moe-quantize "
                             "(it quantizes the backward GEMMs too)");
    Value g = gradOf(0), x = mm.getLhs(), w = mm.getRhs(),
          off = mm.getOffsets();
    bool tr = mm.getTransposeRhs();
    // A dense GEMM's (-moe-dense-to-grouped) gradients are dense GEMMs.
    auto likeForward = [&](Operation *grad) {
      if (Attribute dense = op->getAttr("moe.dense"))
        grad->setAttr("moe.dense", dense);
      return grad->getResult(0);
    };
    if (isActive(x))
      accumulate(x, likeForward(GroupedMatmulOp::create(b, l, x.getType(), g, w,
                                                        off, !tr)));
    if (isActive(w))
      accumulate(
          w,
          likeForward(
              tr ? GroupedMatmulWgradOp::create(b, l, w.getType(), g, x, off)
                 : GroupedMatmulWgradOp::create(b, l, w.getType(), x, g, off)));
    return success();
  }
  if (auto s = dyn_cast<SwigluOp>(op)) {
    accumulate(s.getInput(),
               SwigluGradOp::create(b, l, s.getInput().getType(), s.getInput(),
                                    gradOf(0), s.getLayout()));
    return success();
  }
  if (auto mlp = dyn_cast<GroupedMlpOp>(op)) {
    for (Value v : {mlp.getInput(), mlp.getW1(), mlp.getW2()})
      if (isa<BlockScaledType>(v.getType()))
        return op->emitOpError("-moe-autodiff: block-scaled operands have no "
                               "gradient; differentiate before -moe-quantize");
    auto grad = GroupedMlpBackwardOp::create(
        b, l,
        TypeRange{mlp.getInput().getType(), mlp.getW1().getType(),
                  mlp.getW2().getType()},
        mlp.getInput(), mlp.getW1(), mlp.getW2(), mlp.getOffsets(), gradOf(0),
        mlp.getLayout(), mlp.getScaleMode(), TypeAttr());
    accumulate(mlp.getInput(), grad.getDx());
    accumulate(mlp.getW1(), grad.getDw1());
    accumulate(mlp.getW2(), grad.getDw2());
    return success();
  }
  if (auto a2a = dyn_cast<AllToAllOp>(op)) {
    // Rows went from their sender to the receiver: their gradients go back
    // the same way, counted by what each rank received (a slot-major side
    // of the exchange is the same side of the way back).
    Value g = gradOf(0);
    if (!g)
      return success();
    auto back = AllToAllOp::create(
        b, l,
        TypeRange{a2a.getInput().getType(), a2a.getRecvCounts().getType()}, g,
        a2a.getRecvCounts(), a2a.getGridAttr(), a2a.getGridAxesAttr(),
        a2a.getSlotMajorResultAttr(), a2a.getSlotMajorInputAttr(),
        a2a.getPadToAttr());
    accumulate(a2a.getInput(), back.getResult());
    return success();
  }
  if (isa<ExpertsOp>(op))
    return op->emitOpError("-moe-autodiff: run -moe-group-experts first (the "
                           "grouped ops have gradients, the region has none)");
  return op->emitOpError("-moe-autodiff: no gradient rule for this op (the "
                         "loss depends on its result)");
}

struct MoEAutodiffPass : moe::impl::MoEAutodiffBase<MoEAutodiffPass> {
  using MoEAutodiffBase::MoEAutodiffBase;

  /// A 0-d f32 loss, then any outputs (results with moe.output, such as
  /// the routers' expert loads), which are passed through undifferentiated.
  static bool isLossFunction(func::FuncOp f) {
    if (f.isExternal() || f.getNumResults() < 1)
      return false;
    for (unsigned r = 1; r < f.getNumResults(); ++r)
      if (!f.getResultAttrOfType<StringAttr>(r, "moe.output"))
        return false;
    auto t = dyn_cast<RankedTensorType>(f.getResultTypes()[0]);
    return t && t.getRank() == 0 && t.getElementType().isF32();
  }

  /// Called functions already split, by callee.
  DenseMap<Operation *, const Differentiator::Pullback *> pullbacks;
  std::deque<Differentiator::Pullback> pullbackStorage;
  /// Callees being differentiated (a recursive call is refused).
  llvm::SmallPtrSet<Operation *, 4> inProgress;

  /// Appends to `step`'s single-block body the backward of its ops, seeded
  /// by `seed` (before the terminator), and returns the gradient of each of
  /// `wrt` (zeros for those the seeds do not reach). Calls of functions are
  /// first turned into calls of their forwards.
  FailureOr<SmallVector<Value>>
  appendBackward(func::FuncOp step, ArrayRef<BlockArgument> wrt,
                 function_ref<void(Differentiator &, OpBuilder &)> seed,
                 SymbolTable &symbols) {
    Block &body = step.getBody().front();
    Operation *ret = body.getTerminator();
    OpBuilder b(ret);
    Differentiator diff(b, recompute);
    {
      // Which calls the seeds may reach back through.
      Differentiator scan(b);
      scan.markActive(body, wrt);
      SmallVector<func::CallOp> active;
      for (auto call : body.getOps<func::CallOp>())
        if (llvm::any_of(call.getOperands(),
                         [&](Value v) { return scan.isActive(v); }))
          active.push_back(call);
      for (func::CallOp call : active) {
        auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
        if (!callee || callee.isExternal())
          return call.emitOpError("-moe-autodiff: the loss depends on a call "
                                  "of a function without a body");
        FailureOr<const Differentiator::Pullback *> p =
            pullback(callee, symbols);
        if (failed(p))
          return call.emitOpError("-moe-autodiff: cannot differentiate the "
                                  "called function");
        if (recompute) {
          // The call stays; its backward recomputes the residuals.
          diff.addCall(call, *p);
          continue;
        }
        OpBuilder at(call);
        auto forward = func::CallOp::create(at, call.getLoc(), (*p)->forward,
                                            call.getOperands());
        if (call.getNoInline())
          forward.setNoInline(true);
        call.replaceAllUsesWith(
            forward.getResults().take_front((*p)->numOutputs));
        call.erase();
        diff.addCall(forward, *p);
      }
    }
    diff.markActive(body, wrt);
    SmallVector<Operation *> forward;
    for (Operation &op : body.without_terminator())
      forward.push_back(&op);
    seed(diff, b);
    for (Operation *op : llvm::reverse(forward)) {
      b.setInsertionPoint(ret);
      if (failed(diff.backprop(op)))
        return failure();
    }
    b.setInsertionPoint(ret);
    SmallVector<Value> grads;
    for (BlockArgument a : wrt) {
      Value g = diff.adjoint(a);
      if (!g) {
        auto t = cast<RankedTensorType>(a.getType());
        Value init = tensor::EmptyOp::create(
            b, ret->getLoc(), tensor::getMixedSizes(b, ret->getLoc(), a),
            t.getElementType());
        Value z = arith::ConstantOp::create(b, ret->getLoc(),
                                            b.getZeroAttr(t.getElementType()));
        g = linalg::FillOp::create(b, ret->getLoc(), z, init).getResult(0);
      }
      grads.push_back(g);
    }
    return grads;
  }

  /// `callee` differentiated once: @<callee>_forward(args) -> (results,
  /// residuals) and @<callee>_backward(args, residuals, a cotangent per
  /// float result) -> a gradient per float argument (moe.gradient_of).
  FailureOr<const Differentiator::Pullback *> pullback(func::FuncOp callee,
                                                       SymbolTable &symbols) {
    if (auto it = pullbacks.find(callee); it != pullbacks.end())
      return it->second;
    if (!callee.getBody().hasOneBlock())
      return callee.emitOpError("-moe-autodiff: expects a single-block body");
    if (!inProgress.insert(callee).second)
      return callee.emitOpError("-moe-autodiff: a recursive call");
    llvm::scope_exit done([&] { inProgress.erase(callee); });

    func::FuncOp step = callee.clone();
    step.setName((callee.getName() + "_vjp").str());
    step.setPrivate();
    symbols.insert(step, Block::iterator(callee->getNextNode()));
    Block &body = step.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    unsigned numArgs = body.getNumArguments();
    SmallVector<BlockArgument> wrt;
    for (BlockArgument a : body.getArguments())
      if (isFloatTensor(a.getType()) &&
          !step.getArgAttr(a.getArgNumber(), "moe.no_grad"))
        wrt.push_back(a);
    // A cotangent argument per float result.
    SmallVector<std::pair<Value, BlockArgument>> seeds;
    for (Value r : ret.getOperands())
      if (isFloatTensor(r.getType()))
        seeds.push_back({r, body.addArgument(r.getType(), ret.getLoc())});
    auto fail = [&]() -> FailureOr<const Differentiator::Pullback *> {
      step.erase();
      return failure();
    };
    FailureOr<SmallVector<Value>> grads = appendBackward(
        step, wrt,
        [&](Differentiator &diff, OpBuilder &) {
          for (auto [r, c] : seeds)
            diff.accumulate(r, c);
        },
        symbols);
    if (failed(grads))
      return fail();

    SmallVector<Value> results(ret.getOperands());
    llvm::append_range(results, *grads);
    OpBuilder b(ret);
    func::ReturnOp::create(b, ret.getLoc(), results);
    unsigned numOutputs = ret.getNumOperands();
    ret.erase();
    SmallVector<DictionaryAttr> argAttrs;
    for (unsigned i = 0; i < body.getNumArguments(); ++i)
      argAttrs.push_back(i < numArgs ? step.getArgAttrDict(i)
                                     : b.getDictionaryAttr(b.getNamedAttr(
                                           "moe.cotangent", b.getUnitAttr())));
    step.setFunctionType(FunctionType::get(
        step.getContext(), body.getArgumentTypes(), ValueRange(results)));
    step.setAllArgAttrs(argAttrs);
    step.setAllResultAttrs(ArrayRef<DictionaryAttr>{});
    for (unsigned r = 0; r < numOutputs; ++r)
      step.setResultAttr(r, "moe.output",
                         b.getStringAttr("result" + llvm::Twine(r)));
    Differentiator::Pullback *p = &pullbackStorage.emplace_back();
    p->numOutputs = numOutputs;
    for (auto [i, a] : llvm::enumerate(wrt)) {
      step.setResultAttr(numOutputs + i, "moe.gradient_of",
                         b.getI64IntegerAttr(a.getArgNumber()));
      p->gradientOf.push_back(a.getArgNumber());
    }
    FailureOr<std::pair<func::FuncOp, func::FuncOp>> split =
        splitForwardBackward(step, symbols,
                             (callee.getName() + "_forward").str(),
                             (callee.getName() + "_backward").str());
    if (failed(split)) {
      pullbackStorage.pop_back();
      return fail();
    }
    std::tie(p->forward, p->backward) = *split;
    // (-moe-reuse-forward-values finds the pair and its residuals by the
    // attributes the split left.)
    p->forward.setPrivate();
    p->backward.setPrivate();
    p->backward->setAttr("moe.forward",
                         FlatSymbolRefAttr::get(p->forward.getNameAttr()));
    return pullbacks[callee] = p;
  }

  LogicalResult differentiate(func::FuncOp f, SymbolTable &symbols) {
    if (!isLossFunction(f))
      return f.emitOpError("-moe-autodiff: expects a loss function returning "
                           "one tensor<f32> (then only results marked "
                           "moe.output), got ")
             << f.getFunctionType();
    if (!f.getBody().hasOneBlock())
      return f.emitOpError("-moe-autodiff: expects a single-block body");
    std::string name = (f.getName() + suffix).str();
    if (symbols.lookup(name))
      return f.emitOpError("-moe-autodiff: a symbol named '")
             << name << "' already exists";

    // The train step starts as a copy of the forward function.
    func::FuncOp step = f.clone();
    step.setName(name);
    symbols.insert(step, Block::iterator(f->getNextNode()));
    Block &body = step.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    Value loss = ret.getOperand(0);

    SmallVector<BlockArgument> wrt;
    for (BlockArgument a : body.getArguments())
      if (isFloatTensor(a.getType()) &&
          !step.getArgAttr(a.getArgNumber(), "moe.no_grad") &&
          !step.getArgAttr(a.getArgNumber(), "moe.cotangent"))
        wrt.push_back(a);

    FailureOr<SmallVector<Value>> grads = appendBackward(
        step, wrt,
        [&](Differentiator &diff, OpBuilder &b) {
          Value loss = ret.getOperand(0);
          if (diff.isActive(loss))
            diff.accumulate(
                loss, arith::ConstantOp::create(
                          b, ret.getLoc(),
                          DenseElementsAttr::get(
                              cast<RankedTensorType>(loss.getType()), 1.0f)));
        },
        symbols);
    if (failed(grads))
      return failure();

    // return loss, d arg...  (zeros for arguments the loss does not use)
    OpBuilder b(ret);
    loss = ret.getOperand(0);
    SmallVector<Value> results = {loss};
    SmallVector<Type> types = {loss.getType()};
    SmallVector<unsigned> argOf;
    for (auto [a, g] : llvm::zip_equal(wrt, *grads)) {
      results.push_back(g);
      types.push_back(g.getType());
      argOf.push_back(a.getArgNumber());
    }
    // Then the outputs, as they were.
    SmallVector<StringAttr> outputs;
    for (unsigned r = 1; r < ret.getNumOperands(); ++r) {
      results.push_back(ret.getOperand(r));
      types.push_back(ret.getOperand(r).getType());
      outputs.push_back(step.getResultAttrOfType<StringAttr>(r, "moe.output"));
    }
    func::ReturnOp::create(b, ret.getLoc(), results);
    ret.erase();
    step.setFunctionType(
        FunctionType::get(step.getContext(), step.getArgumentTypes(), types));
    step.setAllResultAttrs(ArrayRef<DictionaryAttr>{});
    step.setResultAttr(0, "moe.loss", b.getUnitAttr());
    for (auto [i, arg] : llvm::enumerate(argOf))
      step.setResultAttr(i + 1, "moe.gradient_of", b.getI64IntegerAttr(arg));
    for (auto [i, name] : llvm::enumerate(outputs))
      step.setResultAttr(1 + argOf.size() + i, "moe.output", name);
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    pullbacks.clear();
    pullbackStorage.clear();
    SmallVector<func::FuncOp> todo;
    if (functions.empty()) {
      for (auto f : module.getOps<func::FuncOp>())
        if (isLossFunction(f))
          todo.push_back(f);
      if (todo.empty()) {
        module.emitError("-moe-autodiff: no loss function (a function "
                         "returning one tensor<f32>) in the module");
        return signalPassFailure();
      }
    }
    for (const std::string &name : functions) {
      auto f = symbols.lookup<func::FuncOp>(name);
      if (!f) {
        module.emitError("-moe-autodiff: no function named '") << name << "'";
        return signalPassFailure();
      }
      todo.push_back(f);
    }
    for (func::FuncOp f : todo)
      if (failed(differentiate(f, symbols)))
        return signalPassFailure();
  }
};

} // namespace
