//===- TmaGemm.h - the TMA kernel's parts -----------------------*- C++ -*-===//
//
// What the TMA, warp-specialized grouped GEMM's mainloop
// (TmaGemmMainloop.cpp) and its epilogues (TmaGemmEpilogues.cpp) share: the
// tile shapes and shared-memory plan (namespace tma) and the epilogue
// collective, which stores a consumer warpgroup's 64 x 256 accumulators,
// 64 x 128 with blockwise FP8 (the f32 result through the copy engine, or
// the SwiGLU epilogues with their MX roundings and encodings).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_CONVERSION_MOETOGPU_KERNELS_TMAGEMM_H
#define MOE_CONVERSION_MOETOGPU_KERNELS_TMAGEMM_H

#include "HopperBuilder.h"
#include "Kernels.h"

namespace mlir::moe::kernels {

/// Tiles, the stage ring, barriers, staging boxes and registers of the TMA
/// kernel; budgets pinned by static_asserts.
namespace tma {
constexpr int64_t TileM = 128; // two consumer warpgroups of m64
constexpr int64_t TileN = 256; // MMA N
constexpr int64_t TileK = 64;  // one 128-byte swizzle row of bf16
constexpr int64_t Stages = 4;
constexpr int64_t Threads = 384; // producer warpgroup + two consumers
constexpr int64_t ConsumerThreads = 256;
constexpr int64_t TileABytes = TileM * TileK * 2; // 16384
constexpr int64_t TileBBytes = TileK * TileN * 2; // 32768
constexpr int64_t StageBytes = TileABytes + TileBBytes;
constexpr int64_t Barriers = Stages * StageBytes; // 8-byte mbarriers
constexpr int64_t SmemBytes = Barriers + 2 * Stages * 8 + 1024;
// The f32 result's staging buffers (kernels without a SwiGLU epilogue; see
// storeBoxes): per consumer warpgroup two boxes of 64 rows x 32 columns
// (8 KiB, the 128-byte swizzled layout of the result's tensor map), 1 KiB
// aligned after the barriers. 231424 bytes in all with the alignment slack,
// within the 232448 (227 KiB) a CTA may have.
constexpr int64_t BoxColumns = 32;
constexpr int64_t BoxBytes = hopper::MmaM * BoxColumns * 4;
constexpr int64_t StagingAt = Barriers + 1024;
constexpr int64_t StagingBytes = 2 * 2 * BoxBytes;
constexpr int64_t StoreSmemBytes = StagingAt + StagingBytes + 1024;
// Named barriers of one consumer warpgroup (0 is __syncthreads, 1 both
// consumers, 2-5 the columnwise epilogue's warp pairs).
constexpr int64_t WarpgroupBarrier = 6;
// Within the dynamic shared memory a Hopper CTA may have (227 KiB), and the
// staging boxes clear of the barriers (the SwiGLU kernels' amax slots start
// right after them, but those kernels stage nothing).
static_assert(StoreSmemBytes <= 232448, "TMA kernel: shared memory");
static_assert(StagingAt >= Barriers + 2 * Stages * 8 && StagingAt % 1024 == 0,
              "TMA kernel: staging boxes after the barriers, 1 KiB aligned");
// An 8-bit lhs (TmaGemm::lhsF8): per stage its 128 x 64 elements (8 KiB,
// unswizzled 64-byte rows) land in the A slot, and warps 1-3 of the
// producer warpgroup expand them there into the bf16 tile (units of 16
// elements: a quarter of a row); a third mbarrier a stage after the other
// two, and a named barrier for the converters.
constexpr int64_t TileAF8Bytes = TileM * TileK;
constexpr int64_t Converters = 96;
constexpr int64_t ConvertUnits = TileM * TileK / 16;
constexpr int64_t ConverterBarrier = 8;
// Registers a thread (setmaxnreg; hopper::registerPool): the SwiGLU kernels'
// producer warpgroup keeps 40 and its consumers get 232; with an 8-bit lhs the
// producer warpgroup keeps 120 (the converters spill below that) and the
// consumers get 184.
constexpr int64_t ProducerRegs = 40, SwigluConsumerRegs = 232;
constexpr int64_t ConverterRegs = 120, ConverterConsumerRegs = 184;
static_assert(128 * ProducerRegs + 256 * SwigluConsumerRegs <=
                      hopper::registerPool(384) &&
                  128 * ConverterRegs + 256 * ConverterConsumerRegs <=
                      hopper::registerPool(384),
              "TMA kernel: the register split");
static_assert(Barriers + 3 * Stages * 8 <= StagingAt,
              "TMA kernel: the 8-bit lhs's barriers before the staging boxes");
// Persistent CTAs: the SM count of an H100 / H200 SXM (on a GPU with fewer
// SMs the last wave is simply shorter).
constexpr int64_t Ctas = 132;
// The grouped raster (rasterRows): 8 row tiles a group, where a row of
// tiles reads more than 32 MiB of B (the H200's L2: 50 MiB).
constexpr int64_t RasterRows = 8;
constexpr int64_t RasterBytes = int64_t(32) << 20;
// The SwiGLU epilogue's MX blocks: 8 values in each of 4 lanes.
constexpr int64_t SwigluBlock = 32;
// The backward epilogue's columnwise MX blocks (see SwigluEpilogue::col):
// each consumer warp's column amaxes of its 16 rows, 64 f32 a block of 8
// columns x 2 halves x 4 lanes, in two slots (blocks alternate), handed to
// the other warp of its 32-row pair.
constexpr int64_t ColSlotBytes = 64 * 4;
constexpr int64_t ColAmaxAt = Barriers + 2 * Stages * 8;
constexpr int64_t ColAmaxBytes = 8 * 2 * ColSlotBytes;
static_assert(SmemBytes + ColAmaxBytes <= 232448,
              "TMA kernel: shared memory (columnwise epilogue)");
} // namespace tma

/// K values a stage: 64 (a 128-byte swizzle row of bf16), or 128 with
/// blockwise FP8 operands (a row of 8-bit elements: one scale tile).
inline int64_t stageK(const TmaGemm &g) {
  return g.blockLhs ? 2 * tma::TileK : tma::TileK;
}
/// Stages along K; the last one is partial when K % stageK (the copy engine
/// reads zeros past K).
inline int64_t kStages(const TmaGemm &g) {
  return (g.k + stageK(g) - 1) / stageK(g);
}
/// A weight gradient's row tiles of 128 along K (the last one partial when
/// K % 128).
inline int64_t kTiles(const TmaGemm &g) {
  return (g.k + tma::TileM - 1) / tma::TileM;
}
/// Whether the rhs [E, K, N] is read through a 3-D map ([E][K][N], boxes
/// within one expert), so that a partial last K stage reads zeros and not
/// the next expert's first rows (whose values, were they infinite, would
/// make 0 * inf): K % 64 with the untransposed rhs.
inline bool rhsPlanes(const TmaGemm &g) {
  return !g.wgrad && !g.rhsTransposed && g.k % tma::TileK;
}
/// Whether a weight gradient's result [E, K, N] is stored through a 3-D map,
/// so that the last row tile stores nothing past K (into the next expert's
/// rows): K % 128.
inline bool outPlanes(const TmaGemm &g) { return g.wgrad && g.k % tma::TileM; }

/// The order of an expert's tiles: row tile after row tile (its column tiles
/// side by side), or, where a row of tiles reads more of B than
/// tma::RasterBytes (an expert of 4096 x 28672, an LM head), groups of
/// tma::RasterRows row tiles walked column tile after column tile, so that
/// the CTAs in flight share their A and B tiles in L2 instead of streaming
/// all of B from memory for every row tile (CUTLASS's and Triton's grouped
/// raster).
/// Forward: B is [K, N] an expert; weight gradient: the rhs rows of an
/// expert (its average group) by N.
inline int64_t rasterRows(const TmaGemm &g) {
  int64_t depth = g.wgrad ? g.rows / g.experts : g.k;
  int64_t bytes = g.blockLhs ? 1 : 2;
  return g.columnTiles() * g.tileN() * depth * bytes > tma::RasterBytes
             ? tma::RasterRows
             : 1;
}

/// Columns of a staging box: 128 bytes of the result's element type.
inline int64_t boxColumns(const TmaGemm &g) {
  return g.outBf16 ? 2 * tma::BoxColumns : tma::BoxColumns;
}

/// The epilogue collective of the TMA kernel: what a consumer warpgroup
/// does with its accumulators once a tile's MMAs are complete. The mainloop
/// (TmaGemmEmitter, TmaGemmMainloop.cpp) derives from it for its buffers.
struct TmaEpilogue : HopperBuilder {
  const TmaGemm &g;
  // Buffers: offsets [E+1], result; device addresses of the tensor maps of
  // A and B (host values, i64).
  Value offsets, out, mapA, mapB;
  // The SwiGLU epilogue's optional results h and the f32 values it rounds
  // (null if not kept), the backward's columnwise rounding (null if not
  // computed), and the backward's h argument; `out` is then the MX-rounded
  // result.
  Value outH{}, outF32{}, outCol{}, inH{};
  // The 8-bit lhs's scales (TmaGemm::lhsF8, or blockwise with the rhs's,
  // scalesB), the forward epilogue's MX scales (SwigluEpilogue::mx; `out`
  // holds the elements); else null.
  Value scalesA{}, scalesB{}, outScales{};
  // The tensor map (boxes of 64 rows x 32 columns) of the f32 result the
  // copy engine stores (see stagesF32); null if none.
  Value mapOut{};
  Value tid{};

  /// One output tile: expert e with clamped rows [lo, hi); the tile's first
  /// row (forward: of the result; weight gradient: of result[e], a K index)
  /// and column; its K stages of 64.
  struct Tile {
    Value e, lo, hi, m0, n0, stages;
  };

  /// Stores consumer `c`'s 64 x tileN() accumulators (its rows from
  /// `first`) through the copy engine into the f32 array of tensor map
  /// `map`, rows from `outRow`, box q (registers 4 j + 2 h + cc, j in
  /// [4 q, 4 q + 4)) at column `column(q)`: tileN() / 32 boxes of 32
  /// columns (bf16: of 64), alternating between the
  /// warpgroup's two staging buffers: wait until the store that last read the
  /// buffer (two boxes ago) has read it, write the box (the map's 128-byte
  /// swizzle: 16-byte chunk k of row r at chunk k ^ (r % 8); a warp's 8-byte
  /// stores cover every bank twice), fence the writes for the copy engine, and
  /// one thread issues the store. The warpgroup then moves on to its next tile
  /// while the boxes travel.
  /// With `plane` (a 3-D map, outPlanes), rows of that plane.
  void storeBoxes(Value acc, Value map, Value outRow, Value plane,
                  function_ref<Value(int64_t)> column, Value c, Value warp,
                  Value lane);
  /// Box q of storeBoxes, staged in `box`.
  void storeBox(Value acc, Value map, Value outRow, Value plane,
                function_ref<Value(int64_t)> column, Value c, Value warp,
                Value lane, int64_t q, Value leader, function_ref<void()> sync,
                Value box);

  /// Whether the MX block of 32 output columns from `first` lies within the
  /// result's `columns` (the SwiGLU epilogues' last tile may hold columns
  /// past them, whose values it computes from whatever the B tile held and
  /// stores nowhere); null when every tile of `tileColumns` is whole.
  Value blockWithin(Value first, int64_t columns, int64_t tileColumns) {
    if (columns % tileColumns == 0)
      return Value();
    return cmp(P::slt, first, idx(columns));
  }
  /// `row` < `hi`, and `within` when not null.
  Value rowAndBlock(Value row, Value hi, Value within) {
    Value valid = cmp(P::slt, row, hi);
    return within ? land(valid, within) : valid;
  }

  /// The SwiGLU epilogue (see SwigluEpilogue). The B tile held 128 gate
  /// columns, then the up columns of the same outputs, so register
  /// 4 j + 2 h + c (j < 16) is the gate and register 4 (j + 16) + 2 h + c the
  /// up of output column n0 / 2 + 8 j + 2 (l%4) + c: this thread's 32
  /// outputs of a row make four MX blocks of 8 values each, the other 24 of
  /// every block in the 3 lanes of the same row (the lanes l ^ 1, l ^ 2,
  /// l ^ 3), which one amax reduction over 2 xor shuffles combines.
  void storeSwiglu(const Tile &t, Value acc, Value rowBase, Value c, Value warp,
                   Value lane);

  /// The columnwise pass's shared memory (SwigluEpilogue::col): warp w's
  /// slots and its partner's (w ^ 1), and the warp pair's named barrier
  /// (2 + 2 c + w / 2).
  struct ColumnExchange {
    Value own, partner, pairBarrier;
  };
  ColumnExchange columnExchange(Value c, Value warp);

  /// The MX rounding of one rowwise block: this thread's 8 values of it
  /// and the other 24 in the lanes l ^ 1, l ^ 2, l ^ 3.
  SmallVector<Value> roundRowBlock(ArrayRef<Value> values);
  /// The MX encoding of that block (SwigluEpilogue::mx): its scale byte and
  /// this thread's element pairs.
  std::pair<Value, SmallVector<Value>> encodeRowBlock(ArrayRef<Value> values);
  /// Stores an encoded block: this thread's 4 pairs at elements at + 8 i
  /// of `out` (columns 8 j + 2 (l%4) + {0, 1}: `at` is the thread's first),
  /// and the scale byte at `scaleAt` of `outScales` from lane l%4 == 0.
  void storeEncoded(const std::pair<Value, SmallVector<Value>> &encoded,
                    Value at, Value scaleAt, Value lane);

  /// The backward SwiGLU epilogue (see SwigluEpilogue): register
  /// 4 j + 2 h + c is da at column n0 + 8 j + 2 (l%4) + c; with the gate and
  /// up of h at that column and F further (8-byte loads of h's row, clamped
  /// to the group so rows past it stay in bounds), dh's gate and up halves.
  /// dh's rowwise MX blocks of the gate half and of the up half each have 8
  /// values in this thread (j in [4 m, 4 m + 4)), as in the forward.
  ///
  /// With the columnwise rounding (`outCol`), blocks go m-major (both rows h
  /// of block m, then m + 1): a column's 32-row block is the 16 rows of warp
  /// w (2 rows h in each of the 8 lanes l%4 + 4 i) and the 16 of warp w ^ 1
  /// (warps 2p, 2p + 1 hold rows 32 p .. 32 p + 31 of the warpgroup's 64,
  /// which start at a multiple of 32). Each warp's amaxes go through xor
  /// shuffles over lanes 4, 8, 16, then shared memory (lanes 0-3 write, a
  /// 64-thread named barrier per warp pair, every lane reads the other
  /// warp's), and each column's two values here round with the pair's
  /// amax. A block past the group's end is entirely past it (the group ends
  /// at a multiple of 32 too) and stores nothing.
  void storeSwigluGrad(const Tile &t, Value acc, Value rowBase, Value c,
                       Value warp, Value lane);

  /// The columnwise MX rounding of 16 columns here, two halves of 8
  /// (backward: block m's gate values 2 i + cc, then its up; forward: blocks
  /// m and m + 1), rows h = 0 (`first`) and h = 1 (`second`), through the
  /// warp pair's shared-memory slot `slot` (alternating: see
  /// storeSwigluGrad). Value 2 i + cc of half `half` is stored at column
  /// col + halfAt[half] + 8 i + cc of the bf16 result's rows of `rowStride`,
  /// when `within[half]` (see blockWithin; null: always).
  void storeColumnBlock(const Tile &t, int64_t slot, int64_t rowStride,
                        std::array<int64_t, 2> halfAt,
                        std::array<Value, 2> within,
                        std::array<ArrayRef<Value>, 2> first,
                        std::array<ArrayRef<Value>, 2> second,
                        const ColumnExchange &x, Value rowBase, Value col,
                        Value lane);
};

} // namespace mlir::moe::kernels

#endif
