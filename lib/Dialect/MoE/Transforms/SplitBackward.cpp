//===- SplitBackward.cpp - a train step as forward and backward -----------===//
//
// -moe-split-backward: a train step of a loss sum(out * dy), `dy` marked
// moe.cotangent, becomes the pair an autograd framework calls: the forward
// returns the outputs and the residuals the backward reads; the backward
// takes the arguments again, the residuals and the cotangents, and returns
// the gradients.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/SplitBackward.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOESPLITBACKWARD
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// Marks in `set` every op of `block` that the values in `roots` need
/// (their defining ops and, transitively, those of their operands).
void markNeeded(ArrayRef<Value> roots, Block &block,
                llvm::SmallPtrSetImpl<Operation *> &set) {
  SmallVector<Value> work(roots.begin(), roots.end());
  while (!work.empty()) {
    Operation *def = work.pop_back_val().getDefiningOp();
    if (!def || def->getBlock() != &block || !set.insert(def).second)
      continue;
    llvm::append_range(work, def->getOperands());
    // Values used inside regions (none in a train step's tensor ops, but
    // kept correct): their definitions outside are needed too.
    def->walk([&](Operation *inner) {
      for (Value v : inner->getOperands())
        if (v.getParentBlock() == &block)
          work.push_back(v);
    });
  }
}

/// A linalg.generic that only changes the precision of one tensor.
bool isCastGeneric(Operation *op) {
  auto g = dyn_cast<linalg::GenericOp>(op);
  if (!g || g.getNumDpsInputs() != 1 || g.getNumDpsInits() != 1 ||
      g.getNumParallelLoops() != g.getNumLoops() ||
      !llvm::all_of(g.getIndexingMapsArray(),
                    [](AffineMap m) { return m.isIdentity(); }))
    return false;
  for (Operation &inner : g.getBody()->without_terminator())
    if (!isa<arith::ExtFOp, arith::TruncFOp>(inner))
      return false;
  return true;
}

/// Forward ops the backward recomputes instead of reading their results as
/// residuals:
/// - ops without operands (constants, empty tensors), and precision
///   changes (MX quantizations included) and reshapes of the arguments and
///   of recomputed values (a widened weight would otherwise be kept at twice
///   its size; recomputed, it fuses into the backward's reader, and the
///   backward's own quantization of the same tensor is the same op, which
///   CSE merges);
/// - dispatches (their rows are a gather of the tokens, which the GPU
///   kernels reading them read in place; their other inputs become
///   residuals);
/// - fused expert MLPs (`moe.grouped_mlp`): the backward's
///   `moe.grouped_mlp_backward` recomputes the same rows' up-projection and
///   SwiGLU from the same operands, so recomputing the MLP adds its down
///   projection only, one GEMM, where keeping its output would hold the
///   largest tensor of the layer ([tokens x top-k, hidden], f32) from the
///   forward to the backward.
llvm::SmallPtrSet<Operation *, 32>
recomputable(Block &body, const llvm::SmallPtrSetImpl<Operation *> &forward) {
  llvm::SmallPtrSet<Operation *, 32> set;
  for (Operation &op : body.without_terminator()) {
    if (!forward.contains(&op))
      continue;
    if (isa<moe::DispatchOp, moe::GroupedMlpOp>(op)) {
      set.insert(&op);
      continue;
    }
    bool cast = (op.getNumOperands() == 0 && op.getNumRegions() == 0) ||
                isa<arith::ExtFOp, arith::TruncFOp, moe::QuantizeOp,
                    tensor::ExpandShapeOp, tensor::CollapseShapeOp>(op) ||
                isCastGeneric(&op);
    if (cast && llvm::all_of(op.getOperands(), [&](Value v) {
          Operation *def = v.getDefiningOp();
          return def ? set.contains(def) : v.getParentBlock() == &body;
        }))
      set.insert(&op);
  }
  return set;
}

/// A function `name` of the ops of `step`'s body that `keep` selects (in
/// order), taking `inputs` (values of the body) as its arguments and
/// returning `results`.
func::FuncOp extract(OpBuilder &builder, func::FuncOp step, StringRef name,
                     ArrayRef<Value> inputs, ArrayRef<Value> results,
                     function_ref<bool(Operation *)> keep) {
  auto types = [](ArrayRef<Value> values) {
    return llvm::to_vector(
        llvm::map_range(values, [](Value v) { return v.getType(); }));
  };
  auto f = func::FuncOp::create(
      builder, step.getLoc(), name,
      FunctionType::get(step.getContext(), types(inputs), types(results)));
  Block *entry = f.addEntryBlock();
  IRMapping map;
  map.map(inputs, entry->getArguments());
  OpBuilder b = OpBuilder::atBlockEnd(entry);
  for (Operation &op : step.getBody().front().without_terminator())
    if (keep(&op))
      b.clone(op, map);
  func::ReturnOp::create(b, step.getLoc(),
                         llvm::to_vector(llvm::map_range(
                             results, [&](Value v) { return map.lookup(v); })));
  return f;
}

} // namespace

FailureOr<std::pair<func::FuncOp, func::FuncOp>>
mlir::moe::splitForwardBackward(func::FuncOp step, SymbolTable &symbols,
                                StringRef fwdName, StringRef bwdName) {
  if (!step.getBody().hasOneBlock())
    return step.emitOpError("-moe-split-backward: expects a single-block body");
  Block &body = step.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (StringRef name : {fwdName, bwdName})
    if (symbols.lookup(name))
      return step.emitOpError("-moe-split-backward: a symbol named '")
             << name << "' already exists";

  SmallVector<BlockArgument> args, cotangents;
  for (BlockArgument a : body.getArguments())
    (step.getArgAttr(a.getArgNumber(), "moe.cotangent") ? cotangents : args)
        .push_back(a);
  SmallVector<unsigned> outputs, gradients;
  for (unsigned r = 0; r < step.getNumResults(); ++r) {
    if (step.getResultAttr(r, "moe.output"))
      outputs.push_back(r);
    else if (step.getResultAttr(r, "moe.gradient_of"))
      gradients.push_back(r);
    else if (!step.getResultAttr(r, "moe.loss"))
      return step.emitOpError("-moe-split-backward: result #")
             << r << " is neither an output, a gradient nor the loss";
  }
  if (outputs.empty())
    return step.emitOpError("-moe-split-backward: no result marked "
                            "moe.output (the forward would return nothing)");

  // Ops that (transitively) read a cotangent.
  llvm::SmallPtrSet<Operation *, 32> late;
  llvm::DenseSet<Value> lateValues(cotangents.begin(), cotangents.end());
  for (Operation &op : body.without_terminator()) {
    bool reads = false;
    op.walk([&](Operation *inner) {
      for (Value v : inner->getOperands())
        reads |= lateValues.contains(v);
    });
    if (!reads)
      continue;
    late.insert(&op);
    lateValues.insert(op.result_begin(), op.result_end());
  }

  SmallVector<Value> outputValues, gradientValues;
  for (unsigned r : outputs)
    outputValues.push_back(ret.getOperand(r));
  for (unsigned r : gradients)
    gradientValues.push_back(ret.getOperand(r));
  llvm::SmallPtrSet<Operation *, 32> forward, backward;
  markNeeded(outputValues, body, forward);
  for (Value v : outputValues)
    if (isa<BlockArgument>(v) && lateValues.contains(v))
      return step.emitOpError("-moe-split-backward: an output is a cotangent");
  for (Operation &op : body.without_terminator())
    if (forward.contains(&op) && late.contains(&op))
      return op.emitOpError("-moe-split-backward: an output depends on a "
                            "cotangent through this op");
  markNeeded(gradientValues, body, backward);
  for (Operation *op : forward)
    backward.erase(op);
  for (Operation &op : body.without_terminator())
    if ((forward.contains(&op) || backward.contains(&op)) &&
        !isMemoryEffectFree(&op))
      return op.emitOpError("-moe-split-backward: an op with side effects "
                            "cannot be split between forward and backward");

  // Residuals: values of forward ops the backward reads (in body order),
  // but for the recomputed ones, which the backward clones.
  llvm::SmallPtrSet<Operation *, 32> cheap = recomputable(body, forward);
  SmallVector<Value> residuals;
  llvm::SmallPtrSet<Operation *, 32> cloned;
  llvm::DenseSet<Value> seen;
  std::function<void(Value)> read = [&](Value v) {
    Operation *def = v.getDefiningOp();
    if (!def || !forward.contains(def))
      return;
    if (!cheap.contains(def)) {
      if (seen.insert(v).second)
        residuals.push_back(v);
    } else if (cloned.insert(def).second) {
      def->walk([&](Operation *inner) {
        for (Value operand : inner->getOperands())
          read(operand);
      });
    }
  };
  for (Operation &op : body.without_terminator()) {
    if (!backward.contains(&op))
      continue;
    op.walk([&](Operation *inner) {
      for (Value v : inner->getOperands())
        read(v);
    });
  }
  // Gradients the forward computed are read too.
  for (Value g : gradientValues)
    read(g);
  llvm::sort(residuals, [&](Value a, Value b) {
    Operation *da = a.getDefiningOp(), *db = b.getDefiningOp();
    if (da != db)
      return da->isBeforeInBlock(db);
    return cast<OpResult>(a).getResultNumber() <
           cast<OpResult>(b).getResultNumber();
  });

  OpBuilder builder(step);
  SmallVector<Value> argValues(args.begin(), args.end());

  // The forward.
  SmallVector<Value> fwdResults(outputValues);
  llvm::append_range(fwdResults, residuals);
  func::FuncOp fwd =
      extract(builder, step, fwdName, argValues, fwdResults,
              [&](Operation *op) { return forward.contains(op); });
  for (auto [i, a] : llvm::enumerate(args))
    fwd.setArgAttrs(i, step.getArgAttrDict(a.getArgNumber()));
  for (auto [i, r] : llvm::enumerate(outputs))
    fwd.setResultAttrs(i, step.getResultAttrDict(r));
  for (unsigned i = 0; i < residuals.size(); ++i)
    fwd.setResultAttr(outputs.size() + i, "moe.residual",
                      builder.getI64IntegerAttr(i));

  // The backward.
  SmallVector<Value> bwdArgs(argValues);
  llvm::append_range(bwdArgs, residuals);
  llvm::append_range(bwdArgs, cotangents);
  func::FuncOp bwd = extract(
      builder, step, bwdName, bwdArgs, gradientValues, [&](Operation *op) {
        return cloned.contains(op) || backward.contains(op);
      });
  for (auto [i, a] : llvm::enumerate(args))
    bwd.setArgAttrs(i, step.getArgAttrDict(a.getArgNumber()));
  for (unsigned i = 0; i < residuals.size(); ++i)
    bwd.setArgAttr(args.size() + i, "moe.residual",
                   builder.getI64IntegerAttr(i));
  for (auto [i, c] : llvm::enumerate(cotangents))
    bwd.setArgAttrs(args.size() + residuals.size() + i,
                    step.getArgAttrDict(c.getArgNumber()));
  for (auto [i, r] : llvm::enumerate(gradients))
    bwd.setResultAttrs(i, step.getResultAttrDict(r));
  symbols.insert(fwd, Block::iterator(step));
  symbols.insert(bwd, Block::iterator(step));
  step.erase();
  return std::make_pair(fwd, bwd);
}

namespace {

struct MoESplitBackwardPass
    : moe::impl::MoESplitBackwardBase<MoESplitBackwardPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    SmallVector<func::FuncOp> steps;
    for (auto f : module.getOps<func::FuncOp>()) {
      // Train steps (a moe.loss result), not the loss functions they
      // came from.
      bool step = false;
      for (unsigned r = 0; r < f.getNumResults(); ++r)
        step |= static_cast<bool>(f.getResultAttr(r, "moe.loss"));
      if (f.isExternal() || !step)
        continue;
      for (unsigned i = 0; i < f.getNumArguments(); ++i)
        if (f.getArgAttr(i, "moe.cotangent")) {
          steps.push_back(f);
          break;
        }
    }
    for (func::FuncOp f : steps)
      if (failed(moe::splitForwardBackward(f, symbols,
                                           (f.getName() + "_forward").str(),
                                           (f.getName() + "_backward").str())))
        return signalPassFailure();
  }
};

} // namespace
