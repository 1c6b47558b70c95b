//===- TmaGemmMainloop.cpp - the TMA kernel's mainloop --------------------===//
//
// Hopper (sm_90a): bf16 grouped GEMM, TMA and warp-specialized wgmma
// ------------------------------------------------------------------
// The forward kernel's shapes with N % 256 == 0 (the expert MLP's GEMMs and
// their data gradients) take this kernel instead of the cp.async one
// (WgmmaGemm.cpp), and so do GEMMs and weight gradients with N above 256
// (an LM head's vocabulary) or with tiles that are not whole (any K and N
// multiples of 8; the matcher pads others), the SwiGLU epilogues included:
// a partial last column tile reads zeros past N (the copy engine fills
// them; a SwiGLU tile's gate boxes past F read up columns, a transposed
// rhs's box the next expert's rows) and stores nothing there;
// a partial last K stage reads zeros past K: the lhs's map ends at K, and an
// untransposed rhs [E, K, N] is read through a 3-D map [E][K][N] whose boxes
// stay within one expert (rhsPlanes; the 2-D map would bring in the next
// expert's first rows, and 0 * inf is not 0). A weight gradient's partial
// last row tile (K % 128) stores through a 3-D map of its result (outPlanes),
// so nothing lands in the next expert's rows.
//
// Tiles: 128 rows x 256 columns, K in stages of 64. Tiles are per expert:
// expert e's clamped rows [lo, hi) give ceil((hi - lo) / 128) row tiles of
// N/256 column tiles, numbered expert after expert, row tile after row tile
// (the column tiles of one row tile run side by side: they share the A rows,
// and the few experts in flight share their B in L2), or, where a row of
// tiles reads more than 32 MiB of B, in groups of 8 row tiles
// walked column after column (tma::rasterRows). A tile past hi reads rows
// of the next expert (or zeros past R) and stores none of them.
//
// Persistent grid: min(132, tile bound) CTAs; CTA b takes tiles b, b + grid,
// ... Every warpgroup walks the same tile sequence: the expert of a tile is
// found by advancing (expert, its first tile) from the previous tile's, so
// each CTA reads the offsets once over the whole kernel.
//
// Warp specialization, 384 threads:
// - warpgroup 0, thread 0 (the producer) issues the bulk tensor copies: per
//   stage one 128 x 64 box of A (the lhs [R, K]) and the B tile: four 64 x 64
//   boxes of the rhs [E * K, N] (MN-major), or one 256 x 64 box of the
//   transposed rhs [E * N, K] (K-major). The tensor maps are encoded on the
//   host (libmoert's moertTensorMap2D, 128-byte swizzle, zeros outside the
//   array) and read from device memory.
// - warpgroups 1 and 2 (consumers) each own 64 rows of the tile: m64n256k16
//   MMAs, 128 f32 accumulators a thread, then store their rows of the tile
//   while the producer already loads the next tile. The f32 result of the
//   plain GEMMs and the weight gradients leaves through the copy engine: the
//   warpgroup writes 64 x 32 boxes into two staging buffers in the result
//   tensor map's swizzled layout and one thread issues bulk tensor stores, so
//   the warpgroup starts its next tile while the boxes travel (storeBoxes);
//   rows of a warpgroup that crosses its group's end, and the other epilogue
//   results, are stored directly (8-byte vector stores).
// Ring: 4 stages of 48 KiB (A 16 KiB, B 32 KiB) in the 128-byte swizzled
// layouts of the cp.async kernel (the copy engine writes the same pattern:
// it swizzles by address bits, every tile starts on 1 KiB), and two
// mbarriers a stage: `full` (one arrival, the producer's expect-tx of the
// stage's 49152 bytes, then the copies' completion) and `empty` (256
// arrivals: every consumer thread, once the MMAs that read the stage are
// complete). Iteration g of a warpgroup's running count uses stage g % 4 in
// phase (g / 4) % 2; the producer first waits for `empty` in the other
// parity, which a fresh barrier passes at once. Consumers keep one MMA group
// in flight (wgmma.wait_group 1) and release the stage before it.
//
// An MX lhs (TmaGemm::lhsF8, `_<f8>_lhs`: 8-bit elements and E8M0 scales
// with blocks of 32 along K): the producer's box of A is the stage's 128 x 64
// elements (8 KiB, unswizzled 64-byte rows) into the first half of the A
// slot, on a third barrier a stage (`elements`); warps 1-3 of warpgroup 0
// expand them in place into the bf16 tile (see converter()) and arrive on
// `full` (then 97 arrivals: theirs and the producer's expect-tx of the B
// bytes). The consumers are unchanged.
//
// Blockwise FP8 (TmaGemm::blockLhs, `moe_tma_fp8block_gmm_*`): DeepSeek-V3's
// recipe on the FP8 tensor cores. Operands: lhs elements [R, K] (E4M3 or
// E5M2) with f32 scales [R, K' / 128] (1 x 128 tiles; K' = K rounded up
// to 128), rhs elements K-major [E, N, K] with f32 scales per 128 x 128
// tile ([E, N'/128, K'/128] for a transposed rhs, [E, K'/128, N'/128] for
// an untransposed one, whose elements the caller transposed: FP8 wgmma reads
// K-major operands only); K and N multiples of 64: the last stage of K may
// be half (the copy engine reads zeros past K) and the last column tile
// half (its first 64 columns stored). Tiles of 128 x 128 (a consumer's m64n128
// partial and accumulators, 64 + 64 registers a thread, fit beside each other),
// stages of 128 K values: one 128-byte swizzle row of both operands, so the
// ring, the boxes (128 x 128 bytes, the copy engine's 128-byte swizzle) and the
// descriptors (32 bytes along K a wgmma) are the bf16 kernel's, with the
// B tile in the first 16 KiB of its slot. Each stage's four m64n128k32
// wgmmas sum into a fresh partial, promoted into the f32 accumulators with
// the two scales once complete (blockwiseMainloop): acc = fma(P, sa * sb,
// acc). The tensor core sums a partial's 128 products in its own
// accumulator, narrower than f32 (about 14 bits, DeepSeek-V3's measurement
// on H800): the bound is stated in test/Integration/GPU/fp8block.mlir.
//
// Blockwise FP8 weight gradients (TmaGemm::blockLhs with wgrad,
// `moe_tma_fp8block_wgrad_*`): result[e] = x[lo:hi]^T dy[lo:hi] with x and
// dy in 128 x 1 tiles (one scale per 128 rows of a column), every group
// starting and ending at a multiple of 128 rows. The group rows are the
// MMAs' K, which FP8 wgmma reads K-major: both operands arrive transposed
// ([K, R'] and [N, R'], R' = R rounded up to 128, written by their
// quantize kernel, quantizeTransposed), and a stage is one 128-row tile of
// both, boxes of 128 x 128 bytes as above. The promotion's factor is the
// product of the result row's x scale and the column's dy scale of the
// stage's row tile (the thread's 2 + 32, loaded as the stage begins).
//
// Rows outside [offsets[0], offsets[E]) (clamped) are zeroed first by all
// threads (up to offsets[E] only in the `_live` variant). Offsets are a
// dispatch's: nondecreasing; rows where decreasing offsets make groups
// overlap are written by each of them, in no set order.
//
// Numerics: the forward kernel's (bf16 products, f32 accumulation in the
// tensor core's order).
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "TmaGemm.h"

#include "../MemoryPolicy.h"
#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"
#include "moe/Dialect/MoE/Utils/LiveRows.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

using namespace tma;

namespace {

/// Emits the body of the TMA grouped GEMM's gpu.launch: the producer's
/// copies, the converters of an 8-bit lhs, the consumers' MMAs, then the
/// epilogue collective (TmaEpilogue).
struct TmaGemmEmitter : TmaEpilogue {
  Value fullBarrier(Value s) {
    return sharedPtrAt(add(idx(Barriers), mul(s, idx(8))));
  }
  Value emptyBarrier(Value s) {
    return sharedPtrAt(add(idx(Barriers + Stages * 8), mul(s, idx(8))));
  }
  /// With an 8-bit lhs: the stage's A elements have landed (one arrival,
  /// the producer's expect-tx of their 8192 bytes).
  Value elementsBarrier(Value s) {
    return sharedPtrAt(add(idx(Barriers + 2 * Stages * 8), mul(s, idx(8))));
  }
  Value ceilDiv(Value x, int64_t d) { return div(add(x, idx(d - 1)), d); }
  Value columnTiles() { return idx(g.columnTiles()); }
  /// Tile `local` of an expert's `rowTiles` x columnTiles() as (row tile,
  /// column tile), in the order rasterRows gives.
  std::pair<Value, Value> tileAt(Value local, Value rowTiles) {
    int64_t group = rasterRows(g);
    if (group == 1)
      return {div(local, g.columnTiles()), rem(local, g.columnTiles())};
    // Groups of `group` row tiles (the last one shorter), column-major.
    Value first = mul(div(local, group * g.columnTiles()), idx(group));
    Value rows =
        minS(arith::SubIOp::create(b, loc, rowTiles, first), idx(group));
    Value within = rem(local, group * g.columnTiles());
    return {add(first, arith::RemUIOp::create(b, loc, within, rows)),
            arith::DivUIOp::create(b, loc, within, rows)};
  }
  /// Forward: expert e's tiles.
  Value tilesOfExpert(Value e) {
    Value lo, hi;
    std::tie(lo, hi) = groupRows(offsets, e, g.rows);
    return mul(ceilDiv(arith::SubIOp::create(b, loc, hi, lo), TileM),
               columnTiles());
  }
  /// Forward: the expert of tile `tile` and its first tile, advancing from
  /// (e, base) (an earlier tile's); e == E when `tile` is past the last.
  std::pair<Value, Value> locate(Value tile, Value e, Value base) {
    Type index = b.getIndexType();
    auto w = scf::WhileOp::create(
        b, loc, TypeRange{index, index}, ValueRange{e, base},
        [&](OpBuilder &, Location, ValueRange args) {
          Value inRange = cmp(P::slt, args[0], idx(g.experts));
          Value e1 = minS(args[0], idx(g.experts - 1));
          Value past = cmp(P::sge, tile, add(args[1], tilesOfExpert(e1)));
          scf::ConditionOp::create(b, loc, land(inRange, past), args);
        },
        [&](OpBuilder &, Location, ValueRange args) {
          Value next = add(args[1], tilesOfExpert(args[0]));
          scf::YieldOp::create(b, loc, ValueRange{add(args[0], idx(1)), next});
        });
    return {w.getResult(0), w.getResult(1)};
  }
  /// The persistent tile loop: body(tile, g0) for each of this CTA's tiles,
  /// g0 the running stage count at its start (index); the body returns the
  /// count after it.
  void tileLoop(Value grid, function_ref<Value(const Tile &, Value)> body) {
    Type index = b.getIndexType();
    Value first = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
    if (g.wgrad) {
      // Tiles e * tilesPerExpert + (local tile), local tiles in tileAt's
      // order of (K tile, N tile).
      int64_t perExpert = kTiles(g) * g.columnTiles();
      auto loop = scf::ForOp::create(b, loc, first, idx(g.experts * perExpert),
                                     grid, ValueRange{idx(0)});
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      Value tile = loop.getInductionVar();
      Value e = div(tile, perExpert), local = rem(tile, perExpert);
      Value lo, hi;
      std::tie(lo, hi) = groupRows(offsets, e, g.rows);
      auto [kTile, nTile] = tileAt(local, idx(kTiles(g)));
      Tile t{e,
             lo,
             hi,
             mul(kTile, idx(TileM)),
             mul(nTile, idx(g.tileN())),
             ceilDiv(arith::SubIOp::create(b, loc, hi, lo), stageK(g))};
      scf::YieldOp::create(b, loc, body(t, loop.getRegionIterArgs()[0]));
      return;
    }
    scf::WhileOp::create(
        b, loc, TypeRange{index, index, index, index},
        ValueRange{first, idx(0), idx(0), idx(0)},
        [&](OpBuilder &, Location, ValueRange args) {
          auto [e, base] = locate(args[0], args[1], args[2]);
          scf::ConditionOp::create(b, loc, cmp(P::slt, e, idx(g.experts)),
                                   ValueRange{args[0], e, base, args[3]});
        },
        [&](OpBuilder &, Location, ValueRange args) {
          Value tile = args[0], e = args[1], base = args[2];
          Value lo, hi;
          std::tie(lo, hi) = groupRows(offsets, e, g.rows);
          Value local = arith::SubIOp::create(b, loc, tile, base);
          auto [rowTile, colTile] = tileAt(
              local, ceilDiv(arith::SubIOp::create(b, loc, hi, lo), TileM));
          Tile t{e,
                 lo,
                 hi,
                 add(lo, mul(rowTile, idx(TileM))),
                 mul(colTile, idx(g.tileN())),
                 idx(kStages(g))};
          Value count = body(t, args[3]);
          scf::YieldOp::create(b, loc,
                               ValueRange{add(tile, grid), e, base, count});
        });
  }

  void producer(Value grid) {
    tileLoop(grid, [&](const Tile &t, Value g0) {
      forLoop(0, t.stages, {}, [&](Value kt, ValueRange) {
        Value it = add(g0, kt);
        Value s = rem(it, Stages);
        wait(emptyBarrier(s), rem(add(div(it, Stages), idx(1)), 2));
        Value full = fullBarrier(s);
        // Blockwise FP8: A 128 x 128 and B 128 x 128 elements of a byte.
        int64_t bytes = g.blockLhs ? TileABytes + g.tileN() * stageK(g)
                        : g.lhsF8  ? TileBBytes
                                   : StageBytes;
        NVVM::MBarrierArriveExpectTxOp::create(
            b, loc, Type(), full, int32(bytes), NVVM::MemScopeKind::CTA,
            /*relaxed=*/false, Value());
        Value stage = mul(s, idx(StageBytes));
        Value bTile = add(stage, idx(TileABytes));
        Value k0 = mul(kt, idx(stageK(g)));
        if (g.wgrad && g.blockLhs) {
          // Group rows lo + 128 kt .. + 128 (the stage's K) of the
          // transposed lhs [K, R] (rows m0 .. + 128) and rhs [N, R] (rows
          // n0 .. + 128): K-major, one box each.
          Value row = add(t.lo, k0);
          tmaLoad(sharedPtrAt(stage), mapA, row, t.m0, full);
          tmaLoad(sharedPtrAt(bTile), mapB, row, t.n0, full);
          return SmallVector<Value>{};
        }
        if (g.wgrad) {
          // Rows lo + 64 kt .. + 64 of lhs [R, K] (columns m0 .. + 128, two
          // 64-column blocks) and rhs [R, N] (columns n0 .. + 256, four).
          Value row = add(t.lo, k0);
          for (int64_t q = 0; q < TileM / 64; ++q)
            tmaLoad(sharedPtrAt(add(stage, idx(8192 * q))), mapA,
                    add(t.m0, idx(64 * q)), row, full);
          for (int64_t q = 0; q < TileN / 64; ++q)
            tmaLoad(sharedPtrAt(add(bTile, idx(8192 * q))), mapB,
                    add(t.n0, idx(64 * q)), row, full);
          return SmallVector<Value>{};
        }
        if (g.lhsF8) {
          // The 128 x 64 elements (8 KiB) into the stage's A slot, where
          // the converters expand them in place.
          Value landed = elementsBarrier(s);
          NVVM::MBarrierArriveExpectTxOp::create(
              b, loc, Type(), landed, int32(TileAF8Bytes),
              NVVM::MemScopeKind::CTA, /*relaxed=*/false, Value());
          tmaLoad(sharedPtrAt(stage), mapA, k0, t.m0, landed);
        } else {
          tmaLoad(sharedPtrAt(stage), mapA, k0, t.m0, full);
        }
        if (g.rhsTransposed || g.blockLhs) {
          // [E * N, K]: rows e * N + n0 .. + 256 (blockwise: + 128).
          tmaLoad(sharedPtrAt(bTile), mapB, k0, add(mul(t.e, idx(g.n)), t.n0),
                  full);
        } else {
          // [E * K, N]: four 64-column blocks of K rows e * K + k0 .. + 64.
          // SwiGLU: 128 gate columns (from n0 / 2) then the 128 up columns
          // of the same outputs (F further).
          // (A 3-D map, rhsPlanes: K rows k0 .. + 64 of plane e.)
          Value krow = add(mul(t.e, idx(g.k)), k0);
          for (int64_t q = 0; q < TileN / 64; ++q) {
            Value column = add(t.n0, idx(64 * q));
            if (g.swiglu && !g.swiglu->grad)
              column =
                  add(div(t.n0, 2), idx(64 * (q % 2) + (q / 2) * (g.n / 2)));
            Value dst = sharedPtrAt(add(bTile, idx(8192 * q)));
            if (rhsPlanes(g))
              tmaLoad(dst, mapB, {column, k0, t.e}, full);
            else
              tmaLoad(dst, mapB, column, krow, full);
          }
        }
        return SmallVector<Value>{};
      });
      return add(g0, t.stages);
    });
  }

  /// With an 8-bit lhs (g.lhsF8), warps 1-3 of the producer warpgroup: the
  /// copy engine puts each stage's 128 x 64 A elements into the first 8 KiB
  /// of the stage's A slot (64-byte rows, unswizzled), and these 96 threads
  /// expand them in place into the bf16 tile the MMAs read (the bf16 lhs's
  /// 128-byte swizzled layout, 16 KiB): each loads its units (16 elements,
  /// quarter q of row r; unit u = 4 r + q, thread t's are t, t + 96, ...),
  /// the 96 meet (named barrier) so that no write lands on elements still
  /// unread, and each writes its units' 16 bf16 values (chunks 2 q, 2 q + 1
  /// of row r). A value is the dequantize kernel's (decodeF8Pair: exact
  /// f8 -> f16, times the block's scale in f32, rounded once to bf16), so
  /// the MMAs see exactly the bf16 operand this kernel would otherwise read.
  /// A unit's scale (block 2 kt + q / 2 of its row) is loaded from global
  /// memory a stage ahead; rows past R and blocks past K (the copy's zeros)
  /// take scale byte 0. Each thread then fences its writes for the tensor cores
  /// and arrives on the stage's `full` barrier (the producer's expect-tx of
  /// the B bytes and these 96 arrivals).
  void converter(Value grid) {
    Value ct = arith::SubIOp::create(b, loc, tid, idx(32));
    Value sBase = baseAddress(scalesA);
    int64_t blocksPerRow = g.k / SwigluBlock;
    int64_t rounds = tilesOf(ConvertUnits, Converters);
    Type bf16 = b.getBF16Type();
    // Thread ct's units (the same in every stage): u = ct + 96 i, row u / 4,
    // quarter u % 4 (the last round's spare threads repeat the last unit,
    // unstored).
    SmallVector<Value> rows, quarters;
    for (int64_t i = 0; i < rounds; ++i) {
      Value u = minS(add(ct, idx(Converters * i)), idx(ConvertUnits - 1));
      rows.push_back(div(u, 4));
      quarters.push_back(rem(u, 4));
    }
    // The units' scale bytes in stage kt of the tile from row m0 (0 for
    // rows past R and, in a partial last stage, blocks past K: the copy's
    // zeros, whose products must stay 0).
    auto loadScales = [&](Value m0, Value kt) {
      SmallVector<Value> scales;
      for (int64_t i = 0; i < rounds; ++i) {
        Value row = add(m0, rows[i]);
        Value block =
            add(mul(kt, idx(TileK / SwigluBlock)), div(quarters[i], 2));
        Value valid = cmp(P::slt, row, idx(g.rows));
        if (g.k % TileK) {
          valid = land(valid, cmp(P::slt, block, idx(blocksPerRow)));
          block = minS(block, idx(blocksPerRow - 1));
        }
        Value at =
            add(mul(minS(row, idx(g.rows - 1)), idx(blocksPerRow)), block);
        Value byte = LLVM::LoadOp::create(b, loc, i8(), globalPtr(sBase, at));
        scales.push_back(select(valid, byte, int8(0)));
      }
      return scales;
    };
    tileLoop(grid, [&](const Tile &t, Value g0) {
      // The next stage's scales are loaded while this one converts.
      forLoop(
          0, t.stages, loadScales(t.m0, idx(0)),
          [&](Value kt, ValueRange carried) {
            Value it = add(g0, kt);
            Value s = rem(it, Stages);
            Value stage = mul(s, idx(StageBytes));
            SmallVector<Value> scales(carried.begin(), carried.end()), elements;
            SmallVector<Value> next =
                loadScales(t.m0, minS(add(kt, idx(1)), idx(kStages(g) - 1)));
            wait(elementsBarrier(s), rem(div(it, Stages), 2));
            for (int64_t i = 0; i < rounds; ++i)
              elements.push_back(LLVM::LoadOp::create(
                  b, loc, VectorType::get({16}, i8()),
                  sharedPtrAt(add(stage, add(mul(rows[i], idx(TileK)),
                                             mul(quarters[i], idx(16))))),
                  /*alignment=*/16));
            NVVM::BarrierOp::create(b, loc, Type(), int32(ConverterBarrier),
                                    int32(Converters),
                                    NVVM::BarrierReductionAttr(), Value());
            for (int64_t i = 0; i < rounds; ++i) {
              auto expand = [&] {
                Value scale = buildScaleValue(b, loc, scales[i]);
                SmallVector<Value> values;
                for (int64_t p = 0; p < 8; ++p) {
                  Value pair = LLVM::ShuffleVectorOp::create(
                      b, loc, elements[i], elements[i],
                      ArrayRef<int32_t>{int32_t(2 * p), int32_t(2 * p + 1)});
                  llvm::append_range(
                      values,
                      decodeF8Pair(pair, g.lhsF8, {scale, scale}, bf16));
                }
                for (int64_t h = 0; h < 2; ++h) {
                  LLVM::StoreOp::create(
                      b, loc, vectorOf(ArrayRef(values).slice(8 * h, 8)),
                      sharedPtrAt(
                          swizzledChunk(stage, rows[i],
                                        add(mul(quarters[i], idx(2)), idx(h)))),
                      /*alignment=*/16);
                }
              };
              if (Converters * (i + 1) <= ConvertUnits)
                expand();
              else
                ifThen(cmp(P::slt, add(ct, idx(Converters * i)),
                           idx(ConvertUnits)),
                       expand);
            }
            fenceForAsyncProxy();
            NVVM::MBarrierArriveOp::create(b, loc, Type(), fullBarrier(s),
                                           Value());
            return next;
          });
      return add(g0, t.stages);
    });
  }

  /// Weight gradient: zeros rows [valid, 64) of the stage at byte `stage`
  /// (rows of the next expert, which the copy brought in) in the blocks
  /// consumer `c` reads alone: its A block and half of B's. Then every
  /// consumer thread's writes reach the tensor cores (proxy fence) before
  /// either warpgroup's MMAs (barrier 1, the 256 consumer threads).
  void zeroStageTail(Value stage, Value valid, Value c) {
    Value local = rem(tid, 128);
    Value zero = LLVM::ZeroOp::create(b, loc, VectorType::get({4}, i32()));
    // 16-byte chunks of 64 rows x 128 bytes: chunk u is row u / 8, bytes
    // 16 (u % 8) (whole rows, so the swizzle does not matter).
    for (int64_t blk = 0; blk < 3; ++blk) {
      Value blockAt = blk == 0
                          ? add(stage, mul(c, idx(8192)))
                          : add(stage, add(idx(TileABytes + 8192 * (blk - 1)),
                                           mul(c, idx(2 * 8192))));
      strideLoop(
          add(mul(valid, idx(8)), local), idx(64 * 8), 128, [&](Value u) {
            LLVM::StoreOp::create(b, loc, zero,
                                  sharedPtrAt(add(blockAt, mul(u, idx(16)))),
                                  /*alignment=*/16);
          });
    }
    fenceForAsyncProxy();
    NVVM::BarrierOp::create(b, loc, Type(), int32(1), int32(ConsumerThreads),
                            NVVM::BarrierReductionAttr(), Value());
  }

  /// The bf16 MMAs of tile `t` by consumer `c`, from running stage count
  /// `g0`: its 64 x 256 accumulators.
  Value bf16Mainloop(const Tile &t, Value g0, Value c) {
    // A: K-major (forward) or MN-major (weight gradient: the lhs's rows run
    // along the contraction); B: MN-major, or K-major for a transposed rhs.
    auto layoutA = g.wgrad ? NVVM::MMALayout::col : NVVM::MMALayout::row;
    auto layoutB =
        g.rhsTransposed ? NVVM::MMALayout::col : NVVM::MMALayout::row;
    Value zero = LLVM::ZeroOp::create(b, loc, accType);
    SmallVector<Value> acc =
        forLoop(0, t.stages, {zero}, [&](Value kt, ValueRange carried) {
          Value it = add(g0, kt);
          Value s = rem(it, Stages);
          wait(fullBarrier(s), rem(div(it, Stages), 2));
          Value stage = mul(s, idx(StageBytes));
          if (g.wgrad) {
            Value valid = arith::SubIOp::create(b, loc, t.hi,
                                                add(t.lo, mul(kt, idx(TileK))));
            ifThen(cmp(P::slt, valid, idx(TileK)),
                   [&] { zeroStageTail(stage, valid, c); });
          }
          Value slotUnits = toI64(div(stage, 16));
          // This warpgroup's 64 rows of A: the second 64 (K-major) rows
          // or the second 64-column block (MN-major), 8 KiB further.
          Value aUnits = toI64(mul(c, idx(8192 >> 4)));
          Value d = carried[0];
          NVVM::WgmmaFenceAlignedOp::create(b, loc);
          for (int64_t j = 0; j < TileK / hopper::MmaK; ++j) {
            int64_t aAt = g.wgrad ? 2048 * j : 32 * j;
            Value aDesc = arith::AddIOp::create(
                b, loc, descriptor(slotUnits, aAt), aUnits);
            int64_t bAt = TileABytes + (g.rhsTransposed ? 32 * j : 2048 * j);
            d = bf16Mma(d, aDesc, descriptor(slotUnits, bAt), layoutA, layoutB);
          }
          NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
          NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 1);
          // The previous stage's MMAs are complete: hand it back.
          ifThen(cmp(P::ugt, kt, idx(0)), [&] {
            NVVM::MBarrierArriveOp::create(
                b, loc, Type(),
                emptyBarrier(rem(add(it, idx(Stages - 1)), Stages)), Value());
          });
          return SmallVector<Value>{d};
        });
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
    ifThen(cmp(P::ugt, t.stages, idx(0)), [&] {
      Value last = add(g0, add(t.stages, idx(-1)));
      NVVM::MBarrierArriveOp::create(b, loc, Type(),
                                     emptyBarrier(rem(last, Stages)), Value());
    });
    return acc[0];
  }

  /// Blockwise FP8 (TmaGemm::blockLhs): the MMAs of tile `t` by consumer
  /// `c` (rows from `row`, this thread's first; `lane` its lane), from
  /// running stage count `g0`: its 64 x 128 accumulators. Per stage, the
  /// four m64n128k32 FP8 wgmmas of its 64 rows sum the stage's 128 K values
  /// into a fresh partial P (scale-d 0, then 1); once they are complete the
  /// stage goes back to the producer and P is promoted, acc = fma(P, f,
  /// acc), f the product of the two operands' scales of the stage:
  /// - forward: sa(row) * sb, sa the row's lhs scale, sb the tile's rhs
  ///   scale, loaded (from global memory, L2) a stage ahead;
  /// - weight gradient: sa(row) * sb(column), the scales of the stage's
  ///   128 group rows (one row tile of both operands' 128 x 1 tiles) for
  ///   the result's row (a K index) and column, loaded as the stage
  ///   begins, before its barrier wait.
  /// While one consumer promotes, the other's MMAs keep the tensor cores
  /// busy.
  Value blockwiseMainloop(const Tile &t, Value g0, Value c, Value row,
                          Value lane) {
    // Scale blocks along K and N (the last ones partial when K or N % 128:
    // the forward's K and N are multiples of 64).
    int64_t kBlocks = kStages(g), nBlocks = g.columnTiles();
    Value saBase = baseAddress(scalesA), sbBase = baseAddress(scalesB);
    Value nTile = div(t.n0, g.tileN());
    auto loadF32 = [&](Value base, Value at) {
      return LLVM::LoadOp::create(b, loc, b.getF32Type(),
                                  globalPtr(base, mul(at, idx(4))),
                                  /*alignment=*/4)
          .getResult();
    };
    // Forward: sa(row) * sb of this thread's rows `row` and `row` + 8
    // (clamped to the last row: rows past R are stored nowhere) in stage
    // kt.
    auto forwardScales = [&](Value kt) -> SmallVector<Value> {
      Value sbAt =
          g.rhsTransposed
              ? add(mul(add(mul(t.e, idx(nBlocks)), nTile), idx(kBlocks)), kt)
              : add(mul(add(mul(t.e, idx(kBlocks)), kt), idx(nBlocks)), nTile);
      Value sb = loadF32(sbBase, sbAt);
      SmallVector<Value> scales;
      for (int64_t h = 0; h < 2; ++h) {
        Value r = minS(add(row, idx(8 * h)), idx(g.rows - 1));
        Value sa = loadF32(saBase, add(mul(r, idx(kBlocks)), kt));
        scales.push_back(arith::MulFOp::create(b, loc, sa, sb));
      }
      return scales;
    };
    // Weight gradient: row block lo / 128 + kt of the lhs's scales [R/128,
    // K] at rows `row`, `row` + 8, then of the rhs's [R/128, N] at the
    // thread's 32 columns n0 + 8 j + 2 (l%4) + cc (16 pairs).
    auto wgradScales = [&](Value kt) -> SmallVector<Value> {
      Value block = add(div(t.lo, stageK(g)), kt);
      SmallVector<Value> scales;
      for (int64_t h = 0; h < 2; ++h)
        scales.push_back(
            loadF32(saBase, add(mul(block, idx(g.k)), add(row, idx(8 * h)))));
      Value col = add(t.n0, mul(rem(lane, 4), idx(2)));
      Value at = add(mul(block, idx(g.n)), col);
      for (int64_t j = 0; j < g.tileN() / 8; ++j)
        llvm::append_range(
            scales,
            loadVector(b.getF32Type(), 2,
                       globalPtr(sbBase, mul(add(at, idx(8 * j)), idx(4))),
                       /*alignment=*/8));
      return scales;
    };
    // The factor of register i = 4 j + 2 h + cc (row `row` + 8 h, column
    // 2 j + cc of the thread's).
    auto factor = [&](ArrayRef<Value> f, int64_t i) -> Value {
      int64_t h = (i / 2) % 2;
      if (!g.wgrad)
        return f[h];
      return arith::MulFOp::create(b, loc, f[h], f[2 + 2 * (i / 4) + i % 2]);
    };
    SmallVector<Value> init = {LLVM::ZeroOp::create(b, loc, accType)};
    if (!g.wgrad)
      llvm::append_range(init, forwardScales(idx(0)));
    SmallVector<Value> acc =
        forLoop(0, t.stages, init, [&](Value kt, ValueRange carried) {
          Value it = add(g0, kt);
          Value s = rem(it, Stages);
          SmallVector<Value> now, next;
          if (g.wgrad) {
            now = wgradScales(kt);
          } else {
            now.assign(carried.begin() + 1, carried.end());
            next = forwardScales(minS(add(kt, idx(1)), idx(kBlocks - 1)));
          }
          wait(fullBarrier(s), rem(div(it, Stages), 2));
          Value slotUnits = toI64(div(mul(s, idx(StageBytes)), 16));
          // This warpgroup's 64 rows of A, 8 KiB further for the second.
          Value aUnits = toI64(mul(c, idx(8192 >> 4)));
          Value part = LLVM::UndefOp::create(b, loc, accType);
          NVVM::WgmmaFenceAlignedOp::create(b, loc);
          for (int64_t j = 0; j < stageK(g) / hopper::F8MmaK; ++j) {
            Value aDesc = arith::AddIOp::create(
                b, loc, descriptor(slotUnits, 32 * j), aUnits);
            part =
                f8Mma(part, aDesc, descriptor(slotUnits, TileABytes + 32 * j),
                      g.blockLhs, g.blockRhs, /*accumulate=*/j > 0);
          }
          NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
          NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
          NVVM::MBarrierArriveOp::create(b, loc, Type(), emptyBarrier(s),
                                         Value());
          Value x = carried[0];
          for (int64_t i = 0; i < g.tileN() / 2; ++i) {
            Value r = LLVM::FMAOp::create(b, loc, accAt(part, i),
                                          factor(now, i), accAt(x, i));
            x = LLVM::InsertValueOp::create(b, loc, x, r, i);
          }
          SmallVector<Value> results = {x};
          llvm::append_range(results, next);
          return results;
        });
    return acc[0];
  }

  void consumer(Value grid, Value c) {
    Value local = rem(tid, 128);
    Value warp = div(local, 32), lane = rem(local, 32);
    Value outBase = baseAddress(out);
    tileLoop(grid, [&](const Tile &t, Value g0) {
      // Register 4 j + 2 h + c of the m64n256 accumulator: row 16 w + l/4
      // + 8 h of this warpgroup's 64, columns 8 j + 2 (l%4) + c.
      Value rowBase = add(add(t.m0, mul(c, idx(hopper::MmaM))),
                          add(mul(warp, idx(16)), div(lane, 4)));
      Value acc = g.blockLhs ? blockwiseMainloop(t, g0, c, rowBase, lane)
                             : bf16Mainloop(t, g0, c);
      if (g.swiglu) {
        if (g.swiglu->grad)
          storeSwigluGrad(t, acc, rowBase, c, warp, lane);
        else
          storeSwiglu(t, acc, rowBase, c, warp, lane);
        return add(g0, t.stages);
      }
      // Whole 64-row halves (every half of a weight gradient) go through
      // the copy engine; the half that crosses the group's end stores its
      // rows before it directly.
      Value first = add(t.m0, mul(c, idx(hopper::MmaM)));
      auto boxes = [&] {
        // (A 3-D map, outPlanes: rows of plane e, none past K.)
        storeBoxes(
            acc, mapOut,
            g.wgrad && !outPlanes(g) ? add(mul(t.e, idx(g.k)), first) : first,
            outPlanes(g) ? t.e : Value(),
            [&](int64_t q) { return add(t.n0, idx(boxColumns(g) * q)); }, c,
            warp, lane);
      };
      if (g.wgrad) {
        boxes();
        return add(g0, t.stages);
      }
      ifElseVoid(cmp(P::sle, add(first, idx(hopper::MmaM)), t.hi), boxes, [&] {
        Value colBase = add(t.n0, mul(rem(lane, 4), idx(2)));
        for (int64_t h = 0; h < 2; ++h) {
          Value row = add(rowBase, idx(8 * h));
          ifThen(cmp(P::slt, row, t.hi), [&] {
            Value rowAt = add(mul(row, idx(g.n)), colBase);
            for (int64_t j = 0; j < g.tileN() / 8; ++j) {
              auto store = [&] {
                storePair(outBase, add(rowAt, idx(8 * j)),
                          accAt(acc, 4 * j + 2 * h),
                          accAt(acc, 4 * j + 2 * h + 1), b.getF32Type());
              };
              // A last tile past N (N % 256 == 128) stores its first half.
              if (g.n % g.tileN() == 0 || j < (g.n % g.tileN()) / 8)
                store();
              else
                ifThen(cmp(P::slt, add(t.n0, idx(8 * j)), idx(g.n)), store);
            }
          });
        }
      });
      return add(g0, t.stages);
    });
    // The last boxes' stores are complete before the CTA's shared memory
    // goes.
    if (mapOut)
      ifThen(cmp(P::eq, local, idx(0)), [&] {
        NVVM::CpAsyncBulkWaitGroupOp::create(b, loc, 0, UnitAttr());
      });
  }

  /// Forward: zeros the rows in no group, [0, offsets[0]) and [offsets[E],
  /// end), of every result.
  void zeroUncovered(Value grid) {
    if (!g.swiglu)
      return zeroUncovered(grid, out, g.n * 4);
    // The rounded result (bf16) is [R, F] forward, [R, 2F] backward; the MX
    // encoding's elements [R, F] and scales [R, F / 32] (a zero block's
    // scale byte is 0).
    int64_t columns = g.swiglu->grad ? 2 * g.n : g.n / 2;
    if (g.swiglu->mx) {
      zeroUncovered(grid, out, columns);
      zeroUncovered(grid, outScales, columns / SwigluBlock);
    } else {
      zeroUncovered(grid, out, columns * 2);
    }
    if (outH)
      zeroUncovered(grid, outH, g.n * 4);
    if (outF32)
      zeroUncovered(grid, outF32, columns * 4);
    if (outCol)
      zeroUncovered(grid, outCol, columns * 2);
  }
  /// zeroUncovered for the result `buffer` of `rowBytes` bytes a row (16-byte
  /// stores, or byte stores where rows are not whole 16-byte chunks).
  void zeroUncovered(Value grid, Value buffer, int64_t rowBytes) {
    Value start = clampedOffset(offsets, idx(0), g.rows);
    Value end = groupsEnd(offsets, g.rows);
    Value zeroEnd = g.liveRowsOnly ? end : idx(g.rows);
    Value outBase = baseAddress(buffer);
    int64_t width = rowBytes % 16 ? 1 : 16;
    Value zero =
        width == 1
            ? int8(0)
            : LLVM::ZeroOp::create(b, loc, VectorType::get({4}, b.getF32Type()))
                  .getResult();
    Value chunksPerRow = idx(rowBytes / width);
    Value first = add(
        mul(gpu::BlockIdOp::create(b, loc, gpu::Dimension::x), idx(Threads)),
        tid);
    Value stride = mul(grid, idx(Threads));
    auto zeroRows = [&](Value from, Value to) {
      Value chunks = mul(arith::SubIOp::create(b, loc, maxS(to, from), from),
                         chunksPerRow);
      strideLoop(first, chunks, stride, [&](Value chunk) {
        Value at = add(mul(from, chunksPerRow), chunk);
        LLVM::StoreOp::create(b, loc, zero,
                              globalPtr(outBase, mul(at, idx(width))),
                              /*alignment=*/width);
      });
    };
    zeroRows(idx(0), start);
    zeroRows(maxS(end, start), zeroEnd);
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    Value grid = launch.getGridSize().x;
    setUp(hopper::LBO, hopper::SBO, /*swizzled=*/true,
          /*accRegs=*/g.tileN() / 2);
    if (!g.wgrad)
      zeroUncovered(grid);
    ifThen(cmp(P::eq, tid, idx(0)), [&] {
      for (int64_t s = 0; s < Stages; ++s) {
        NVVM::MBarrierInitOp::create(b, loc, fullBarrier(idx(s)),
                                     int32(g.lhsF8 ? 1 + Converters : 1),
                                     Value());
        NVVM::MBarrierInitOp::create(b, loc, emptyBarrier(idx(s)),
                                     int32(ConsumerThreads), Value());
        if (g.lhsF8)
          NVVM::MBarrierInitOp::create(b, loc, elementsBarrier(idx(s)),
                                       int32(1), Value());
      }
    });
    NVVM::Barrier0Op::create(b, loc);
    // The warpgroup index, broadcast from lane 0 so the compiler sees it is
    // warp-uniform (else it serializes the wgmmas of the divergent branch).
    Value wg =
        toIndex(gpu::ShuffleOp::create(b, loc, i32Of(div(tid, 128)), int32(0),
                                       int32(32), gpu::ShuffleMode::IDX)
                    .getShuffleResult());
    // The SwiGLU epilogue (and blockwise FP8's partial sums beside the
    // accumulators) need more than the 168 registers a thread of 384 gets:
    // the producer warpgroup gives most of its registers to the consumers;
    // with an 8-bit lhs it keeps enough for the converters.
    int64_t producerRegs = g.lhsF8 ? ConverterRegs : ProducerRegs;
    int64_t consumerRegs = g.lhsF8 ? ConverterConsumerRegs : SwigluConsumerRegs;
    auto setMaxRegisters = [&](int64_t count,
                               NVVM::SetMaxRegisterAction action) {
      if (g.swiglu || g.lhsF8 || g.blockLhs)
        NVVM::SetMaxRegisterOp::create(b, loc, count, action);
    };
    ifElseVoid(
        cmp(P::eq, wg, idx(0)),
        [&] {
          setMaxRegisters(producerRegs, NVVM::SetMaxRegisterAction::decrease);
          if (g.lhsF8)
            ifElseVoid(
                cmp(P::ult, tid, idx(32)),
                [&] {
                  ifThen(cmp(P::eq, tid, idx(0)), [&] { producer(grid); });
                },
                [&] { converter(grid); });
          else
            ifThen(cmp(P::eq, tid, idx(0)), [&] { producer(grid); });
        },
        [&] {
          setMaxRegisters(consumerRegs, NVVM::SetMaxRegisterAction::increase);
          consumer(grid, add(wg, idx(-1)));
        });
  }
};

} // namespace

/// The TMA kernel computing `t` (see "bf16 grouped GEMM, TMA and
/// warp-specialized wgmma"), named `name`: the host encodes both tensor
/// maps before the launch.
func::FuncOp getOrCreateWgmmaTmaFunction(ModuleOp module, SymbolTable &symbols,
                                         const TmaGemm &t, StringRef name,
                                         ArrayRef<Type> argTypes,
                                         ArrayRef<RankedTensorType> resultTypes,
                                         Location loc) {
  func::FuncOp encode = getOrCreateTensorMapDecl(module, symbols);
  func::FuncOp encode3D = rhsPlanes(t) || outPlanes(t)
                              ? getOrCreateTensorMap3DDecl(module, symbols)
                              : func::FuncOp();
  int64_t tiles = t.wgrad
                      ? t.experts * kTiles(t) * t.columnTiles()
                      : (tilesOf(t.rows, TileM) + t.experts) * t.columnTiles();
  Value mapA, mapB, mapOut;
  return withGroupedArgs(
      getOrCreateKernelCall(
          module, symbols, name,
          t.wgrad && t.blockLhs
              ? "cp.async.bulk.tensor + wgmma.mma_async f8 weight gradient, "
                "promoted every 128"
          : t.wgrad ? "cp.async.bulk.tensor + wgmma.mma_async bf16 weight "
                      "gradient"
          : t.swiglu && !t.swiglu->f8
              ? "cp.async.bulk.tensor + wgmma.mma_async bf16, SwiGLU and bf16 "
                "rounding epilogue"
          : t.swiglu ? "cp.async.bulk.tensor + wgmma.mma_async bf16, SwiGLU "
                       "and MX rounding epilogue"
          : t.lhsF8  ? "cp.async.bulk.tensor + wgmma.mma_async bf16, MX lhs "
                       "dequantized in shared memory"
          : t.blockLhs
              ? "cp.async.bulk.tensor + wgmma.mma_async f8, promoted every 128"
              : "cp.async.bulk.tensor + wgmma.mma_async bf16",
          argTypes, resultTypes, loc,
          {std::min(Ctas, tiles), 1, 1, Threads,
           stagesF32(t) ? StoreSmemBytes
                        : SmemBytes + (t.swiglu->col ? ColAmaxBytes : 0)},
          [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
              ArrayRef<Value> outs) {
            TmaGemmEmitter k{
                {{{b, loc}}, t, buf[t.offsetsArg()], outs[0], mapA, mapB}};
            k.mapOut = mapOut;
            if (t.lhsF8 || t.blockLhs)
              k.scalesA = buf[1];
            if (t.blockLhs)
              k.scalesB = buf[3];
            if (t.swiglu) {
              unsigned next = 1;
              if (t.swiglu->mx)
                k.outScales = outs[next++];
              if (t.swiglu->keepH)
                k.outH = outs[next++];
              if (t.swiglu->keepF32)
                k.outF32 = outs[next++];
              if (t.swiglu->col)
                k.outCol = outs[next++];
              if (t.swiglu->grad)
                k.inH = buf[3];
            }
            k.emit(launch);
          },
          [&](OpBuilder &b, ArrayRef<Value> buf, ArrayRef<Value> outs) {
            KernelBuilder h{b, loc};
            // A bf16 [rows, columns] array in boxes of 64 columns (128
            // bytes, one swizzle row) x boxRows; f32 boxes of 32 columns;
            // 8-bit boxes of `boxColumns` (64: one stage, unswizzled).
            auto map = [&](Value array, int64_t columns, int64_t rows,
                           int64_t boxRows, int64_t bytes = 2,
                           int64_t boxColumns = 0) {
              SmallVector<Value> args = {
                  h.baseAddress(array),
                  h.int64(bytes),
                  h.int64(columns),
                  h.int64(rows),
                  h.int64(bytes * columns),
                  h.int64(boxColumns ? boxColumns : 128 / bytes),
                  h.int64(boxRows)};
              return func::CallOp::create(b, loc, encode, args).getResult(0);
            };
            // `planes` such arrays one after the other, boxes within one.
            auto map3D = [&](Value array, int64_t columns, int64_t rows,
                             int64_t planes, int64_t boxRows,
                             int64_t bytes = 2) {
              SmallVector<Value> args = {h.baseAddress(array),
                                         h.int64(bytes),
                                         h.int64(columns),
                                         h.int64(rows),
                                         h.int64(planes),
                                         h.int64(bytes * columns),
                                         h.int64(bytes * columns * rows),
                                         h.int64(128 / bytes),
                                         h.int64(boxRows)};
              return func::CallOp::create(b, loc, encode3D, args).getResult(0);
            };
            // The f32 (or bf16) result [R, N] (weight gradient:
            // [E * K, N]), stored in boxes of 64 rows.
            if (outPlanes(t))
              mapOut = map3D(outs[0], t.n, t.k, t.experts, hopper::MmaM,
                             t.outBf16 ? 2 : 4);
            else if (stagesF32(t))
              mapOut = map(outs[0], t.n, t.wgrad ? t.experts * t.k : t.rows,
                           hopper::MmaM, t.outBf16 ? 2 : 4);
            if (t.wgrad && t.blockLhs) {
              // The transposed 8-bit lhs [K, R'] and rhs [N, R'] (R' the
              // quantize kernel's rows, rounded up to 128): boxes of 128
              // rows x 128 group rows.
              int64_t padded = cast<ShapedType>(buf[0].getType()).getDimSize(1);
              mapA = map(buf[0], padded, t.k, TileM, 1, stageK(t));
              mapB = map(buf[2], padded, t.n, t.tileN(), 1, stageK(t));
              return;
            }
            if (t.wgrad) {
              // lhs [R, K], rhs [R, N]: 64 rows (one stage) a box.
              mapA = map(buf[0], t.k, t.rows, TileK);
              mapB = map(buf[1], t.n, t.rows, TileK);
              return;
            }
            Value rhs = buf[t.rhsArg()];
            if (t.blockLhs) {
              // 8-bit [R, K] and [E * N, K]: boxes of 128 K values (one
              // 128-byte swizzle row) x 128 rows.
              mapA = map(buf[0], t.k, t.rows, TileM, 1, stageK(t));
              mapB = map(rhs, t.k, t.experts * t.n, t.tileN(), 1, stageK(t));
              return;
            }
            mapA = t.lhsF8 ? map(buf[0], t.k, t.rows, TileM, 1, TileK)
                           : map(buf[0], t.k, t.rows, TileM);
            mapB = t.rhsTransposed ? map(rhs, t.k, t.experts * t.n, TileN)
                   : rhsPlanes(t)  ? map3D(rhs, t.n, t.k, t.experts, 64)
                                   : map(rhs, t.n, t.experts * t.k, 64);
          }),
      // (A blockwise weight gradient's operands are transposed: their rows
      // are not the groups'.)
      t.wgrad && t.blockLhs              ? SmallVector<unsigned>{}
      : t.wgrad || t.lhsF8 || t.blockLhs ? SmallVector<unsigned>{0, 1}
                                         : SmallVector<unsigned>{0},
      t.offsetsArg());
}

void lowerSwigluFusion(GroupedMatmulOp op, WgmmaGemm g, SwigluFusion &fusion,
                       ModuleOp module, SymbolTable &symbols) {
  const SwigluEpilogue &e = fusion.epilogue;
  Operation *activation = fusion.activation;
  auto valuesType = cast<RankedTensorType>(activation->getResult(0).getType());
  auto mxType = fusion.quantize ? cast<MXTensorType>(fusion.quantize.getType())
                                : MXTensorType();
  SmallVector<RankedTensorType> resultTypes;
  if (e.mx)
    resultTypes = {cast<RankedTensorType>(mxType.getDataType()),
                   cast<RankedTensorType>(mxType.getScalesType())};
  else
    resultTypes = {RankedTensorType::get(valuesType.getShape(),
                                         BFloat16Type::get(op.getContext()))};
  if (e.keepH)
    resultTypes.push_back(cast<RankedTensorType>(op.getType()));
  if (e.keepF32)
    resultTypes.push_back(valuesType);
  if (e.col)
    resultTypes.push_back(RankedTensorType::get(
        valuesType.getShape(), BFloat16Type::get(op.getContext())));
  TmaGemm t{g.rows,          g.k, g.n, g.experts, g.rhsTransposed,
            g.liveRowsOnly,
            /*wgrad=*/false, e};
  SmallVector<Value> args = {op.getLhs(), op.getRhs(), op.getOffsets()};
  if (e.grad)
    args.push_back(cast<SwigluGradOp>(activation).getInput());
  func::FuncOp kernel = withGroupedArgs(
      getOrCreateWgmmaTmaFunction(module, symbols, t, g.name() + e.name(),
                                  llvm::to_vector(ValueRange(args).getTypes()),
                                  resultTypes, op.getLoc()),
      e.grad ? SmallVector<unsigned>{0, 3} : SmallVector<unsigned>{0}, 2);
  OpBuilder b(e.grad ? activation : op.getOperation());
  auto call = func::CallOp::create(b, op.getLoc(), kernel, args);
  unsigned next = 1;
  if (e.mx) {
    // The MX value itself: its dequantizes stay, for the GEMMs reading it to
    // take the elements and scales (f8LhsOf).
    auto pack = MXPackOp::create(b, op.getLoc(), mxType, call.getResult(0),
                                 call.getResult(1));
    fusion.quantize.getResult().replaceAllUsesWith(pack.getResult());
    fusion.quantize.erase();
    next = 2;
  } else if (!fusion.quantize) {
    // The bf16 rounding: the activation's bf16 result, or its roundings.
    Value values = activation->getResult(0);
    if (valuesType.getElementType().isBF16())
      values.replaceAllUsesWith(call.getResult(0));
    else
      replaceRoundings(values, call.getResult(0));
  } else {
    for (DequantizeOp dq : fusion.roundTrips) {
      dq.getResult().replaceAllUsesWith(call.getResult(0));
      dq.erase();
    }
    if (fusion.quantize->use_empty())
      fusion.quantize.erase();
  }
  if (e.keepH)
    op.getResult().replaceUsesWithIf(call.getResult(next++), [&](OpOperand &u) {
      return u.getOwner() != activation;
    });
  // The columnwise round trips before the f32 values' other users take the
  // kept values (their quantize reads the activation).
  if (e.col) {
    Value colRounded = call.getResult(resultTypes.size() - 1);
    for (DequantizeOp dq : fusion.colRoundTrips) {
      dq.getResult().replaceAllUsesWith(colRounded);
      dq.erase();
    }
    fusion.colQuantize.erase();
  }
  if (e.keepF32)
    activation->getResult(0).replaceAllUsesWith(call.getResult(next++));
  if (activation->use_empty())
    activation->erase();
  if (op->use_empty())
    op.erase();
}

void lowerF8LhsGemm(GroupedMatmulOp op, const WgmmaGemm &g, DequantizeOp dq,
                    MXPackOp pack, ModuleOp module, SymbolTable &symbols) {
  TmaGemm t{g.rows,
            g.k,
            g.n,
            g.experts,
            g.rhsTransposed,
            g.liveRowsOnly,
            /*wgrad=*/false,
            /*swiglu=*/std::nullopt};
  t.lhsF8 = cast<MXTensorType>(pack.getType()).getElementType();
  SmallVector<Value> args = {pack.getData(), pack.getScales(), op.getRhs(),
                             op.getOffsets()};
  func::FuncOp kernel = getOrCreateWgmmaTmaFunction(
      module, symbols, t, g.name() + "_" + elementName(t.lhsF8) + "_lhs",
      llvm::to_vector(ValueRange(args).getTypes()), {op.getType()},
      op.getLoc());
  OpBuilder b(op);
  auto call = func::CallOp::create(b, op.getLoc(), kernel, args);
  op.getResult().replaceAllUsesWith(call.getResult(0));
  op.erase();
  if (dq->use_empty())
    dq.erase();
  if (pack->use_empty())
    pack.erase();
}

void lowerBlockwiseTmaGemm(GroupedMatmulOp op, ModuleOp module,
                           SymbolTable &symbols) {
  auto lhs = cast<FP8BlockTensorType>(op.getLhs().getType());
  auto rhs = cast<FP8BlockTensorType>(op.getRhs().getType());
  bool transposed = op.getTransposeRhs();
  ArrayRef<int64_t> rhsShape = rhs.getShape();
  TmaGemm t{lhs.getShape()[0],
            lhs.getShape()[1],
            rhsShape[transposed ? 1 : 2],
            rhsShape[0],
            transposed,
            /*liveRowsOnly=*/false,
            /*wgrad=*/false,
            /*swiglu=*/std::nullopt};
  t.blockLhs = lhs.getElementType();
  t.blockRhs = rhs.getElementType();
  Location loc = op.getLoc();
  OpBuilder b(op);
  auto lhsParts = MXUnpackOp::create(b, loc, lhs.getDataType(),
                                     lhs.getScalesType(), op.getLhs());
  auto rhsParts = MXUnpackOp::create(b, loc, rhs.getDataType(),
                                     rhs.getScalesType(), op.getRhs());
  Value rhsData = rhsParts.getData();
  if (!transposed)
    rhsData = transposeBytes(b, loc, rhsData, module, symbols);
  SmallVector<Value> args = {lhsParts.getData(), lhsParts.getScales(), rhsData,
                             rhsParts.getScales(), op.getOffsets()};
  auto offsets = cast<RankedTensorType>(op.getOffsets().getType());
  std::string name =
      llvm::formatv("moe_tma_fp8block_gmm_{0}x{1}x{2}_e{3}_{4}_{5}{6}_{7}",
                    t.rows, t.k, t.n, t.experts, elementName(t.blockLhs),
                    elementName(t.blockRhs), transposed ? "_rhsT" : "",
                    elementName(offsets.getElementType()))
          .str();
  func::FuncOp kernel = getOrCreateWgmmaTmaFunction(
      module, symbols, t, name, llvm::to_vector(ValueRange(args).getTypes()),
      {op.getType()}, loc);
  auto call = func::CallOp::create(b, loc, kernel, args);
  op.getResult().replaceAllUsesWith(call.getResult(0));
  op.erase();
}

Operation *lowerBlockwiseTmaWgrad(GroupedMatmulWgradOp op, ModuleOp module,
                                  SymbolTable &symbols, WhyNot why) {
  auto lhs = dyn_cast<FP8BlockTensorType>(op.getLhs().getType());
  auto rhs = dyn_cast<FP8BlockTensorType>(op.getRhs().getType());
  if (!lhs || !rhs)
    return nullptr; // not blockwise FP8: nothing to say
  auto qx = op.getLhs().getDefiningOp<QuantizeOp>();
  auto qdy = op.getRhs().getDefiningOp<QuantizeOp>();
  RankedTensorType result = op.getType();
  auto refuse = [&](const char *reason) -> Operation * {
    noKernel(why, reason);
    return nullptr;
  };
  if (!qx || !qdy)
    return refuse("an operand is not quantized here (the kernel's quantize "
                  "writes it transposed)");
  if (op->getParentOfType<ExpertsOp>())
    return refuse("inside a moe.experts region (not grouped)");
  if (lhs.getShape().size() != 2 || rhs.getShape().size() != 2 ||
      lhs.getBlock() != ArrayRef<int64_t>{kFP8BlockTile, 1} ||
      rhs.getBlock() != ArrayRef<int64_t>{kFP8BlockTile, 1} ||
      !result.hasStaticShape() || !result.getElementType().isF32() ||
      result.getRank() != 3)
    return refuse("not 2-d operands in 128 x 1 tiles with a static f32 "
                  "result");
  int64_t rows = lhs.getShape()[0], k = lhs.getShape()[1],
          n = rhs.getShape()[1], experts = result.getDimSize(0);
  if (ShapedType::isDynamic(rows) || rhs.getShape()[0] != rows || experts < 1)
    return refuse("dynamic or mismatched rows, or no experts");
  if (k % TileM || n % TileM) {
    noKernel(why, "K = {0} and N = {1} are not both multiples of {2}", k, n,
             TileM);
    return nullptr;
  }
  if (!groupsAlignedTo(op.getOffsets(), kFP8BlockTile))
    return refuse("the groups are not known to start at multiples of 128 "
                  "rows (the row blocks would span two experts)");
  Location loc = op.getLoc();
  OpBuilder b(op);
  // Each operand transposed by its quantize kernel; where the same tensor
  // is also quantized in 1 x 128 tiles in this block (its forward or data
  // gradient GEMM's operand), one kernel computes both, reading it once.
  // (Both operands are checked before anything is rewritten.)
  if (!quantizeTransposedTakes(qx) || !quantizeTransposedTakes(qdy))
    return refuse("an operand's quantize cannot write it transposed");
  auto siblingOf = [&](QuantizeOp q) -> QuantizeOp {
    for (Operation *user : q.getInput().getUsers()) {
      auto sibling = dyn_cast<QuantizeOp>(user);
      auto type = sibling ? dyn_cast<FP8BlockTensorType>(sibling.getType())
                          : FP8BlockTensorType();
      if (type && sibling != q && sibling->getBlock() == op->getBlock() &&
          type.getBlock() == ArrayRef<int64_t>{1, kFP8BlockTile})
        return sibling;
    }
    return QuantizeOp();
  };
  // Rows past the groups' end: this kernel reads none of them; a quantize
  // kernel skips them where nothing else reads them either (LiveRows, asked
  // before anything is rewritten).
  LiveRows live(module);
  RowBound end = LiveRows::groupsEnd(op.getOffsets());
  auto liveEnd = [&](QuantizeOp q, QuantizeOp sibling) -> Value {
    if (!end || !end.offsets || live.boundOf(q.getResult()) != end ||
        (sibling && live.boundedOp(sibling) != end))
      return Value();
    return end.offsets;
  };
  struct Plan {
    QuantizeOp q, rows;
    Value pairEnd, aloneEnd;
  };
  // A SwiGLU (or its gradient) that a pair kernel computes itself is gone
  // once its quantizes are.
  SmallVector<Operation *> producers;
  for (QuantizeOp q : {qx, qdy})
    if (Operation *p = q.getInput().getDefiningOp();
        isa_and_nonnull<SwigluOp, SwigluGradOp>(p) &&
        !llvm::is_contained(producers, p))
      producers.push_back(p);
  SmallVector<Plan> plans;
  for (QuantizeOp q : {qx, qdy}) {
    QuantizeOp sibling = siblingOf(q);
    plans.push_back({q, sibling, sibling ? liveEnd(q, sibling) : Value(),
                     liveEnd(q, QuantizeOp())});
  }
  SmallVector<std::pair<Value, Value>> operands;
  for (Plan &p : plans) {
    if (!operands.empty() && qdy == qx) { // both operands one quantize
      operands.push_back(operands.front());
      continue;
    }
    if (p.rows) {
      OpBuilder at(p.rows->isBeforeInBlock(op) ? p.rows.getOperation()
                                               : op.getOperation());
      if (std::optional<std::array<Value, 4>> parts =
              quantizePair(at, p.rows, p.q, module, symbols, p.pairEnd)) {
        auto packed = MXPackOp::create(at, p.rows.getLoc(), p.rows.getType(),
                                       (*parts)[0], (*parts)[1]);
        p.rows.getResult().replaceAllUsesWith(packed.getResult());
        p.rows.erase();
        operands.push_back({(*parts)[2], (*parts)[3]});
        continue;
      }
    }
    // (quantizeTransposedTakes: this succeeds.)
    operands.push_back(
        *quantizeTransposed(b, p.q, module, symbols, p.aloneEnd));
  }
  auto [x, dy] = std::make_pair(operands[0], operands[1]);
  TmaGemm t{rows,
            k,
            n,
            experts,
            /*rhsTransposed=*/false,
            /*liveRowsOnly=*/false,
            /*wgrad=*/true,
            /*swiglu=*/std::nullopt};
  t.blockLhs = lhs.getElementType();
  t.blockRhs = rhs.getElementType();
  SmallVector<Value> args = {x.first, x.second, dy.first, dy.second,
                             op.getOffsets()};
  std::string name =
      llvm::formatv("moe_tma_fp8block_wgrad_{0}x{1}x{2}_e{3}_{4}_{5}_{6}", rows,
                    k, n, experts, elementName(t.blockLhs),
                    elementName(t.blockRhs),
                    elementName(getElementTypeOrSelf(op.getOffsets())))
          .str();
  func::FuncOp kernel = getOrCreateWgmmaTmaFunction(
      module, symbols, t, name, llvm::to_vector(ValueRange(args).getTypes()),
      {result}, loc);
  auto call = func::CallOp::create(b, loc, kernel, args);
  op.getResult().replaceAllUsesWith(call.getResult(0));
  op.erase();
  if (qx->use_empty())
    qx.erase();
  if (qdy != qx && qdy->use_empty())
    qdy.erase();
  for (Operation *p : producers)
    if (p->use_empty())
      p->erase();
  return call;
}

} // namespace mlir::moe::kernels
