//===- ReuseForwardValues.cpp - the backward reads what the forward made --===//
//
// -moe-reuse-forward-values: for each pair of functions -moe-autodiff split
// from a called function (@f_forward, and @f_backward marked
// `moe.forward = @f_forward`), an op of the backward that the forward also
// computes, from the same arguments and residuals, is read from the forward
// instead of computed again: CSE across the pair, as one function would get
// it. The residuals are then chosen anew: the forward values that the
// backward's remaining ops read. After -moe-quantize this is what keeps a
// bf16 GEMM operand (instead of its f32 source) from the forward to the
// backward, and a weight rounded to bf16 once per step.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEREUSEFORWARDVALUES
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

constexpr StringLiteral kForwardAttr = "moe.forward";
constexpr StringLiteral kResidualAttr = "moe.residual";

/// The positions among `n` arguments or results whose attributes
/// (`attrsOf`) mark residual 0, 1, 2, ... in that order; failure when the
/// marks are out of order.
FailureOr<SmallVector<unsigned>>
residualPositions(unsigned n, function_ref<DictionaryAttr(unsigned)> attrsOf) {
  SmallVector<unsigned> positions;
  for (unsigned i = 0; i < n; ++i) {
    DictionaryAttr attrs = attrsOf(i);
    auto index = attrs ? dyn_cast_or_null<IntegerAttr>(attrs.get(kResidualAttr))
                       : nullptr;
    if (!index)
      continue;
    if (index.getInt() != int64_t(positions.size()))
      return failure();
    positions.push_back(i);
  }
  return positions;
}

/// Whether `op` reads a dispatch's rows (through reshapes): the GPU kernels
/// fuse such a read (a rounding, a GEMM operand) into reading the tokens in
/// place, so its result is never materialized unless it is kept.
bool readsDispatchRows(Operation &op) {
  for (Value v : op.getOperands()) {
    while (Operation *def = v.getDefiningOp()) {
      if (isa<tensor::ExpandShapeOp, tensor::CollapseShapeOp>(def)) {
        v = def->getOperand(0);
        continue;
      }
      if (auto dispatch = dyn_cast<moe::DispatchOp>(def))
        if (v == dispatch.getSorted())
          return true;
      break;
    }
  }
  return false;
}

LogicalResult reuse(func::FuncOp fwd, func::FuncOp bwd, ModuleOp module,
                    SymbolTable &symbols) {
  if (!fwd.getBody().hasOneBlock() || !bwd.getBody().hasOneBlock())
    return success();
  Block &fb = fwd.getBody().front(), &bb = bwd.getBody().front();
  auto fret = cast<func::ReturnOp>(fb.getTerminator());
  unsigned numArgs = fwd.getNumArguments();

  // The residuals as they are: forward result r <-> backward argument a.
  FailureOr<SmallVector<unsigned>> resultMarks =
      residualPositions(fwd.getNumResults(),
                        [&](unsigned r) { return fwd.getResultAttrDict(r); });
  FailureOr<SmallVector<unsigned>> argMarks = residualPositions(
      bwd.getNumArguments(), [&](unsigned a) { return bwd.getArgAttrDict(a); });
  if (failed(resultMarks) || failed(argMarks))
    return (failed(resultMarks) ? fwd : bwd)
        .emitOpError("-moe-reuse-forward-values: residuals out of order");
  SmallVector<unsigned> oldResults = *resultMarks, oldArgs = *argMarks;
  if (oldResults.empty() || oldResults.size() != oldArgs.size() ||
      oldArgs.front() != numArgs || bwd.getNumArguments() < numArgs ||
      oldResults.back() + 1 != fwd.getNumResults() ||
      oldArgs.back() + 1 - numArgs != oldArgs.size())
    return success(); // not a pair this pass understands: left alone
  unsigned numOutputs = oldResults.front();
  for (unsigned i = 0; i < numArgs; ++i)
    if (fb.getArgument(i).getType() != bb.getArgument(i).getType())
      return success();
  for (auto [r, a] : llvm::zip_equal(oldResults, oldArgs))
    if (fwd.getResultTypes()[r] != bb.getArgument(a).getType())
      return success();

  // Backward values known to equal forward values.
  DenseMap<Value, Value> same;
  for (unsigned i = 0; i < numArgs; ++i)
    same[bb.getArgument(i)] = fb.getArgument(i);
  for (auto [r, a] : llvm::zip_equal(oldResults, oldArgs))
    same[bb.getArgument(a)] = fret.getOperand(r);
  // Constants and empty tensors: equal to any equivalent op's result, and
  // always made again where they are used.
  auto fresh = [&](Value v) {
    Operation *def = v.getDefiningOp();
    return def && def->getBlock() == &bb && def->getNumOperands() == 0 &&
           def->getNumRegions() == 0 && isMemoryEffectFree(def);
  };
  auto equal = [&](Value l, Value r) {
    if (auto it = same.find(l); it != same.end())
      return it->second == r;
    if (!fresh(l))
      return false;
    Operation *ld = l.getDefiningOp(), *rd = r.getDefiningOp();
    return rd &&
           cast<OpResult>(l).getResultNumber() ==
               cast<OpResult>(r).getResultNumber() &&
           OperationEquivalence::isEquivalentTo(
               ld, rd, OperationEquivalence::IgnoreLocations);
  };

  // Backward ops the forward computes too (CSE's equivalence, through the
  // map). Their results are read from the forward (`taken`), but views
  // (reshapes, slices), dispatches and ops reading a dispatch's rows (a
  // rounding of them), which stay in the backward: a view of an argument
  // returned would be copied, and a dispatch's rows are read in place by
  // the kernels that consume them (never materialized).
  // Calls of the GPU kernels' host functions (`moe.dedicated_kernel`) take
  // and return tensors only: pure, as the ops they replace.
  auto pure = [&](Operation &op) {
    if (auto call = dyn_cast<func::CallOp>(op)) {
      auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
      return callee && callee->hasAttr("moe.dedicated_kernel");
    }
    return isMemoryEffectFree(&op);
  };
  llvm::SmallPtrSet<Operation *, 32> taken;
  for (Operation &op : bb.without_terminator()) {
    Value anchor;
    bool known = op.getNumOperands() != 0 && pure(op);
    for (Value v : op.getOperands()) {
      if (same.count(v))
        anchor = anchor ? anchor : v;
      else
        known &= fresh(v);
    }
    if (!known || !anchor)
      continue;
    for (Operation *candidate : same[anchor].getUsers()) {
      if (candidate->getBlock() != &fb ||
          candidate->getName() != op.getName() ||
          candidate->getNumResults() != op.getNumResults())
        continue;
      DenseMap<Value, Value> inner; // values defined inside regions
      bool equivalent = OperationEquivalence::isEquivalentTo(
          &op, candidate,
          [&](Value l, Value r) {
            if (Value m = inner.lookup(l))
              return success(m == r);
            return success(equal(l, r));
          },
          [&](Value l, Value r) { inner[l] = r; },
          OperationEquivalence::IgnoreLocations);
      if (!equivalent)
        continue;
      for (auto [l, r] :
           llvm::zip_equal(op.getResults(), candidate->getResults()))
        same[l] = r;
      if (!isa<tensor::ExpandShapeOp, tensor::CollapseShapeOp,
               tensor::ExtractSliceOp, moe::DispatchOp>(op) &&
          !readsDispatchRows(op))
        taken.insert(&op);
      break;
    }
  }

  // Backward values the forward provides: the old residuals and the
  // results of the ops taken from the forward.
  auto provided = [&](Value v) {
    if (auto a = dyn_cast<BlockArgument>(v))
      return a.getOwner() == &bb && a.getArgNumber() >= numArgs &&
             a.getArgNumber() < numArgs + oldArgs.size();
    return taken.contains(v.getDefiningOp());
  };
  // The new residuals: those the rest of the backward reads, in forward
  // order.
  llvm::SetVector<Value> needed;
  for (Operation &op : bb) {
    if (taken.contains(&op))
      continue;
    op.walk([&](Operation *inner) {
      for (Value v : inner->getOperands())
        if (provided(v))
          needed.insert(same.lookup(v));
    });
  }
  SmallVector<Value> residuals = needed.takeVector();
  llvm::sort(residuals, [&](Value a, Value b) {
    auto pos = [&](Value v) -> std::pair<Operation *, unsigned> {
      if (auto arg = dyn_cast<BlockArgument>(v))
        return {nullptr, arg.getArgNumber()};
      return {v.getDefiningOp(), cast<OpResult>(v).getResultNumber()};
    };
    auto [da, ia] = pos(a);
    auto [db, ib] = pos(b);
    if (da != db) {
      if (!da || !db)
        return !da;
      return da->isBeforeInBlock(db);
    }
    return ia < ib;
  });
  bool changed = residuals.size() != oldResults.size() || !taken.empty();
  for (auto [i, r] : llvm::enumerate(oldResults))
    changed |= i >= residuals.size() || fret.getOperand(r) != residuals[i];
  if (!changed)
    return success();

  // The backward: new residual arguments after the old ones (and before
  // the cotangents), the old ones and the matched ops dropped.
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  DenseMap<Value, BlockArgument> argOf; // forward value -> new argument
  unsigned insertAt = numArgs + oldArgs.size();
  for (auto [i, v] : llvm::enumerate(residuals)) {
    BlockArgument a = bb.insertArgument(insertAt + i, v.getType(), v.getLoc());
    argOf[v] = a;
  }
  // Uses of backward values the forward provides.
  for (Operation &op : bb) {
    if (taken.contains(&op))
      continue;
    op.walk([&](Operation *inner) {
      for (OpOperand &use : inner->getOpOperands())
        if (provided(use.get()))
          use.set(argOf.lookup(same.lookup(use.get())));
    });
  }
  for (Operation &op : llvm::make_early_inc_range(llvm::reverse(bb)))
    if (taken.contains(&op)) {
      op.dropAllUses();
      op.erase();
    }
  BitVector dropArgs(bb.getNumArguments());
  for (unsigned i = 0; i < oldArgs.size(); ++i)
    dropArgs.set(numArgs + i);
  // Attributes: arguments as they were, the new residuals numbered.
  SmallVector<DictionaryAttr> oldAttrs, bwdArgAttrs;
  for (unsigned a = 0; a < bwd.getNumArguments(); ++a)
    oldAttrs.push_back(bwd.getArgAttrDict(a));
  for (unsigned a = 0; a < bb.getNumArguments(); ++a) {
    if (dropArgs.test(a))
      continue;
    if (a >= insertAt && a < insertAt + residuals.size()) {
      bwdArgAttrs.push_back(b.getDictionaryAttr(
          b.getNamedAttr(kResidualAttr, b.getI64IntegerAttr(a - insertAt))));
      continue;
    }
    unsigned old = a < insertAt ? a : a - residuals.size();
    bwdArgAttrs.push_back(oldAttrs[old]);
  }
  bb.eraseArguments(dropArgs);
  bwd.setFunctionType(
      FunctionType::get(ctx, bb.getArgumentTypes(), bwd.getResultTypes()));
  bwd.setAllArgAttrs(bwdArgAttrs);

  // The forward returns the new residuals.
  SmallVector<Value> results(fret.getOperands().take_front(numOutputs));
  llvm::append_range(results, residuals);
  SmallVector<DictionaryAttr> resultAttrs;
  for (unsigned r = 0; r < numOutputs; ++r)
    resultAttrs.push_back(fwd.getResultAttrDict(r));
  for (unsigned i = 0; i < residuals.size(); ++i)
    resultAttrs.push_back(b.getDictionaryAttr(
        b.getNamedAttr(kResidualAttr, b.getI64IntegerAttr(i))));
  b.setInsertionPoint(fret);
  func::ReturnOp::create(b, fret.getLoc(), results);
  fret.erase();
  fwd.setFunctionType(FunctionType::get(ctx, fwd.getArgumentTypes(),
                                        ValueRange(results).getTypes()));
  fwd.setAllResultAttrs(resultAttrs);

  // The calls: each backward call takes the residuals of the forward call
  // that made its old ones.
  SmallVector<func::CallOp> fwdCalls, bwdCalls;
  module.walk([&](func::CallOp call) {
    if (call.getCallee() == fwd.getName())
      fwdCalls.push_back(call);
    else if (call.getCallee() == bwd.getName())
      bwdCalls.push_back(call);
  });
  DenseMap<Operation *, func::CallOp> replacement;
  for (func::CallOp call : fwdCalls) {
    b.setInsertionPoint(call);
    auto next = func::CallOp::create(b, call.getLoc(), fwd, call.getOperands());
    next->setAttrs(call->getAttrs());
    for (unsigned r = 0; r < numOutputs; ++r)
      call.getResult(r).replaceAllUsesWith(next.getResult(r));
    replacement[call] = next;
  }
  for (func::CallOp call : bwdCalls) {
    Value first = call.getOperand(numArgs);
    auto from = first.getDefiningOp<func::CallOp>();
    auto it = from ? replacement.find(from) : replacement.end();
    if (it == replacement.end())
      return call.emitOpError("-moe-reuse-forward-values: its residuals do "
                              "not come from a call of ")
             << fwd.getName();
    SmallVector<Value> operands(call.getOperands().take_front(numArgs));
    llvm::append_range(operands,
                       it->second.getResults().drop_front(numOutputs));
    llvm::append_range(operands,
                       call.getOperands().drop_front(numArgs + oldArgs.size()));
    b.setInsertionPoint(call);
    auto next = func::CallOp::create(b, call.getLoc(), bwd, operands);
    next->setAttrs(call->getAttrs());
    call.replaceAllUsesWith(next.getResults());
    call.erase();
  }
  for (func::CallOp call : fwdCalls) {
    if (!call->use_empty())
      return call.emitOpError("-moe-reuse-forward-values: a residual is read "
                              "by something other than ")
             << bwd.getName();
    call.erase();
  }
  return success();
}

struct MoEReuseForwardValuesPass
    : moe::impl::MoEReuseForwardValuesBase<MoEReuseForwardValuesPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    SmallVector<std::pair<func::FuncOp, func::FuncOp>> pairs;
    for (auto bwd : module.getOps<func::FuncOp>())
      if (auto ref = bwd->getAttrOfType<FlatSymbolRefAttr>(kForwardAttr))
        if (auto fwd = symbols.lookup<func::FuncOp>(ref.getValue()))
          pairs.push_back({fwd, bwd});
    for (auto [fwd, bwd] : pairs)
      if (failed(reuse(fwd, bwd, module, symbols)))
        return signalPassFailure();
  }
};

} // namespace
