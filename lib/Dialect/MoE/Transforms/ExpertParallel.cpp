//===- ExpertParallel.cpp - shard experts over a grid axis ----------------===//
//
// Rewrites every MoE layer (moe.dispatch -> expert computation -> moe.combine)
// into its expert-parallel form for one rank of `ep-size` ranks, each holding
// E / ep-size experts:
//
//   dispatch(x, idx, E)            rows grouped by global expert (no padding)
//   all_to_all(rows, counts)       rows of the experts of rank r go to rank r,
//     slot_major_result            arriving grouped by local expert (each
//                                  group padded as the original dispatch's)
//   slot_offsets(recv counts)      the local groups' boundaries
//   <expert computation>           on the local rows, local weight shards
//   all_to_all(y, recv counts)     rows return to the ranks they came from,
//     slot_major_input             read from the local groups
//   combine(y, weights, positions) as before
//
// With chunks=N the layer's tokens are split into N equal parts that are
// exchanged and computed one after another, emitted stage by stage (every
// chunk's dispatch and exchange, then every chunk's experts and return
// exchange, then every chunk's combine): with the exchanges split into a
// start and a wait (-convert-moe-to-runtime), one chunk's rows travel while
// the experts compute another's.
//
// Expert weights [E, ...] that are function arguments become this rank's
// shard [E / ep-size, ...] (argument attribute `moe.expert_shard`); other
// expert weights are sliced at this rank's offset. Results marked
// `moe.gradient_of = i` whose argument i is not an expert shard (data-parallel
// parameters) are summed over the grid with `shard.all_reduce`.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/CountedRows.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEEXPERTPARALLEL
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

int64_t roundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/// One MoE layer: the dispatch, the ops computing the experts' rows, the
/// combine that reads them.
struct Layer {
  DispatchOp dispatch;
  CombineOp combine;
  SmallVector<Operation *> compute; // in program order
};

/// The ops between the dispatch's rows/offsets and the combine's expert
/// outputs, if they form a closed expert computation.
FailureOr<Layer> matchLayer(CombineOp combine, bool remarks) {
  auto fail = [&](const Twine &why) -> FailureOr<Layer> {
    if (remarks)
      combine.emitRemark("not sharded: ") << why;
    return failure();
  };
  auto dispatch = combine.getPositions().getDefiningOp<DispatchOp>();
  if (!dispatch)
    return fail("the combine's positions do not come from a moe.dispatch");
  // Backward slice from the expert outputs to the dispatch.
  llvm::SetVector<Operation *> slice;
  SmallVector<Value> work = {combine.getExpertOut()};
  while (!work.empty()) {
    Value v = work.pop_back_val();
    Operation *def = v.getDefiningOp();
    if (!def || def == dispatch.getOperation() || slice.contains(def))
      continue;
    // Only values that depend on the dispatch belong to the computation.
    bool dependent = false;
    SmallVector<Value> stack = {v};
    llvm::DenseSet<Value> seen;
    while (!stack.empty() && !dependent) {
      Value s = stack.pop_back_val();
      if (!seen.insert(s).second)
        continue;
      Operation *d = s.getDefiningOp();
      if (!d)
        continue;
      if (d == dispatch.getOperation()) {
        dependent = true;
        break;
      }
      for (Value o : d->getOperands())
        stack.push_back(o);
    }
    if (!dependent)
      continue;
    if (!isa<GroupedMatmulOp, GroupedMlpOp, SwigluOp, QuantizeOp, DequantizeOp,
             ExpertsOp>(def))
      return fail(Twine("'") + def->getName().getStringRef() +
                  "' in the expert computation has no sharded form");
    slice.insert(def);
    for (Value o : def->getOperands())
      work.push_back(o);
  }
  if (slice.empty())
    return fail("no expert computation between dispatch and combine");
  // The computation may read only the dispatch's rows and offsets.
  for (Operation *op : slice)
    for (Value o : op->getOperands())
      if (o.getDefiningOp() == dispatch.getOperation() &&
          o != dispatch.getSorted() && o != dispatch.getOffsets())
        return fail("the expert computation reads dispatch results other than "
                    "the rows and offsets");
  // Its values must not escape except into the combine.
  for (Operation *op : slice)
    for (Operation *user : op->getUsers())
      if (!slice.contains(user) && user != combine.getOperation())
        return fail("a value of the expert computation is used outside it");
  Layer layer{dispatch, combine, {}};
  for (Operation *op : slice)
    layer.compute.push_back(op);
  llvm::sort(layer.compute,
             [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  Block *block = combine->getBlock();
  for (Operation *op : layer.compute)
    if (op->getBlock() != block)
      return fail("the expert computation spans several blocks");
  return layer;
}

/// `type` with its leading dimension replaced. (A blockwise FP8 shard's
/// tiles are the whole tensor's: tiles of one expert each, see expertTiles.)
Type withLeading(Type type, int64_t d) {
  if (auto scaled = dyn_cast<BlockScaledType>(type)) {
    SmallVector<int64_t> shape(scaled.getShape());
    shape[0] = d;
    return scaled.withShape(shape);
  }
  auto t = cast<RankedTensorType>(type);
  SmallVector<int64_t> shape(t.getShape());
  shape[0] = d;
  return RankedTensorType::get(shape, t.getElementType());
}

/// Whether every tile of a blockwise FP8 `type` holds one expert's values
/// (other types: always), so that a shard of experts quantizes alike.
bool expertTiles(Type type) {
  auto fp8 = dyn_cast<FP8BlockTensorType>(type);
  return !fp8 || fp8.getBlock()[0] == 1;
}

int64_t leading(Type type) {
  if (auto scaled = dyn_cast<BlockScaledType>(type))
    return scaled.getShape()[0];
  return cast<RankedTensorType>(type).getDimSize(0);
}

/// Operands that hold stacked expert weights ([E, ...]).
SmallVector<unsigned> weightOperands(Operation *op) {
  if (isa<GroupedMatmulOp>(op))
    return {1};
  if (isa<GroupedMlpOp>(op))
    return {1, 2};
  if (auto experts = dyn_cast<ExpertsOp>(op)) {
    SmallVector<unsigned> idx;
    for (unsigned i = 0; i < experts.getWeights().size(); ++i)
      idx.push_back(2 + i);
    return idx;
  }
  return {};
}

struct MoEExpertParallelPass
    : moe::impl::MoEExpertParallelBase<MoEExpertParallelPass> {
  using MoEExpertParallelBase::MoEExpertParallelBase;

  /// The grid's shape: [ep-size], or [dp-size, ep-size] (expert groups of
  /// adjacent ranks).
  SmallVector<int64_t> gridShape() const {
    if (dpSize > 1)
      return {dpSize, epSize};
    return {epSize};
  }
  /// The grid axis the experts are spread over, and the data-parallel one.
  int16_t epAxis() const { return dpSize > 1 ? 1 : 0; }
  static constexpr int16_t kDpAxis = 0;
  /// Every axis: what the whole job sums over.
  SmallVector<shard::GridAxis> allAxes() const {
    if (dpSize > 1)
      return {0, 1};
    return {0};
  }

  shard::GridOp getOrCreateGrid(ModuleOp module) {
    SymbolTable symbols(module);
    SmallVector<int64_t> shape = gridShape();
    if (auto grid = symbols.lookup<shard::GridOp>(gridName)) {
      if (grid.getShape() != ArrayRef<int64_t>(shape)) {
        grid.emitError("moe-expert-parallel: grid @")
            << gridName << " exists with another shape; expected "
            << (dpSize > 1 ? std::to_string(dpSize) + " x " : std::string())
            << int64_t(epSize) << " ranks";
        return {};
      }
      return grid;
    }
    OpBuilder b = OpBuilder::atBlockBegin(module.getBody());
    auto grid = shard::GridOp::create(b, module.getLoc(), gridName.getValue(),
                                      ArrayRef<int64_t>(shape));
    symbols.insert(grid);
    return grid;
  }

  /// This rank's E_local experts of a stacked weight (null if it has none:
  /// a blockwise FP8 quantization whose tiles span experts).
  Value localShard(OpBuilder &b, Location loc, Value weight, int64_t local,
                   func::FuncOp func, llvm::DenseMap<Value, Value> &done) {
    if (Value v = done.lookup(weight))
      return v;
    if (!expertTiles(weight.getType()) ||
        llvm::any_of(weight.getUsers(), [](Operation *u) {
          return isa<QuantizeOp>(u) && !expertTiles(u->getResult(0).getType());
        }))
      return {};
    Value result;
    auto arg = dyn_cast<BlockArgument>(weight);
    bool onlyExperts =
        arg && arg.getOwner()->isEntryBlock() &&
        arg.getOwner()->getParentOp() == func.getOperation() &&
        llvm::all_of(arg.getUsers(), [](Operation *u) {
          return isa<GroupedMatmulOp, GroupedMlpOp, ExpertsOp, QuantizeOp>(u);
        });
    if (onlyExperts) {
      // The argument itself becomes the shard.
      Type shardType = withLeading(arg.getType(), local);
      // Which slice of the experts this argument holds (a plain string names
      // the grid: metadata, not a use that would keep the grid alive).
      int64_t total = leading(weight.getType());
      func.setArgAttr(
          arg.getArgNumber(), "moe.expert_shard",
          b.getDictionaryAttr(
              {b.getNamedAttr("grid", b.getStringAttr(gridName)),
               b.getNamedAttr("axis", b.getI64IntegerAttr(epAxis())),
               b.getNamedAttr("experts", b.getI64IntegerAttr(total)),
               b.getNamedAttr("local_experts", b.getI64IntegerAttr(local))}));
      arg.setType(shardType);
      // Quantize users of the argument see the smaller type too.
      for (Operation *u : arg.getUsers())
        if (auto q = dyn_cast<QuantizeOp>(u))
          q.getResult().setType(withLeading(q.getType(), local));
      result = arg;
    } else {
      result = sliceAtRank(b, loc, weight, local);
    }
    done[weight] = result;
    return result;
  }

  /// This rank's `local` experts of a stacked weight `[E, ...]`: the slice
  /// at its offset on the expert axis (null for a value that is not a
  /// ranked tensor).
  Value sliceAtRank(OpBuilder &b, Location loc, Value weight, int64_t local) {
    auto t = dyn_cast<RankedTensorType>(weight.getType());
    if (!t)
      return {};
    Value index = shard::ProcessMultiIndexOp::create(
                      b, loc, StringRef(gridName), {epAxis()})
                      .getResult()[0];
    Value off = arith::MulIOp::create(
        b, loc, index, arith::ConstantIndexOp::create(b, loc, local));
    SmallVector<OpFoldResult> offs(t.getRank(), b.getIndexAttr(0)), sizes,
        strides(t.getRank(), b.getIndexAttr(1));
    offs[0] = off;
    for (int64_t i = 0; i < t.getRank(); ++i)
      sizes.push_back(b.getIndexAttr(i == 0 ? local : t.getDimSize(i)));
    return tensor::ExtractSliceOp::create(
        b, loc, cast<RankedTensorType>(withLeading(t, local)), weight, offs,
        sizes, strides);
  }

  /// Calls of functions whose expert weights became shards (layer
  /// functions, -moe-model --layer-functions) pass shards: an argument of
  /// the caller that only such calls read becomes a shard too (and its own
  /// callers are fixed in turn); any other value is sliced at this rank's
  /// offset before the call.
  LogicalResult passShardsToCalls(ModuleOp module) {
    SymbolTable symbols(module);
    auto shardAt = [&](OpOperand &use) -> DictionaryAttr {
      auto call = dyn_cast<func::CallOp>(use.getOwner());
      auto callee =
          call ? symbols.lookup<func::FuncOp>(call.getCallee()) : nullptr;
      return callee ? callee.getArgAttrOfType<DictionaryAttr>(
                          use.getOperandNumber(), "moe.expert_shard")
                    : DictionaryAttr();
    };
    for (bool changed = true; changed;) {
      changed = false;
      SmallVector<func::CallOp> calls;
      module.walk([&](func::CallOp call) { calls.push_back(call); });
      for (func::CallOp call : calls) {
        auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
        if (!callee)
          continue;
        for (OpOperand &use : call->getOpOperands()) {
          DictionaryAttr shard = shardAt(use);
          Type want = callee.getArgumentTypes()[use.getOperandNumber()];
          Value v = use.get();
          if (!shard || v.getType() == want)
            continue;
          auto caller = call->getParentOfType<func::FuncOp>();
          auto arg = dyn_cast<BlockArgument>(v);
          if (arg && arg.getOwner()->isEntryBlock() &&
              arg.getOwner()->getParentOp() == caller.getOperation() &&
              llvm::all_of(arg.getUses(), [&](OpOperand &u) {
                DictionaryAttr other = shardAt(u);
                return other && other == shard;
              })) {
            arg.setType(want);
            caller.setArgAttr(arg.getArgNumber(), "moe.expert_shard", shard);
            caller.setType(FunctionType::get(
                &getContext(), caller.getBody().front().getArgumentTypes(),
                caller.getResultTypes()));
            changed = true;
            continue;
          }
          auto local = shard.getAs<IntegerAttr>("local_experts");
          OpBuilder b(call);
          Value slice = local ? sliceAtRank(b, call.getLoc(), v, local.getInt())
                              : Value();
          if (!slice || slice.getType() != want)
            return call.emitError("moe-expert-parallel: operand #")
                   << use.getOperandNumber() << " of this call, " << v.getType()
                   << ", is not the whole of the expert shard " << want
                   << " the callee takes";
          use.set(slice);
        }
      }
    }
    return success();
  }

  /// Rows [offset, offset + rows) of a 2-d tensor.
  static Value rowSlice(OpBuilder &b, Location loc, Value t, int64_t offset,
                        int64_t rows) {
    auto type = cast<RankedTensorType>(t.getType());
    return tensor::ExtractSliceOp::create(
        b, loc,
        RankedTensorType::get({rows, type.getDimSize(1)},
                              type.getElementType()),
        t, ArrayRef<OpFoldResult>{b.getIndexAttr(offset), b.getIndexAttr(0)},
        ArrayRef<OpFoldResult>{b.getIndexAttr(rows),
                               b.getIndexAttr(type.getDimSize(1))},
        ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
  }

  LogicalResult shardLayer(Layer &layer, func::FuncOp func) {
    DispatchOp d = layer.dispatch;
    int64_t experts = d.getNumExperts();
    if (experts % epSize != 0)
      return d.emitError("moe-expert-parallel: the ")
             << experts << " experts do not divide evenly over ep-size="
             << int64_t(epSize);
    int64_t local = experts / epSize;
    if (isa<MXTensorType>(d.getTokens().getType()))
      return d.emitError("moe-expert-parallel: expects the dispatched tokens "
                         "in high precision, got ")
             << d.getTokens().getType()
             << " (shard first, then -moe-hoist-quantize moves the "
                "quantization before the exchange)";
    auto idxType = d.getIndices().getType();
    int64_t tokens = idxType.getDimSize(0), k = idxType.getDimSize(1);
    int64_t pad = d.getPadTo();
    int64_t parts = chunks;
    if (parts < 1)
      return d.emitError("moe-expert-parallel: chunks must be at least 1, got ")
             << parts;
    if (tokens % parts != 0)
      return d.emitError("moe-expert-parallel: the ")
             << tokens << " tokens do not split into chunks=" << parts
             << " equal parts";
    if (parts > 1 && d.getCapacity() >= 0)
      return d.emitError("moe-expert-parallel: chunks=")
             << parts
             << " with a capacity factor: capacity would apply to each chunk "
                "of tokens instead of the layer (use chunks=1)";
    int64_t part = tokens / parts;
    MLIRContext *ctx = &getContext();
    Location loc = d.getLoc();
    OpBuilder b(layer.combine);
    Type i32 = b.getI32Type();
    auto tokensType = cast<RankedTensorType>(d.getTokens().getType());
    int64_t hidden = tokensType.getDimSize(1);
    Type rowElt = tokensType.getElementType();
    auto grid = FlatSymbolRefAttr::get(ctx, gridName);
    auto axes = b.getDenseI16ArrayAttr({epAxis()});
    int64_t rows0 = part * k;
    if (int64_t cap = d.getCapacity(); cap >= 0)
      rows0 = std::min(rows0, experts * cap);
    int64_t recvRows = epSize * rows0;
    int64_t rows2 =
        roundUp(DispatchOp::droplessRows(recvRows, local, pad).value_or(0), 32);
    auto counts = RankedTensorType::get({experts}, i32);

    // The expert weights: this rank's shards.
    IRMapping weights;
    llvm::DenseMap<Value, Value> shards;
    OpBuilder wb(layer.combine); // before the chunks' ops
    for (Operation *op : layer.compute)
      for (unsigned i : weightOperands(op)) {
        Value w = op->getOperand(i);
        if (weights.contains(w))
          continue;
        // Weights quantized in the graph: shard the float weights.
        if (auto q = w.getDefiningOp<QuantizeOp>();
            q && !llvm::is_contained(layer.compute, q.getOperation())) {
          Value s = localShard(wb, loc, q.getInput(), local, func, shards);
          if (!s)
            return op->emitError("moe-expert-parallel: cannot shard this "
                                 "expert weight");
          if (s != q.getInput()) {
            OpBuilder qb(q);
            qb.setInsertionPointAfterValue(s);
            auto lq = QuantizeOp::create(qb, q.getLoc(),
                                         withLeading(q.getType(), local), s,
                                         q.getScaleMode());
            weights.map(w, lq.getResult());
          }
          continue;
        }
        if (leading(w.getType()) != experts)
          return op->emitError("moe-expert-parallel: expects the expert weight "
                               "to have a leading dimension of ")
                 << experts << " experts";
        Value s = localShard(wb, loc, w, local, func, shards);
        if (!s)
          return op->emitError("moe-expert-parallel: cannot shard this expert "
                               "weight");
        if (s != w)
          weights.map(w, s);
      }

    // Each chunk of tokens goes through the exchange on its own; the ops are
    // emitted stage by stage over the chunks (all dispatches and exchanges,
    // then all expert computations and return exchanges, then all
    // combines), so that a chunk's exchange can run while the experts
    // compute another (-convert-moe-to-runtime starts each exchange where
    // its operands are ready and waits where its rows are used).
    struct Chunk {
      DispatchOp global;
      AllToAllOp sent, back;
      Value weights;
    };
    SmallVector<Chunk> chunkList(parts);
    for (int64_t c = 0; c < parts; ++c) {
      Chunk &ch = chunkList[c];
      Value x = d.getTokens(), idx = d.getIndices();
      ch.weights = layer.combine.getWeights();
      if (parts > 1) {
        x = rowSlice(b, loc, x, c * part, part);
        idx = rowSlice(b, loc, idx, c * part, part);
        ch.weights = rowSlice(b, loc, ch.weights, c * part, part);
      }
      // 1. Dispatch by global expert, no padding (padding happens locally).
      ch.global = DispatchOp::create(
          b, loc, RankedTensorType::get({rows0, hidden}, rowElt),
          RankedTensorType::get({experts + 1}, i32), counts,
          RankedTensorType::get({part, k}, i32), x, idx,
          b.getI64IntegerAttr(experts), d.getCapacityFactorAttr(),
          b.getI64IntegerAttr(1));
      // 2. Rows to the ranks owning their experts, arriving grouped by
      // local expert with the original padding.
      ch.sent = AllToAllOp::create(
          b, loc, RankedTensorType::get({rows2, hidden}, rowElt), counts,
          ch.global.getSorted(), ch.global.getCounts(), grid, axes,
          /*slot_major_input=*/UnitAttr(),
          /*slot_major_result=*/b.getUnitAttr(), b.getI64IntegerAttr(pad));
    }
    for (Chunk &ch : chunkList) {
      // 3. Where the local experts' groups are.
      Value recvCounts = ch.sent.getRecvCounts();
      Value offsets =
          SlotOffsetsOp::create(b, loc, RankedTensorType::get({local + 1}, i32),
                                recvCounts, b.getI64IntegerAttr(pad));
      // 4. The expert computation on local rows and weight shards.
      IRMapping mapping = weights;
      mapping.map(d.getSorted(), ch.sent.getResult());
      mapping.map(d.getOffsets(), offsets);
      for (Operation *op : layer.compute) {
        Operation *clone = b.clone(*op, mapping);
        // Row results now have the local row count.
        for (Value r : clone->getResults())
          r.setType(withLeading(r.getType(), rows2));
        for (auto [o, c] : llvm::zip(op->getResults(), clone->getResults()))
          mapping.map(o, c);
      }
      Value localOut = mapping.lookup(layer.combine.getExpertOut());
      auto outType = cast<RankedTensorType>(localOut.getType());
      int64_t outCols = outType.getDimSize(1);
      // 5. Rows return to where they came from, read from the local groups
      // (they arrive in the order they left: the global dispatch's).
      ch.back = AllToAllOp::create(
          b, loc,
          RankedTensorType::get({rows0, outCols}, outType.getElementType()),
          counts, localOut, recvCounts, grid, axes,
          /*slot_major_input=*/b.getUnitAttr(),
          /*slot_major_result=*/UnitAttr(), b.getI64IntegerAttr(pad));
    }
    // 6. The original combine, on the returned rows (chunk by chunk).
    auto resultType = layer.combine.getType();
    Value result;
    if (parts == 1) {
      result = CombineOp::create(
          b, loc, resultType, chunkList[0].back.getResult(),
          chunkList[0].weights, chunkList[0].global.getPositions());
    } else {
      result = tensor::EmptyOp::create(b, loc, resultType.getShape(),
                                       resultType.getElementType());
      auto partType = RankedTensorType::get({part, resultType.getDimSize(1)},
                                            resultType.getElementType());
      for (auto [c, ch] : llvm::enumerate(chunkList)) {
        Value y = CombineOp::create(b, loc, partType, ch.back.getResult(),
                                    ch.weights, ch.global.getPositions());
        result = tensor::InsertSliceOp::create(
            b, loc, y, result,
            ArrayRef<OpFoldResult>{b.getIndexAttr(int64_t(c) * part),
                                   b.getIndexAttr(0)},
            ArrayRef<OpFoldResult>{b.getIndexAttr(part),
                                   b.getIndexAttr(partType.getDimSize(1))},
            ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
      }
    }
    layer.combine.getResult().replaceAllUsesWith(result);
    layer.combine.erase();
    for (Operation *op : llvm::reverse(layer.compute))
      if (op->use_empty())
        op->erase();
    if (d->use_empty())
      d.erase();
    return success();
  }

  /// `v` summed over `axes` of the grid (by default every rank's).
  Value sumOverGrid(OpBuilder &b, Location loc, Value v,
                    ArrayRef<shard::GridAxis> axes = {}) {
    SmallVector<shard::GridAxis> all = allAxes();
    return shard::AllReduceOp::create(b, loc, v, gridName.getValue(),
                                      axes.empty() ? ArrayRef(all) : axes,
                                      shard::ReductionKind::Sum)
        .getResult();
  }

  /// A 0-d f32 tensor computed by `fn` from the 0-d (or broadcast) inputs.
  static Value
  scalarOp(OpBuilder &b, Location loc, ValueRange inputs,
           function_ref<Value(OpBuilder &, Location, ValueRange)> fn) {
    MLIRContext *ctx = b.getContext();
    Type f32 = b.getF32Type();
    Value init = tensor::EmptyOp::create(b, loc, ArrayRef<int64_t>{}, f32);
    SmallVector<AffineMap> maps(inputs.size() + 1, AffineMap::get(0, 0, ctx));
    return linalg::GenericOp::create(
               b, loc, TypeRange{init.getType()}, inputs, ValueRange{init},
               maps, {},
               [&](OpBuilder &nb, Location l, ValueRange args) {
                 linalg::YieldOp::create(nb, l, fn(nb, l, args.drop_back()));
               })
        .getResult(0);
  }

  /// Scales `op` (the mean over this rank's counted rows) by this rank's
  /// count over the ranks' total, so the ranks' losses add up to the mean
  /// over every rank's rows (0 when no rank has a counted row).
  void globalMean(CrossEntropyOp op) {
    OpBuilder b(op);
    b.setInsertionPointAfter(op);
    Location loc = op.getLoc();
    MLIRContext *ctx = b.getContext();
    Value labels = op.getLabels();
    int64_t vocab =
        cast<RankedTensorType>(op.getLogits().getType()).getDimSize(1);
    // This rank's counted rows: labels in [0, V).
    Value local = buildCountedRows(b, loc, labels, vocab);
    Value total = sumOverGrid(b, loc, local);
    // This rank's share of the counted rows (0 when no rank has one), then
    // the loss times it: an arith op on the 0-d tensors, which -moe-autodiff
    // differentiates (the share does not depend on any parameter).
    Value share = scalarOp(
        b, loc, ValueRange{local, total},
        [](OpBuilder &nb, Location l, ValueRange a) -> Value {
          Value none = arith::ConstantOp::create(nb, l, nb.getF32FloatAttr(0));
          Value any = arith::CmpFOp::create(nb, l, arith::CmpFPredicate::OGT,
                                            a[1], none);
          return arith::SelectOp::create(
              nb, l, any, arith::DivFOp::create(nb, l, a[0], a[1]), none);
        });
    Value loss = op.getResult();
    Value scaled = arith::MulFOp::create(b, loc, loss, share);
    loss.replaceAllUsesExcept(scaled, scaled.getDefiningOp());
    op->setAttr("moe.global_mean", UnitAttr::get(ctx));
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (epSize < 1 || dpSize < 1) {
      module.emitError("moe-expert-parallel: ")
          << (epSize < 1 ? "ep-size" : "dp-size") << " must be at least 1, got "
          << int64_t(epSize < 1 ? epSize : dpSize);
      return signalPassFailure();
    }
    if (!getOrCreateGrid(module))
      return signalPassFailure();
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      // A function that already exchanges rows is expert-parallel (for
      // example a train step -moe-autodiff derived from a sharded loss):
      // its layers stay as they are; only its gradients are reduced below.
      // (Data-parallel copies of whole experts, ep-size=1 with dp-size > 1:
      // nothing to exchange.)
      SmallVector<CombineOp> combines;
      if ((epSize > 1 || dpSize == 1) &&
          !func.walk([](AllToAllOp) { return WalkResult::interrupt(); })
               .wasInterrupted())
        func.walk([&](CombineOp op) { combines.push_back(op); });
      for (CombineOp combine : combines) {
        FailureOr<Layer> layer = matchLayer(combine, remarks);
        if (failed(layer))
          continue;
        if (failed(shardLayer(*layer, func)))
          return signalPassFailure();
      }
      // The function's signature follows its (possibly resharded) arguments.
      func.setType(FunctionType::get(&getContext(),
                                     func.getBody().front().getArgumentTypes(),
                                     func.getResultTypes()));
    }
    // Callers of layer functions pass the shards.
    if (failed(passShardsToCalls(module)))
      return signalPassFailure();
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      // One rank: nothing to sum over the ranks.
      if (epSize * dpSize == 1)
        continue;
      // Means over tokens: over every rank's tokens.
      func.walk([&](CrossEntropyOp op) {
        if (!op->hasAttr("moe.global_mean"))
          globalMean(op);
      });
      // Summed over the ranks: the gradients of data-parallel parameters
      // and the expert load (of every rank's tokens), where the step returns
      // them -- not in the private functions it calls (a layer function's
      // backward), whose gradients the step sums once, over all layers.
      if (func.isPrivate())
        continue;
      auto ret = cast<func::ReturnOp>(func.getBody().back().getTerminator());
      for (unsigned i = 0; i < func.getNumResults(); ++i) {
        auto output = func.getResultAttrOfType<StringAttr>(i, "moe.output");
        bool sum = output && output.getValue() == "expert_load";
        SmallVector<shard::GridAxis> axes = allAxes();
        if (auto of =
                func.getResultAttrOfType<IntegerAttr>(i, "moe.gradient_of")) {
          int64_t argNo = of.getInt();
          if (argNo < 0 || argNo >= int64_t(func.getNumArguments())) {
            func.emitError("moe.gradient_of = ")
                << argNo << " on result #" << i << " names no argument";
            return signalPassFailure();
          }
          // Each expert group owns its experts' gradients: summed over the
          // data-parallel copies of the group only.
          sum = true;
          if (func.getArgAttr(argNo, "moe.expert_shard")) {
            sum = dpSize > 1;
            axes = {kDpAxis};
          }
        }
        Value v = ret.getOperand(i);
        if (!sum || v.getDefiningOp<shard::AllReduceOp>())
          continue; // (reduced by an earlier run of this pass)
        OpBuilder b(ret);
        ret.setOperand(i, sumOverGrid(b, ret.getLoc(), v, axes));
      }
    }
  }
};
} // namespace
