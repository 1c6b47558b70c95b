//===- FlashAttentionRows.cpp - flash attention's row kernels -------------===//
//
// The small kernels around the flash kernels (FlashAttention.cpp), a warp
// or a thread a row: delta = rowsum(dO * O), which both backward kernels
// read, and each 64-row tile's range of document ids, by which the flash
// kernels skip the tiles that share no document with theirs.
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"
#include "Kernels.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace {

/// delta[b, n, s] = sum_d dO[b, s, n, d] * O[b, s, n, d]: one warp a row
/// (b, s, n), D / 32 values a lane (one vector load each of dO and O), a
/// butterfly sum over the warp.
struct DeltaEmitter : KernelBuilder {
  const FlashAttention &f;
  Value dout, out, delta;

  static constexpr int64_t Warps = 8;

  void emit(gpu::LaunchOp launch) {
    Value tid = launch.getThreadIds().x;
    Value row = add(mul(launch.getBlockIds().x, idx(Warps)), div(tid, 32));
    Value lane = rem(tid, 32);
    int64_t rows = f.batch * f.seq * f.heads, per = f.dim / 32;
    ifThen(cmp(P::slt, row, idx(rows)), [&] {
      Value first = add(mul(row, idx(f.dim)), mul(lane, idx(per)));
      SmallVector<Value> g =
          loadVector(b.getBF16Type(), per,
                     globalPtr(baseAddress(dout), mul(first, idx(2))), 2 * per);
      SmallVector<Value> o =
          loadVector(b.getF32Type(), per,
                     globalPtr(baseAddress(out), mul(first, idx(4))), 4 * per);
      Value sum = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0f));
      for (int64_t i = 0; i < per; ++i)
        sum = arith::AddFOp::create(
            b, loc, sum, arith::MulFOp::create(b, loc, toF32(g[i]), o[i]));
      for (int64_t d : {16, 8, 4, 2, 1})
        sum = arith::AddFOp::create(
            b, loc, sum,
            gpu::ShuffleOp::create(b, loc, sum, int32(d), int32(32),
                                   gpu::ShuffleMode::XOR)
                .getShuffleResult());
      // row = (b S + s) N + n.
      Value n = rem(row, f.heads), bs = div(row, f.heads);
      Value bb = div(bs, f.seq), sq = rem(bs, f.seq);
      ifThen(cmp(P::eq, lane, idx(0)), [&] {
        memref::StoreOp::create(b, loc, sum, delta, ValueRange{bb, n, sq});
      });
    });
  }
};

/// ranges[b, t] = the least and the greatest document id of rows
/// [64 t, 64 t + 64) of batch entry b (rows past S not counted): a thread a
/// tile.
struct RangesEmitter : KernelBuilder {
  const FlashAttention &f;
  Value documents, ranges;

  static constexpr int64_t Threads = 128;

  void emit(gpu::LaunchOp launch) {
    int64_t tiles = tilesOf(f.seq, FlashAttention::Tile);
    Value r =
        add(mul(launch.getBlockIds().x, idx(Threads)), launch.getThreadIds().x);
    ifThen(cmp(P::slt, r, idx(f.batch * tiles)), [&] {
      Value bb = div(r, tiles), t = rem(r, tiles);
      Value s0 = mul(t, idx(FlashAttention::Tile));
      auto at = [&](Value s) {
        return memref::LoadOp::create(b, loc, documents, ValueRange{bb, s})
            .getResult();
      };
      Value first = at(s0);
      SmallVector<Value> bounds =
          forLoop(1, idx(FlashAttention::Tile), {first, first},
                  [&](Value i, ValueRange lohi) -> SmallVector<Value> {
                    Value x = at(minS(add(s0, i), idx(f.seq - 1)));
                    return {minS(lohi[0], x), maxS(lohi[1], x)};
                  });
      for (int64_t i = 0; i < 2; ++i)
        memref::StoreOp::create(b, loc, bounds[i], ranges,
                                ValueRange{bb, t, idx(i)});
    });
  }
};

} // namespace

Value createFlashDelta(OpBuilder &b, Location loc, const FlashAttention &f,
                       Value dout, Value out, ModuleOp module,
                       SymbolTable &symbols) {
  // The same kernel with or without documents.
  FlashAttention plain = f;
  plain.documents = {};
  func::FuncOp fn = getOrCreateKernelCall(
      module, symbols, plain.name("delta"), "flash attention rowsum(dO * O)",
      {dout.getType(), out.getType()}, f.statType(b.getContext()), loc,
      {tilesOf(f.batch * f.seq * f.heads, DeltaEmitter::Warps), 1, 1,
       32 * DeltaEmitter::Warps, 0},
      [&](OpBuilder &kb, gpu::LaunchOp launch, ArrayRef<Value> buf,
          Value result) {
        DeltaEmitter e{{kb, loc}, f};
        e.dout = buf[0];
        e.out = buf[1];
        e.delta = result;
        e.emit(launch);
      });
  return func::CallOp::create(b, loc, fn, ValueRange{dout, out}).getResult(0);
}

Value createDocumentRanges(OpBuilder &b, Location loc, const FlashAttention &f,
                           Value documents, ModuleOp module,
                           SymbolTable &symbols) {
  int64_t tiles = tilesOf(f.seq, FlashAttention::Tile);
  auto type = RankedTensorType::get({f.batch, tiles, 2}, f.documents);
  func::FuncOp fn = getOrCreateKernelCall(
      module, symbols,
      llvm::formatv("moe_flash_ranges_b{0}_s{1}_i{2}", f.batch, f.seq,
                    f.documents.getIntOrFloatBitWidth())
          .str(),
      "flash attention document ranges per tile", {documents.getType()}, type,
      loc,
      {tilesOf(f.batch * tiles, RangesEmitter::Threads), 1, 1,
       RangesEmitter::Threads, 0},
      [&](OpBuilder &kb, gpu::LaunchOp launch, ArrayRef<Value> buf,
          Value result) {
        RangesEmitter e{{kb, loc}, f};
        e.documents = buf[0];
        e.ranges = result;
        e.emit(launch);
      });
  return func::CallOp::create(b, loc, fn, ValueRange{documents}).getResult(0);
}

} // namespace mlir::moe::kernels
