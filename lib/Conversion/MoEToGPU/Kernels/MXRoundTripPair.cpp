//===- MXRoundTripPair.cpp - MX round-trip pairs --------------------------===//
//
// MX round trips of both blockings of a matrix in one pass
// --------------------------------------------------------
// A train step rounds each MXFP8 weight [..., K, N] twice: with blocks along
// K for the forward GEMM and along N for the data gradient (transpose_rhs).
// The pair of round trips of the same x (blocks along the last two dims,
// K and N multiples of 32) becomes one kernel that reads x once and writes
// both results (one f32 read and two bf16 writes a value instead of two
// reads and two writes; the K-blocked pass alone also reads 32 rows apart).
//
// Work: tiles of 32 rows x 32 columns of one matrix, a warp a tile, warps
// striding over the tiles (at most roundtrip::MaxBlocks CTAs of 8 warps). Lane
// l loads column l of the tile's 32 rows (every load a coalesced 128-byte row
// of f32): its 32 values are one block of the K-blocked result. The tile
// goes through the warp's shared-memory slab so that lane l then holds row
// l: one block of the N-blocked result, stored as one 32-value run (and,
// in the K-only kernel of scaled gathered rows, the K-blocked results too:
// kThroughSlab). Each
// lane computes two scales a tile (a block's scale in every lane of the
// warp, by shuffles, made the kernel ALU-bound). Scales and rounding are
// mxRoundTrip's: both results are bit-identical to the single round trips'.
//
//===----------------------------------------------------------------------===//

#include "../MemoryPolicy.h"
#include "KernelBuilder.h"
#include "Kernels.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

using namespace roundtrip;

namespace {

/// Emits the body of the round-trip pair's gpu.launch. With `source` (a
/// [rows] index buffer), the pair's row r is gathered row source[r], or
/// zeros where source[r] is outside [0, sourceRows) (a dispatch's gather,
/// fused: see -moe-gpu-fuse-row-gathers): x's row source[r], or with
/// `scale` ([sourceRows] f32) scale[s] * x's row s / perRow (s = source[r];
/// `scaleFirst`: the product's operand order).
struct RoundTripPairEmitter : KernelBuilder {
  const MXRoundTripPair &g;
  int64_t grid;
  Value x, outK, outN;

  /// The emitter for a kernel of `g` whose results are `outs` (both, or
  /// the one `g` computes).
  RoundTripPairEmitter(OpBuilder &b, Location loc, const MXRoundTripPair &g,
                       int64_t grid, Value x, ArrayRef<Value> outs)
      : KernelBuilder{b, loc}, g(g), grid(grid), x(x),
        outK(g.withK ? outs.front() : Value()),
        outN(g.withN ? outs.back() : Value()) {}
  Value source{}, scale{};
  int64_t sourceRows = 0, perRow = 1;
  bool scaleFirst = true;

  void syncWarp() { NVVM::SyncWarpOp::create(b, loc, int32(-1)); }

  /// Whether the K-blocked results leave through the slab as row runs
  /// instead of 32 two-byte stores a lane, 32 rows apart: for the K-only
  /// kernel of scaled gathered rows, where it measured 0.52 ms instead of
  /// 0.77 (gpt-oss-20b's dims, 66528 x 2880 rows). The pair kernel and the
  /// unscaled gather measured slower that way (0.99 ms instead of 0.79,
  /// 0.39 instead of 0.28) and store directly.
  bool kThroughSlab() const { return !outN && scale; }

  void emit(gpu::LaunchOp launch) {
    Value tid = launch.getThreadIds().x;
    Value lane = rem(tid, 32);
    Value warpInCta = div(tid, 32);
    Value warp = add(mul(launch.getBlockIds().x, idx(PairWarps)), warpInCta);
    setUpSharedMemory();
    // This warp's 32 x 33 f32 (row i at 33 i: column j of every row in
    // bank (i + j) % 32, so both the column writes and the row reads are
    // conflict-free).
    Value slab = mul(warpInCta, idx(PairSlabBytes));
    auto slot = [&](Value i, Value j) {
      return sharedPtrAt(add(slab, mul(add(mul(i, idx(33)), j), idx(4))));
    };
    Value xs = flat(x);
    Value ks = outK ? flat(outK) : Value(), ns = outN ? flat(outN) : Value();
    // A result's address and whether it takes 16-byte stores (storeRun).
    auto aligned16 = [&](Value base) {
      return cmp(P::eq, arith::AndIOp::create(b, loc, base, int64(15)),
                 int64(0));
    };
    Value nBase = ns ? baseAddress(ns) : Value();
    Value nAligned = ns ? aligned16(nBase) : Value();
    Value kBase = kThroughSlab() ? baseAddress(ks) : Value();
    Value kAligned = kThroughSlab() ? aligned16(kBase) : Value();
    int64_t rows = g.rows(), cols = g.cols();
    int64_t colTiles = cols / 32, rowTiles = rows / 32;
    Type f32 = b.getF32Type();
    strideLoop(warp, idx(g.tiles()), grid * PairWarps, [&](Value tile) {
      // Tile (matrix m, row tile r, column tile c): element (32 r + i,
      // 32 c + j) of matrix m at ((m * rows) + 32 r + i) * cols + 32 c + j.
      Value m = div(tile, rowTiles * colTiles);
      Value rc = rem(tile, rowTiles * colTiles);
      Value corner =
          add(mul(add(mul(m, idx(rows)), mul(div(rc, colTiles), idx(32))),
                  idx(cols)),
              mul(rem(rc, colTiles), idx(32)));
      // Where lane l's row of the tile starts (a run of 32 results), made
      // where it is stored (made up front, it took 16 more registers).
      auto runAt = [&] { return add(corner, mul(lane, idx(cols))); };
      // Row `lane` of the slab, once every lane's column is in it; the slab
      // is free for the next writes after.
      auto readRow = [&] {
        syncWarp();
        SmallVector<Value> row;
        for (int64_t j = 0; j < 32; ++j)
          row.push_back(
              LLVM::LoadOp::create(b, loc, f32, slot(lane, idx(j)), 4));
        syncWarp();
        return row;
      };
      // Column `lane` (a K block): loads coalesced across the warp.
      SmallVector<Value> at, column;
      // Gathered: lane i reads row i's source, shuffled to every lane.
      Value rowSource, rowScale;
      if (source) {
        Value r = add(mul(div(rc, colTiles), idx(32)), lane);
        Value s = memref::LoadOp::create(b, loc, source, ValueRange{r});
        Value inside =
            land(cmp(P::sge, s, idx(0)), cmp(P::slt, s, idx(sourceRows)));
        rowSource = arith::IndexCastOp::create(b, loc, i32(),
                                               select(inside, s, idx(-1)));
        if (scale)
          rowScale = memref::LoadOp::create(
              b, loc, scale, ValueRange{select(inside, s, idx(0))});
      }
      for (int64_t i = 0; i < 32; ++i) {
        at.push_back(add(corner, add(idx(i * cols), lane)));
        if (!source) {
          column.push_back(
              toF32(memref::LoadOp::create(b, loc, xs, ValueRange{at.back()})));
        } else {
          Value s = gpu::ShuffleOp::create(b, loc, rowSource, int32(i),
                                           int32(32), gpu::ShuffleMode::IDX)
                        .getShuffleResult();
          Value inside = cmp(P::sge, s, int32(0));
          Value row = toIndex(select(inside, s, int32(0)));
          if (scale)
            row = div(row, perRow);
          Value from = add(mul(row, idx(cols)),
                           add(mul(rem(rc, colTiles), idx(32)), lane));
          Value v = toF32(memref::LoadOp::create(b, loc, xs, ValueRange{from}));
          if (scale) {
            Value w = gpu::ShuffleOp::create(b, loc, rowScale, int32(i),
                                             int32(32), gpu::ShuffleMode::IDX)
                          .getShuffleResult();
            v = scaleFirst ? arith::MulFOp::create(b, loc, w, v)
                           : arith::MulFOp::create(b, loc, v, w);
          }
          column.push_back(select(
              inside, v,
              arith::ConstantFloatOp::create(
                  b, loc, cast<FloatType>(b.getF32Type()), APFloat(0.0f))));
        }
        if (ns)
          LLVM::StoreOp::create(b, loc, column.back(), slot(idx(i), lane), 4);
      }
      if (ks) {
        SmallVector<Value> alongK =
            mxRoundTrip(column, amaxOf(column), g.alongK.mx.getElementType(),
                        g.alongK.mode, g.alongK.outElt);
        if (!kThroughSlab()) {
          for (int64_t i = 0; i < 32; ++i)
            memref::StoreOp::create(b, loc, alongK[i], ks, ValueRange{at[i]});
        } else {
          // Through the slab (exactly, as f32): lane l then stores row l's
          // 32 results as one run.
          for (int64_t i = 0; i < 32; ++i)
            LLVM::StoreOp::create(b, loc, toF32(alongK[i]), slot(idx(i), lane),
                                  4);
          SmallVector<Value> row = readRow();
          if (!g.alongK.outElt.isF32())
            for (Value &v : row)
              v = arith::TruncFOp::create(b, loc, g.alongK.outElt, v);
          storeRun(ks, kBase, runAt(), row, kAligned);
        }
      }
      if (!ns)
        return;
      // Row `lane` (an N block), through shared memory: 32 consecutive
      // results stored as one run.
      SmallVector<Value> row = readRow();
      SmallVector<Value> alongN =
          mxRoundTrip(row, amaxOf(row), g.alongN.mx.getElementType(),
                      g.alongN.mode, g.alongN.outElt);
      storeRun(ns, nBase, runAt(), alongN, nAligned);
    });
  }
};

/// A pair's round trips, recorded on its function (the MX types, modes and
/// element types), so that -moe-gpu-fuse-row-gathers can emit the same
/// kernel reading gathered rows.
constexpr llvm::StringLiteral kRoundTripPairAttr = "moe.round_trip_pair";

ArrayAttr roundTripPairAttr(MLIRContext *ctx, const MXRoundTripPair &g) {
  SmallVector<Attribute> parts;
  for (const MXRoundTrip &t : {g.alongK, g.alongN})
    parts.append({TypeAttr::get(t.mx), TypeAttr::get(t.inElt),
                  TypeAttr::get(t.outElt),
                  StringAttr::get(ctx, stringifyScaleMode(t.mode))});
  parts.append({BoolAttr::get(ctx, g.withK), BoolAttr::get(ctx, g.withN)});
  return ArrayAttr::get(ctx, parts);
}

} // namespace

std::optional<MXRoundTripPair> roundTripPairOf(func::FuncOp func) {
  auto parts = func->getAttrOfType<ArrayAttr>(kRoundTripPairAttr);
  if (!parts || parts.size() != 10)
    return std::nullopt;
  auto withK = dyn_cast<BoolAttr>(parts[8]),
       withN = dyn_cast<BoolAttr>(parts[9]);
  if (!withK || !withN)
    return std::nullopt;
  MXRoundTrip trips[2];
  for (int i = 0; i < 2; ++i) {
    auto mx = dyn_cast<TypeAttr>(parts[4 * i]);
    auto in = dyn_cast<TypeAttr>(parts[4 * i + 1]);
    auto out = dyn_cast<TypeAttr>(parts[4 * i + 2]);
    auto mode = dyn_cast<StringAttr>(parts[4 * i + 3]);
    if (!mx || !in || !out || !mode || !isa<MXTensorType>(mx.getValue()))
      return std::nullopt;
    std::optional<ScaleMode> m = symbolizeScaleMode(mode.getValue());
    if (!m)
      return std::nullopt;
    trips[i] = MXRoundTrip{cast<MXTensorType>(mx.getValue()), in.getValue(),
                           out.getValue(), *m, Type()};
  }
  return MXRoundTripPair{trips[0], trips[1], withK.getValue(),
                         withN.getValue()};
}

/// Every pair of round trips of one x along its last two dims (see "MX round
/// trips of both blockings") in one block becomes one call, placed before
/// the first of them.
void lowerRoundTripPairs(ModuleOp module, SymbolTable &symbols,
                         bool withinPeak) {
  SmallVector<std::tuple<DequantizeOp, DequantizeOp, MXRoundTripPair>> work;
  for (auto func : module.getOps<func::FuncOp>()) {
    if (func->hasAttr("moe.dedicated_kernel"))
      continue;
    // Round trips by input and blocking axis (the first of each).
    llvm::MapVector<std::pair<Value, unsigned>,
                    std::pair<DequantizeOp, MXRoundTrip>>
        byInput;
    func.walk([&](DequantizeOp dq) {
      std::optional<MXRoundTrip> g = matchRoundTrip(dq);
      if (!g || g->mx.getShape().size() < 2)
        return;
      auto q = dq.getInput().getDefiningOp<QuantizeOp>();
      byInput.try_emplace({q.getInput(), g->mx.getAxis()}, dq, *g);
    });
    for (auto &[key, alongK] : byInput) {
      unsigned rank = alongK.second.mx.getShape().size();
      if (key.second != rank - 2)
        continue;
      auto it = byInput.find({key.first, rank - 1});
      if (it == byInput.end() ||
          it->second.first->getBlock() != alongK.first->getBlock())
        continue;
      work.push_back({alongK.first, it->second.first,
                      MXRoundTripPair{alongK.second, it->second.second}});
    }
  }
  // Paired, the later round trip's result lives from the earlier one on.
  // Pairs that would raise their block's peak of live tensors are split,
  // each round trip at its own place (reading x twice): a weight's
  // data-gradient blocking or the activations' columnwise one is then not
  // held through the backward's widest point. A weight's pair becomes two
  // single round trips; a dispatch's rows, which only the pair kernel reads
  // from the tokens (-moe-gpu-fuse-row-gathers), two pair kernels of one
  // result each.
  // (MemoryPolicy.h decides.) Each pair's round trips in block order:
  SmallVector<std::pair<Operation *, Operation *>> ordered;
  for (auto &[dqK, dqN, pair] : work) {
    if (dqK->isBeforeInBlock(dqN))
      ordered.push_back({dqK, dqN});
    else
      ordered.push_back({dqN, dqK});
  }
  SmallVector<bool> split = roundTripPairsToSplit(ordered, withinPeak);
  SmallVector<std::tuple<SmallVector<DequantizeOp>, MXRoundTripPair>> calls;
  for (auto [i, item] : llvm::enumerate(work)) {
    auto &[dqK, dqN, pair] = item;
    Value x = dqK.getInput().getDefiningOp<QuantizeOp>().getInput();
    if (!split[i]) {
      calls.push_back({{dqK, dqN}, pair});
      continue;
    }
    if (!x.getDefiningOp<DispatchOp>())
      continue; // two single round trips (lowerRoundTrips)
    MXRoundTripPair k = pair, n = pair;
    k.withN = false;
    n.withK = false;
    calls.push_back({{dqK}, k});
    calls.push_back({{dqN}, n});
  }
  for (auto &[dqs, pair] : calls) {
    const MXRoundTripPair &g = pair;
    Location loc = dqs.front().getLoc();
    Value x = dqs.front().getInput().getDefiningOp<QuantizeOp>().getInput();
    int64_t grid = std::min(tilesOf(g.tiles(), PairWarps), MaxBlocks);
    SmallVector<RankedTensorType> types;
    for (DequantizeOp dq : dqs)
      types.push_back(dq.getType());
    func::FuncOp kernel = getOrCreateKernelCall(
        module, symbols, g.name(), "mx round trips along both dims",
        {x.getType()}, types, loc,
        {grid, 1, 1, PairWarps * 32, PairWarps * PairSlabBytes},
        [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
            ArrayRef<Value> outs) {
          RoundTripPairEmitter k(b, loc, g, grid, buf[0], outs);
          k.emit(launch);
        });
    if (g.alongK.mx.getShape().size() == 2)
      kernel->setAttr(kRoundTripPairAttr,
                      roundTripPairAttr(module.getContext(), g));
    Operation *first = dqs.front();
    for (DequantizeOp dq : dqs)
      if (dq->isBeforeInBlock(first))
        first = dq;
    OpBuilder b(first);
    auto call = func::CallOp::create(b, loc, kernel, ValueRange{x});
    for (auto [dq, result] : llvm::zip(dqs, call.getResults())) {
      auto q = dq.getInput().getDefiningOp<QuantizeOp>();
      dq.getResult().replaceAllUsesWith(result);
      dq.erase();
      if (q->use_empty())
        q.erase();
    }
  }
}

func::FuncOp
getOrCreateRoundTripPairGather(ModuleOp module, SymbolTable &symbols,
                               const MXRoundTripPair &g, StringRef name,
                               ArrayRef<Type> argTypes,
                               ArrayRef<RankedTensorType> resultTypes,
                               Location loc, const GatheredRows &rows) {
  int64_t grid = std::min(tilesOf(g.tiles(), PairWarps), MaxBlocks);
  return getOrCreateKernelCall(
      module, symbols, name, "mx round trips along both dims of gathered rows",
      argTypes, resultTypes, loc,
      {grid, 1, 1, PairWarps * 32, PairWarps * PairSlabBytes},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
          ArrayRef<Value> outs) {
        RoundTripPairEmitter k(b, loc, g, grid, buf[0], outs);
        k.source = buf[1];
        k.sourceRows = rows.sourceRows;
        if (rows.scaled) {
          k.scale = k.flat(buf[2]);
          k.perRow = rows.perRow;
          k.scaleFirst = rows.scaleFirst;
        }
        k.emit(launch);
      });
}

} // namespace mlir::moe::kernels
