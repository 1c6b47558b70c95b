//===- GroupExperts.cpp - per-expert GEMMs -> moe.grouped_matmul ----------===//
//
// Three ways frontends write the experts of an MoE layer, each turned into
// ops on all rows at once (`moe.grouped_matmul`, `moe.swiglu`, ...):
//
//  (a) `moe.experts` whose body is a chain of row-wise ops on the group's
//      rows: the same chain on all rows, every linalg.matmul with a
//      per-expert weight becoming a `moe.grouped_matmul`.
//  (b) `scf.for e = 0 to E` that slices rows [offsets[e], offsets[e+1]) of
//      the tokens and slice e of stacked weights, computes, and inserts the
//      rows back: raised to `moe.experts`, then (a).
//  (c) E unrolled linalg.matmuls of consecutive static row slices of one
//      tensor with per-expert weights, written to consecutive rows of one
//      result: one `moe.grouped_matmul` with constant offsets.
//
// Every rewrite is checked to give the same result bit for bit (see each
// matcher); anything else is left as it is, with a remark under `remarks`.
// Matching never modifies the IR: (a) builds its new ops in a detached block
// that is spliced in only once the whole body has been accepted.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGROUPEXPERTS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

//===----------------------------------------------------------------------===//
// Shared helpers
//===----------------------------------------------------------------------===//

/// Records why a candidate is left unchanged; returns failure().
LogicalResult refuse(std::string &why, const Twine &reason) {
  why = reason.str();
  return failure();
}

/// +0.0 (not -0.0), integer 0, or a splat of either.
bool isPosZeroAttr(Attribute a) {
  if (auto f = dyn_cast_or_null<FloatAttr>(a))
    return f.getValue().isPosZero();
  if (auto i = dyn_cast_or_null<IntegerAttr>(a))
    return i.getValue().isZero();
  if (auto s = dyn_cast_or_null<SplatElementsAttr>(a))
    return isPosZeroAttr(s.getSplatValue<Attribute>());
  return false;
}

/// True if every element of tensor `v` is +0: a linalg.fill of a +0
/// constant, or a +0 splat constant.
bool isZeroTensor(Value v) {
  Attribute a;
  if (auto fill = v.getDefiningOp<linalg::FillOp>())
    return fill.hasPureTensorSemantics() &&
           matchPattern(fill.getInputs().front(), m_Constant(&a)) &&
           isPosZeroAttr(a);
  return matchPattern(v, m_Constant(&a)) && isPosZeroAttr(a);
}

/// Element types that convert to f32 exactly (what grouped_matmul reads).
bool isGemmOperandType(Type t) { return t.isF32() || t.isBF16() || t.isF16(); }

std::string str(Type t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << t;
  return s;
}

std::string opName(Operation *op) {
  return "'" + op->getName().getStringRef().str() + "'";
}

/// Fast-math flags let the compiled op return what folding does not (with
/// `nsz`, -0 for +0): such ops are never evaluated.
bool hasFastMath(Operation *op) {
  auto fm = dyn_cast<arith::ArithFastMathInterface>(op);
  return fm && fm.getFastMathFlagsAttr() &&
         fm.getFastMathFlagsAttr().getValue() != arith::FastMathFlags::none;
}

/// Folds a detached clone (no regions) at constant operands `attrs`, then
/// erases it. Returns the results as attributes, or nothing if some result
/// does not fold to a constant. Folding computes what the op computes at
/// run time (IEEE arithmetic, round to nearest even), without fast-math.
std::optional<SmallVector<Attribute>> foldClone(Operation *clone,
                                                ArrayRef<Attribute> attrs) {
  SmallVector<OpFoldResult> folded;
  std::optional<SmallVector<Attribute>> out;
  if (!hasFastMath(clone) && succeeded(clone->fold(attrs, folded)) &&
      folded.size() == clone->getNumResults()) {
    out.emplace();
    for (OpFoldResult r : folded) {
      Attribute a = dyn_cast<Attribute>(r);
      // A fold to one of the operands (x + 0 -> x) has that operand's value.
      if (!a)
        for (auto [i, operand] : llvm::enumerate(clone->getOperands()))
          if (operand == cast<Value>(r))
            a = attrs[i];
      if (!a) {
        out.reset();
        break;
      }
      out->push_back(a);
    }
  }
  clone->erase();
  return out;
}

/// Evaluates a scalar payload block (a linalg body) at constant block
/// arguments by folding it op by op; values from above must be constants.
/// Returns the yielded attributes, or nothing if some op does not fold.
std::optional<SmallVector<Attribute>> evalPayload(Block &payload,
                                                  ArrayRef<Attribute> args) {
  DenseMap<Value, Attribute> env;
  for (auto [arg, a] : llvm::zip(payload.getArguments(), args))
    env[arg] = a;
  auto lookup = [&](Value v) -> Attribute {
    if (Attribute a = env.lookup(v))
      return a;
    Attribute a;
    if (matchPattern(v, m_Constant(&a)))
      return a;
    return {};
  };
  for (Operation &op : payload.without_terminator()) {
    if (op.getNumRegions() != 0)
      return std::nullopt;
    SmallVector<Attribute> attrs;
    for (Value v : op.getOperands()) {
      attrs.push_back(lookup(v));
      if (!attrs.back())
        return std::nullopt;
    }
    auto results = foldClone(op.clone(), attrs);
    if (!results)
      return std::nullopt;
    for (auto [r, a] : llvm::zip(op.getResults(), *results))
      env[r] = a;
  }
  SmallVector<Attribute> yielded;
  for (Value v : payload.getTerminator()->getOperands()) {
    yielded.push_back(lookup(v));
    if (!yielded.back())
      return std::nullopt;
  }
  return yielded;
}

/// Evaluates an elementwise op on tensors (OpTrait::Elementwise) at constant
/// scalar operands through its scalar form (the same op on element types).
std::optional<SmallVector<Attribute>> evalScalarForm(Operation *op,
                                                     ArrayRef<Attribute> args) {
  Block scratch;
  IRMapping mapping;
  for (Value v : op->getOperands())
    mapping.map(v, scratch.addArgument(getElementTypeOrSelf(v.getType()),
                                       op->getLoc()));
  Operation *scalar = op->clone(mapping);
  for (OpResult r : scalar->getResults())
    r.setType(getElementTypeOrSelf(r.getType()));
  return foldClone(scalar, args);
}

bool allPosZero(const std::optional<SmallVector<Attribute>> &attrs) {
  return attrs && llvm::all_of(*attrs, isPosZeroAttr);
}

/// Replaces `op`'s results with `values`, erases it, then every op that only
/// fed it and is now dead (per-expert slices, fills, transposes, ...).
void replaceAndErase(Operation *op, ValueRange values) {
  op->replaceAllUsesWith(values);
  SmallVector<Operation *> worklist{op};
  llvm::DenseSet<Operation *> queued{op};
  while (!worklist.empty()) {
    Operation *dead = worklist.pop_back_val();
    llvm::SetVector<Operation *> defs;
    dead->walk([&](Operation *nested) {
      for (Value v : nested->getOperands())
        if (Operation *d = v.getDefiningOp())
          if (!dead->isAncestor(d))
            defs.insert(d);
    });
    dead->erase();
    for (Operation *d : defs)
      if (!queued.contains(d) && isOpTriviallyDead(d)) {
        queued.insert(d);
        worklist.push_back(d);
      }
  }
}

/// Static offsets/sizes/strides of a slice op, or nothing if one is dynamic.
std::optional<SmallVector<int64_t>> constants(ArrayRef<OpFoldResult> ofrs) {
  SmallVector<int64_t> out;
  for (OpFoldResult r : ofrs) {
    std::optional<int64_t> c = getConstantIntValue(r);
    if (!c)
      return std::nullopt;
    out.push_back(*c);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// linalg.matmul that moe.grouped_matmul computes bit for bit
//===----------------------------------------------------------------------===//

/// One linalg.matmul `C = A @ B` (or `A @ B^T`): rows of A times a weight.
struct RowMatmul {
  Value lhs, rhs;
  bool transposeRhs = false;
};

/// Matches `mm` when moe.grouped_matmul gives identical bits for its rows:
/// - the accumulator (init and result) is f32 and the init is all +0.
///   linalg.matmul computes `C += cast(a) * cast(b)` in C's element type in
///   order of increasing k from C's initial value; grouped_matmul does the
///   same in f32 from +0 and rounds once to its result type, here f32 (no
///   rounding). A bf16/f16 accumulator rounds after every add, and a -0
///   init gives -0 where every product is -0: both are refused.
/// - A and B are f32, bf16 or f16 (extended to f32 exactly, as grouped_matmul
///   does) and the cast is the default (signed) one;
/// - the indexing maps are the default ones, or those of `A @ B^T`; a B made
///   by `linalg.transpose(w, [1, 0])` is read as `w` transposed (the same
///   values).
FailureOr<RowMatmul> matchRowMatmul(linalg::MatmulOp mm, std::string &why) {
  if (!mm.hasPureTensorSemantics() || mm.getInputs().size() != 2 ||
      mm.getOutputs().size() != 1)
    return refuse(why, "linalg.matmul is not on tensors");
  if (mm.getCast() != linalg::TypeFn::cast_signed)
    return refuse(why, "linalg.matmul uses an unsigned cast");
  Value a = mm.getInputs()[0], b = mm.getInputs()[1], c = mm.getOutputs()[0];
  Type ta = getElementTypeOrSelf(a.getType()),
       tb = getElementTypeOrSelf(b.getType()),
       tc = getElementTypeOrSelf(c.getType());
  if (!tc.isF32())
    return refuse(why, "linalg.matmul accumulates in " + str(tc) +
                           " but moe.grouped_matmul in f32, rounded once: "
                           "only an f32 accumulator gives the same bits");
  if (!isGemmOperandType(ta) || !isGemmOperandType(tb))
    return refuse(why, "linalg.matmul operands are " + str(ta) + " and " +
                           str(tb) + ", not f32, bf16 or f16");
  if (!isZeroTensor(c))
    return refuse(why, "linalg.matmul accumulates into a tensor not known "
                       "to be +0 (a linalg.fill of +0.0)");

  MLIRContext *ctx = mm.getContext();
  AffineExpr m, n, k;
  bindDims(ctx, m, n, k);
  auto maps = [&](ArrayRef<AffineExpr> bExprs) {
    return SmallVector<AffineMap>{AffineMap::get(3, 0, {m, k}, ctx),
                                  AffineMap::get(3, 0, bExprs, ctx),
                                  AffineMap::get(3, 0, {m, n}, ctx)};
  };
  SmallVector<AffineMap> actual = mm.getIndexingMapsArray();
  RowMatmul r{a, b, false};
  if (actual == maps({n, k})) {
    r.transposeRhs = true;
  } else if (actual != maps({k, n})) {
    return refuse(why, "linalg.matmul has indexing maps other than A @ B "
                       "or A @ B^T");
  } else if (auto t = b.getDefiningOp<linalg::TransposeOp>()) {
    if (t.hasPureTensorSemantics() &&
        t.getPermutation() == ArrayRef<int64_t>{1, 0}) {
      r.rhs = t.getInput();
      r.transposeRhs = true;
    }
  }
  return r;
}

//===----------------------------------------------------------------------===//
// (a) moe.experts -> grouped ops on all rows
//===----------------------------------------------------------------------===//

/// What a value of an experts body is, seen from all rows at once.
enum class Kind {
  /// A `[?, N]` tensor computed row by row from the group's rows. `whole` is
  /// the `[R, N]` tensor whose row r, for r in the group of expert e, is the
  /// value's row (r - offsets[e]) when the body runs for expert e.
  Rows,
  /// tensor.empty of `[?, N]` (contents undefined); `whole` is `[R, N]`.
  EmptyRows,
  /// The group's row count (tensor.dim of rows, 0): only sizes empties.
  RowCount,
  /// The same for every expert (constants, pure ops on them); `whole` is a
  /// clone outside the body.
  Uniform,
  /// Expert e's slice of a stacked weight; `whole` is the stacked weight.
  Weight,
  /// linalg.transpose of a Weight: only read by linalg.matmul as B^T.
  WeightT,
};

struct Info {
  Kind kind;
  Value whole;
  /// Rows: the rows of `whole` outside every group are known to be +0.
  bool zeroOutside = false;
};

/// Form (a): converts one moe.experts op. The body is walked in order; every
/// op is checked and its all-rows form is built in a detached block, spliced
/// in front of the experts op only if the whole body is accepted.
///
/// Legal because every accepted op is row-wise: row r of its result depends
/// only on row r of its row operands and, for r in the group of expert e, on
/// expert e's weights, which grouped_matmul reads with the same group bounds
/// as moe.experts (both clamp them the same way, and with overlapping groups
/// the last expert wins in both). So the all-rows chain gives every grouped
/// row the bits the body gives it. The yielded value must also be +0 on rows
/// outside every group, as moe.experts returns there: grouped_matmul gives
/// +0 there, and elementwise ops f with f(+0, ...) = +0 (checked by folding
/// their scalar form at +0) keep that.
class ExpertsGrouper {
public:
  explicit ExpertsGrouper(ExpertsOp op)
      : op(op), scratch(std::make_unique<Block>()), b(op.getContext()) {
    b.setInsertionPointToEnd(scratch.get());
  }

  /// Converts the op (and erases it), or says why not; then the IR is
  /// untouched.
  LogicalResult run(std::string &why);

private:
  const Info *info(Value v) {
    auto it = infos.find(v);
    return it == infos.end() ? nullptr : &it->second;
  }
  bool isKind(Value v, Kind k) {
    const Info *i = info(v);
    return i && i->kind == k;
  }
  bool isRows(Value v) { return isKind(v, Kind::Rows); }
  void set(Value v, Kind k, Value whole, bool zeroOutside = false) {
    infos[v] = Info{k, whole, zeroOutside};
    if (whole)
      mapping.map(v, whole);
  }
  /// `[R, N]` for a body type `[?, N]`.
  RankedTensorType wholeType(Type bodyType) {
    auto t = cast<RankedTensorType>(bodyType);
    SmallVector<int64_t> shape(t.getShape());
    shape[0] = rowsStatic;
    return RankedTensorType::get(shape, t.getElementType());
  }
  bool usesOnlyUniform(Operation *inner);
  LogicalResult visit(Operation &inner, std::string &why);
  LogicalResult visitElementwiseLinalg(linalg::LinalgOp lop, std::string &why);

  ExpertsOp op;
  std::unique_ptr<Block> scratch;
  OpBuilder b;
  DenseMap<Value, Info> infos;
  IRMapping mapping;
  int64_t rowsStatic = ShapedType::kDynamic;
  OpFoldResult rowsSize;
};

/// Whether `inner` reads (in it or its regions) only Uniform values.
bool ExpertsGrouper::usesOnlyUniform(Operation *inner) {
  bool ok = true;
  inner->walk([&](Operation *nested) {
    for (Value v : nested->getOperands())
      if (!inner->isAncestor(v.getParentBlock()->getParentOp()) &&
          !isKind(v, Kind::Uniform))
        ok = false;
  });
  return ok;
}

LogicalResult ExpertsGrouper::run(std::string &why) {
  Location loc = op.getLoc();
  Block &body = op.getBody().front();
  auto tokens = op.getTokens();
  if (!cast<RankedTensorType>(op.getOffsets().getType()).hasStaticShape())
    return refuse(why, "the number of experts (size of offsets) is dynamic");

  rowsStatic = tokens.getType().getDimSize(0);
  if (ShapedType::isDynamic(rowsStatic))
    rowsSize = tensor::DimOp::create(b, loc, tokens, 0).getResult();
  else
    rowsSize = b.getIndexAttr(rowsStatic);

  // The rows of moe.dispatch's `sorted` at or beyond offsets[E] are zero by
  // its definition.
  auto dispatch = tokens.getDefiningOp<DispatchOp>();
  bool tokensZeroOutside = dispatch && dispatch.getOffsets() == op.getOffsets();
  set(body.getArgument(0), Kind::Rows, tokens, tokensZeroOutside);
  for (auto [i, w] : llvm::enumerate(op.getWeights()))
    set(body.getArgument(i + 1), Kind::Weight, w);

  for (Operation &inner : body.without_terminator())
    if (failed(visit(inner, why)))
      return failure();

  Value yielded = cast<YieldOp>(body.getTerminator()).getValue();
  const Info *y = info(yielded);
  if (!y || y->kind != Kind::Rows)
    return refuse(why, "the yielded value is not computed row by row");
  if (!y->zeroOutside)
    return refuse(why, "the yielded value is not known to be +0 on rows "
                       "outside every group (moe.experts gives zeros there): "
                       "it should be a linalg.matmul with a weight, or ops f "
                       "with f(0) = 0 applied to one");
  Value result = y->whole;
  if (result.getType() != op.getType())
    result = tensor::CastOp::create(b, loc, op.getType(), result);

  // Move the new ops in front of the op, then drop those that only served
  // the body (row counts, matmul inits).
  SmallVector<Operation *> added =
      llvm::map_to_vector(*scratch, [](Operation &o) { return &o; });
  op->getBlock()->getOperations().splice(op->getIterator(),
                                         scratch->getOperations());
  replaceAndErase(op, result);
  for (Operation *o : llvm::reverse(added))
    if (isOpTriviallyDead(o))
      o->erase();
  return success();
}

LogicalResult ExpertsGrouper::visit(Operation &inner, std::string &why) {
  Location loc = inner.getLoc();
  if (!isMemoryEffectFree(&inner))
    return refuse(why, opName(&inner) + " in the body has side effects");

  // Constants and pure ops on them: the same for every expert, hoisted.
  if (usesOnlyUniform(&inner)) {
    Operation *c = b.clone(inner, mapping);
    for (auto [r, cr] : llvm::zip(inner.getResults(), c->getResults()))
      set(r, Kind::Uniform, cr);
    return success();
  }

  // tensor.dim of rows: dim 0 is the group's row count, the others are the
  // same for every expert.
  if (auto dim = dyn_cast<tensor::DimOp>(inner)) {
    std::optional<int64_t> idx = dim.getConstantIndex();
    Value src = dim.getSource();
    if (idx && (isRows(src) || isKind(src, Kind::EmptyRows))) {
      if (*idx == 0) {
        set(dim.getResult(), Kind::RowCount, Value());
        return success();
      }
      set(dim.getResult(), Kind::Uniform,
          b.clone(inner, mapping)->getResult(0));
      return success();
    }
    return refuse(why, "tensor.dim in the body is not a size of the "
                       "group's rows");
  }

  // tensor.empty sized by the group's row count.
  if (auto empty = dyn_cast<tensor::EmptyOp>(inner)) {
    RankedTensorType type = empty.getType();
    if (type.getRank() != 2 || !type.isDynamicDim(0) ||
        !isKind(empty.getDynamicSizes().front(), Kind::RowCount) ||
        !llvm::all_of(empty.getDynamicSizes().drop_front(),
                      [&](Value v) { return isKind(v, Kind::Uniform); }))
      return refuse(why, "tensor.empty in the body is not [group rows, N]");
    SmallVector<OpFoldResult> sizes{rowsSize};
    if (type.isDynamicDim(1))
      sizes.push_back(mapping.lookup(empty.getDynamicSizes()[1]));
    else
      sizes.push_back(b.getIndexAttr(type.getDimSize(1)));
    set(empty.getResult(), Kind::EmptyRows,
        tensor::EmptyOp::create(b, loc, sizes, type.getElementType()));
    return success();
  }

  // linalg.fill of rows: every row the same constant (+0 outside the groups
  // if that constant is +0).
  if (auto fill = dyn_cast<linalg::FillOp>(inner)) {
    Value v = fill.getInputs().front(), dest = fill.getOutputs().front();
    if (!fill.hasPureTensorSemantics() || !isKind(v, Kind::Uniform) ||
        !(isRows(dest) || isKind(dest, Kind::EmptyRows)))
      return refuse(why, "linalg.fill in the body does not fill the group's "
                         "rows with a constant");
    Attribute a;
    bool zero = matchPattern(v, m_Constant(&a)) && isPosZeroAttr(a);
    Value whole =
        linalg::FillOp::create(b, loc, mapping.lookup(v), mapping.lookup(dest))
            .getResult(0);
    set(fill.getResult(0), Kind::Rows, whole, zero);
    return success();
  }

  // linalg.transpose of a weight slice: read by linalg.matmul as B^T (any
  // other reader is refused below, as it reads a WeightT).
  if (auto t = dyn_cast<linalg::TransposeOp>(inner)) {
    if (!t.hasPureTensorSemantics() || !isKind(t.getInput(), Kind::Weight) ||
        t.getPermutation() != ArrayRef<int64_t>{1, 0})
      return refuse(why, "linalg.transpose in the body is not a 2-d "
                         "transpose of a weight");
    set(t.getResult()[0], Kind::WeightT, Value());
    return success();
  }

  // linalg.matmul of the group's rows by expert e's weight: row r of
  // grouped_matmul(all rows, stacked weights) is the same dot product in the
  // same order (see matchRowMatmul), and +0 on rows outside every group.
  if (auto mm = dyn_cast<linalg::MatmulOp>(inner)) {
    FailureOr<RowMatmul> rm = matchRowMatmul(mm, why);
    if (failed(rm))
      return failure();
    if (!isRows(rm->lhs) || !isRows(mm.getOutputs()[0]))
      return refuse(why, "linalg.matmul in the body does not multiply the "
                         "group's rows (A) by a weight into rows");
    if (!isKind(rm->rhs, Kind::Weight))
      return refuse(why, "linalg.matmul in the body multiplies by something "
                         "other than a per-expert weight (B)");
    Value whole = GroupedMatmulOp::create(
        b, loc, wholeType(mm.getResultTypes()[0]), mapping.lookup(rm->lhs),
        mapping.lookup(rm->rhs), op.getOffsets(), rm->transposeRhs);
    set(mm.getResult(0), Kind::Rows, whole, /*zeroOutside=*/true);
    return success();
  }

  // moe.swiglu is row-wise, and silu(+0) * (+0) = +0.
  if (auto sw = dyn_cast<SwigluOp>(inner)) {
    const Info *in = info(sw.getInput());
    if (!in || in->kind != Kind::Rows)
      return refuse(why, "moe.swiglu in the body is not applied to rows");
    Value whole = SwigluOp::create(b, loc, wholeType(sw.getType()), in->whole,
                                   sw.getLayout());
    set(sw.getResult(), Kind::Rows, whole, in->zeroOutside);
    return success();
  }

  if (auto lop = dyn_cast<linalg::LinalgOp>(inner))
    return visitElementwiseLinalg(lop, why);

  // Elementwise ops on row tensors (arith, math): row-wise by definition;
  // +0 outside the groups if all operands are and the scalar op maps +0 to
  // +0.
  if (inner.hasTrait<OpTrait::Elementwise>() && inner.getNumRegions() == 0 &&
      inner.getNumOperands() > 0 &&
      llvm::all_of(inner.getOperands(), [&](Value v) { return isRows(v); })) {
    bool zero = llvm::all_of(inner.getOperands(),
                             [&](Value v) { return info(v)->zeroOutside; });
    if (zero) {
      SmallVector<Attribute> zeros;
      for (Value v : inner.getOperands())
        zeros.push_back(b.getZeroAttr(getElementTypeOrSelf(v.getType())));
      zero = allPosZero(evalScalarForm(&inner, zeros));
    }
    Operation *c = b.clone(inner, mapping);
    ArrayRef<int64_t> shape =
        cast<RankedTensorType>(c->getOperand(0).getType()).getShape();
    for (auto [r, cr] : llvm::zip(inner.getResults(), c->getResults())) {
      cr.setType(
          RankedTensorType::get(shape, getElementTypeOrSelf(r.getType())));
      set(r, Kind::Rows, cr, zero);
    }
    return success();
  }

  return refuse(why, opName(&inner) +
                         " in the body is not a row-wise op this pass knows "
                         "(linalg.matmul by a weight, moe.swiglu, elementwise "
                         "linalg/arith/math on the rows)");
}

/// A linalg op elementwise on the group's rows: all loops parallel, identity
/// indexing maps, no linalg.index, a pure payload reading only its arguments
/// and Uniform values.
LogicalResult ExpertsGrouper::visitElementwiseLinalg(linalg::LinalgOp lop,
                                                     std::string &why) {
  Operation *inner = lop.getOperation();
  std::string name = opName(inner);
  if (!lop.hasPureTensorSemantics() || !lop.isAllParallelLoops() ||
      lop.hasIndexSemantics() ||
      !llvm::all_of(lop.getIndexingMapsArray(),
                    [](AffineMap m) { return m.isIdentity(); }))
    return refuse(why, name + " in the body is not elementwise (all loops "
                              "parallel, identity maps, no linalg.index)");
  Block *payload = lop.getBlock();
  bool pure = true;
  payload->walk([&](Operation *p) {
    if (p->getNumRegions() != 0 || !isMemoryEffectFree(p))
      pure = false;
    for (Value v : p->getOperands())
      if (v.getParentBlock() != payload && !isKind(v, Kind::Uniform))
        pure = false;
  });
  if (!pure)
    return refuse(why, name + " in the body has a payload with regions, "
                              "side effects or values that differ per "
                              "expert");

  bool zero = true;
  SmallVector<Attribute> zeros;
  for (OpOperand &operand : inner->getOpOperands()) {
    Value v = operand.get();
    bool read = lop.payloadUsesValueFromOperand(&operand);
    if (isRows(v)) {
      if (read && !info(v)->zeroOutside)
        zero = false;
    } else if (!(lop.isDpsInit(&operand) && !read &&
                 isKind(v, Kind::EmptyRows))) {
      return refuse(why, name + " in the body reads something other than "
                                "the group's rows (a per-expert weight would "
                                "need a gather)");
    }
    zeros.push_back(b.getZeroAttr(getElementTypeOrSelf(v.getType())));
  }
  if (zero)
    zero = allPosZero(evalPayload(*payload, zeros));

  Operation *c = b.clone(*inner, mapping);
  for (auto [i, r] : llvm::enumerate(c->getResults())) {
    r.setType(mapping.lookup(lop.getDpsInits()[i]).getType());
    set(inner->getResult(i), Kind::Rows, r, zero);
  }
  return success();
}

//===----------------------------------------------------------------------===//
// (b) scf.for over experts -> moe.experts
//===----------------------------------------------------------------------===//

/// A candidate for (b): a loop reading a 1-d integer tensor at its induction
/// variable (offsets[e]).
bool isExpertLoopCandidate(scf::ForOp loop) {
  Value iv = loop.getInductionVar();
  return llvm::any_of(iv.getUsers(), [&](Operation *user) {
    auto ex = dyn_cast<tensor::ExtractOp>(user);
    return ex && ex.getTensor().getType().getRank() == 1 &&
           isa<IntegerType>(ex.getType()) && ex.getIndices()[0] == iv;
  });
}

/// Matches `v = arith.index_cast(tensor.extract %off[%idx])` defined in
/// `body`; returns (%off, %idx) and records the two ops.
std::optional<std::pair<Value, Value>>
matchOffsetRead(Value v, Block *body, SmallVectorImpl<Operation *> &ops) {
  Operation *cast = v.getDefiningOp();
  if (!cast || cast->getBlock() != body ||
      !isa<arith::IndexCastOp, arith::IndexCastUIOp>(cast))
    return std::nullopt;
  auto ex = cast->getOperand(0).getDefiningOp<tensor::ExtractOp>();
  if (!ex || ex->getBlock() != body || ex.getIndices().size() != 1)
    return std::nullopt;
  ops.push_back(cast);
  ops.push_back(ex);
  return std::make_pair(ex.getTensor(), ex.getIndices()[0]);
}

/// Form (b): raises
///
///   %r = scf.for %e = 0 to E step 1 iter_args(%acc = <+0 tensor [R, N]>) {
///     %lo = index_cast(offsets[%e]); %hi = index_cast(offsets[%e + 1])
///     %n = %hi - %lo
///     %x = tensor.extract_slice %tokens[%lo, 0] [%n, H] [1, 1]
///     %w = tensor.extract_slice %W[%e, 0, ..] [1, ...] [1, ..]   (any number)
///     ... pure ops on %x, %w, %n and constants -> %y : tensor<?xN>
///     %acc' = tensor.insert_slice %y into %acc[%lo, 0] [%n, N] [1, 1]
///     scf.yield %acc'
///   }
///
/// to `moe.experts %tokens, %offsets weights(%W, ...)` whose body is the
/// pure ops (%x, %w the block arguments, %n = tensor.dim %x, 0). Legal:
/// for offsets with 0 <= offsets[e] <= offsets[e+1] <= R the loop writes
/// each group's rows with the body's result and leaves the other rows at +0,
/// which is moe.experts' definition; other offsets make the loop's slices
/// out of bounds (undefined), where moe.experts clamps, a refinement.
LogicalResult raiseExpertLoop(scf::ForOp loop, std::string &why) {
  std::optional<int64_t> lb = getConstantIntValue(loop.getLowerBound()),
                         ub = getConstantIntValue(loop.getUpperBound()),
                         step = getConstantIntValue(loop.getStep());
  if (!lb || *lb != 0 || !step || *step != 1 || !ub || *ub < 1)
    return refuse(why, "the loop is not over experts 0 to a constant E "
                       "with step 1");
  int64_t numExperts = *ub;
  if (loop.getNumRegionIterArgs() != 1)
    return refuse(why, "the loop does not carry exactly one tensor (the "
                       "result rows)");
  Block *body = loop.getBody();
  Value iv = loop.getInductionVar(), acc = loop.getRegionIterArgs()[0];
  auto accType = dyn_cast<RankedTensorType>(acc.getType());
  if (!accType || accType.getRank() != 2 || !accType.hasStaticShape() ||
      !isGemmOperandType(accType.getElementType()))
    return refuse(why, "the carried result is not a static 2-d f32, bf16 or "
                       "f16 tensor");
  int64_t numCols = accType.getDimSize(1);

  // The write-back: rows [lo, lo + n) of the carried result.
  auto yield = cast<scf::YieldOp>(body->getTerminator());
  auto ins = yield.getOperand(0).getDefiningOp<tensor::InsertSliceOp>();
  if (!ins || ins->getBlock() != body || ins.getDest() != acc ||
      !acc.hasOneUse() || !ins->hasOneUse())
    return refuse(why, "the loop does not end by inserting rows into the "
                       "carried result, or reads that result otherwise");
  std::optional<SmallVector<int64_t>> insStrides =
      constants(ins.getMixedStrides());
  SmallVector<OpFoldResult> insOffsets = ins.getMixedOffsets(),
                            insSizes = ins.getMixedSizes();
  Value lo = dyn_cast<Value>(insOffsets[0]), n = dyn_cast<Value>(insSizes[0]);
  if (!lo || !n || !isConstantIntValue(insOffsets[1], 0) ||
      !isConstantIntValue(insSizes[1], numCols) || !insStrides ||
      *insStrides != SmallVector<int64_t>{1, 1})
    return refuse(why, "the loop does not insert whole rows [lo, lo + n) "
                       "into the carried result");

  // lo = offsets[e], n = offsets[e + 1] - lo.
  SmallVector<Operation *> plumbing{ins, yield};
  auto sub = n.getDefiningOp<arith::SubIOp>();
  if (!sub || sub->getBlock() != body || sub.getRhs() != lo)
    return refuse(why, "the group size is not offsets[e + 1] - offsets[e]");
  plumbing.push_back(sub);
  Value hi = sub.getLhs();
  auto loRead = matchOffsetRead(lo, body, plumbing);
  auto hiRead = matchOffsetRead(hi, body, plumbing);
  if (!loRead || !hiRead || loRead->first != hiRead->first ||
      loRead->second != iv)
    return refuse(why, "the group bounds are not read from one offsets "
                       "tensor at e and e + 1");
  auto next = hiRead->second.getDefiningOp<arith::AddIOp>();
  if (!next || next->getBlock() != body ||
      !((next.getLhs() == iv && isConstantIntValue(next.getRhs(), 1)) ||
        (next.getRhs() == iv && isConstantIntValue(next.getLhs(), 1))))
    return refuse(why, "the upper group bound is not read at e + 1");
  plumbing.push_back(next);
  Value offsets = loRead->first;
  auto offsetsType = cast<RankedTensorType>(offsets.getType());
  if (!loop.isDefinedOutsideOfLoop(offsets) || !offsetsType.hasStaticShape() ||
      offsetsType.getDimSize(0) != numExperts + 1 ||
      !(offsetsType.getElementType().isInteger(32) ||
        offsetsType.getElementType().isInteger(64)))
    return refuse(why, "the offsets are not an i32/i64 tensor of E + 1 = " +
                           Twine(numExperts + 1) +
                           " entries defined outside the loop");

  // The group's rows of the tokens, and slice e of the stacked weights.
  Value tokens;
  SmallVector<tensor::ExtractSliceOp> rowSlices;
  llvm::SetVector<Value> weights;
  SmallVector<tensor::ExtractSliceOp> weightSlices;
  for (Operation &o : *body) {
    auto s = dyn_cast<tensor::ExtractSliceOp>(o);
    if (!s)
      continue;
    SmallVector<OpFoldResult> offs = s.getMixedOffsets(),
                              sizes = s.getMixedSizes();
    std::optional<SmallVector<int64_t>> strides =
        constants(s.getMixedStrides());
    RankedTensorType srcType = s.getSourceType();
    bool unitStrides =
        strides && llvm::all_of(*strides, [](int64_t v) { return v == 1; });
    if (dyn_cast<Value>(offs[0]) == lo) {
      if (!loop.isDefinedOutsideOfLoop(s.getSource()) ||
          srcType.getRank() != 2 || s.getType().getRank() != 2 ||
          srcType.isDynamicDim(1) || !isConstantIntValue(offs[1], 0) ||
          dyn_cast<Value>(sizes[0]) != n ||
          !isConstantIntValue(sizes[1], srcType.getDimSize(1)) ||
          !unitStrides || (tokens && tokens != s.getSource()))
        return refuse(why, "the loop slices rows [lo, lo + n) of something "
                           "other than whole rows of one tokens tensor");
      tokens = s.getSource();
      rowSlices.push_back(s);
    } else if (dyn_cast<Value>(offs[0]) == iv) {
      auto sliceType = RankedTensorType::get(srcType.getShape().drop_front(),
                                             srcType.getElementType());
      bool whole = unitStrides && isConstantIntValue(sizes[0], 1) &&
                   s.getType() == sliceType && srcType.hasStaticShape();
      for (int64_t d = 1; whole && d < srcType.getRank(); ++d)
        whole = isConstantIntValue(offs[d], 0) &&
                isConstantIntValue(sizes[d], srcType.getDimSize(d));
      if (!whole || !loop.isDefinedOutsideOfLoop(s.getSource()) ||
          srcType.getDimSize(0) < numExperts)
        return refuse(why, "the loop slices something at e that is not "
                           "expert e's whole slice of a stacked weight "
                           "[>= E, ...]");
      weights.insert(s.getSource());
      weightSlices.push_back(s);
    } else {
      continue;
    }
    plumbing.push_back(s);
  }
  if (!tokens)
    return refuse(why, "the loop does not slice rows [offsets[e], "
                       "offsets[e + 1]) of a tokens tensor");
  auto tokensType = cast<RankedTensorType>(tokens.getType());
  if (!isGemmOperandType(tokensType.getElementType()) ||
      tokensType.getDimSize(0) != accType.getDimSize(0))
    return refuse(why, "the tokens are not f32, bf16 or f16 with as many "
                       "rows as the result");
  if (!isZeroTensor(loop.getInitArgs()[0]))
    return refuse(why, "the loop's initial result is not known to be +0 "
                       "(moe.experts gives zeros on rows outside every "
                       "group)");
  Value y = ins.getSource();
  if (y.getType() != RankedTensorType::get({ShapedType::kDynamic, numCols},
                                           accType.getElementType()))
    return refuse(why, "the inserted rows are not a tensor<?x" +
                           Twine(numCols) + "x" +
                           str(accType.getElementType()) + ">");

  // Everything else is the body: pure, and reading only the slices, the
  // group size, its own values and constants.
  llvm::DenseSet<Operation *> isPlumbing(plumbing.begin(), plumbing.end());
  llvm::DenseSet<Value> forbidden{
      iv, acc, lo, hi, next.getResult(), ins.getResult()};
  for (Operation *p : plumbing)
    if (isa<arith::IndexCastOp, arith::IndexCastUIOp, tensor::ExtractOp>(p))
      forbidden.insert(p->getResult(0));
  SmallVector<Operation *> compute;
  llvm::SetVector<Operation *> hoisted;
  bool nUsed = false;
  for (Operation &o : *body) {
    if (isPlumbing.contains(&o))
      continue;
    if (!isMemoryEffectFree(&o))
      return refuse(why, opName(&o) + " in the loop has side effects");
    WalkResult r = o.walk([&](Operation *nested) {
      for (Value v : nested->getOperands()) {
        if (forbidden.contains(v)) {
          why = "the loop body uses the expert index or the group bounds "
                "other than to slice the tokens, weights and result";
          return WalkResult::interrupt();
        }
        nUsed |= v == n;
        if (!loop.isDefinedOutsideOfLoop(v))
          continue;
        if (!matchPattern(v, m_Constant())) {
          why = "the loop body reads a value from outside the loop that is "
                "not a constant nor sliced per expert (a moe.experts body is "
                "isolated from above)";
          return WalkResult::interrupt();
        }
        hoisted.insert(v.getDefiningOp());
      }
      return WalkResult::advance();
    });
    if (r.wasInterrupted())
      return failure();
    compute.push_back(&o);
  }

  // Build the moe.experts op.
  Location loc = loop.getLoc();
  OpBuilder b(loop);
  SmallVector<Value> stacked;
  for (Value w : weights) {
    auto t = cast<RankedTensorType>(w.getType());
    if (t.getDimSize(0) != numExperts) {
      SmallVector<OpFoldResult> offs(t.getRank(), b.getIndexAttr(0)),
          strides(t.getRank(), b.getIndexAttr(1)), sizes;
      sizes.push_back(b.getIndexAttr(numExperts));
      for (int64_t d = 1; d < t.getRank(); ++d)
        sizes.push_back(b.getIndexAttr(t.getDimSize(d)));
      w = tensor::ExtractSliceOp::create(b, loc, w, offs, sizes, strides);
    }
    stacked.push_back(w);
  }
  auto experts = ExpertsOp::create(b, loc, accType, tokens, offsets, stacked);
  SmallVector<Type> argTypes{
      RankedTensorType::get({ShapedType::kDynamic, tokensType.getDimSize(1)},
                            tokensType.getElementType())};
  for (Value w : weights) {
    auto t = cast<RankedTensorType>(w.getType());
    argTypes.push_back(
        RankedTensorType::get(t.getShape().drop_front(), t.getElementType()));
  }
  SmallVector<Location> argLocs(argTypes.size(), loc);
  Block *eb = b.createBlock(&experts.getBody(), {}, argTypes, argLocs);
  IRMapping mapping;
  for (tensor::ExtractSliceOp s : rowSlices)
    mapping.map(s.getResult(), eb->getArgument(0));
  for (tensor::ExtractSliceOp s : weightSlices)
    mapping.map(s.getResult(),
                eb->getArgument(1 + (llvm::find(weights, s.getSource()) -
                                     weights.begin())));
  if (nUsed)
    mapping.map(
        n, tensor::DimOp::create(b, loc, eb->getArgument(0), 0).getResult());
  for (Operation *c : hoisted)
    b.clone(*c, mapping);
  for (Operation *c : compute)
    b.clone(*c, mapping);
  YieldOp::create(b, loc, mapping.lookupOrDefault(y));
  replaceAndErase(loop, experts.getResult());
  return success();
}

//===----------------------------------------------------------------------===//
// (c) unrolled per-expert matmuls -> one moe.grouped_matmul
//===----------------------------------------------------------------------===//

bool isMatmulResult(Value v) { return v.getDefiningOp<linalg::MatmulOp>(); }

/// An insert_slice of a linalg.matmul result (a link of an unrolled chain).
bool isMatmulInsert(Operation *op) {
  auto ins = dyn_cast_or_null<tensor::InsertSliceOp>(op);
  return ins && isMatmulResult(ins.getSource());
}

/// The insert chain ending at `last`, first insert first.
SmallVector<tensor::InsertSliceOp> insertChain(tensor::InsertSliceOp last) {
  SmallVector<tensor::InsertSliceOp> chain;
  for (Operation *cur = last; isMatmulInsert(cur);
       cur = cast<tensor::InsertSliceOp>(cur).getDest().getDefiningOp())
    chain.push_back(cast<tensor::InsertSliceOp>(cur));
  std::reverse(chain.begin(), chain.end());
  return chain;
}

/// A candidate for (c): tensor.concat along rows of at least two matmul
/// results, or the last of a chain of at least two insert_slices of matmul
/// results into rows of one tensor.
bool isUnrolledCandidate(Operation *op) {
  if (auto cat = dyn_cast<tensor::ConcatOp>(op))
    return cat.getDim() == 0 &&
           llvm::count_if(cat.getInputs(), isMatmulResult) >= 2;
  if (!isMatmulInsert(op))
    return false;
  for (Operation *user : op->getUsers())
    if (isMatmulInsert(user) &&
        cast<tensor::InsertSliceOp>(user).getDest() == op->getResult(0))
      return false;
  return insertChain(cast<tensor::InsertSliceOp>(op)).size() >= 2;
}

/// One expert of an unrolled group: `mm` writes output rows
/// [outRow, outRow + rows) from input rows [inRow, inRow + rows) of `input`.
struct Piece {
  linalg::MatmulOp mm;
  int64_t outRow, rows;
  Value input;
  int64_t inRow;
  RowMatmul rm;
  int64_t index; // position in the concat / chain
};

/// If the rhs of every piece is slice `first + e` of one stacked tensor
/// `[>= E, d1, d2]` (rank-reducing tensor.extract_slice), returns it.
Value stackedSource(ArrayRef<Piece> pieces, int64_t &first) {
  Value src;
  for (auto [e, p] : llvm::enumerate(pieces)) {
    auto s = p.rm.rhs.getDefiningOp<tensor::ExtractSliceOp>();
    if (!s)
      return {};
    RankedTensorType st = s.getSourceType();
    std::optional<SmallVector<int64_t>> offs = constants(s.getMixedOffsets()),
                                        sizes = constants(s.getMixedSizes()),
                                        strides =
                                            constants(s.getMixedStrides());
    if (!offs || !sizes || !strides || st.getRank() != 3 ||
        !st.hasStaticShape() ||
        *sizes != SmallVector<int64_t>{1, st.getDimSize(1), st.getDimSize(2)} ||
        *strides != SmallVector<int64_t>{1, 1, 1} || (*offs)[1] != 0 ||
        (*offs)[2] != 0 || (src && src != s.getSource()))
      return {};
    if (e == 0)
      first = (*offs)[0];
    else if ((*offs)[0] != first + int64_t(e))
      return {};
    src = s.getSource();
  }
  return src;
}

/// Form (c): E >= 2 linalg.matmuls, each of a static row slice of one tensor
/// X by a per-expert weight, written to consecutive rows of one result, in
/// the same order as their input rows:
///
///   %x_e = tensor.extract_slice %X[s_e, 0] [n_e, H] [1, 1]
///   %y_e = linalg.matmul ins(%x_e, %w_e) outs(<+0 f32 [n_e, N]>)
///   %r = tensor.concat dim(0) %y_0, ..., %y_{E-1}
///     or a chain of tensor.insert_slice %y_e into ...[c_e, 0] [n_e, N]
///
/// with s_{e+1} = s_e + n_e and c_{e+1} = c_e + n_e (after sorting by c_e).
/// Becomes moe.grouped_matmul(X[s_0 : s_0 + sum n], W, offsets = [0, n_0,
/// n_0 + n_1, ...]) with W the stacked weights (a stacked tensor itself
/// when the w_e are its slices e, else the w_e stacked with insert_slices),
/// inserted at row c_0 (or the whole result of the concat). Legal: every
/// row of group e is the same dot products with w_e in the same order (see
/// matchRowMatmul), and every row of the grouped result is in a group.
LogicalResult groupUnrolled(Operation *root, std::string &why) {
  SmallVector<std::pair<Value, int64_t>> outputs; // (matmul result, out row)
  Value dest;                                     // insert chain only
  if (auto cat = dyn_cast<tensor::ConcatOp>(root)) {
    int64_t row = 0;
    for (Value in : cat.getInputs()) {
      auto t = cast<RankedTensorType>(in.getType());
      if (!isMatmulResult(in) || !t.hasStaticShape())
        return refuse(why, "an operand of tensor.concat is not a static "
                           "per-expert linalg.matmul result");
      outputs.push_back({in, row});
      row += t.getDimSize(0);
    }
  } else {
    SmallVector<tensor::InsertSliceOp> chain =
        insertChain(cast<tensor::InsertSliceOp>(root));
    dest = chain.front().getDest();
    for (auto [i, ins] : llvm::enumerate(chain)) {
      auto offs = constants(ins.getMixedOffsets());
      auto sizes = constants(ins.getMixedSizes());
      auto strides = constants(ins.getMixedStrides());
      RankedTensorType dt = ins.getDestType(), st = ins.getSourceType();
      if (!offs || !sizes || !strides || dt.getRank() != 2 ||
          !dt.hasStaticShape() || st.getRank() != 2 || (*offs)[1] != 0 ||
          (*sizes)[1] != dt.getDimSize(1) ||
          *strides != SmallVector<int64_t>{1, 1})
        return refuse(why, "a tensor.insert_slice of the chain does not "
                           "write whole rows at static offsets");
      if (ins != chain.back() && !ins->hasOneUse())
        return refuse(why, "a partial result of the insert_slice chain is "
                           "also used elsewhere");
      outputs.push_back({ins.getSource(), (*offs)[0]});
    }
  }

  SmallVector<Piece> pieces;
  for (auto [v, outRow] : outputs) {
    auto mm = v.getDefiningOp<linalg::MatmulOp>();
    FailureOr<RowMatmul> rm = matchRowMatmul(mm, why);
    if (failed(rm))
      return failure();
    if (!v.hasOneUse())
      return refuse(why, "a per-expert linalg.matmul result is also used "
                         "elsewhere");
    auto slice = rm->lhs.getDefiningOp<tensor::ExtractSliceOp>();
    auto offs = slice ? constants(slice.getMixedOffsets()) : std::nullopt;
    auto sizes = slice ? constants(slice.getMixedSizes()) : std::nullopt;
    auto strides = slice ? constants(slice.getMixedStrides()) : std::nullopt;
    if (!offs || !sizes || !strides || slice.getSourceType().getRank() != 2 ||
        slice.getType().getRank() != 2 ||
        slice.getSourceType().isDynamicDim(1) || (*offs)[1] != 0 ||
        (*sizes)[1] != slice.getSourceType().getDimSize(1) ||
        *strides != SmallVector<int64_t>{1, 1})
      return refuse(why, "the input of a per-expert linalg.matmul is not a "
                         "static slice of whole rows of a tensor");
    pieces.push_back({mm, outRow, (*sizes)[0], slice.getSource(), (*offs)[0],
                      *rm, int64_t(pieces.size())});
  }
  // By output row; pieces of zero rows keep their program order.
  llvm::sort(pieces, [](const Piece &a, const Piece &b) {
    return std::make_pair(a.outRow, a.index) <
           std::make_pair(b.outRow, b.index);
  });
  Piece p0 = pieces.front();
  int64_t total = 0;
  for (const Piece &p : pieces) {
    if (p.outRow != p0.outRow + total)
      return refuse(why, "the per-expert results do not fill consecutive "
                         "rows");
    if (p.input != p0.input || p.inRow != p0.inRow + total)
      return refuse(why, "the per-expert inputs are not consecutive row "
                         "slices of one tensor, in the order of the "
                         "results");
    if (p.rm.transposeRhs != p0.rm.transposeRhs ||
        p.rm.rhs.getType() != p0.rm.rhs.getType() ||
        !cast<RankedTensorType>(p.rm.rhs.getType()).hasStaticShape())
      return refuse(why, "the per-expert weights do not have one static "
                         "type and layout");
    total += p.rows;
  }
  int64_t numExperts = pieces.size();
  auto resultType = cast<RankedTensorType>(p0.mm.getResultTypes()[0]);
  int64_t numCols = resultType.getDimSize(1);

  Location loc = root->getLoc();
  OpBuilder b(root);
  auto inType = cast<RankedTensorType>(p0.input.getType());
  Value lhs = p0.input;
  if (p0.inRow != 0 || inType.getDimSize(0) != total)
    lhs = tensor::ExtractSliceOp::create(
        b, loc, lhs,
        ArrayRef<OpFoldResult>{b.getIndexAttr(p0.inRow), b.getIndexAttr(0)},
        ArrayRef<OpFoldResult>{b.getIndexAttr(total),
                               b.getIndexAttr(inType.getDimSize(1))},
        ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});

  auto wType = cast<RankedTensorType>(p0.rm.rhs.getType());
  auto stackedType = RankedTensorType::get(
      {numExperts, wType.getDimSize(0), wType.getDimSize(1)},
      wType.getElementType());
  SmallVector<OpFoldResult> unit(3, b.getIndexAttr(1));
  int64_t first = 0;
  Value weights = stackedSource(pieces, first);
  if (weights &&
      (first != 0 ||
       cast<RankedTensorType>(weights.getType()).getDimSize(0) != numExperts)) {
    weights = tensor::ExtractSliceOp::create(
        b, loc, stackedType, weights,
        ArrayRef<OpFoldResult>{b.getIndexAttr(first), b.getIndexAttr(0),
                               b.getIndexAttr(0)},
        ArrayRef<OpFoldResult>{b.getIndexAttr(numExperts),
                               b.getIndexAttr(wType.getDimSize(0)),
                               b.getIndexAttr(wType.getDimSize(1))},
        unit);
  } else if (!weights) {
    // Separate weights: stack them, one insert_slice each.
    weights = tensor::EmptyOp::create(b, loc, stackedType.getShape(),
                                      stackedType.getElementType());
    for (auto [e, p] : llvm::enumerate(pieces))
      weights = tensor::InsertSliceOp::create(
          b, loc, p.rm.rhs, weights,
          ArrayRef<OpFoldResult>{b.getIndexAttr(e), b.getIndexAttr(0),
                                 b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1),
                                 b.getIndexAttr(wType.getDimSize(0)),
                                 b.getIndexAttr(wType.getDimSize(1))},
          unit);
  }

  bool wide = total > std::numeric_limits<int32_t>::max();
  auto offType =
      RankedTensorType::get({numExperts + 1}, b.getIntegerType(wide ? 64 : 32));
  SmallVector<APInt> bounds{APInt(wide ? 64 : 32, 0)};
  int64_t acc = 0;
  for (const Piece &p : pieces)
    bounds.push_back(APInt(wide ? 64 : 32, acc += p.rows));
  Value offsets = arith::ConstantOp::create(
      b, loc, DenseIntElementsAttr::get(offType, bounds));
  Value result = GroupedMatmulOp::create(
      b, loc, RankedTensorType::get({total, numCols}, b.getF32Type()), lhs,
      weights, offsets, p0.rm.transposeRhs);
  if (dest) {
    auto destType = cast<RankedTensorType>(dest.getType());
    if (p0.outRow != 0 || destType.getDimSize(0) != total)
      result = tensor::InsertSliceOp::create(
          b, loc, result, dest,
          ArrayRef<OpFoldResult>{b.getIndexAttr(p0.outRow), b.getIndexAttr(0)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(total),
                                 b.getIndexAttr(numCols)},
          ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
  }
  replaceAndErase(root, result);
  return success();
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

struct MoEGroupExpertsPass
    : moe::impl::MoEGroupExpertsBase<MoEGroupExpertsPass> {
  using Base::Base;

  /// Tries `rewrite` on every op of type OpTy that `isCandidate` accepts,
  /// first found first, until none is left: a rewrite erases its candidate,
  /// a refused candidate is remembered (and stays alive).
  template <typename OpTy>
  void forEach(function_ref<bool(OpTy)> isCandidate,
               function_ref<LogicalResult(OpTy, std::string &)> rewrite) {
    llvm::DenseSet<Operation *> refused;
    while (true) {
      OpTy next = {};
      getOperation()->walk([&](OpTy op) {
        if (refused.contains(op) || !isCandidate(op))
          return WalkResult::advance();
        next = op;
        return WalkResult::interrupt();
      });
      if (!next)
        return;
      std::string why;
      if (succeeded(rewrite(next, why)))
        continue;
      refused.insert(next);
      if (remarks)
        next->emitRemark() << "moe-group-experts: left unchanged: " << why;
    }
  }

  void runOnOperation() override {
    // (b) loops over experts -> moe.experts (inner loops first).
    forEach<scf::ForOp>(isExpertLoopCandidate, raiseExpertLoop);
    // (c) unrolled per-expert matmuls -> moe.grouped_matmul.
    forEach<Operation *>(isUnrolledCandidate, groupUnrolled);
    // (a) moe.experts, including those raised from loops.
    forEach<ExpertsOp>([](ExpertsOp) { return true; },
                       [](ExpertsOp op, std::string &why) {
                         return ExpertsGrouper(op).run(why);
                       });
  }
};

} // namespace
