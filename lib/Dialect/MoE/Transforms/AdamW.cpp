//===- AdamW.cpp - the optimizer update inside the train step -------------===//
//
// -moe-adamw: @<f>_grad (loss, gradients) becomes @<f>_step (loss, gradient
// norm, updated parameters and moments); see Passes.td.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/SymbolTable.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEADAMW
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// Positions in the step's scalar tensor (see Passes.td).
enum Scalar : int64_t {
  StepSize,
  Bias2Sqrt,
  DecayKeep,
  Beta1,
  Beta2,
  Eps,
  Clip,
  LearningRate,
  NumScalars
};

/// The widest row of a sum of squares over `n` elements: the largest divisor
/// of `n` up to 2^20. Summing [n / c, c] down its rows lets c threads read
/// adjacent elements; the c partial sums are then summed once. (On a GPU a
/// thread has one load in flight per row: 2^16 threads read a 1.2 GB
/// gradient at 0.5 TB/s, 2^20 fill every SM.)
int64_t sumWidth(int64_t n) {
  for (int64_t c = std::min<int64_t>(n, 1 << 20); c > 1; --c)
    if (n % c == 0)
      return c;
  return 1;
}

struct OptimizerBuilder {
  OpBuilder &b;
  Location loc;

  Value constF32(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
  }
  Value filled(ArrayRef<int64_t> shape, Type elt, double v) {
    Value e = tensor::EmptyOp::create(b, loc, shape, elt);
    Value c = arith::ConstantOp::create(b, loc, b.getFloatAttr(elt, v));
    return linalg::FillOp::create(b, loc, c, e).getResult(0);
  }

  /// sum(g^2) in f64, as a 0-d tensor.
  Value sumOfSquares(Value g) {
    auto type = cast<RankedTensorType>(g.getType());
    int64_t n = type.getNumElements();
    int64_t width = sumWidth(n);
    // Rows summed `unroll` at a time: [n / width / unroll, unroll, width],
    // the inner reduction loop (constant trip count) unrolled into
    // independent loads, so that a GPU thread has several in flight. The
    // terms are added in row order either way.
    int64_t rows = n / width;
    int64_t unroll = rows % 8 == 0 ? 8 : rows % 4 == 0 ? 4 : 1;
    Type f64 = b.getF64Type();
    // [n / width / unroll, unroll, width]: a view of the contiguous gradient.
    SmallVector<ReassociationIndices> all(1);
    for (int64_t i = 0; i < type.getRank(); ++i)
      all[0].push_back(i);
    Value flat = g;
    if (type.getRank() != 1)
      flat = tensor::CollapseShapeOp::create(
          b, loc, RankedTensorType::get({n}, type.getElementType()), g,
          type.getRank() ? all : SmallVector<ReassociationIndices>{});
    Value view = tensor::ExpandShapeOp::create(
        b, loc,
        RankedTensorType::get({rows / unroll, unroll, width},
                              type.getElementType()),
        flat, SmallVector<ReassociationIndices>{{0, 1, 2}});
    MLIRContext *ctx = b.getContext();
    AffineExpr d0 = getAffineDimExpr(0, ctx), d1 = getAffineDimExpr(1, ctx),
               d2 = getAffineDimExpr(2, ctx);
    auto partial =
        linalg::GenericOp::create(
            b, loc, TypeRange{RankedTensorType::get({width}, f64)}, view,
            filled({width}, f64, 0.0),
            // Column d0 (parallel, outermost: the loop mapped to threads),
            // summed down its rows d1 * unroll + d2.
            {AffineMap::get(3, 0, {d1, d2, d0}, ctx),
             AffineMap::get(3, 0, {d0}, ctx)},
            {utils::IteratorType::parallel, utils::IteratorType::reduction,
             utils::IteratorType::reduction},
            [](OpBuilder &nb, Location l, ValueRange args) {
              Value x = arith::ExtFOp::create(nb, l, nb.getF64Type(), args[0]);
              Value sq = arith::MulFOp::create(nb, l, x, x);
              linalg::YieldOp::create(
                  nb, l, ValueRange{arith::AddFOp::create(nb, l, args[1], sq)});
            })
            .getResult(0);
    return linalg::GenericOp::create(
               b, loc, TypeRange{RankedTensorType::get({}, f64)}, partial,
               filled({}, f64, 0.0),
               {AffineMap::get(1, 0, {d0}, ctx), AffineMap::get(1, 0, {}, ctx)},
               {utils::IteratorType::reduction},
               [](OpBuilder &nb, Location l, ValueRange args) {
                 linalg::YieldOp::create(nb, l,
                                         ValueRange{arith::AddFOp::create(
                                             nb, l, args[1], args[0])});
               })
        .getResult(0);
  }
};

struct AdamWPass : moe::impl::MoEAdamWBase<AdamWPass> {
  LogicalResult rewrite(func::FuncOp grad, SymbolTable &symbols) {
    StringRef name = grad.getSymName();
    std::string stepName = (name.drop_back(5) + "_step").str();
    if (symbols.lookup(stepName))
      return grad.emitOpError("-moe-adamw: a symbol named '")
             << stepName << "' already exists";
    // Expert shards: the grid and axis their gradients' squares are summed
    // over (the ranks holding the other experts).
    SmallVector<StringAttr> shardGrid(grad.getNumArguments());
    SmallVector<shard::GridAxis> shardAxis(grad.getNumArguments(), 0);
    for (unsigned i = 0; i < grad.getNumArguments(); ++i)
      if (Attribute a = grad.getArgAttr(i, "moe.expert_shard")) {
        auto dict = dyn_cast<DictionaryAttr>(a);
        auto gridName = dict ? dict.getAs<StringAttr>("grid") : StringAttr();
        auto grid = gridName
                        ? SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(
                              grad, FlatSymbolRefAttr::get(gridName))
                        : shard::GridOp();
        if (!grid)
          return grad.emitOpError("-moe-adamw: argument ")
                 << i
                 << " is an expert shard (moe.expert_shard) without the "
                    "grid of its ranks";
        auto axis = dict.getAs<IntegerAttr>("axis");
        if (axis && (axis.getInt() < 0 || axis.getInt() >= grid.getRank()))
          return grad.emitOpError("-moe-adamw: argument ")
                 << i << " is an expert shard over axis " << axis.getInt()
                 << " of the " << grid.getRank() << "-d grid @"
                 << gridName.getValue();
        shardGrid[i] = gridName;
        shardAxis[i] = axis ? shard::GridAxis(axis.getInt()) : 0;
      }
    Block &body = grad.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    MLIRContext *ctx = &getContext();
    Type f32 = Float32Type::get(ctx);

    // The differentiated arguments and their gradients.
    struct Trained {
      unsigned arg;
      Value grad;
      unsigned m = 0, v = 0; // the moments' argument numbers
    };
    SmallVector<Trained> trained;
    SmallVector<std::pair<Value, StringAttr>> outputs; // passed through
    for (unsigned r = 1; r < grad.getNumResults(); ++r) {
      if (auto name = grad.getResultAttrOfType<StringAttr>(r, "moe.output")) {
        outputs.push_back({ret.getOperand(r), name});
        continue;
      }
      auto of = grad.getResultAttrOfType<IntegerAttr>(r, "moe.gradient_of");
      if (!of || of.getInt() < 0 ||
          of.getInt() >= int64_t(grad.getNumArguments()))
        return grad.emitOpError("-moe-adamw: result ")
               << r << " is not the gradient of an argument (moe.gradient_of)";
      auto type = dyn_cast<RankedTensorType>(ret.getOperand(r).getType());
      if (!type || !type.hasStaticShape() || type.getElementType() != f32 ||
          type != grad.getArgument(of.getInt()).getType())
        return grad.emitOpError("-moe-adamw: the gradient of argument ")
               << of.getInt()
               << " is not a static f32 tensor of the argument's type";
      trained.push_back({unsigned(of.getInt()), ret.getOperand(r)});
    }
    if (trained.empty())
      return grad.emitOpError("-moe-adamw: no gradients to apply");

    // Arguments: the moments, then the scalars (appended in this order).
    Location loc = grad.getLoc();
    unsigned first = grad.getNumArguments();
    SmallVector<unsigned> at;
    SmallVector<Type> types;
    SmallVector<DictionaryAttr> attrs;
    SmallVector<Location> locs;
    OpBuilder b(ret);
    for (StringRef state : {"exp_avg", "exp_avg_sq"})
      for (Trained &t : trained) {
        (state == "exp_avg" ? t.m : t.v) = first + at.size();
        at.push_back(first);
        types.push_back(grad.getArgument(t.arg).getType());
        attrs.push_back(b.getDictionaryAttr(
            {b.getNamedAttr("moe.state", b.getStringAttr(state)),
             b.getNamedAttr("moe.state_of", b.getI64IntegerAttr(t.arg))}));
        locs.push_back(loc);
      }
    unsigned scalarsArg = first + at.size();
    at.push_back(first);
    types.push_back(RankedTensorType::get({NumScalars}, f32));
    attrs.push_back(b.getDictionaryAttr(
        {b.getNamedAttr("moe.input", b.getStringAttr("adamw"))}));
    locs.push_back(loc);
    if (failed(grad.insertArguments(at, types, attrs, locs)))
      return grad.emitOpError("-moe-adamw: cannot add the optimizer state");

    OptimizerBuilder ob{b, NameLoc::get(b.getStringAttr("optimizer"))};
    Location oloc = ob.loc;
    // One 0-d tensor per scalar.
    Value scalars = body.getArgument(scalarsArg);
    auto scalar = [&](Scalar s) -> Value {
      return tensor::ExtractSliceOp::create(
          b, oloc, RankedTensorType::get({}, f32), scalars,
          ArrayRef<OpFoldResult>{b.getIndexAttr(s)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1)});
    };

    // The global norm and the clipping factor, from the sums of squares.
    SmallVector<Value> squares;
    for (Trained &t : trained) {
      Value sq = ob.sumOfSquares(t.grad);
      if (StringAttr gridName = shardGrid[t.arg])
        sq = shard::AllReduceOp::create(
                 b, oloc, sq, gridName.getValue(),
                 ArrayRef<shard::GridAxis>{shardAxis[t.arg]},
                 shard::ReductionKind::Sum)
                 .getResult();
      squares.push_back(sq);
    }
    auto zeroD = AffineMap::get(0, 0, {}, ctx);
    // At most kMaxSumInputs 0-d tensors per op: each becomes a kernel
    // parameter of three words, and a kernel's parameters are limited
    // (4 KiB below PTX ISA 8.1). Partial sums fold left, in the same order
    // as one sum would.
    constexpr size_t kMaxSumInputs = 64;
    SmallVector<Value> sums;
    ArrayRef<Value> rest = squares;
    while (rest.size() + sums.size() > kMaxSumInputs) {
      size_t take = kMaxSumInputs - sums.size();
      llvm::append_range(sums, rest.take_front(take));
      rest = rest.drop_front(take);
      Value init =
          tensor::EmptyOp::create(b, oloc, ArrayRef<int64_t>{}, b.getF64Type());
      SmallVector<AffineMap> partialMaps(sums.size() + 1, zeroD);
      Value partial = linalg::GenericOp::create(
                          b, oloc, TypeRange{init.getType()}, sums,
                          ValueRange{init}, partialMaps, {},
                          [&](OpBuilder &nb, Location l, ValueRange args) {
                            Value total = args[0];
                            for (size_t i = 1; i + 1 < args.size(); ++i)
                              total =
                                  arith::AddFOp::create(nb, l, total, args[i]);
                            linalg::YieldOp::create(nb, l, total);
                          })
                          .getResult(0);
      sums.assign({partial});
    }
    llvm::append_range(sums, rest);
    unsigned numSums = sums.size();
    sums.push_back(scalar(Clip));
    SmallVector<AffineMap> maps(sums.size() + 2, zeroD);
    Value normInit = tensor::EmptyOp::create(b, oloc, ArrayRef<int64_t>{}, f32);
    Value scaleInit =
        tensor::EmptyOp::create(b, oloc, ArrayRef<int64_t>{}, f32);
    auto normAndScale = linalg::GenericOp::create(
        b, oloc, TypeRange{normInit.getType(), scaleInit.getType()}, sums,
        ValueRange{normInit, scaleInit}, maps, {},
        [&](OpBuilder &nb, Location l, ValueRange args) {
          unsigned n = numSums;
          Value total = args[0];
          for (unsigned i = 1; i < n; ++i)
            total = arith::AddFOp::create(nb, l, total, args[i]);
          Value norm64 = math::SqrtOp::create(nb, l, total);
          Value norm = arith::TruncFOp::create(nb, l, nb.getF32Type(), norm64);
          Value clip = args[n];
          Value zero = arith::ConstantOp::create(nb, l, nb.getF32FloatAttr(0));
          Value one = arith::ConstantOp::create(nb, l, nb.getF32FloatAttr(1));
          Value tiny =
              arith::ConstantOp::create(nb, l, nb.getF32FloatAttr(1e-6f));
          Value ratio = arith::DivFOp::create(
              nb, l, clip, arith::AddFOp::create(nb, l, norm, tiny));
          Value clips = arith::AndIOp::create(
              nb, l,
              arith::CmpFOp::create(nb, l, arith::CmpFPredicate::OGT, clip,
                                    zero),
              arith::CmpFOp::create(nb, l, arith::CmpFPredicate::OGT, norm,
                                    clip));
          Value scale = arith::SelectOp::create(nb, l, clips, ratio, one);
          linalg::YieldOp::create(nb, l, ValueRange{norm, scale});
        });
    Value norm = normAndScale.getResult(0);
    Value scale = normAndScale.getResult(1);

    // The update of each tensor and its moments, in place of the arguments.
    Value stepSize = scalar(StepSize), bias2 = scalar(Bias2Sqrt),
          keep = scalar(DecayKeep), beta1 = scalar(Beta1),
          beta2 = scalar(Beta2), eps = scalar(Eps);
    SmallVector<Value> results = {ret.getOperand(0), norm};
    for (auto &[v, name] : outputs)
      results.push_back(v);
    SmallVector<int64_t> updates;
    SmallVector<Value> newP, newM, newV;
    for (Trained &t : trained) {
      auto type = cast<RankedTensorType>(t.grad.getType());
      bool decay = type.getRank() >= 2;
      unsigned rank = type.getRank();
      auto id = AffineMap::getMultiDimIdentityMap(rank, ctx);
      auto bcast = AffineMap::get(rank, 0, {}, ctx);
      SmallVector<AffineMap> umaps = {id,    bcast, bcast, bcast, bcast, bcast,
                                      bcast, bcast, id,    id,    id};
      SmallVector<utils::IteratorType> iters(rank,
                                             utils::IteratorType::parallel);
      auto update = linalg::GenericOp::create(
          b, oloc, TypeRange{type, type, type},
          ValueRange{t.grad, scale, stepSize, bias2, keep, beta1, beta2, eps},
          ValueRange{body.getArgument(t.arg), body.getArgument(t.m),
                     body.getArgument(t.v)},
          umaps, iters, [&](OpBuilder &nb, Location l, ValueRange a) {
            Value g = arith::MulFOp::create(nb, l, a[0], a[1]);
            Value p = a[8], m = a[9], v = a[10];
            if (decay)
              p = arith::MulFOp::create(nb, l, p, a[4]);
            Value one = arith::ConstantOp::create(nb, l, nb.getF32FloatAttr(1));
            Value b1 = a[5], b2 = a[6];
            m = arith::AddFOp::create(
                nb, l, arith::MulFOp::create(nb, l, b1, m),
                arith::MulFOp::create(
                    nb, l, arith::SubFOp::create(nb, l, one, b1), g));
            v = arith::AddFOp::create(
                nb, l, arith::MulFOp::create(nb, l, b2, v),
                arith::MulFOp::create(
                    nb, l,
                    arith::MulFOp::create(
                        nb, l, arith::SubFOp::create(nb, l, one, b2), g),
                    g));
            Value denom = arith::AddFOp::create(
                nb, l,
                arith::DivFOp::create(nb, l, math::SqrtOp::create(nb, l, v),
                                      a[3]),
                a[7]);
            p = arith::SubFOp::create(
                nb, l, p,
                arith::MulFOp::create(nb, l, a[2],
                                      arith::DivFOp::create(nb, l, m, denom)));
            linalg::YieldOp::create(nb, l, ValueRange{p, m, v});
          });
      newP.push_back(update.getResult(0));
      newM.push_back(update.getResult(1));
      newV.push_back(update.getResult(2));
    }
    for (auto [t, p] : llvm::zip(trained, newP)) {
      results.push_back(p);
      updates.push_back(t.arg);
    }
    for (auto [t, m] : llvm::zip(trained, newM)) {
      results.push_back(m);
      updates.push_back(t.m);
    }
    for (auto [t, v] : llvm::zip(trained, newV)) {
      results.push_back(v);
      updates.push_back(t.v);
    }
    func::ReturnOp::create(b, ret.getLoc(), results);
    ret.erase();

    SmallVector<Type> resultTypes;
    for (Value r : results)
      resultTypes.push_back(r.getType());
    grad.setFunctionType(
        FunctionType::get(ctx, grad.getArgumentTypes(), resultTypes));
    SmallVector<DictionaryAttr> resultAttrs = {
        b.getDictionaryAttr({b.getNamedAttr("moe.loss", b.getUnitAttr())}),
        b.getDictionaryAttr(
            {b.getNamedAttr("moe.grad_norm", b.getUnitAttr())})};
    for (auto &[v, name] : outputs)
      resultAttrs.push_back(
          b.getDictionaryAttr({b.getNamedAttr("moe.output", name)}));
    for (int64_t u : updates)
      resultAttrs.push_back(b.getDictionaryAttr(
          {b.getNamedAttr("moe.updates", b.getI64IntegerAttr(u))}));
    grad.setAllResultAttrs(resultAttrs);
    symbols.setSymbolName(grad, stepName);
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    SmallVector<func::FuncOp> steps;
    for (auto f : module.getOps<func::FuncOp>())
      if (!f.isExternal() && f.getSymName().ends_with("_grad") &&
          f.getNumResults() >= 1 && f.getResultAttr(0, "moe.loss"))
        steps.push_back(f);
    if (steps.empty()) {
      module.emitError("-moe-adamw: no train step (a function of "
                       "-moe-autodiff, @<name>_grad) in the module");
      return signalPassFailure();
    }
    for (func::FuncOp f : steps)
      if (failed(rewrite(f, symbols)))
        return signalPassFailure();
  }
};

} // namespace
