//===- TmaGemmEpilogues.cpp - the TMA kernel's epilogues ------------------===//
//
// The epilogues of the TMA, warp-specialized grouped GEMM (see
// TmaGemmMainloop.cpp for the kernel): each consumer warpgroup holds a
// 64 x 256 f32 accumulator (64 x 128 with blockwise FP8: TmaGemm::tileN;
// the wgmma fragment: register 4 j + 2 h + c is row 16 w + l/4 + 8 h,
// column 8 j + 2 (l%4) + c) and
// - storeBoxes: writes it through the copy engine (64 x 32 f32 boxes, or
//   64 x 64 bf16 ones, in two 8 KiB staging buffers a warpgroup,
//   tma::StagingAt);
// - storeSwiglu / storeSwigluGrad: computes SwiGLU (or its gradient) and the
//   bf16 rounding, or the MX rounding or encoding, of the result: the MX
//   one rowwise (blocks of 32 along a row:
//   8 values in each of 4 lanes, xor-shuffle amaxes) and, with `col`,
//   columnwise (blocks of 32 rows: a warp pair's amaxes exchanged through
//   shared memory, tma::ColAmaxAt, 4 KiB), storing with 8-byte vector stores.
//
//===----------------------------------------------------------------------===//

#include "TmaGemm.h"

#include "moe/Dialect/MoE/Utils/Activations.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

using namespace tma;

void TmaEpilogue::storeBoxes(Value acc, Value map, Value outRow, Value plane,
                             function_ref<Value(int64_t)> column, Value c,
                             Value warp, Value lane) {
  Value local = rem(tid, 128);
  Value leader = cmp(P::eq, local, idx(0));
  Value barrier = i32Of(add(c, idx(WarpgroupBarrier)));
  auto sync = [&] {
    NVVM::BarrierOp::create(b, loc, Type(), barrier, int32(128),
                            NVVM::BarrierReductionAttr(), Value());
  };
  Value staging = add(idx(StagingAt), mul(c, idx(2 * BoxBytes)));
  const int64_t columns = boxColumns(g);
  for (int64_t q = 0; q < g.tileN() / columns; ++q) {
    // Boxes past N (a last tile's second half, N % 256 == 128) are skipped
    // whole, by the warpgroup alike: written to the staging buffer, one
    // would overwrite the box two before it while its store still reads it
    // (no store of its own to wait for in between).
    if (g.n % g.tileN() == 0)
      storeBox(acc, map, outRow, plane, column, c, warp, lane, q, leader, sync,
               add(staging, idx((q % 2) * BoxBytes)));
    else
      ifThen(cmp(P::slt, column(q), idx(g.n)), [&] {
        storeBox(acc, map, outRow, plane, column, c, warp, lane, q, leader,
                 sync, add(staging, idx((q % 2) * BoxBytes)));
      });
  }
}

void TmaEpilogue::storeBox(Value acc, Value map, Value outRow, Value plane,
                           function_ref<Value(int64_t)> column, Value c,
                           Value warp, Value lane, int64_t q, Value leader,
                           function_ref<void()> sync, Value box) {
  const int64_t columns = boxColumns(g);
  {
    // The store that last read this buffer, two boxes ago, has read it.
    // When a partial last column tile stores an odd number of boxes, the
    // previous tile's last box may be in this buffer: a tile's first box
    // then waits for every store.
    int64_t lastBoxes = (g.n % g.tileN() + columns - 1) / columns;
    int64_t pending = q == 0 && lastBoxes % 2 ? 0 : 1;
    ifThen(leader, [&] {
      NVVM::CpAsyncBulkWaitGroupOp::create(b, loc, pending,
                                           UnitAttr::get(b.getContext()));
    });
    sync();
    for (int64_t h = 0; h < 2; ++h) {
      Value r = add(add(mul(warp, idx(16)), div(lane, 4)), idx(8 * h));
      Value rowAt = add(box, mul(r, idx(128)));
      if (g.outBf16) {
        // bf16 boxes of 64 columns: columns 8 jj + 2 (l%4) + {0, 1} are
        // bytes 16 jj + 4 (l%4), chunk jj; a warp's 4-byte stores cover
        // each bank once.
        for (int64_t jj = 0; jj < columns / 8; ++jj) {
          Value at = add(
              rowAt, add(mul(arith::XOrIOp::create(b, loc, idx(jj), rem(r, 8)),
                             idx(16)),
                         mul(rem(lane, 4), idx(4))));
          int64_t i = 4 * ((columns / 8) * q + jj) + 2 * h;
          LLVM::StoreOp::create(
              b, loc, pairOf(accAt(acc, i), accAt(acc, i + 1), b.getBF16Type()),
              sharedPtrAt(at), /*alignment=*/4);
        }
        continue;
      }
      // Row r of the box (this thread's row of the accumulator), columns
      // 8 jj + 2 (l%4) + {0, 1}: bytes 32 jj + 8 (l%4), chunk 2 jj +
      // (l%4) / 2.
      for (int64_t jj = 0; jj < BoxColumns / 8; ++jj) {
        Value chunk = add(idx(2 * jj), div(rem(lane, 4), 2));
        Value at = add(
            rowAt,
            add(mul(arith::XOrIOp::create(b, loc, chunk, rem(r, 8)), idx(16)),
                mul(rem(lane, 2), idx(8))));
        int64_t i = 4 * (4 * q + jj) + 2 * h;
        LLVM::StoreOp::create(
            b, loc, pairOf(accAt(acc, i), accAt(acc, i + 1), b.getF32Type()),
            sharedPtrAt(at), /*alignment=*/8);
      }
    }
    fenceForAsyncProxy();
    sync();
    ifThen(leader, [&] {
      Value desc = LLVM::IntToPtrOp::create(
          b, loc, LLVM::LLVMPointerType::get(b.getContext()), map);
      SmallVector<Value> at = {i32Of(column(q)), i32Of(outRow)};
      if (plane)
        at.push_back(i32Of(plane));
      NVVM::CpAsyncBulkTensorSharedCTAToGlobalOp::create(
          b, loc, desc, sharedPtrAt(box), at, Value(), NVVM::TMAStoreMode::TILE,
          Value());
      NVVM::CpAsyncBulkCommitGroupOp::create(b, loc);
    });
  }
}

void TmaEpilogue::storeSwiglu(const Tile &t, Value acc, Value rowBase, Value c,
                              Value warp, Value lane) {
  int64_t f = g.n / 2;
  Value c0 = div(t.n0, 2);
  Value col = add(c0, mul(rem(lane, 4), idx(2)));
  Value outBase = baseAddress(out);
  Value hBase = outH ? baseAddress(outH) : Value();
  Value aBase = outF32 ? baseAddress(outF32) : Value();
  Type f32 = b.getF32Type();
  auto rowOf = [&](int64_t h) { return add(rowBase, idx(8 * h)); };
  auto reg = [&](int64_t h, int64_t j, int64_t cc) {
    return accAt(acc, 4 * j + 2 * h + cc);
  };
  // Whether block m (outputs c0 + 32 m .. + 32) lies within F: a last tile
  // past F (F % 128) holds, past it, products of whatever the B boxes read
  // there (up columns, zeros) and stores none of them.
  auto within = [&](int64_t m) {
    return blockWithin(add(c0, idx(32 * m)), f, TileN / 2);
  };
  if (hBase)
    for (int64_t h = 0; h < 2; ++h) {
      Value row = rowOf(h);
      ifThen(cmp(P::slt, row, t.hi), [&] {
        Value hAt = add(mul(row, idx(g.n)), col);
        for (int64_t m = 0; m < 4; ++m) {
          auto store = [&] {
            for (int64_t j = 4 * m; j < 4 * m + 4; ++j)
              for (int64_t up = 0; up < 2; ++up)
                storePair(hBase, add(hAt, idx(8 * j + up * f)),
                          reg(h, j + 16 * up, 0), reg(h, j + 16 * up, 1), f32);
          };
          if (Value w = within(m))
            ifThen(w, store);
          else
            store();
        }
      });
    }
  // Row h's MX block m (its accumulators die after it): output columns
  // col + 8 j + cc for j in [4 m, 4 m + 4). Returns its activations.
  auto rowBlock = [&](int64_t h, int64_t m) {
    Value row = rowOf(h);
    Value valid = rowAndBlock(row, t.hi, within(m));
    Value rowAt = add(mul(row, idx(f)), col);
    SmallVector<Value> act;
    for (int64_t j = 4 * m; j < 4 * m + 4; ++j)
      for (int64_t cc = 0; cc < 2; ++cc)
        act.push_back(buildSwiglu(b, loc, reg(h, j, cc), reg(h, j + 16, cc)));
    if (g.swiglu->mx) {
      // Block n0 / 64 + m of the row's F / 32.
      auto encoded = encodeRowBlock(act);
      ifThen(valid, [&] {
        storeEncoded(encoded, add(rowAt, idx(32 * m)),
                     add(mul(row, idx(f / SwigluBlock)),
                         add(div(c0, SwigluBlock), idx(m))),
                     lane);
        if (aBase)
          for (int64_t i = 0; i < 4; ++i)
            storePair(aBase, add(rowAt, idx(8 * (4 * m + i))), act[2 * i],
                      act[2 * i + 1], f32);
      });
      return act;
    }
    SmallVector<Value> rounded = roundRowBlock(act);
    ifThen(valid, [&] {
      for (int64_t i = 0; i < 4; ++i) {
        Value at = add(rowAt, idx(8 * (4 * m + i)));
        storePair(outBase, at, rounded[2 * i], rounded[2 * i + 1],
                  b.getBF16Type());
        if (aBase)
          storePair(aBase, at, act[2 * i], act[2 * i + 1], f32);
      }
    });
    return act;
  };
  if (!outCol) {
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t m = 0; m < 4; ++m)
        (void)rowBlock(h, m);
    return;
  }
  // With the columnwise rounding: blocks m, m + 1 of both rows, then their
  // 16 columns' 32-row blocks (see storeSwigluGrad).
  ColumnExchange x = columnExchange(c, warp);
  for (int64_t m = 0; m < 4; m += 2) {
    SmallVector<Value> first[2], second[2];
    for (int64_t k = 0; k < 2; ++k) {
      first[k] = rowBlock(0, m + k);
      second[k] = rowBlock(1, m + k);
    }
    storeColumnBlock(t, m / 2, f, {32 * m, 32 * (m + 1)},
                     {within(m), within(m + 1)}, {first[0], first[1]},
                     {second[0], second[1]}, x, rowBase, col, lane);
  }
}

TmaEpilogue::ColumnExchange TmaEpilogue::columnExchange(Value c, Value warp) {
  Value w = add(mul(c, idx(4)), warp);
  Value other =
      add(mul(c, idx(4)), arith::XOrIOp::create(b, loc, warp, idx(1)));
  return {add(idx(ColAmaxAt), mul(w, idx(2 * ColSlotBytes))),
          add(idx(ColAmaxAt), mul(other, idx(2 * ColSlotBytes))),
          arith::IndexCastOp::create(
              b, loc, i32(), add(idx(2), add(mul(c, idx(2)), div(warp, 2))))};
}

SmallVector<Value> TmaEpilogue::roundRowBlock(ArrayRef<Value> values) {
  // The bf16 rounding: the stores round each value.
  if (!g.swiglu->f8)
    return SmallVector<Value>(values);
  Value amax = warpMax(amaxOf(values), {1, 2});
  return mxRoundTrip(values, amax, g.swiglu->f8, g.swiglu->mode,
                     b.getF32Type());
}

std::pair<Value, SmallVector<Value>>
TmaEpilogue::encodeRowBlock(ArrayRef<Value> values) {
  Value amax = warpMax(amaxOf(values), {1, 2});
  return mxEncode(values, amax, g.swiglu->f8, g.swiglu->mode);
}

void TmaEpilogue::storeEncoded(
    const std::pair<Value, SmallVector<Value>> &encoded, Value at,
    Value scaleAt, Value lane) {
  Value outBase = baseAddress(out);
  for (int64_t i = 0; i < 4; ++i)
    LLVM::StoreOp::create(b, loc, encoded.second[i],
                          globalPtr(outBase, add(at, idx(8 * i))),
                          /*alignment=*/2);
  ifThen(cmp(P::eq, rem(lane, 4), idx(0)), [&] {
    LLVM::StoreOp::create(b, loc, encoded.first,
                          globalPtr(baseAddress(outScales), scaleAt),
                          /*alignment=*/1);
  });
}

void TmaEpilogue::storeSwigluGrad(const Tile &t, Value acc, Value rowBase,
                                  Value c, Value warp, Value lane) {
  int64_t f = g.n, twoF = 2 * g.n;
  Value col = add(t.n0, mul(rem(lane, 4), idx(2)));
  Value outBase = baseAddress(out);
  Value hBase = baseAddress(inH);
  Value dhBase = outF32 ? baseAddress(outF32) : Value();
  Type f32 = b.getF32Type();
  Value lastRow = add(t.hi, idx(-1));
  constexpr int64_t blocksPerRow = TileN / SwigluBlock;
  bool mMajor = bool(outCol);
  auto hOf = [&](int64_t k) { return mMajor ? k % 2 : k / blocksPerRow; };
  auto mOf = [&](int64_t k) { return mMajor ? k / 2 : k % blocksPerRow; };
  auto rowOf = [&](int64_t h) { return add(rowBase, idx(8 * h)); };
  // Whether block m (columns n0 + 32 m .. + 32 of da, and of dh's gate and
  // up halves) lies within F: a last tile past F (F % 256) computes
  // columns past it from the rhs rows its box read there and stores none.
  auto within = [&](int64_t m) {
    return blockWithin(add(t.n0, idx(32 * m)), f, TileN);
  };
  // gate and up of h at da's columns 8 j + 2 (l%4) + {0, 1}, j in the block
  // (past F: at F - 2, in bounds).
  auto loadBlock = [&](int64_t k) {
    int64_t h = hOf(k), m = mOf(k);
    Value hRowAt = mul(minS(rowOf(h), lastRow), idx(twoF));
    SmallVector<Value> values; // gate 0, gate 1, up 0, up 1 for each j
    for (int64_t j = 4 * m; j < 4 * m + 4; ++j) {
      Value column = add(col, idx(8 * j));
      if (f % TileN)
        column = minS(column, idx(f - 2));
      for (int64_t at : {int64_t(0), f})
        llvm::append_range(
            values,
            loadVector(f32, 2,
                       globalPtr(hBase, mul(add(hRowAt, add(column, idx(at))),
                                            idx(4))),
                       8));
    }
    return values;
  };
  ColumnExchange x;
  if (outCol)
    x = columnExchange(c, warp);
  SmallVector<Value> firstGate, firstUp; // row h = 0 of block m (m-major)
  SmallVector<Value> next = loadBlock(0);
  for (int64_t k = 0; k < 2 * blocksPerRow; ++k) {
    int64_t h = hOf(k), m = mOf(k);
    SmallVector<Value> hValues = next;
    SmallVector<Value> dg, du;
    for (int64_t i = 0; i < 4; ++i) {
      int64_t j = 4 * m + i;
      for (int64_t cc = 0; cc < 2; ++cc) {
        Value da = accAt(acc, 4 * j + 2 * h + cc);
        auto [dGate, dUp] = buildSwigluGrad(b, loc, hValues[4 * i + cc],
                                            hValues[4 * i + 2 + cc], da);
        dg.push_back(dGate);
        du.push_back(dUp);
      }
    }
    Value row = rowOf(h);
    Value rowAt = add(mul(row, idx(twoF)), col);
    // The gate's block and the up's, F further: the MX encoding (blocks
    // n0 / 32 + m and F / 32 further of the row's 2F / 32 scales) or the
    // rounding.
    std::pair<Value, SmallVector<Value>> gEncoded, uEncoded;
    SmallVector<Value> gRounded, uRounded;
    if (g.swiglu->mx) {
      gEncoded = encodeRowBlock(dg);
      uEncoded = encodeRowBlock(du);
    } else {
      gRounded = roundRowBlock(dg);
      uRounded = roundRowBlock(du);
    }
    if (k + 1 < 2 * blocksPerRow)
      next = loadBlock(k + 1);
    ifThen(rowAndBlock(row, t.hi, within(m)), [&] {
      if (g.swiglu->mx) {
        Value at = add(rowAt, idx(32 * m));
        Value scaleAt = add(mul(row, idx(twoF / SwigluBlock)),
                            add(div(t.n0, SwigluBlock), idx(m)));
        storeEncoded(gEncoded, at, scaleAt, lane);
        storeEncoded(uEncoded, add(at, idx(f)),
                     add(scaleAt, idx(f / SwigluBlock)), lane);
      }
      for (int64_t i = 0; i < 4; ++i) {
        Value at = add(rowAt, idx(8 * (4 * m + i)));
        Value upAt = add(at, idx(f));
        if (!g.swiglu->mx) {
          storePair(outBase, at, gRounded[2 * i], gRounded[2 * i + 1],
                    b.getBF16Type());
          storePair(outBase, upAt, uRounded[2 * i], uRounded[2 * i + 1],
                    b.getBF16Type());
        }
        if (dhBase) {
          storePair(dhBase, at, dg[2 * i], dg[2 * i + 1], f32);
          storePair(dhBase, upAt, du[2 * i], du[2 * i + 1], f32);
        }
      }
    });
    if (!outCol)
      continue;
    if (h == 0) {
      firstGate = dg;
      firstUp = du;
      continue;
    }
    storeColumnBlock(t, m % 2, twoF, {8 * 4 * m, 8 * 4 * m + f},
                     {within(m), within(m)}, {firstGate, firstUp}, {dg, du}, x,
                     rowBase, col, lane);
  }
}

void TmaEpilogue::storeColumnBlock(
    const Tile &t, int64_t slot, int64_t rowStride,
    std::array<int64_t, 2> halfAt, std::array<Value, 2> within,
    std::array<ArrayRef<Value>, 2> first, std::array<ArrayRef<Value>, 2> second,
    const ColumnExchange &x, Value rowBase, Value col, Value lane) {
  Value own = x.own, partner = x.partner, pairBarrier = x.pairBarrier;
  Type f32 = b.getF32Type();
  // Column v: half v / 8 (gate, up), value v % 8 = 2 i + cc.
  SmallVector<Value> amax;
  for (int64_t v = 0; v < 16; ++v)
    amax.push_back(warpMax(amaxOf({first[v / 8][v % 8], second[v / 8][v % 8]}),
                           {4, 8, 16}));
  Value slotAt = idx(ColSlotBytes * slot);
  Value laneAt = mul(rem(lane, 4), idx(16 * 4));
  ifThen(cmp(P::ult, lane, idx(4)), [&] {
    Value at = add(add(own, slotAt), laneAt);
    for (int64_t q = 0; q < 4; ++q) {
      Value v = vectorOf(ArrayRef(amax).slice(4 * q, 4));
      LLVM::StoreOp::create(b, loc, v, sharedPtrAt(add(at, idx(16 * q))), 16);
    }
  });
  NVVM::BarrierOp::create(b, loc, Type(), pairBarrier, int32(64),
                          NVVM::BarrierReductionAttr(), Value());
  Value at = add(add(partner, slotAt), laneAt);
  for (int64_t q = 0; q < 4; ++q) {
    SmallVector<Value> other =
        loadVector(f32, 4, sharedPtrAt(add(at, idx(16 * q))), 16);
    for (int64_t e = 0; e < 4; ++e)
      amax[4 * q + e] =
          arith::MaximumFOp::create(b, loc, amax[4 * q + e], other[e]);
  }
  // rounded[v] = {row h = 0, row h = 1} of column v.
  SmallVector<SmallVector<Value>> rounded;
  for (int64_t v = 0; v < 16; ++v)
    rounded.push_back(mxRoundTrip({first[v / 8][v % 8], second[v / 8][v % 8]},
                                  amax[v], g.swiglu->colF8, g.swiglu->colMode,
                                  f32));
  Value colOutBase = baseAddress(outCol);
  for (int64_t h = 0; h < 2; ++h) {
    Value row = add(rowBase, idx(8 * h));
    Value rowAt = add(mul(row, idx(rowStride)), col);
    ifThen(cmp(P::slt, row, t.hi), [&] {
      for (int64_t half = 0; half < 2; ++half) {
        auto store = [&] {
          for (int64_t i = 0; i < 4; ++i) {
            Value at = add(rowAt, idx(halfAt[half] + 8 * i));
            storePair(colOutBase, at, rounded[8 * half + 2 * i][h],
                      rounded[8 * half + 2 * i + 1][h], b.getBF16Type());
          }
        };
        if (within[half])
          ifThen(within[half], store);
        else
          store();
      }
    });
  }
}

} // namespace mlir::moe::kernels
