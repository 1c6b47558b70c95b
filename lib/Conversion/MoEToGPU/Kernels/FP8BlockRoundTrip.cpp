//===- FP8BlockRoundTrip.cpp - blockwise FP8 round trips and quantizes ----===//
//
// Blockwise FP8 round trip and quantize
// -------------------------------------
// `moe.dequantize (moe.quantize x)` through an !moe.fp8block type in one
// pass (every blockwise FP8 GEMM operand takes it on its way to the bf16
// wgmma kernels), and a `moe.quantize` to that type whose 8-bit data and
// scales are read (the FP8 wgmma kernel's operands) as one kernel writing
// both. The generic path runs a quantize as an amax kernel and an encoding
// kernel, and a dequantize as a third, reading x twice; this kernel reads x
// once. Tiles of the last two dims: 1 x 128 (along the innermost dim),
// 128 x 1 (along the rows) and 128 x 128, 1 along every leading dim (a
// rank-1 tensor: 128); the last tile along a dim may be partial. Static
// shapes; f32, bf16 or f16 input and result.
//
// Numerics, as the generic lowering computes them: the tile's amax (NaN
// propagating), buildFP8BlockScale's factor s and the stored scale 1 / s
// (an f32 division); each element x * s, clamped to +-max (NaN stays NaN),
// converted by the hardware (cvt.rn.satfinite: nearest even, buildEncode's
// rule; a quantize stores a NaN as the format's NaN with the sign of the
// input's bits, as buildEncode does); the round trip's value is the exact f8 ->
// f16 conversion times 1 / s in f32, rounded once to the result type.
// Bit-identical (test/Integration/GPU/fp8block.mlir checks it on the GPU,
// special values included).
//
// Work: a CTA of 256 threads takes a region of RR rows x W columns of one
// matrix; thread t holds the 4 consecutive columns 4 (t % L) of the rows
// t / L + G r (L = W / 4 lanes across the columns, G = 256 / L row groups),
// so each load of a warp is a run of contiguous columns (16-byte loads where
// the buffers are aligned and the columns a multiple of 4).
// - 1 x 128: W = 128, RR = 8, a warp a row; the amax by five xor shuffles.
// - 128 x 1: W = 32, RR = 128, 4 rows of 4 columns a thread; each column's
//   amax by two xor shuffles, then across the 8 warps in shared memory.
// - 128 x 128: W = 128, RR = 128, 16 rows of 4 columns a thread; the amax by
//   five xor shuffles, then across the warps (each lane reads one warp's,
//   three more shuffles).
// - A pair (both tilings of one input, 1 x 128 and 128 x 1): W = 128,
//   RR = 128, a CTA of 512 threads, 8 rows of 4 columns a thread, every
//   row's run loaded at once.
// A quantize in 128 x 128 tiles (all whole) whose data something transposes
// (the K-major rhs of a forward FP8 wgmma GEMM, transposeBytes) writes the
// transposed data too, in place of that transpose: each region's codes go
// to shared memory by column, and rows of the transposed tile leave in
// 64-byte runs (storeTransposed).
// CTAs stride over the regions. Live rows (1 x 128 tiles of a matrix whose
// rows past the groups' last offset nothing reads, LiveRows.h): only the
// rows before it are computed.
// A pair of a dispatch's rows (-moe-gpu-fuse-row-gathers) reads each row
// from the tokens through the dispatch's source index (and computes a
// combine gradient's scaled copies itself): the gathered f32 rows are
// never written.
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"
#include "Kernels.h"

#include "moe/Dialect/MoE/Utils/Activations.h"
#include "moe/Dialect/MoE/Utils/LiveRows.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace {

/// A CTA's threads; a pair's CTA has twice as many (FP8BlockKernel::threads).
constexpr int64_t Threads = 256;
constexpr int64_t Warps = Threads / 32;
static_assert(Warps == 8, "the whole-tile amax reads 8 warps' values");
/// The tile size the kernel takes along a dim that is tiled.
constexpr int64_t Tile = 128;
/// The transposed codes of a region (FP8BlockKernel::transposed): a row of
/// 132 bytes for each of its columns (4-byte aligned; a warp's byte stores
/// down a column meet 4-way bank conflicts at most), after the amax slots.
constexpr int64_t TransposedRow = Tile + 4;
/// The rows whose runs a thread loads together (loadRegion): their loads
/// issue back to back; more would hold more registers.
constexpr int64_t LoadRows = 4;
/// On a pair kernel's function (quantizePair): its [rowwise, columnwise]
/// types, for fp8BlockPairGather.
constexpr llvm::StringLiteral kFP8BlockPairAttr = "moe.fp8block_pair";

/// What a quantize writes of its data: as it is, also transposed (the last
/// two dims swapped), or transposed only.
enum class Transposed { no, also, only };

/// The op whose result a pair kernel quantizes, computed by the kernel
/// itself (quantizePair): none (the input is read), moe.swiglu of h
/// ([R, 2F] -> [R, F]) or moe.swiglu_grad of h and the result's gradient d
/// ([R, 2F], [R, F] -> [R, 2F]), split layout, f32.
enum class Producer { none, swiglu, swigluGrad };

/// One blockwise FP8 conversion the kernel handles: a round trip (`outElt`
/// set) or a quantize (`outElt` null: data and scales).
struct FP8BlockKernel {
  FP8BlockTensorType type;
  Type inElt, outElt;
  /// The offsets' element type when only the rows before their last entry
  /// are computed; null otherwise.
  Type offsetElt;
  /// A quantize that also (or only) writes its data with the last two dims
  /// swapped (transposes(): the K-major copies FP8 wgmma reads of a forward
  /// GEMM's rhs, see transposeBytes, and of a weight gradient's operands).
  Transposed transposed = Transposed::no;
  /// A pair (quantizePair): `type` is the rowwise quantization (1 x 128
  /// tiles), this the columnwise one (128 x 1) of the same input, written
  /// transposed; regions of 128 x 128, one pass. Null otherwise.
  FP8BlockTensorType colType{};
  bool pair() const { return bool(colType); }
  /// A pair reading its rows through a dispatch's gather (GatheredRows):
  /// arguments (tokens, source[, scale][, offsets]).
  std::optional<GatheredRows> gathered{};
  /// A pair computing its input (Producer), F the SwiGLU's output width:
  /// arguments (h[, d][, offsets]).
  Producer producer = Producer::none;
  int64_t half = 0;

  bool roundTrip() const { return bool(outElt); }
  /// A CTA's threads and warps: a pair's thread holds 8 rows of its
  /// region, every row's run loaded at once, in at most 128 registers (one
  /// CTA of 16 warps an SM); 16 rows a thread took 247 registers, and its
  /// 8 warps an SM waited on the loads in turn with the math.
  int64_t threads() const { return pair() ? 2 * Threads : Threads; }
  int64_t warps() const { return threads() / 32; }
  /// The rows whose runs a thread loads together (loadRegion): a pair's
  /// all (its values are held until the region's columnwise amax anyway),
  /// else LoadRows.
  int64_t loadRows() const { return pair() ? rowsPerThread() : LoadRows; }
  ArrayRef<int64_t> shape() const { return type.getShape(); }
  int64_t rank() const { return int64_t(shape().size()); }
  /// The tensor as `matrices()` matrices of rows() x cols().
  int64_t rows() const { return rank() == 1 ? 1 : shape()[rank() - 2]; }
  int64_t cols() const { return shape().back(); }
  int64_t matrices() const {
    int64_t n = 1;
    for (int64_t d : shape().drop_back(std::min<int64_t>(rank(), 2)))
      n *= d;
    return n;
  }
  int64_t tileRows() const {
    return rank() == 1 ? 1 : type.getBlock()[rank() - 2];
  }
  int64_t tileCols() const { return type.getBlock().back(); }
  /// The region a CTA takes: regionRows() x width().
  int64_t width() const {
    return pair() ? Tile : tileCols() == 1 ? 32 : tileCols();
  }
  int64_t lanes() const { return width() / 4; }
  int64_t rowGroups() const { return threads() / lanes(); }
  int64_t regionRows() const {
    if (pair())
      return Tile;
    return tileRows() == 1 ? rowGroups() : tileRows();
  }
  int64_t rowsPerThread() const { return regionRows() / rowGroups(); }
  int64_t rowRegions() const { return tilesOf(rows(), regionRows()); }
  int64_t colRegions() const { return tilesOf(cols(), width()); }
  int64_t regions() const { return matrices() * rowRegions() * colRegions(); }
  /// Whether a tile's rows are spread over the CTA's warps.
  bool acrossWarps() const { return pair() || tileRows() > 1; }
  /// Amax values a warp hands to the others: one a column (128 x 1) or one.
  int64_t warpSlots() const { return pair() || tileCols() == 1 ? width() : 1; }
  /// Whether the quantize can write its data transposed: tiles of 128
  /// rows (by 128 or 1 columns), columns a multiple of the region width.
  /// The transposed rows are transposedRows() long: the last region's rows
  /// past rows() (zeros, whose codes are 0) are written too.
  bool transposes() const {
    return !roundTrip() && rank() >= 2 && tileRows() == Tile &&
           cols() % width() == 0;
  }
  int64_t transposedRows() const { return tilesOf(rows(), Tile) * Tile; }
  /// Where the transposed codes of a region start in shared memory.
  int64_t transposedAt() const {
    return std::max<int64_t>(128, warps() * warpSlots() * 4);
  }
  int64_t smemBytes() const {
    if (transposed != Transposed::no)
      return transposedAt() + width() * TransposedRow;
    return acrossWarps() ? warps() * warpSlots() * 4 : 0;
  }

  std::string name() const {
    std::string dims;
    for (int64_t d : shape())
      dims += (dims.empty() ? "" : "x") + std::to_string(d);
    std::string tile =
        std::to_string(tileRows()) + "x" + std::to_string(tileCols());
    std::string scales = type.getPow2() ? "pow2" : "f32s";
    std::string live =
        offsetElt ? "_live_" + elementName(offsetElt) : std::string();
    if (pair())
      return llvm::formatv(
                 "moe_fp8block_quantize_pair_{0}_{1}_{2}_{3}_{4}_{5}{6}{7}",
                 dims, elementName(type.getElementType()), scales,
                 elementName(colType.getElementType()),
                 colType.getPow2() ? "pow2" : "f32s", elementName(inElt), live,
                 gathered                           ? gathered->suffix()
                 : producer == Producer::swiglu     ? "_of_swiglu"
                 : producer == Producer::swigluGrad ? "_of_swiglu_grad"
                                                    : "")
          .str();
    if (!roundTrip())
      return llvm::formatv("moe_fp8block_quantize_{0}_t{1}_{2}_{3}_{4}{5}{6}",
                           dims, tile, elementName(type.getElementType()),
                           scales, elementName(inElt),
                           transposed == Transposed::also   ? "_and_T"
                           : transposed == Transposed::only ? "_T"
                                                            : "",
                           live)
          .str();
    return llvm::formatv(
               "moe_fp8block_round_trip_{0}_t{1}_{2}_{3}_{4}_to_{5}{6}", dims,
               tile, elementName(type.getElementType()), scales,
               elementName(inElt), elementName(outElt), live)
        .str();
  }
};

/// The conversion of `q` (to `outElt`, or a quantize when null), if the
/// kernel takes it.
std::optional<FP8BlockKernel> matchFP8Block(QuantizeOp q, Type outElt,
                                            WhyNot why) {
  auto type = dyn_cast<FP8BlockTensorType>(q.getType());
  auto in = dyn_cast<RankedTensorType>(q.getInput().getType());
  if (!type)
    return noKernel(why, "the result is not blockwise FP8");
  if (q->getParentOfType<ExpertsOp>())
    return noKernel(why, "inside a moe.experts region (not grouped)");
  if (!in || !in.hasStaticShape() ||
      ShapedType::isDynamicShape(type.getShape()))
    return noKernel(why, "a dynamic shape (the kernels are generated for "
                         "static shapes)");
  if (!isRoundTripFloat(in.getElementType()))
    return noKernel(why, "a {0} input", in.getElementType());
  if (outElt && !isRoundTripFloat(outElt))
    return noKernel(why, "a {0} result", outElt);
  if (in.getNumElements() == 0)
    return noKernel(why, "no elements");
  ArrayRef<int64_t> block = type.getBlock();
  int64_t rank = int64_t(block.size());
  for (int64_t d = 0; d + 2 < rank; ++d)
    if (block[d] != 1)
      return noKernel(why,
                      "tiles of {0} along dim {1} (the kernel tiles the "
                      "last two dims only)",
                      block[d], d);
  int64_t tr = rank == 1 ? 1 : block[rank - 2], tc = block.back();
  if ((tr != 1 && tr != Tile) || (tc != 1 && tc != Tile) ||
      (tr == 1 && tc == 1))
    return noKernel(why,
                    "{0} x {1} tiles (the kernel takes 1 x {2}, {2} x 1 and "
                    "{2} x {2})",
                    tr, tc, Tile);
  return FP8BlockKernel{type, in.getElementType(), outElt, Type()};
}

/// Emits the body of the kernel's gpu.launch.
struct FP8BlockEmitter : KernelBuilder {
  const FP8BlockKernel &g;
  int64_t grid;
  Value x, offsets;
  // The round trip's result, or the quantize's data and scales (and the
  // transposed data: FP8BlockKernel::transposed).
  Value out, data, scales, dataT{};
  // A pair's columnwise scales (FP8BlockKernel::pair).
  Value colScales{};
  // Gathered rows (FP8BlockKernel::gathered): row r is the tokens' (x's)
  // row source[r], zeros where that is outside [0, sourceRows); scaled,
  // scale[s] * x's row s / perRow (s = source[r]). With offsets, source is
  // read before the groups' end only (`liveEnd`; past it, a bounded
  // gather's source is unspecified, and so are the rows).
  Value source{}, scale{}, liveEnd{};
  // The gradient d of a SwiGLU gradient's result (Producer::swigluGrad).
  Value grad{};
  // The data's address and whether it is 4-byte aligned (storeCodes).
  Value codesBase{}, codesAligned{};

  Type f32() { return b.getF32Type(); }
  Value f32c(float v) {
    return arith::ConstantFloatOp::create(b, loc, cast<FloatType>(f32()),
                                          APFloat(v));
  }

  void emit(gpu::LaunchOp launch) {
    if (g.smemBytes())
      setUpSharedMemory();
    Value tid = launch.getThreadIds().x;
    Value lane = rem(tid, 32), warp = div(tid, 32);
    Value cl = rem(tid, g.lanes()), rg = div(tid, g.lanes());
    Value xs = flat(x);
    Value ys = out ? flat(out) : Value();
    Value ds = data ? flat(data) : Value();
    Value ss = scales ? flat(scales) : Value();
    // 16-byte vector accesses need the columns a multiple of 4 and the
    // buffers 16-byte aligned (device allocations are; a caller's need not
    // be).
    Value aligned = boolean(false);
    if (g.cols() % 4 == 0) {
      Value bases = baseAddress(xs);
      if (ys)
        bases = arith::OrIOp::create(b, loc, bases, baseAddress(ys));
      if (grad)
        bases = arith::OrIOp::create(b, loc, bases, baseAddress(grad));
      aligned =
          cmp(P::eq, arith::AndIOp::create(b, loc, bases, int64(15)), int64(0));
    }
    if (ds) {
      codesBase = baseAddress(ds);
      codesAligned = cmp(
          P::eq, arith::AndIOp::create(b, loc, codesBase, int64(3)), int64(0));
    }
    Value regions = idx(g.regions());
    if (offsets) {
      liveEnd = groupsEnd(offsets, g.rows());
      regions = mul(div(add(liveEnd, idx(g.regionRows() - 1)), g.regionRows()),
                    idx(g.colRegions()));
    }
    int64_t perMatrix = g.rowRegions() * g.colRegions();
    strideLoop(launch.getBlockIds().x, regions, grid, [&](Value region) {
      Value m = div(region, perMatrix), rc = rem(region, perMatrix);
      Value row0 = mul(div(rc, g.colRegions()), idx(g.regionRows()));
      Value colRegion = rem(rc, g.colRegions());
      if (g.producer == Producer::swigluGrad && g.half % g.width() == 0)
        // A gate region, then the up region of the same h columns: run by
        // CTAs side by side, they read h and d from memory once between
        // them (the second read hits L2).
        colRegion = add(mul(rem(colRegion, 2), idx(g.colRegions() / 2)),
                        div(colRegion, 2));
      Value col = add(mul(colRegion, idx(g.width())), mul(cl, idx(4)));
      if (g.pair())
        emitPairRegion(m, row0, col, rg, cl, lane, warp, aligned, xs, ds, ss);
      else
        emitRegion(m, row0, col, rg, cl, lane, warp, aligned, xs, ys, ds, ss);
      if (g.transposed != Transposed::no)
        storeTransposed(m, row0,
                        arith::SubIOp::create(b, loc, col, mul(cl, idx(4))));
    });
  }

  /// The region's tile (rows row0.., columns col0..) of element codes,
  /// which emitRegion left transposed in shared memory, as rows of the
  /// transposed data: a row of 128 codes (8 chunks of 16 bytes) for each of
  /// the region's W columns, thread t of T writing the C = 8 W / T chunks
  /// from t C (W = 128, T = 256: row col0 + t / 2, 64 bytes from
  /// row0 + 64 (t % 2); a pair's T = 512: row col0 + t / 4, 32 bytes from
  /// row0 + 32 (t % 4); W = 32: row col0 + t / 8, 16 bytes from
  /// row0 + 16 (t % 8)), so 16, 4 or 8 lanes write one row's contiguous
  /// bytes. Every region is whole (FP8BlockKernel::transposes).
  void storeTransposed(Value m, Value row0, Value col0) {
    NVVM::Barrier0Op::create(b, loc); // every code is in shared memory
    Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
    int64_t chunks = 8 * g.width() / g.threads();
    assert(chunks >= 1 && 8 % chunks == 0 && "a thread's chunks in one row");
    Value first = mul(tid, idx(chunks));
    Value n = div(first, 8), at = mul(rem(first, 8), idx(16));
    Value from =
        add(idx(g.transposedAt()), add(mul(n, idx(TransposedRow)), at));
    Value rowAt = add(
        mul(add(mul(m, idx(g.cols())), add(col0, n)), idx(g.transposedRows())),
        add(row0, at));
    Value base = baseAddress(dataT);
    for (int64_t q = 0; q < chunks; ++q) {
      SmallVector<Value> words;
      for (int64_t w = 0; w < 4; ++w)
        words.push_back(LLVM::LoadOp::create(
            b, loc, i32(), sharedPtrAt(add(from, idx(16 * q + 4 * w))),
            /*alignment=*/4));
      LLVM::StoreOp::create(b, loc, vectorOf(words),
                            globalPtr(base, add(rowAt, idx(16 * q))),
                            /*alignment=*/16);
    }
  }

  /// One run of 4 consecutive elements: of flat `buffer` (address `base`)
  /// from element `at`, in bounds.
  struct Run {
    Value buffer, base, at;
  };
  /// The elements (`elt`) of `runs`: one vector load a run where
  /// `aligned`, else one load an element, under one branch, so that the
  /// loads issue back to back.
  SmallVector<Value> loadRuns(Type elt, ArrayRef<Run> runs, Value aligned) {
    unsigned bytes = elt.getIntOrFloatBitWidth() / 8;
    SmallVector<Type> types(4 * runs.size(), elt);
    return ifElse(
        types, aligned,
        [&] {
          SmallVector<Value> v;
          for (const Run &run : runs)
            llvm::append_range(
                v,
                loadVector(elt, 4, globalPtr(run.base, mul(run.at, idx(bytes))),
                           4 * bytes));
          return v;
        },
        [&] {
          SmallVector<Value> v;
          for (const Run &run : runs)
            for (int64_t c = 0; c < 4; ++c)
              v.push_back(memref::LoadOp::create(
                  b, loc, run.buffer, ValueRange{add(run.at, idx(c))}));
          return v;
        });
  }

  /// A thread's values of one region: rows row0 + rg + G r, columns
  /// col + c; each row's index, validity and first flat element, the loaded
  /// elements (`raw`, the input type; zero where invalid) and as f32.
  struct RegionValues {
    SmallVector<Value> rowOf, rowValid, first;
    SmallVector<SmallVector<Value>> raw, values;
  };
  RegionValues loadRegion(Value m, Value row0, Value col, Value rg,
                          Value aligned, Value xs) {
    int64_t rowsPer = g.rowsPerThread(), rows = g.rows(), cols = g.cols();
    Value xBase = baseAddress(xs);
    RegionValues rv;
    auto &[rowOf, rowValid, first, raw, values] = rv;
    Value zeroIn = arith::ConstantOp::create(b, loc, b.getZeroAttr(g.inElt));
    // Each row's index, validity, first element and where its run is read
    // from (x's row, or a gathered row's source: then `loaded` also
    // requires the source inside the tokens), every source index loaded
    // before any element.
    SmallVector<Value> from, loaded, weight;
    for (int64_t r = 0; r < rowsPer; ++r) {
      Value row = add(add(row0, rg), idx(r * g.rowGroups()));
      rowOf.push_back(row);
      rowValid.push_back(
          land(cmp(P::ult, row, idx(rows)), cmp(P::ult, col, idx(cols))));
      first.push_back(add(mul(add(mul(m, idx(rows)), row), idx(cols)), col));
      from.push_back(first.back());
      loaded.push_back(rowValid.back());
      if (!source)
        continue;
      Value defined = cmp(P::ult, row, liveEnd ? liveEnd : idx(rows));
      Value s = memref::LoadOp::create(
          b, loc, source, ValueRange{select(defined, row, idx(0))});
      Value inside = land(cmp(P::sge, s, idx(0)),
                          cmp(P::slt, s, idx(g.gathered->sourceRows)));
      loaded.back() = land(loaded.back(), land(defined, inside));
      Value at = select(inside, s, idx(0));
      Value tokenRow = g.gathered->scaled ? div(at, g.gathered->perRow) : at;
      from.back() = add(mul(tokenRow, idx(cols)), col);
      if (scale)
        weight.push_back(memref::LoadOp::create(b, loc, scale, ValueRange{at}));
    }
    for (int64_t r = 0; r < rowsPer; ++r)
      raw.emplace_back();
    if (g.producer != Producer::none) {
      loadProduced(rv, col, loaded, aligned, xs, xBase, zeroIn);
    } else if (cols % 4 == 0) {
      // A valid run is whole. The rows' runs are loaded LoadRows at a
      // time, from element 0 where the row is not valid (so that the loads
      // need no branch and issue back to back), then zeroed.
      for (int64_t r0 = 0; r0 < rowsPer; r0 += g.loadRows()) {
        int64_t n = std::min(g.loadRows(), rowsPer - r0);
        SmallVector<Run> runs;
        for (int64_t r = r0; r < r0 + n; ++r)
          runs.push_back({xs, xBase, select(loaded[r], from[r], idx(0))});
        SmallVector<Value> all = loadRuns(g.inElt, runs, aligned);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t c = 0; c < 4; ++c)
            raw[r0 + i].push_back(
                select(loaded[r0 + i], all[4 * i + c], zeroIn));
      }
    } else {
      for (int64_t r = 0; r < rowsPer; ++r)
        for (int64_t c = 0; c < 4; ++c) {
          Value valid = land(cmp(P::ult, rowOf[r], idx(rows)),
                             cmp(P::ult, add(col, idx(c)), idx(cols)));
          raw[r].push_back(ifElse(
              TypeRange{g.inElt}, valid,
              [&] {
                return SmallVector<Value>{memref::LoadOp::create(
                    b, loc, xs, ValueRange{add(rv.first[r], idx(c))})};
              },
              [&] { return SmallVector<Value>{zeroIn}; })[0]);
        }
    }
    for (int64_t r = 0; r < rowsPer; ++r) {
      if (!weight.empty()) {
        // The scaled copy (f32: matchScaledCopies), as the product's
        // operand order has it; zero rows stay zeros.
        for (Value &e : raw[r])
          e = select(
              loaded[r],
              g.gathered->scaleFirst
                  ? arith::MulFOp::create(b, loc, weight[r], e).getResult()
                  : arith::MulFOp::create(b, loc, e, weight[r]).getResult(),
              zeroIn);
      }
      SmallVector<Value> v = raw[r];
      for (Value &e : v)
        e = toF32(e);
      values.push_back(v);
    }
    return rv;
  }

  /// loadRegion's runs of a pair that computes its input (Producer): h's
  /// gate and up runs (and d's) of each row, LoadRows rows at a time, and the
  /// SwiGLU (or its gradient's gate or up half, by the run's column) in
  /// f32 as the op's lowerings compute it (Activations.h); zeros where the
  /// row is not loaded. The columns are a multiple of 4, F too.
  void loadProduced(RegionValues &rv, Value col, ArrayRef<Value> loaded,
                    Value aligned, Value xs, Value xBase, Value zeroIn) {
    int64_t rowsPer = g.rowsPerThread(), f = g.half;
    bool isGrad = g.producer == Producer::swigluGrad;
    // The run's column of the SwiGLU's output (of d), and for the gradient
    // whether it is the gate half.
    Value isGate = isGrad ? cmp(P::ult, col, idx(f)) : Value();
    Value j =
        isGrad ? select(isGate, col, arith::SubIOp::create(b, loc, col, idx(f)))
               : col;
    Value gradBase = isGrad ? baseAddress(grad) : Value();
    for (int64_t r0 = 0; r0 < rowsPer; r0 += g.loadRows()) {
      int64_t n = std::min(g.loadRows(), rowsPer - r0);
      // Per row: h's gate run, its up run (F further), d's run.
      int64_t streams = isGrad ? 3 : 2;
      SmallVector<Run> runs;
      for (int64_t r = r0; r < r0 + n; ++r) {
        Value row = select(loaded[r], rv.rowOf[r], idx(0));
        Value gate = add(mul(row, idx(2 * f)), j);
        runs.push_back({xs, xBase, gate});
        runs.push_back({xs, xBase, add(gate, idx(f))});
        if (isGrad)
          runs.push_back({grad, gradBase, add(mul(row, idx(f)), j)});
      }
      SmallVector<Value> all = loadRuns(b.getF32Type(), runs, aligned);
      for (int64_t i = 0; i < n; ++i) {
        int64_t r = r0 + i;
        for (int64_t c = 0; c < 4; ++c) {
          auto in = [&](int64_t st) { return all[(i * streams + st) * 4 + c]; };
          Value v;
          if (!isGrad) {
            v = buildSwiglu(b, loc, in(0), in(1));
          } else {
            auto [dGate, dUp] = buildSwigluGrad(b, loc, in(0), in(1), in(2));
            v = select(isGate, dGate, dUp);
          }
          rv.raw[r].push_back(select(loaded[r], v, zeroIn));
        }
      }
    }
  }

  /// The 4 values of a thread's row run (f32 `values`, input `raw`) times
  /// `factor(c)`, clamped to +-max of `type`'s format and converted by the
  /// hardware, two at a time: the conversions' pairs, and the codes (i8)
  /// with a NaN's code buildEncode's (the format's NaN with the sign of the
  /// input's bits; the conversions' NaNs need not keep it).
  std::pair<SmallVector<Value>, SmallVector<Value>>
  encodeRun(ArrayRef<Value> values, ArrayRef<Value> raw,
            function_ref<Value(int64_t)> factor, FP8BlockTensorType type) {
    MXFormat fmt = MXFormat::get(type.getElementType());
    Type f8 = type.getElementType();
    auto pairI8 = VectorType::get({2}, i8());
    Value maxV = f32c(float(fmt.maxValue)), minV = f32c(-float(fmt.maxValue));
    SmallVector<Value> scaled;
    for (int64_t c = 0; c < 4; ++c) {
      Value v = arith::MulFOp::create(b, loc, values[c], factor(c));
      v = arith::MaximumFOp::create(b, loc, v, minV);
      scaled.push_back(arith::MinimumFOp::create(b, loc, v, maxV));
    }
    SmallVector<Value> pairs;
    for (int64_t c = 0; c < 4; c += 2)
      // The i16 holds `a` in its upper byte: element 0 of the pair is `b`.
      pairs.push_back(NVVM::ConvertF32x2ToF8x2Op::create(
          b, loc, pairI8, scaled[c + 1], scaled[c], NVVM::FPRoundingMode::RN,
          NVVM::SaturationMode::SATFINITE, /*relu=*/false, f8));
    unsigned width = g.inElt.getIntOrFloatBitWidth();
    Type bitsType = b.getIntegerType(width);
    SmallVector<Value> codes;
    for (int64_t c = 0; c < 4; ++c) {
      Value code =
          LLVM::ExtractElementOp::create(b, loc, pairs[c / 2], int32(c % 2));
      Value bits = arith::BitcastOp::create(b, loc, bitsType, raw[c]);
      Value negative = arith::CmpIOp::create(
          b, loc, P::slt, bits, arith::ConstantIntOp::create(b, loc, 0, width));
      Value nan =
          select(negative, int8(int8_t(0x80 | fmt.nanCode)), int8(fmt.nanCode));
      Value isNaN = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO,
                                          values[c], values[c]);
      codes.push_back(select(isNaN, nan, code));
    }
    return {pairs, codes};
  }

  /// Stores a code (i8) at [column][row] of the region's transposed codes.
  void stageTransposed(Value code, Value column, Value row) {
    Value at = add(
        idx(g.transposedAt()),
        add(mul(rem(column, g.width()), idx(TransposedRow)), rem(row, Tile)));
    LLVM::StoreOp::create(b, loc, code, sharedPtrAt(at), /*alignment=*/1);
  }

  /// A pair's region of 128 x 128 (rows row0 + rg + 16 r, r < 8, columns
  /// col + c, c < 4; a warp holds whole rows): the rowwise quantization
  /// (each row's amax by five xor shuffles; codes to `ds`, the row's scale
  /// by lane 0) and the columnwise one (each column's amax over the thread's
  /// 8 rows, then across the 16 warps through shared memory; codes staged
  /// transposed for storeTransposed, the column's scale by warp 0).
  void emitPairRegion(Value m, Value row0, Value col, Value rg, Value cl,
                      Value lane, Value warp, Value aligned, Value xs, Value ds,
                      Value ss) {
    int64_t rowsPer = g.rowsPerThread(), rows = g.rows(), cols = g.cols();
    RegionValues rv = loadRegion(m, row0, col, rg, aligned, xs);
    auto &[rowOf, rowValid, first, raw, values] = rv;
    // Columnwise amaxes: the thread's rows, then the warps'.
    SmallVector<Value> colAmax(4, f32c(0.0f));
    for (int64_t r = 0; r < rowsPer; ++r)
      for (int64_t c = 0; c < 4; ++c)
        colAmax[c] = magnitudeMax(colAmax[c], values[r][c]);
    auto slot = [&](Value w, Value c) {
      return sharedPtrAt(mul(add(mul(w, idx(Tile)), c), idx(4)));
    };
    NVVM::Barrier0Op::create(b, loc); // the previous region's reads
    for (int64_t c = 0; c < 4; ++c)
      LLVM::StoreOp::create(b, loc, colAmax[c],
                            slot(warp, add(mul(cl, idx(4)), idx(c))), 4);
    NVVM::Barrier0Op::create(b, loc);
    for (int64_t c = 0; c < 4; ++c)
      for (int64_t w = 0; w < g.warps(); ++w)
        colAmax[c] = arith::MaximumFOp::create(
            b, loc, colAmax[c],
            LLVM::LoadOp::create(
                b, loc, f32(), slot(idx(w), add(mul(cl, idx(4)), idx(c))), 4));
    MXFormat colFmt = MXFormat::get(g.colType.getElementType());
    SmallVector<Value> colFactor, colStored;
    for (Value a : colAmax) {
      colFactor.push_back(
          buildFP8BlockScale(b, loc, a, colFmt, g.colType.getPow2()));
      colStored.push_back(
          arith::DivFOp::create(b, loc, f32c(1.0f), colFactor.back()));
    }
    MXFormat rowFmt = MXFormat::get(g.type.getElementType());
    Type rowF8 = g.type.getElementType();
    int64_t rowScaleCols = tilesOf(cols, Tile);
    for (int64_t r = 0; r < rowsPer; ++r) {
      // Rowwise: the row's amax over the warp's 32 lanes.
      Value a = f32c(0.0f);
      for (int64_t c = 0; c < 4; ++c)
        a = magnitudeMax(a, values[r][c]);
      a = warpMax(a, {16, 8, 4, 2, 1});
      Value factor = buildFP8BlockScale(b, loc, a, rowFmt, g.type.getPow2());
      Value stored = arith::DivFOp::create(b, loc, f32c(1.0f), factor);
      auto [rowPairs, rowCodes] =
          encodeRun(values[r], raw[r], [&](int64_t) { return factor; }, g.type);
      SmallVector<Value> typed;
      for (Value code : rowCodes)
        typed.push_back(arith::BitcastOp::create(b, loc, rowF8, code));
      storeCodes(ds, first[r], rowOf[r], col, rowValid[r], rowCodes, typed);
      Value row = rowOf[r];
      ifThen(land(cmp(P::eq, cl, idx(0)), cmp(P::ult, row, idx(rows))), [&] {
        Value at = add(mul(add(mul(m, idx(rows)), row), idx(rowScaleCols)),
                       div(col, Tile));
        memref::StoreOp::create(b, loc, stored, ss, ValueRange{at});
      });
      // Columnwise: the codes, staged transposed.
      auto [colPairs, colCodes] = encodeRun(
          values[r], raw[r], [&](int64_t c) { return colFactor[c]; },
          g.colType);
      for (int64_t c = 0; c < 4; ++c)
        stageTransposed(colCodes[c], add(col, idx(c)), rowOf[r]);
    }
    // The columns' scales [ceil(R / 128), cols], by warp 0.
    Value colScalesFlat = flat(colScales);
    ifThen(cmp(P::eq, rg, idx(0)), [&] {
      Value base = mul(add(mul(m, idx(tilesOf(rows, Tile))), div(row0, Tile)),
                       idx(cols));
      for (int64_t c = 0; c < 4; ++c)
        memref::StoreOp::create(b, loc, colStored[c], colScalesFlat,
                                ValueRange{add(base, add(col, idx(c)))});
    });
  }

  /// Thread's values of one region: rows row0 + rg + G r, columns col + c.
  void emitRegion(Value m, Value row0, Value col, Value rg, Value cl,
                  Value lane, Value warp, Value aligned, Value xs, Value ys,
                  Value ds, Value ss) {
    int64_t rowsPer = g.rowsPerThread();
    RegionValues rv = loadRegion(m, row0, col, rg, aligned, xs);
    auto &[rowOf, rowValid, first, raw, values] = rv;

    // The amax of each of the thread's tiles: one a column (128 x 1), else
    // one.
    bool perColumn = g.tileCols() == 1;
    SmallVector<Value> amax(perColumn ? 4 : 1, f32c(0.0f));
    for (int64_t r = 0; r < rowsPer; ++r)
      for (int64_t c = 0; c < 4; ++c) {
        Value &a = amax[perColumn ? c : 0];
        a = magnitudeMax(a, values[r][c]);
      }
    // Across the lanes holding the same tile.
    SmallVector<int64_t> xorLanes;
    if (!perColumn)
      for (int64_t d = g.lanes() / 2; d >= 1; d /= 2)
        xorLanes.push_back(d);
    if (g.acrossWarps())
      for (int64_t d = g.lanes(); d < 32; d *= 2)
        xorLanes.push_back(d);
    for (Value &a : amax)
      a = warpMax(a, xorLanes);
    // Across the warps, through shared memory: slot [warp][column or 0].
    if (g.acrossWarps()) {
      int64_t slots = g.warpSlots();
      auto slot = [&](Value w, Value s) {
        return sharedPtrAt(mul(add(mul(w, idx(slots)), s), idx(4)));
      };
      NVVM::Barrier0Op::create(b, loc); // the previous region's reads
      ifThen(cmp(P::ult, lane, idx(perColumn ? g.lanes() : 1)), [&] {
        for (auto [c, a] : llvm::enumerate(amax))
          LLVM::StoreOp::create(
              b, loc, a,
              slot(warp, perColumn ? add(mul(cl, idx(4)), idx(c)) : idx(0)), 4);
      });
      NVVM::Barrier0Op::create(b, loc);
      if (perColumn) {
        for (auto [c, a] : llvm::enumerate(amax))
          for (int64_t w = 0; w < Warps; ++w)
            a = arith::MaximumFOp::create(
                b, loc, a,
                LLVM::LoadOp::create(b, loc, f32(),
                                     slot(idx(w), add(mul(cl, idx(4)), idx(c))),
                                     4));
      } else {
        // Lane l reads warp l % 8's amax; three xor shuffles finish.
        amax[0] = warpMax(LLVM::LoadOp::create(
                              b, loc, f32(), slot(rem(lane, Warps), idx(0)), 4),
                          {4, 2, 1});
      }
    }

    // The factors and stored scales.
    MXFormat fmt = MXFormat::get(g.type.getElementType());
    SmallVector<Value> factor, stored;
    for (Value a : amax) {
      factor.push_back(buildFP8BlockScale(b, loc, a, fmt, g.type.getPow2()));
      stored.push_back(
          arith::DivFOp::create(b, loc, f32c(1.0f), factor.back()));
    }
    auto of = [&](SmallVector<Value> &v, int64_t c) -> Value {
      return v[perColumn ? c : 0];
    };

    // The elements: x * s clamped to +-max, two at a time through the
    // hardware conversion.
    Type f8 = g.type.getElementType();
    for (int64_t r = 0; r < rowsPer; ++r) {
      auto [pairs, codes] = encodeRun(
          values[r], raw[r], [&](int64_t c) { return of(factor, c); }, g.type);
      if (g.roundTrip()) {
        SmallVector<Value> results;
        for (int64_t p = 0; p < 2; ++p)
          llvm::append_range(
              results, decodeF8Pair(pairs[p], f8,
                                    {of(stored, 2 * p), of(stored, 2 * p + 1)},
                                    g.outElt));
        storeValues(ys, first[r], rowOf[r], col, rowValid[r], aligned, results);
        continue;
      }
      SmallVector<Value> typed;
      for (int64_t c = 0; c < 4; ++c) {
        typed.push_back(arith::BitcastOp::create(b, loc, f8, codes[c]));
        if (g.transposed != Transposed::no)
          stageTransposed(codes[c], add(col, idx(c)), rowOf[r]);
      }
      if (ds)
        storeCodes(ds, first[r], rowOf[r], col, rowValid[r], codes, typed);
    }
    if (!g.roundTrip())
      storeScales(ss, m, rowOf[0], col, rg, cl, stored);
  }

  /// Stores a thread's 4 codes of one row (i8 `codes`, `typed` as the
  /// data's type): with whole runs (columns a multiple of 4), a valid run
  /// as one 4-byte store where the data is 4-byte aligned (device
  /// allocations are; a caller's buffer need not be), else each valid one.
  void storeCodes(Value ds, Value first, Value row, Value col, Value runValid,
                  ArrayRef<Value> codes, ArrayRef<Value> typed) {
    if (g.cols() % 4 != 0) {
      storeValues(ds, first, row, col, runValid, Value(), typed);
      return;
    }
    ifThen(runValid,
           [&] { storeRun(ds, codesBase, first, typed, codesAligned, codes); });
  }

  /// Stores a thread's 4 results of one row: as a run when the row's run is
  /// whole and `aligned` (floats only), else each valid one.
  void storeValues(Value buffer, Value first, Value row, Value col,
                   Value runValid, Value aligned, ArrayRef<Value> results) {
    int64_t rows = g.rows(), cols = g.cols();
    if (cols % 4 == 0 && aligned) {
      ifThen(runValid, [&] {
        storeRun(buffer, baseAddress(buffer), first, results, aligned);
      });
      return;
    }
    for (int64_t c = 0; c < 4; ++c)
      ifThen(land(cmp(P::ult, row, idx(rows)),
                  cmp(P::ult, add(col, idx(c)), idx(cols))),
             [&] {
               memref::StoreOp::create(b, loc, results[c], buffer,
                                       ValueRange{add(first, idx(c))});
             });
  }

  /// Stores the stored scales of the thread's tiles, once a tile: by the
  /// threads holding a tile's first row (of the region, for tall tiles) and
  /// first columns.
  void storeScales(Value ss, Value m, Value row, Value col, Value rg, Value cl,
                   ArrayRef<Value> stored) {
    int64_t tr = g.tileRows(), tc = g.tileCols();
    int64_t scaleRows = tilesOf(g.rows(), tr),
            scaleCols = tilesOf(g.cols(), tc);
    Value writer = cmp(P::ult, row, idx(g.rows()));
    if (tr > 1)
      writer = land(writer, cmp(P::eq, rg, idx(0)));
    if (tc > 1)
      writer = land(writer, cmp(P::eq, cl, idx(0)));
    ifThen(writer, [&] {
      Value base =
          mul(add(mul(m, idx(scaleRows)), div(row, tr)), idx(scaleCols));
      for (size_t c = 0; c < stored.size(); ++c) {
        Value column = add(col, idx(c));
        ifThen(cmp(P::ult, column, idx(g.cols())), [&] {
          memref::StoreOp::create(b, loc, stored[c], ss,
                                  ValueRange{add(base, div(column, tc))});
        });
      }
    });
  }
};

/// The private function computing one conversion: (x[, offsets]) -> the
/// round trip's result, or (data, scales).
func::FuncOp getOrCreateFunction(ModuleOp module, SymbolTable &symbols,
                                 const FP8BlockKernel &g,
                                 ArrayRef<Type> argTypes,
                                 ArrayRef<RankedTensorType> resultTypes,
                                 Location loc) {
  int64_t grid = std::min(g.regions(), roundtrip::MaxBlocks);
  int64_t smem = g.smemBytes();
  func::FuncOp kernel = getOrCreateKernelCall(
      module, symbols, g.name(),
      g.roundTrip() ? "fp8block round trip" : "fp8block quantize", argTypes,
      resultTypes, loc, {grid, 1, 1, g.threads(), smem},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
          ArrayRef<Value> outs) {
        // Results: the round trip's; or (data, scales[, transposed data]);
        // or, transposed only, (transposed data, scales).
        bool only = g.transposed == Transposed::only;
        // (x[, d | source[, scale]][, offsets])
        unsigned next = 1;
        Value source, scale, grad;
        if (g.producer == Producer::swigluGrad)
          grad = buf[next++];
        if (g.gathered) {
          source = buf[next++];
          if (g.gathered->scaled)
            scale = buf[next++];
        }
        FP8BlockEmitter k{{b, loc},
                          g,
                          grid,
                          buf[0],
                          g.offsetElt ? buf[next] : Value(),
                          g.roundTrip() ? outs[0] : Value(),
                          g.roundTrip() || only ? Value() : outs[0],
                          g.roundTrip() ? Value() : outs[1]};
        if (g.transposed != Transposed::no)
          k.dataT = only ? outs[0] : outs[2];
        if (g.pair())
          k.colScales = outs[3];
        if (source)
          k.source = source;
        if (scale)
          k.scale = k.flat(scale);
        if (grad)
          k.grad = k.flat(grad);
        k.emit(launch);
      });
  // (Only a pair reading its input: fp8BlockPairGather takes its first
  // argument for the rows it quantizes.)
  if (g.pair() && !g.gathered && g.producer == Producer::none)
    kernel->setAttr(
        kFP8BlockPairAttr,
        ArrayAttr::get(module.getContext(),
                       {TypeAttr::get(g.type), TypeAttr::get(g.colType)}));
  // (Gathered, the kernel reads the tokens by index: no argument is rows of
  // the groups.)
  if (!g.offsetElt || g.gathered)
    return kernel;
  if (g.producer == Producer::swigluGrad)
    return withGroupedArgs(kernel, {0, 1}, 2);
  return withGroupedArgs(kernel, {0}, 1);
}

/// The arguments of a kernel of `g` reading `inputs`: with `liveEnd`
/// (offsets whose last entry bounds the rows anything reads) and a matrix,
/// those offsets too, and `g` computes only the rows before it.
SmallVector<Value> kernelArgs(FP8BlockKernel &g, ValueRange inputs,
                              Value liveEnd) {
  SmallVector<Value> args = inputs;
  if (Value offsets = kernelOffsets(liveEnd); offsets && g.rank() == 2) {
    g.offsetElt = getElementTypeOrSelf(offsets.getType());
    args.push_back(offsets);
  }
  return args;
}

} // namespace

bool isFP8BlockRoundTrip(DequantizeOp dq, WhyNot why) {
  auto q = dq.getInput().getDefiningOp<QuantizeOp>();
  if (!q) {
    noKernel(why, "the input is not a moe.quantize's result (the round trip "
                  "rounds x through the format in one pass)");
    return false;
  }
  return matchFP8Block(q, dq.getType().getElementType(), why).has_value();
}

void lowerFP8BlockConversions(ModuleOp module, SymbolTable &symbols) {
  // Round trips: each dequantize of a quantize the kernel takes (one call
  // per quantize and result type).
  SmallVector<std::tuple<DequantizeOp, FP8BlockKernel, RowBound>> trips;
  {
    LiveRows live(module);
    for (auto func : module.getOps<func::FuncOp>())
      if (!func->hasAttr("moe.dedicated_kernel"))
        func.walk([&](DequantizeOp dq) {
          auto q = dq.getInput().getDefiningOp<QuantizeOp>();
          if (!q)
            return;
          if (std::optional<FP8BlockKernel> g =
                  matchFP8Block(q, dq.getType().getElementType(), nullptr))
            trips.push_back({dq, *g, live.boundedOp(dq)});
        });
  }
  // By quantize, result type and live-rows offsets (a result computed for
  // the rows before offsets[E] only serves dequantizes with that bound).
  llvm::DenseMap<std::tuple<Operation *, Type, Value>, Value> done;
  for (auto [dq, g, bound] : trips) {
    auto q = dq.getInput().getDefiningOp<QuantizeOp>();
    SmallVector<Value> args = kernelArgs(
        g, q.getInput(), g.tileRows() == 1 ? bound.offsets : Value());
    // (The first call of a block serves the block's later round trips of
    // the same quantize.)
    std::tuple<Operation *, Type, Value> key = {
        q, dq.getType(), g.offsetElt ? args[1] : Value()};
    Value y = done.lookup(key);
    if (y && y.getParentBlock() == dq->getBlock()) {
      dq.getResult().replaceAllUsesWith(y);
      dq.erase();
      if (q->use_empty())
        q.erase();
      continue;
    }
    func::FuncOp kernel = getOrCreateFunction(
        module, symbols, g, llvm::to_vector(ValueRange(args).getTypes()),
        {dq.getType()}, dq.getLoc());
    OpBuilder b(dq);
    auto call = func::CallOp::create(b, dq.getLoc(), kernel, args);
    done[key] = call.getResult(0);
    dq.getResult().replaceAllUsesWith(call.getResult(0));
    dq.erase();
    if (q->use_empty())
      q.erase();
    runNarrowingRoundTripEarly(call);
  }

  // Quantizes whose data and scales something else reads.
  SmallVector<std::pair<QuantizeOp, FP8BlockKernel>> quantizes;
  for (auto func : module.getOps<func::FuncOp>())
    if (!func->hasAttr("moe.dedicated_kernel"))
      func.walk([&](QuantizeOp q) {
        if (std::optional<FP8BlockKernel> g = matchFP8Block(q, Type(), nullptr))
          quantizes.push_back({q, *g});
      });
  for (auto &[q, g] : quantizes) {
    FP8BlockTensorType type = g.type;
    // The transposes of its data (a forward GEMM's K-major rhs): written by
    // this kernel too, when its tiles allow.
    SmallVector<func::CallOp> transposes;
    if (g.transposes() && g.rows() % Tile == 0)
      for (Operation *user : q->getUsers())
        if (auto unpack = dyn_cast<MXUnpackOp>(user))
          for (Operation *reader : unpack.getData().getUsers())
            if (auto call = dyn_cast<func::CallOp>(reader))
              if (isTransposeBytes(call))
                transposes.push_back(call);
    g.transposed = transposes.empty() ? Transposed::no : Transposed::also;
    SmallVector<RankedTensorType> results = {type.getDataType(),
                                             type.getScalesType()};
    if (!transposes.empty())
      results.push_back(cast<RankedTensorType>(transposes[0].getType(0)));
    func::FuncOp kernel = getOrCreateFunction(
        module, symbols, g, {q.getInput().getType()}, results, q.getLoc());
    OpBuilder b(q);
    auto call =
        func::CallOp::create(b, q.getLoc(), kernel, ValueRange{q.getInput()});
    auto packed = MXPackOp::create(b, q.getLoc(), type, call.getResult(0),
                                   call.getResult(1));
    q.getResult().replaceAllUsesWith(packed.getResult());
    q.erase();
    for (func::CallOp transpose : transposes) {
      transpose.getResult(0).replaceAllUsesWith(call.getResult(2));
      transpose.erase();
    }
  }
}

bool quantizeTransposedTakes(QuantizeOp q) {
  std::optional<FP8BlockKernel> g = matchFP8Block(q, Type(), nullptr);
  return g && g->transposes();
}

std::optional<std::pair<Value, Value>>
quantizeTransposed(OpBuilder &b, QuantizeOp q, ModuleOp module,
                   SymbolTable &symbols, Value liveEnd) {
  std::optional<FP8BlockKernel> g = matchFP8Block(q, Type(), nullptr);
  if (!g || !g->transposes())
    return std::nullopt;
  g->transposed = Transposed::only;
  SmallVector<Value> args = kernelArgs(*g, q.getInput(), liveEnd);
  RankedTensorType data = g->type.getDataType();
  SmallVector<int64_t> shape(data.getShape());
  std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  shape.back() = g->transposedRows();
  SmallVector<RankedTensorType> results = {
      RankedTensorType::get(shape, data.getElementType()),
      g->type.getScalesType()};
  func::FuncOp kernel = getOrCreateFunction(
      module, symbols, *g, llvm::to_vector(ValueRange(args).getTypes()),
      results, q.getLoc());
  auto call = func::CallOp::create(b, q.getLoc(), kernel, args);
  return std::make_pair(call.getResult(0), call.getResult(1));
}

std::optional<std::array<Value, 4>>
quantizePair(OpBuilder &b, QuantizeOp rows, QuantizeOp cols, ModuleOp module,
             SymbolTable &symbols, Value liveEnd) {
  std::optional<FP8BlockKernel> g = matchFP8Block(rows, Type(), nullptr);
  std::optional<FP8BlockKernel> c = matchFP8Block(cols, Type(), nullptr);
  if (!g || !c || rows.getInput() != cols.getInput() || g->rank() != 2 ||
      g->type.getBlock() != ArrayRef<int64_t>{1, Tile} ||
      c->type.getBlock() != ArrayRef<int64_t>{Tile, 1} || g->cols() % Tile)
    return std::nullopt;
  g->colType = c->type;
  // Results: the rowwise data and scales, then the columnwise transposed
  // data and scales.
  g->transposed = Transposed::also;
  // The input computed by the kernel itself: a SwiGLU (or its gradient)
  // that nothing but these two quantizes reads, split layout, f32; the
  // kernel reads h (and d), and the SwiGLU's result is never written.
  SmallVector<Value> inputs = {rows.getInput()};
  Operation *producer = rows.getInput().getDefiningOp();
  auto onlyRead = [&](Operation *op) {
    return llvm::all_of(op->getUsers(), [&](Operation *user) {
      return user == rows.getOperation() || user == cols.getOperation();
    });
  };
  auto f32Tensor = [](Value v) {
    auto type = dyn_cast<RankedTensorType>(v.getType());
    return type && type.hasStaticShape() && type.getRank() == 2 &&
           type.getElementType().isF32();
  };
  if (auto swiglu = dyn_cast_or_null<SwigluOp>(producer)) {
    if (swiglu.getLayout() == SwigluLayout::split && onlyRead(swiglu) &&
        f32Tensor(swiglu.getInput()) && f32Tensor(swiglu.getResult()) &&
        g->cols() % 4 == 0) {
      g->producer = Producer::swiglu;
      g->half = g->cols();
      inputs = {swiglu.getInput()};
    }
  } else if (auto grad = dyn_cast_or_null<SwigluGradOp>(producer)) {
    if (grad.getLayout() == SwigluLayout::split && onlyRead(grad) &&
        f32Tensor(grad.getInput()) && f32Tensor(grad.getGrad()) &&
        f32Tensor(grad.getResult()) && g->cols() % 8 == 0) {
      g->producer = Producer::swigluGrad;
      g->half = g->cols() / 2;
      inputs = {grad.getInput(), grad.getGrad()};
    }
  }
  SmallVector<Value> args = kernelArgs(*g, inputs, liveEnd);
  RankedTensorType data = g->type.getDataType();
  SmallVector<RankedTensorType> results = {
      data, g->type.getScalesType(),
      RankedTensorType::get({g->cols(), g->transposedRows()},
                            c->type.getElementType()),
      c->type.getScalesType()};
  func::FuncOp kernel = getOrCreateFunction(
      module, symbols, *g, llvm::to_vector(ValueRange(args).getTypes()),
      results, rows.getLoc());
  auto call = func::CallOp::create(b, rows.getLoc(), kernel, args);
  return std::array<Value, 4>{call.getResult(0), call.getResult(1),
                              call.getResult(2), call.getResult(3)};
}

bool isFP8BlockPair(func::FuncOp func) {
  return func && func->hasAttr(kFP8BlockPairAttr);
}

func::CallOp fp8BlockPairGather(OpBuilder &b, func::CallOp pair,
                                ModuleOp module, SymbolTable &symbols,
                                Value tokens, Value source, Value scale,
                                const GatheredRows &rows) {
  auto callee = symbols.lookup<func::FuncOp>(pair.getCallee());
  auto types = callee ? callee->getAttrOfType<ArrayAttr>(kFP8BlockPairAttr)
                      : ArrayAttr();
  if (!types || types.size() != 2 || pair.getNumOperands() < 1 ||
      pair.getNumOperands() > 2 || pair.getNumResults() != 4)
    return {};
  FP8BlockKernel g{
      cast<FP8BlockTensorType>(cast<TypeAttr>(types[0]).getValue()),
      getElementTypeOrSelf(pair.getOperand(0).getType()), Type(), Type()};
  g.colType = cast<FP8BlockTensorType>(cast<TypeAttr>(types[1]).getValue());
  g.transposed = Transposed::also;
  g.gathered = rows;
  SmallVector<Value> args = {tokens, source};
  if (rows.scaled)
    args.push_back(scale);
  if (pair.getNumOperands() == 2) {
    g.offsetElt = getElementTypeOrSelf(pair.getOperand(1).getType());
    args.push_back(pair.getOperand(1));
  }
  func::FuncOp kernel = getOrCreateFunction(
      module, symbols, g, llvm::to_vector(ValueRange(args).getTypes()),
      llvm::map_to_vector(pair.getResultTypes(),
                          [](Type t) { return cast<RankedTensorType>(t); }),
      pair.getLoc());
  return func::CallOp::create(b, pair.getLoc(), kernel, args);
}

} // namespace mlir::moe::kernels
