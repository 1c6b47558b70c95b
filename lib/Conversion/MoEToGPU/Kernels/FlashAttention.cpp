//===- FlashAttention.cpp - Hopper flash attention, forward and backward --===//
//
// Hopper (sm_90a): flash attention on warpgroup MMA (wgmma)
// ---------------------------------------------------------
// Handles moe.attention and moe.attention_grad with bf16 query [B, S, N, D],
// key and value [B, S, M, D] (N a multiple of M: grouped KV heads), the
// gradient of the result bf16 too, f32 results, static shapes, head dim D of
// 64 or 128, causal or not, any S. Nothing of size [S, S] is ever in memory:
//
//   forward   per (128-query tile, head, batch), 64 queries a consumer
//             warpgroup: S = Q K^T a 64-key tile at a time, an online
//             softmax in base 2 (running row max m, partial row sums l;
//             the accumulator rescaled by exp2(m_old - m_new)), O += P V
//             with P rounded to bf16; the result O / l and, per query row,
//             lse = m + log2(l) (base 2, of scale * q.k) into [B, N, S] f32
//             for the backward.
//   dQ        per (64-query tile, head, batch): P = exp2(scale' s - lse)
//             recomputed per key tile, dP = dO V^T, dS = P (dP - delta),
//             dQ += dS K (dS rounded to bf16); dQ = scale dQ at the end.
//   dK, dV    per (128-key tile, KV head, batch), 64 keys a consumer
//             warpgroup, over the query heads of the group and every query
//             tile that sees the keys: S^T = K Q^T,
//             P^T, dP^T = V dO^T, dS^T, dV += P^T dO, dK += dS^T Q (both
//             summed over the group in registers: no atomics, the results
//             are deterministic); dK = scale dK at the end.
// delta = rowsum(dO * O) ([B, N, S] f32), which both backward kernels read,
// is a kernel of its own before them (a warp a row). scale' = scale log2(e).
//
// Documents ([B, S] i32 or i64, packed rows): a key of another document is
// hidden as a future one is. Each thread reads the documents of its fragment
// rows once and those of its columns once a tile (global loads, cached). A
// kernel of its own first finds each 64-row tile's range of ids
// ([B, tiles, 2]); a CTA then visits only the tiles from the first to the
// last whose range meets its own tile's (tiles outside share no document
// with it: exact for any ids, and for the sorted ids of packed rows the
// tiles of its documents alone). The threads of a CTA share the scan of the
// ranges (tilesSharing).
//
// CTA: the forward's and the dK/dV kernel's three warpgroups (a TMA
// producer, two consumers: ForwardEmitter, KeyTileEmitter), the dQ
// kernel's one (128 threads); every MMA is m64nNk16 (N = 64 for the score
// tiles, D for the products with V, K, Q, dO).
//
// Shared memory: every tile is 64 rows of bf16 stored as D / 64 panels of
// 64 rows x 128 bytes (8 KiB), in the 128-byte swizzle of the GEMM kernels
// (WgmmaGemm.cpp: 16-byte chunk c of row r at chunk c ^ (r % 8)), so one
// descriptor base serves all (LBO 8192 = the next panel, SBO 1024 = the next
// 8 rows). A tile is read either
//   K-major (its rows are the MMA's M or N, its columns the contraction):
//     MMA step j (16 values) at panel j / 4, byte 32 (j % 4); wgmma layout
//     `row` for A, `col` for B;
//   MN-major (its rows are the contraction, its columns the N of the MMA):
//     step j at byte 2048 j (two 8-row atoms), N across the panels by LBO;
//     layout `row` for B.
// The probability and dS tiles stay in registers: their accumulator
// fragment (register 4 j + 2 h + c of thread 32 w + l is row 16 w + l / 4 +
// 8 h, column 8 j + 2 (l % 4) + c), rounded to bf16 and paired, is the A
// fragment of the next MMA (HopperBuilder::bf16MmaRegA), so no tile of
// them goes through shared memory and no barrier waits for one (the dK/dV
// kernel at sequence 4096, batch 4, on an H100: 3.48 -> 2.18 ms).
//
// The forward is warp-specialized and software-pipelined, as
// FlashAttention-3 does (ForwardEmitter): a 128-query tile reads each K/V
// tile once (the forward at sequence 4096 on an H100: 1.29 -> 1.21 ms, at
// 16384 5.05 -> 4.53), S = Q K^T takes Q's fragment from registers, and
// within a consumer step j issues
// S_j = Q K_j^T and O += P_{j-1} V_{j-1}, then computes the softmax of S_j
// while the PV MMAs run, then rescales O. The dK/dV kernel is
// warp-specialized the same way (KeyTileEmitter): its producer copies each
// consumer's K and V tile once, then the Q and dO tiles, which serve both
// consumers' 64 keys (on an H200 at 4096: 2.07 -> 1.90 ms).
//
// Masks: only tiles that may hide a pair (causal: the diagonal; the last
// tile past S; documents) test each element; the others skip the indices
// and compares (on an H100 at 4096: forward 1.53 -> 1.42 ms, dQ 1.55 ->
// 1.48).
//
// Loads: the forward's and dK/dV's by TMA (a box of 64 rows x 64 columns a
// panel, through a map of the tensor as [B][S][heads x D]) into a ring of
// three stages; the dQ kernel's by cp.async of 16 bytes, 8 or 16
// consecutive threads per 128 or 256 byte row, double-buffering the
// key/value tiles (the next tile's copies run under this tile's MMAs).
// Rows past S are zeros (and masked: a zero key gives a score of 0, not
// -inf).
//
// Numerics: bf16 products summed in f32 by the tensor core; P and dS are
// rounded to bf16 before their products (as FlashAttention does), which the
// reference does not do: results agree to about bf16's precision, not to
// f32 rounding. exp2 and log2 are libdevice's.
//
// Checked on an H200 by scripts/gpu-check.sh (test/Integration/GPU).
//
//===----------------------------------------------------------------------===//

#include "HopperBuilder.h"
#include "Kernels.h"

#include <cmath>

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace flash {
constexpr int64_t Tile = FlashAttention::Tile;
constexpr int64_t PanelBytes = 8192;  // 64 rows x 128 bytes
constexpr int64_t ScratchBytes = 128; // tilesSharing's reduction
constexpr int64_t Threads = 128;      // one warpgroup
/// The bytes of a 64-row bf16 tile of head dim `dim` (dim / 64 panels).
inline int64_t tileBytes(int64_t dim) { return dim / 64 * PanelBytes; }
} // namespace flash

std::string FlashAttention::name(StringRef kind) const {
  // The scale, exactly, when it is not the default 1/sqrt(D).
  std::string scaleName;
  if (scale != 1.0 / std::sqrt(double(dim)))
    scaleName = "_s" + llvm::utohexstr(llvm::bit_cast<uint64_t>(scale));
  std::string documentsName;
  if (documents)
    documentsName =
        llvm::formatv("_docs_i{0}", documents.getIntOrFloatBitWidth());
  return llvm::formatv("moe_flash_{0}_b{1}_s{2}_h{3}_kv{4}_d{5}{6}{7}{8}{9}",
                       kind, batch, seq, heads, kvHeads, dim,
                       causal ? "_causal" : "", documentsName, scaleName,
                       overlapDkv && kind == "dkv" ? "_overlap" : "")
      .str();
}

RankedTensorType FlashAttention::statType(MLIRContext *ctx) const {
  return RankedTensorType::get({batch, heads, seq}, Float32Type::get(ctx));
}

std::optional<FlashAttention> matchFlashAttention(Operation *op, WhyNot why) {
  auto attention = dyn_cast<AttentionOp>(op);
  auto grad = dyn_cast<AttentionGradOp>(op);
  if (!attention && !grad)
    return std::nullopt;
  SmallVector<Value> inputs(op->getOperands().take_front(grad ? 4 : 3));
  for (Value v : inputs) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    if (!t || !t.hasStaticShape())
      return noKernel(why, "a dynamic shape (the kernels are generated for "
                           "static shapes)");
    if (!t.getElementType().isBF16())
      return noKernel(why,
                      "{0} inputs: the flash kernels take bf16 (a precision "
                      "recipe, bf16 or mxfp8)",
                      t.getElementType());
  }
  for (Type t : op->getResultTypes())
    if (!cast<RankedTensorType>(t).getElementType().isF32())
      return noKernel(why, "{0} results, not f32", t);
  auto q = cast<RankedTensorType>(inputs[0].getType());
  auto k = cast<RankedTensorType>(inputs[1].getType());
  FlashAttention f;
  f.batch = q.getDimSize(0);
  f.seq = q.getDimSize(1);
  f.heads = q.getDimSize(2);
  f.kvHeads = k.getDimSize(2);
  f.dim = q.getDimSize(3);
  f.causal = attention ? attention.getCausal() : grad.getCausal();
  f.scale =
      attention ? attention.getScaleOrDefault() : grad.getScaleOrDefault();
  Value documents = attention ? attention.getDocuments() : grad.getDocuments();
  if (documents) {
    auto t = cast<RankedTensorType>(documents.getType());
    if (!t.hasStaticShape())
      return noKernel(why, "dynamic documents");
    f.documents = t.getElementType();
  }
  // (The verifier makes N a multiple of M.)
  if (f.dim != 64 && f.dim != 128)
    return noKernel(why, "head dim {0}: the flash kernels take 64 or 128",
                    f.dim);
  if (f.seq < 1 || f.batch < 1)
    return noKernel(why, "no rows");
  return f;
}

namespace {

/// What the three kernels share: their buffers, tile copies, descriptors,
/// MMAs on accumulators of any N, fragment coordinates, row reductions.
struct FlashEmitter : HopperBuilder {
  const FlashAttention &f;
  // The kernel's arguments in order: q, k, v, then (backward) do, lse,
  // delta, then the documents if any; its results (forward: o, lse; dQ: dq;
  // dK/dV: dk, dv).
  Value q, k, v, dout{}, lse{}, delta{}, documents{}, ranges{};
  SmallVector<Value> results;
  Value tid{}, warp{}, lane{};
  /// The warp within its warpgroup (the fragment rows' warp).
  Value wgWarp{};
  /// The CTA's threads (loadTile and tilesSharing share their work).
  int64_t threads = flash::Threads;
  /// The batch entry of the CTA (what `hidden` reads the documents of).
  Value batch{};

  FlashEmitter(OpBuilder &b, Location loc, const FlashAttention &f,
               ArrayRef<Value> args, ArrayRef<Value> results)
      : HopperBuilder{{b, loc}}, f(f), q(args[0]), k(args[1]), v(args[2]),
        results(results) {
    if (f.documents) {
      documents = args[args.size() - 2];
      ranges = args.back();
      args = args.drop_back(2);
    }
    if (args.size() == 6) {
      dout = args[3];
      lse = args[4];
      delta = args[5];
    }
  }

  int64_t tileBytes() const { return flash::tileBytes(f.dim); }
  Type f32() { return b.getF32Type(); }
  Value f32c(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(float(v)));
  }
  Value fadd(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value fsub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }
  Value fmul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value fmax(Value x, Value y) {
    return arith::MaximumFOp::create(b, loc, x, y);
  }
  Value exp2(Value x) { return math::Exp2Op::create(b, loc, x); }

  void setUpThread(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    warp = div(tid, 32);
    wgWarp = rem(warp, 4);
    lane = rem(tid, 32);
    setUp(hopper::LBO, hopper::SBO, /*swizzled=*/true);
  }

  /// The CTA's (rank, head, batch entry) for a grid of (tiles, heads, batch)
  /// CTAs, numbered in launch order with the rank slowest: every head's and
  /// batch entry's rank-0 tile is launched before any rank-1 tile. The
  /// query-tile kernels give rank 0 their longest tile (causal: the last),
  /// so the first wave takes the longest CTAs and the last the shortest
  /// (sequence 4096, batch 4, on an H200: the forward 1.667 -> 1.551 ms, dQ
  /// 1.639 -> 1.548). The dK/dV kernel's rank is its key tile (causal: key
  /// tile 0 is the longest); on an H100 at 4096 its CTAs launched tile
  /// fastest took 3.93 ms, this way 3.48 (with every CTA of a KV head
  /// reading the same Q and dO tiles at once, below).
  std::array<Value, 3> rankHeadBatch(gpu::LaunchOp launch, int64_t headsOf,
                                     int64_t rowsPerCta = flash::Tile) {
    gpu::KernelDim3 id = launch.getBlockIds();
    Value linear = add(id.x, mul(idx(tilesOf(f.seq, rowsPerCta)),
                                 add(id.y, mul(idx(headsOf), id.z))));
    int64_t perRank = headsOf * f.batch;
    Value rest = rem(linear, perRank);
    return {div(linear, perRank), rem(rest, headsOf), div(rest, headsOf)};
  }

  /// Copies rows [s0, s0 + 64) of head `head` of batch `bb` of a bf16
  /// [B, S, H, D] tensor at `global` (i64) into the panel tile at byte
  /// `tileBase` (index); rows past S are zero-filled.
  void loadTile(Value tileBase, Value global, int64_t headsOf, Value bb,
                Value s0, Value head) {
    int64_t chunks = f.dim / 8; // 16-byte chunks a row
    assert(flash::Tile * chunks % threads == 0 &&
           "loadTile: the CTA's threads must share the chunks evenly");
    for (int64_t i = 0; i < flash::Tile * chunks / threads; ++i) {
      Value q = add(tid, idx(threads * i));
      Value r = div(q, chunks), c = rem(q, chunks);
      Value s = add(s0, r);
      Value valid = cmp(P::slt, s, idx(f.seq));
      Value sc = minS(s, idx(f.seq - 1));
      Value row = add(mul(add(mul(bb, idx(f.seq)), sc), idx(headsOf)), head);
      Value src = mul(add(mul(row, idx(f.dim)), mul(c, idx(8))), idx(2));
      Value dst =
          add(add(tileBase, mul(div(c, 8), idx(flash::PanelBytes))),
              add(mul(r, idx(128)),
                  mul(arith::XOrIOp::create(b, loc, rem(c, 8), rem(r, 8)),
                      idx(16))));
      copy16(dst, global, src,
             arith::SelectOp::create(b, loc, valid, int32(16), int32(0)));
    }
  }

  LLVM::LLVMStructType accOf(int64_t n) {
    return LLVM::LLVMStructType::getLiteral(
        b.getContext(), SmallVector<Type>(n / 2, b.getF32Type()));
  }
  Value zeroAcc(int64_t n) { return LLVM::ZeroOp::create(b, loc, accOf(n)); }

  /// The descriptor of byte `offset` past the tile at `base` (index).
  Value desc(Value base, int64_t offset) {
    return arith::AddIOp::create(b, loc, descBase,
                                 toI64(div(add(base, idx(offset)), 16)));
  }

  /// acc += A B over `steps` contraction steps of 16: A (64 rows) K-major at
  /// `a`; B at `bTile`, K-major (`bKMajor`: its rows are N) or MN-major
  /// (its rows are the contraction, N across panels).
  Value mma(Value acc, Value a, Value bTile, bool bKMajor, int64_t steps,
            bool fresh = false) {
    LLVM::LLVMStructType saved = accType;
    accType = cast<LLVM::LLVMStructType>(acc.getType());
    for (int64_t j = 0; j < steps; ++j) {
      int64_t kMajorAt = j / 4 * flash::PanelBytes + 32 * (j % 4);
      acc = bf16Mma(acc, desc(a, kMajorAt),
                    desc(bTile, bKMajor ? kMajorAt : 2048 * j),
                    NVVM::MMALayout::row,
                    bKMajor ? NVVM::MMALayout::col : NVVM::MMALayout::row,
                    /*accumulate=*/!(fresh && j == 0));
    }
    accType = saved;
    return acc;
  }
  /// A B into a new m64nN accumulator: the first MMA overwrites it, so no
  /// zeros are written to its registers first. (Zeros copied into the
  /// registers of a second accumulator made ptxas wait for the first's
  /// MMAs before issuing the second's: C7517, the two chains of the dQ and
  /// dK/dV kernels serialized.)
  Value mmaFresh(int64_t n, Value a, Value bTile, bool bKMajor, int64_t steps) {
    return mma(LLVM::PoisonOp::create(b, loc, accOf(n)), a, bTile, bKMajor,
               steps, /*fresh=*/true);
  }
  /// acc += A B over `steps` contraction steps of 16, A in registers (`a`:
  /// fragmentA of a 64-row tile, or fragmentOf a tile), B at `bTile`,
  /// MN-major (its rows are the contraction, N across panels) or K-major
  /// (`bKMajor`); `fresh`: into a new accumulator (mmaFresh).
  Value mmaRegA(Value acc, ArrayRef<Value> a, Value bTile, int64_t steps,
                bool bKMajor = false, bool fresh = false) {
    for (int64_t j = 0; j < steps; ++j)
      acc = bf16MmaRegA(
          acc, a.slice(4 * j, 4),
          desc(bTile,
               bKMajor ? j / 4 * flash::PanelBytes + 32 * (j % 4) : 2048 * j),
          bKMajor ? NVVM::MMALayout::col : NVVM::MMALayout::row,
          /*accumulate=*/!(fresh && j == 0));
    return acc;
  }
  /// This thread's A fragment (bf16MmaRegA's layout, as fragmentA makes it)
  /// of the 64-row K-major tile at `tile`, read from shared memory: step
  /// j's registers hold rows rowOf(0) and rowOf(1), columns
  /// 16 j + 2 (l % 4) + {0, 1} and 8 further, each pair one 4-byte word of
  /// its row's swizzled 16-byte chunk.
  SmallVector<Value> fragmentOf(Value tile) {
    SmallVector<Value> regs;
    for (int64_t j = 0; j < f.dim / 16; ++j)
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t h = 0; h < 2; ++h) {
          int64_t chunk = 2 * j + half;
          Value r = rowOf(h);
          Value at = add(add(tile, idx(chunk / 8 * flash::PanelBytes)),
                         add(add(mul(r, idx(128)),
                                 mul(arith::XOrIOp::create(
                                         b, loc, idx(chunk % 8), rem(r, 8)),
                                     idx(16))),
                             mul(rem(lane, 4), idx(4))));
          regs.push_back(
              LLVM::LoadOp::create(b, loc, b.getI32Type(), sharedPtrAt(at), 4));
        }
    return regs;
  }
  void commitAndWait() { commitAndWaitFor(0); }
  /// Commits the MMAs issued since the last commit as a group and waits
  /// until at most `pending` groups are in flight.
  void commitAndWaitFor(int64_t pending) {
    NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, pending);
  }

  /// This thread's fragment of an m64nN accumulator: row of register 4 j +
  /// 2 h + c within the tile is rowOf(h), its column colOf(j, c).
  Value rowOf(int64_t h) {
    return add(add(mul(wgWarp, idx(16)), div(lane, 4)), idx(8 * h));
  }
  Value colOf(int64_t j, int64_t c) {
    return add(mul(rem(lane, 4), idx(2)), idx(8 * j + c));
  }
  SmallVector<Value> values(Value acc) {
    auto type = cast<LLVM::LLVMStructType>(acc.getType());
    SmallVector<Value> v;
    for (int64_t i = 0; i < int64_t(type.getBody().size()); ++i)
      v.push_back(accAt(acc, i));
    return v;
  }
  Value accFrom(ArrayRef<Value> v) {
    Value acc = LLVM::PoisonOp::create(b, loc, accOf(2 * v.size()));
    for (auto [i, x] : llvm::enumerate(v))
      acc = LLVM::InsertValueOp::create(b, loc, acc, x,
                                        ArrayRef<int64_t>{int64_t(i)});
    return acc;
  }

  /// The sum (or max) of `v` over the 4 lanes holding one fragment row.
  Value rowReduce(Value v, bool max) {
    for (int64_t d : {1, 2}) {
      Value o = gpu::ShuffleOp::create(b, loc, v, int32(d), int32(32),
                                       gpu::ShuffleMode::XOR)
                    .getShuffleResult();
      v = max ? fmax(v, o) : fadd(v, o);
    }
    return v;
  }

  /// The document of position `s` (clamped to S), where there are
  /// documents; null otherwise.
  Value documentOf(Value s) {
    if (!documents)
      return {};
    return memref::LoadOp::create(b, loc, documents,
                                  ValueRange{batch, minS(s, idx(f.seq - 1))});
  }

  /// The tiles in [from, to) from the first to the last whose range of
  /// document ids meets tile `t`'s (index values, the same in every
  /// thread), as [first, end); tile `t` itself, if in [from, to), is among
  /// them. Each thread scans them all, or, given `scratch`, every 128th
  /// (the warps then reduce by shuffles and through 32 bytes of shared
  /// memory at `scratch`).
  std::pair<Value, Value> tilesSharing(Value t, Value from, Value to,
                                       std::optional<int64_t> scratch) {
    auto rangeAt = [&](Value tile, int64_t bound) {
      return memref::LoadOp::create(b, loc, ranges,
                                    ValueRange{batch, tile, idx(bound)})
          .getResult();
    };
    Value lo = rangeAt(t, 0), hi = rangeAt(t, 1);
    auto scan =
        scf::ForOp::create(b, loc, scratch ? add(from, tid) : from, to,
                           idx(scratch ? threads : 1), ValueRange{to, from});
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(scan.getBody());
      Value u = scan.getInductionVar();
      ValueRange bounds = scan.getRegionIterArgs();
      Value meets =
          land(cmp(P::sge, rangeAt(u, 1), lo), cmp(P::sle, rangeAt(u, 0), hi));
      scf::YieldOp::create(
          b, loc,
          ValueRange{
              select(meets, minS(bounds[0], u), bounds[0]),
              select(meets, maxS(bounds[1], add(u, idx(1))), bounds[1])});
    }
    Value first = scan.getResult(0), end = scan.getResult(1);
    if (scratch) {
      // Over the warp, then over the warps.
      SmallVector<Value> found;
      for (auto [i, v] : llvm::enumerate(scan.getResults())) {
        Value x = arith::IndexCastOp::create(b, loc, i32(), v);
        for (int64_t d : {1, 2, 4, 8, 16}) {
          Value o = gpu::ShuffleOp::create(b, loc, x, int32(d), int32(32),
                                           gpu::ShuffleMode::XOR)
                        .getShuffleResult();
          x = i == 0 ? minS(x, o) : maxS(x, o);
        }
        found.push_back(x);
      }
      ifThen(cmp(P::eq, lane, idx(0)), [&] {
        for (int64_t i = 0; i < 2; ++i)
          LLVM::StoreOp::create(
              b, loc, found[i],
              sharedPtrAt(add(idx(*scratch + 4 * i), mul(warp, idx(8)))), 4);
      });
      barrier();
      SmallVector<Value> all = {Value(), Value()};
      for (int64_t w = 0; w < threads / 32; ++w)
        for (int64_t i = 0; i < 2; ++i) {
          Value x = LLVM::LoadOp::create(
              b, loc, i32(), sharedPtrAt(idx(*scratch + 8 * w + 4 * i)), 4);
          all[i] = !all[i] ? x : i == 0 ? minS(all[i], x) : maxS(all[i], x);
        }
      // Everyone has read them before the region is written again.
      barrier();
      first = toIndex(all[0]);
      end = toIndex(all[1]);
    }
    return {first, maxS(end, first)};
  }

  /// Whether key `key` is hidden from query `query` (index values): past S
  /// (the query too, with `queries`), in the query's future with `causal`,
  /// or (with documents: theirs, from documentOf) in another document.
  /// (The forward keeps the rows past S finite: key 0 is never hidden from
  /// them.)
  Value hidden(Value query, Value key, bool queries, Value queryDocument,
               Value keyDocument) {
    Value h = cmp(P::sge, key, idx(f.seq));
    if (queries)
      h = lor(h, cmp(P::sge, query, idx(f.seq)));
    if (f.causal)
      h = lor(h, cmp(P::sgt, key, query));
    if (documents) {
      Value other = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne,
                                          queryDocument, keyDocument);
      h = lor(h, arith::AndIOp::create(b, loc, cmp(P::slt, query, idx(f.seq)),
                                       other));
    }
    return h;
  }

  /// Whether a key of the 64 from `key0` may be hidden from a query of the
  /// 64 from `query0` (index values; the same in every thread): a key past
  /// S, a query past S (with `queries`), a key past a query (causal), or
  /// documents. Elsewhere (causal: all but the diagonal tiles and the last)
  /// the kernels skip hidden()'s per-element indices and compares.
  Value tileMayHide(Value query0, Value key0, bool queries) {
    if (documents)
      return boolean(true);
    Value lastFull = idx(f.seq - flash::Tile);
    Value h = cmp(P::sgt, key0, lastFull);
    if (queries)
      h = lor(h, cmp(P::sgt, query0, lastFull));
    if (f.causal)
      h = lor(h, cmp(P::sgt, add(key0, idx(flash::Tile - 1)), query0));
    return h;
  }

  /// The values fn(i, hide) of the registers i of a 64 x 64 fragment whose
  /// rows are the queries `rows` and columns the keys from `key0` (or, with
  /// `transposed`, whose rows are the keys `rows` and columns the queries
  /// from `q0`); `hide` is the element's hidden() on tiles that may hide a
  /// pair (tileMayHide) and null on the others, which so skip the
  /// per-element indices and compares.
  SmallVector<Value>
  maskedFragment(Value q0, Value key0, bool queries, bool transposed,
                 ArrayRef<Value> rows, ArrayRef<Value> rowDocuments,
                 function_ref<Value(int64_t i, int64_t h, Value hide)> fn) {
    auto body = [&](bool masked) {
      SmallVector<Value> out(32);
      for (int64_t j = 0; j < 8; ++j)
        for (int64_t c = 0; c < 2; ++c) {
          Value col, colDocument;
          if (masked) {
            col = add(transposed ? q0 : key0, colOf(j, c));
            colDocument = documentOf(col);
          }
          for (int64_t h = 0; h < 2; ++h) {
            Value hide;
            if (masked)
              hide = transposed ? hidden(col, rows[h], queries, colDocument,
                                         rowDocuments[h])
                                : hidden(rows[h], col, queries, rowDocuments[h],
                                         colDocument);
            int64_t i = 4 * j + 2 * h + c;
            out[i] = fn(i, h, hide);
          }
        }
      return out;
    };
    return ifElse(
        SmallVector<Type>(32, f32()), tileMayHide(q0, key0, queries),
        [&] { return body(true); }, [&] { return body(false); });
  }

  /// The forward's online softmax of a 64 x 64 score tile (`sv`, an
  /// accumulator's values) of the keys from `key0` for the fragment rows
  /// `rows` (the queries from `q0`): scores in base 2, hidden keys -inf
  /// (tested per element only on tiles that may hide one); `stats` (m0, m1,
  /// l0, l1: the running row maxima and partial sums) updated, `sv`
  /// replaced by the probabilities (f32), and each row's factor for the
  /// accumulator, exp2(m_old - m_new), returned.
  std::array<Value, 2> softmax(SmallVector<Value> &sv,
                               SmallVector<Value> &stats, Value key0, Value q0,
                               ArrayRef<Value> rows,
                               ArrayRef<Value> rowDocument, Value scale2) {
    Value negInf = f32c(-INFINITY), zero = f32c(0.0);
    // Scores in base 2, hidden keys -inf.
    sv = maskedFragment(q0, key0, /*queries=*/false, /*transposed=*/false, rows,
                        rowDocument, [&](int64_t i, int64_t, Value hide) {
                          Value x = fmul(sv[i], scale2);
                          return hide ? select(hide, negInf, x) : x;
                        });
    std::array<Value, 2> corr;
    for (int64_t h = 0; h < 2; ++h) {
      Value mOld = stats[h], lOld = stats[2 + h];
      Value m = mOld;
      for (int64_t j = 0; j < 8; ++j)
        for (int64_t c = 0; c < 2; ++c)
          m = fmax(m, sv[4 * j + 2 * h + c]);
      m = rowReduce(m, /*max=*/true);
      // With documents a row can see no key of its first tiles (its
      // document starts later): m stays -inf, and the exponents are
      // taken from 0 (p = 0, nothing to rescale) instead of
      // -inf - -inf.
      Value base = m;
      if (documents)
        base = select(
            arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ, m, negInf),
            zero, m);
      corr[h] = exp2(fsub(mOld, base));
      Value l = fmul(lOld, corr[h]);
      for (int64_t j = 0; j < 8; ++j)
        for (int64_t c = 0; c < 2; ++c) {
          int64_t i = 4 * j + 2 * h + c;
          sv[i] = exp2(fsub(sv[i], base));
          l = fadd(l, sv[i]);
        }
      stats[h] = m;
      stats[2 + h] = l;
    }
    return corr;
  }

  /// Stores this thread's rows of an m64nD accumulator (`v`, times `mul`
  /// if given) into the f32 [B, S, H, D] buffer `out` (address `outBase`)
  /// at rows s0 + row, head `head`: pairs of 8 bytes, rows past S skipped.
  void storeRows(ArrayRef<Value> v, std::array<Value, 2> mul2, Value outBase,
                 int64_t headsOf, Value bb, Value s0, Value head) {
    for (int64_t h = 0; h < 2; ++h) {
      Value s = add(s0, rowOf(h));
      ifThen(cmp(P::slt, s, idx(f.seq)), [&] {
        Value row = add(mul(add(mul(bb, idx(f.seq)), s), idx(headsOf)), head);
        Value first = mul(row, idx(f.dim));
        for (int64_t j = 0; j < f.dim / 8; ++j) {
          Value x = v[4 * j + 2 * h], y = v[4 * j + 2 * h + 1];
          if (mul2[h]) {
            x = fmul(x, mul2[h]);
            y = fmul(y, mul2[h]);
          }
          storePair(outBase, add(first, colOf(j, 0)), x, y, f32());
        }
      });
    }
  }

  /// Entry [bb, head, s] of an f32 [B, N, S] row statistic (s clamped).
  Value loadStat(Value stat, Value bb, Value head, Value s) {
    return memref::LoadOp::create(
        b, loc, stat, ValueRange{bb, head, minS(s, idx(f.seq - 1))});
  }
  /// The warp-specialized kernels' roles: warpgroup 0 gives registers
  /// away (setmaxnreg down to `producerRegs`) and its first thread runs
  /// `produce`; warpgroup 1 + c raises its count to `consumerRegs` and runs
  /// `consume(c)`. The warpgroup is broadcast from lane 0 so that it is
  /// seen to be warp-uniform (else the wgmmas under the branch are
  /// serialized).
  void warpSpecialize(int64_t producerRegs, int64_t consumerRegs,
                      function_ref<void()> produce,
                      function_ref<void(Value)> consume) {
    Value wg =
        toIndex(gpu::ShuffleOp::create(b, loc, i32Of(div(tid, 128)), int32(0),
                                       int32(32), gpu::ShuffleMode::IDX)
                    .getShuffleResult());
    ifElseVoid(
        cmp(P::eq, wg, idx(0)),
        [&] {
          NVVM::SetMaxRegisterOp::create(b, loc, producerRegs,
                                         NVVM::SetMaxRegisterAction::decrease);
          ifThen(cmp(P::eq, tid, idx(0)), produce);
        },
        [&] {
          NVVM::SetMaxRegisterOp::create(b, loc, consumerRegs,
                                         NVVM::SetMaxRegisterAction::increase);
          consume(add(wg, idx(-1)));
        });
  }
  void barrier() { NVVM::Barrier0Op::create(b, loc); }
  void fenceAndBarrier() {
    fenceForAsyncProxy();
    barrier();
  }
  /// Arrives on mbarrier `bar` expecting `bytes` more of TMA copies.
  void expectBytes(Value bar, int64_t bytes) {
    NVVM::MBarrierArriveExpectTxOp::create(b, loc, Type(), bar, int32(bytes),
                                           NVVM::MemScopeKind::CTA,
                                           /*relaxed=*/false, Value());
  }
  /// Copies rows [s0, s0 + 64) of head `head` of batch `bb` through the
  /// map `map` (tensorMap3D) into the tile at byte `tile`, a panel a box;
  /// rows past S read zeros. Completes on mbarrier `bar`.
  void tmaTile(Value tile, Value map, Value head, Value s0, Value bb,
               Value bar) {
    for (int64_t p = 0; p < f.dim / 64; ++p)
      tmaLoad(sharedPtrAt(add(tile, idx(p * flash::PanelBytes))), map,
              {add(mul(head, idx(f.dim)), idx(64 * p)), s0, bb}, bar);
  }
};

/// The dQ kernel: a query tile, a loop over key/value tiles
/// double-buffered.
struct DqEmitter : FlashEmitter {
  using FlashEmitter::FlashEmitter;

  // Shared memory: Q, dO, two (K, V) slots, tilesSharing's scratch.
  int64_t doAt() const { return tileBytes(); }
  int64_t slotsAt() const { return 2 * tileBytes(); }
  int64_t slotBytes() const { return 2 * tileBytes(); }
  int64_t scratchAt() const { return slotsAt() + 2 * slotBytes(); }

  void emit(gpu::LaunchOp launch) {
    setUpThread(launch);
    int64_t tiles = tilesOf(f.seq, flash::Tile);
    int64_t group = f.heads / f.kvHeads;
    // Longest rows (causal) first.
    std::array<Value, 3> place = rankHeadBatch(launch, f.heads);
    Value qt = arith::SubIOp::create(b, loc, idx(tiles - 1), place[0]);
    Value head = place[1], bb = place[2];
    batch = bb;
    Value kvHead = div(head, group);
    Value q0 = mul(qt, idx(flash::Tile));
    // Key tiles [kFirst, nk).
    Value kFirst = idx(0);
    Value nk = f.causal ? add(qt, idx(1)) : idx(tiles);
    if (documents)
      std::tie(kFirst, nk) = tilesSharing(qt, kFirst, nk, scratchAt());
    Value qG = baseAddress(q), kG = baseAddress(k), vG = baseAddress(v);
    Value doG = baseAddress(dout);
    Value outG = baseAddress(results[0]);

    Value slots = idx(slotsAt());
    loadTile(idx(0), qG, f.heads, bb, q0, head);
    loadTile(idx(doAt()), doG, f.heads, bb, q0, head);
    auto slotBase = [&](Value slot) {
      return add(slots, mul(slot, idx(slotBytes())));
    };
    // K and V tile kt into slot kt % 2.
    auto loadKV = [&](Value kt) {
      Value base = slotBase(rem(kt, 2));
      Value k0 = mul(kt, idx(flash::Tile));
      loadTile(base, kG, f.kvHeads, bb, k0, kvHead);
      loadTile(add(base, idx(tileBytes())), vG, f.kvHeads, bb, k0, kvHead);
    };
    loadKV(kFirst); // the first stage, with Q and dO
    NVVM::CpAsyncCommitGroupOp::create(b, loc);

    double c2 = f.scale / std::log(2.0);
    Value scale2 = f32c(c2);
    // Per fragment row h: the query, its document, its lse and delta.
    SmallVector<Value> rows, rowLse, rowDelta, rowDocument;
    for (int64_t h = 0; h < 2; ++h) {
      rows.push_back(add(q0, rowOf(h)));
      rowDocument.push_back(documentOf(rows[h]));
      rowLse.push_back(loadStat(lse, bb, head, rows[h]));
      rowDelta.push_back(loadStat(delta, bb, head, rows[h]));
    }
    Value zero = f32c(0.0);
    SmallVector<Value> result =
        forLoop(kFirst, nk, {zeroAcc(f.dim)},
                [&](Value kt, ValueRange carried) -> SmallVector<Value> {
                  Value next = add(kt, idx(1));
                  ifThen(cmp(P::slt, next, nk), [&] { loadKV(next); });
                  NVVM::CpAsyncCommitGroupOp::create(b, loc);
                  NVVM::CpAsyncWaitGroupOp::create(b, loc, 1);
                  fenceAndBarrier();
                  Value kTile = slotBase(rem(kt, 2));
                  Value vTile = add(kTile, idx(tileBytes()));
                  Value key0 = mul(kt, idx(flash::Tile));

                  NVVM::WgmmaFenceAlignedOp::create(b, loc);
                  Value s = mmaFresh(flash::Tile, idx(0), kTile,
                                     /*bKMajor=*/true, f.dim / 16);
                  Value dp = mmaFresh(flash::Tile, idx(doAt()), vTile,
                                      /*bKMajor=*/true, f.dim / 16);
                  commitAndWait();
                  SmallVector<Value> sv = values(s), dpv = values(dp);
                  // dS = P (dP - delta) with P = exp2(scale' s - lse), hidden
                  // pairs 0.
                  SmallVector<Value> ds = maskedFragment(
                      q0, key0, /*queries=*/true, /*transposed=*/false, rows,
                      rowDocument, [&](int64_t i, int64_t h, Value hide) {
                        Value p = exp2(fsub(fmul(sv[i], scale2), rowLse[h]));
                        if (hide)
                          p = select(hide, zero, p);
                        return fmul(p, fsub(dpv[i], rowDelta[h]));
                      });
                  // dQ += dS K: dS in registers as the A operand, B MN-major
                  // (rows are keys).
                  SmallVector<Value> a = fragmentA(ds);
                  NVVM::WgmmaFenceAlignedOp::create(b, loc);
                  Value dq = mmaRegA(carried[0], a, kTile, flash::Tile / 16);
                  commitAndWait();
                  // Everyone is done with this slot before it is refilled.
                  barrier();
                  return {dq};
                });
    NVVM::CpAsyncWaitGroupOp::create(b, loc, 0);
    Value sc = f32c(f.scale);
    storeRows(values(result[0]), {sc, sc}, outG, f.heads, bb, q0, head);
  }
};

/// The forward kernel: a 128-query tile of a head and batch entry. The
/// first thread of the producer warpgroup copies the two Q tiles once and
/// the K and V tiles through a ring of stages with TMA (each stage's K and
/// V full on mbarriers of their own, the stage empty once all 256 consumer
/// threads have arrived); each consumer warpgroup computes 64 queries,
/// software-pipelined as FlashAttention-3 does within a warpgroup: step i
/// issues S_i = Q K_i^T and O += P_(i-1) V_(i-1), computes S_i's softmax
/// while the PV MMAs run, then waits for them, frees their stage and
/// rescales O. The two consumers take turns issuing their MMAs (ping-pong,
/// consume()), so one's softmax runs under the other's MMAs. A K/V tile is
/// read once for 128 queries.
struct ForwardEmitter : FlashEmitter {
  static constexpr int64_t Consumers = 2, Stages = 3;
  static constexpr int64_t Rows = Consumers * flash::Tile; // queries a CTA
  // Registers a thread (setmaxnreg; hopper::registerPool): the consumers hold O
  // (64 x D), Q's fragment and the carried P besides S; with documents,
  // 168 a thread (64K over 384) spilled.
  static constexpr int64_t ProducerRegs = 40, ConsumerRegs = 232;
  static_assert(128 * ProducerRegs + 256 * ConsumerRegs <=
                    hopper::registerPool(384),
                "flash forward: the register split");
  // The consumers' named barriers (PingPong + c; 0 is the CTA's).
  static constexpr int64_t PingPong = 1;
  /// The tensor maps of q [B, S, N, D] and k, v [B, S, M, D], each as
  /// [B][S][heads x D] in boxes of 64 rows x 64 columns (one panel).
  Value mapQ, mapK, mapV;

  ForwardEmitter(OpBuilder &b, Location loc, const FlashAttention &f,
                 ArrayRef<Value> args, ArrayRef<Value> results, Value mapQ,
                 Value mapK, Value mapV)
      : FlashEmitter(b, loc, f, args, results), mapQ(mapQ), mapK(mapK),
        mapV(mapV) {
    threads = ctaThreads();
  }

  static int64_t ctaThreads() { return (1 + Consumers) * flash::Threads; }
  // Shared memory: the consumers' Q tiles, the stages (K, V), the mbarriers
  // (Q full; K full, V full and empty a stage), tilesSharing's scratch.
  static int64_t stagesAt(const FlashAttention &f) {
    return Consumers * flash::tileBytes(f.dim);
  }
  static int64_t barriersAt(const FlashAttention &f) {
    return stagesAt(f) + Stages * 2 * flash::tileBytes(f.dim);
  }
  static int64_t scratchAt(const FlashAttention &f) {
    return barriersAt(f) + 8 * (1 + 3 * Stages);
  }
  static int64_t smemBytes(const FlashAttention &f) {
    return scratchAt(f) + flash::ScratchBytes;
  }
  Value kTile(Value s) {
    return add(idx(stagesAt(f)), mul(s, idx(2 * tileBytes())));
  }
  Value vTile(Value s) { return add(kTile(s), idx(tileBytes())); }
  /// mbarrier `first` + s.
  Value mbarrier(int64_t first, Value s) {
    return sharedPtrAt(add(idx(barriersAt(f) + 8 * first), mul(s, idx(8))));
  }
  Value qFull() { return mbarrier(0, idx(0)); }
  Value kFull(Value s) { return mbarrier(1, s); }
  Value vFull(Value s) { return mbarrier(1 + Stages, s); }
  Value empty(Value s) { return mbarrier(1 + 2 * Stages, s); }

  void emit(gpu::LaunchOp launch) {
    setUpThread(launch);
    int64_t tiles = tilesOf(f.seq, flash::Tile);
    int64_t group = f.heads / f.kvHeads;
    // Longest rows (causal) first.
    std::array<Value, 3> place = rankHeadBatch(launch, f.heads, Rows);
    Value qt =
        arith::SubIOp::create(b, loc, idx(tilesOf(f.seq, Rows) - 1), place[0]);
    Value head = place[1], bb = place[2];
    batch = bb;
    Value kvHead = div(head, group);
    // Key tiles [kFirst, nk): those of the CTA's two 64-query tiles.
    Value t0 = mul(qt, idx(Consumers));
    Value t1 = minS(add(t0, idx(1)), idx(tiles - 1));
    Value kFirst = idx(0);
    Value nk = f.causal ? add(t1, idx(1)) : idx(tiles);
    if (documents) {
      auto [first0, end0] = tilesSharing(t0, kFirst, nk, scratchAt(f));
      auto [first1, end1] = tilesSharing(t1, kFirst, nk, scratchAt(f));
      kFirst = minS(first0, first1);
      nk = maxS(end0, end1);
    }
    Value count = arith::SubIOp::create(b, loc, nk, kFirst);
    ifThen(cmp(P::eq, tid, idx(0)), [&] {
      NVVM::MBarrierInitOp::create(b, loc, qFull(), int32(1), Value());
      for (int64_t s = 0; s < Stages; ++s) {
        NVVM::MBarrierInitOp::create(b, loc, kFull(idx(s)), int32(1), Value());
        NVVM::MBarrierInitOp::create(b, loc, vFull(idx(s)), int32(1), Value());
        NVVM::MBarrierInitOp::create(
            b, loc, empty(idx(s)), int32(Consumers * flash::Threads), Value());
      }
    });
    barrier();
    warpSpecialize(
        ProducerRegs, ConsumerRegs,
        [&] { produce(qt, head, kvHead, bb, kFirst, count); },
        [&](Value c) { consume(c, qt, head, bb, kFirst, count); });
  }

  void produce(Value qt, Value head, Value kvHead, Value bb, Value kFirst,
               Value count) {
    expectBytes(qFull(), Consumers * tileBytes());
    for (int64_t c = 0; c < Consumers; ++c)
      tmaTile(idx(c * tileBytes()), mapQ, head,
              add(mul(qt, idx(Rows)), idx(c * flash::Tile)), bb, qFull());
    forLoop(0, count, {}, [&](Value i, ValueRange) {
      Value s = rem(i, Stages), n = div(i, Stages);
      // Its previous use done (the first use waits for nothing).
      wait(empty(s), rem(add(n, idx(1)), 2));
      Value key0 = mul(add(kFirst, i), idx(flash::Tile));
      expectBytes(kFull(s), tileBytes());
      tmaTile(kTile(s), mapK, kvHead, key0, bb, kFull(s));
      expectBytes(vFull(s), tileBytes());
      tmaTile(vTile(s), mapV, kvHead, key0, bb, vFull(s));
      return SmallVector<Value>{};
    });
  }

  void consume(Value c, Value qt, Value head, Value bb, Value kFirst,
               Value count) {
    Value qTile = mul(c, idx(tileBytes()));
    Value q0 = add(mul(qt, idx(Rows)), mul(c, idx(flash::Tile)));
    Value scale2 = f32c(f.scale / std::log(2.0));
    SmallVector<Value> rows, rowDocument;
    for (int64_t h = 0; h < 2; ++h) {
      rows.push_back(add(q0, rowOf(h)));
      rowDocument.push_back(documentOf(rows[h]));
    }
    wait(qFull(), idx(0));
    // Q's A fragment, in registers for every S MMA (A from shared memory,
    // each m64n64k16 MMA read 2 KiB of Q beside its 2 KiB of K).
    SmallVector<Value> qFrag = fragmentOf(qTile);
    // Ping-pong: a consumer issues its MMAs on its turn (named barrier
    // PingPong + c: its sync with the other's arrival) and then passes the
    // turn, so that one consumer's softmax runs under the other's MMAs.
    // Consumer 1 passes the first turn to consumer 0 and does not pass after
    // its last MMAs (each barrier gets as many arrivals as syncs).
    auto myTurn = [&] {
      NVVM::BarrierOp::create(b, loc, Type(), i32Of(add(c, idx(PingPong))),
                              int32(Consumers * flash::Threads),
                              NVVM::BarrierReductionAttr(), Value());
    };
    auto passTurn = [&] {
      NVVM::BarrierArriveOp::create(
          b, loc, i32Of(arith::SubIOp::create(b, loc, idx(PingPong + 1), c)),
          int32(Consumers * flash::Threads));
    };
    ifThen(cmp(P::eq, c, idx(1)), passTurn);
    Value negInf = f32c(-INFINITY), zero = f32c(0.0);
    // O, m0, m1, l0, l1, then the previous tile's P in f32, not as its bf16
    // A fragment (carried packed, the next fragment's conversions wrote the
    // registers of the PV MMAs in flight and ptxas serialized every wgmma:
    // C7513).
    SmallVector<Value> inits = {zeroAcc(f.dim), negInf, negInf, zero, zero};
    inits.append(SmallVector<Value>(accOf(flash::Tile).getBody().size(), zero));
    auto stageOf = [&](Value i) {
      return std::make_pair(rem(i, Stages), rem(div(i, Stages), 2));
    };
    // Step i; the first has no PV MMAs (emitted before the loop: the PV
    // MMAs under a branch made ptxas serialize the wgmmas).
    auto step = [&](Value i, ValueRange carried,
                    bool first) -> SmallVector<Value> {
      auto [s, parity] = stageOf(i);
      Value key0 = mul(add(kFirst, i), idx(flash::Tile));
      SmallVector<Value> pPrev;
      Value sPrev;
      if (!first) {
        pPrev = fragmentA(SmallVector<Value>(carried.drop_front(5)));
        auto [sp, parityPrev] = stageOf(add(i, idx(-1)));
        sPrev = sp;
        wait(vFull(sPrev), parityPrev);
      }
      wait(kFull(s), parity);
      myTurn();
      NVVM::WgmmaFenceAlignedOp::create(b, loc);
      Value sAcc = mmaRegA(LLVM::PoisonOp::create(b, loc, accOf(flash::Tile)),
                           qFrag, kTile(s), f.dim / 16, /*bKMajor=*/true,
                           /*fresh=*/true);
      NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
      Value o = carried[0];
      if (!first) {
        // O += P V of the previous tile.
        o = mmaRegA(o, pPrev, vTile(sPrev), flash::Tile / 16);
        NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
      }
      passTurn();
      // S's group done; PV's may run on.
      NVVM::WgmmaWaitGroupSyncOp::create(b, loc, first ? 0 : 1);
      SmallVector<Value> sv = values(sAcc);
      SmallVector<Value> stats(carried.slice(1, 4));
      std::array<Value, 2> corr =
          softmax(sv, stats, key0, q0, rows, rowDocument, scale2);
      if (!first) {
        // The PV MMAs done: their stage is free, O to this tile's max.
        NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
        NVVM::MBarrierArriveOp::create(b, loc, Type(), empty(sPrev), Value());
        SmallVector<Value> acc = values(o);
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t j = 0; j < f.dim / 8; ++j)
            for (int64_t cc = 0; cc < 2; ++cc)
              acc[4 * j + 2 * h + cc] = fmul(acc[4 * j + 2 * h + cc], corr[h]);
        o = accFrom(acc);
      }
      SmallVector<Value> yielded = {o};
      llvm::append_range(yielded, stats);
      llvm::append_range(yielded, sv);
      return yielded;
    };
    SmallVector<Value> result = step(idx(0), inits, /*first=*/true);
    result = forLoop(1, count, result, [&](Value i, ValueRange carried) {
      return step(i, carried, /*first=*/false);
    });
    // The last tile's PV (every CTA has a tile: its own, at least).
    SmallVector<Value> pLast = fragmentA(ArrayRef<Value>(result).drop_front(5));
    auto [sLast, parityLast] = stageOf(add(count, idx(-1)));
    wait(vFull(sLast), parityLast);
    myTurn();
    NVVM::WgmmaFenceAlignedOp::create(b, loc);
    Value o = mmaRegA(result[0], pLast, vTile(sLast), flash::Tile / 16);
    NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
    ifThen(cmp(P::eq, c, idx(0)), passTurn);
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);

    SmallVector<Value> ov = values(o);
    std::array<Value, 2> inv;
    for (int64_t h = 0; h < 2; ++h) {
      Value l = rowReduce(result[3 + h], /*max=*/false);
      inv[h] = arith::DivFOp::create(b, loc, f32c(1.0), l);
      Value lse2 = fadd(result[1 + h], math::Log2Op::create(b, loc, l));
      ifThen(land(cmp(P::slt, rows[h], idx(f.seq)),
                  cmp(P::eq, rem(lane, 4), idx(0))),
             [&] {
               memref::StoreOp::create(b, loc, lse2, results[1],
                                       ValueRange{bb, head, rows[h]});
             });
    }
    storeRows(ov, inv, baseAddress(results[0]), f.heads, bb, q0, head);
  }
};

/// The dK/dV kernel: 128 keys of a KV head a CTA, over the query heads of
/// its group and the query tiles that see them; warp-specialized as the
/// forward is. The first thread of the producer warpgroup copies each
/// consumer's K and V tile once, then each step's Q and dO tiles through a
/// ring of stages with TMA; each of the two consumer warpgroups takes a
/// 64-key tile, so a Q and dO tile copied once serves 128 keys.
struct KeyTileEmitter : FlashEmitter {
  static constexpr int64_t Consumers = 2, Stages = 3;
  static constexpr int64_t Keys = Consumers * flash::Tile; // keys a CTA
  // Registers a thread (setmaxnreg; hopper::registerPool): the consumers hold
  // dK and dV (64 x D each) besides S^T and dP^T.
  static constexpr int64_t ProducerRegs = 40, ConsumerRegs = 232;
  static_assert(128 * ProducerRegs + 256 * ConsumerRegs <=
                    hopper::registerPool(384),
                "flash dK/dV: the register split");
  /// The tensor maps of q and dO [B, S, N, D] and k, v [B, S, M, D]
  /// (tensorMap3D).
  Value mapQ, mapDO, mapK, mapV;

  KeyTileEmitter(OpBuilder &b, Location loc, const FlashAttention &f,
                 ArrayRef<Value> args, ArrayRef<Value> results, Value mapQ,
                 Value mapDO, Value mapK, Value mapV)
      : FlashEmitter(b, loc, f, args, results), mapQ(mapQ), mapDO(mapDO),
        mapK(mapK), mapV(mapV) {
    threads = ctaThreads();
  }

  static int64_t ctaThreads() { return (1 + Consumers) * flash::Threads; }
  // Shared memory: each consumer's K and V tiles, the stages (Q, dO), the
  // mbarriers (K/V full; full and empty a stage), tilesSharing's scratch.
  // D 128: 161 KiB, a CTA an SM.
  static int64_t stagesAt(const FlashAttention &f) {
    return Consumers * 2 * flash::tileBytes(f.dim);
  }
  static int64_t barriersAt(const FlashAttention &f) {
    return stagesAt(f) + Stages * 2 * flash::tileBytes(f.dim);
  }
  static int64_t scratchAt(const FlashAttention &f) {
    return barriersAt(f) + 8 * (1 + 2 * Stages);
  }
  static int64_t smemBytes(const FlashAttention &f) {
    return scratchAt(f) + flash::ScratchBytes;
  }
  Value kTile(Value c) { return mul(c, idx(2 * tileBytes())); }
  Value vTile(Value c) { return add(kTile(c), idx(tileBytes())); }
  Value qTile(Value s) {
    return add(idx(stagesAt(f)), mul(s, idx(2 * tileBytes())));
  }
  Value doTile(Value s) { return add(qTile(s), idx(tileBytes())); }
  /// mbarrier `first` + s.
  Value mbarrier(int64_t first, Value s) {
    return sharedPtrAt(add(idx(barriersAt(f) + 8 * first), mul(s, idx(8))));
  }
  Value kvFull() { return mbarrier(0, idx(0)); }
  Value full(Value s) { return mbarrier(1, s); }
  Value empty(Value s) { return mbarrier(1 + Stages, s); }

  /// The walk every CTA of a KV head takes: query tiles [first, end) of
  /// each query head of the group, the last tile first and the group's
  /// heads innermost (step `it` is query tile end - 1 - it / group of head
  /// it % group). So every CTA of a KV head reads the same Q and dO tiles at
  /// the same step, whatever its keys (causal: a CTA ends at its first
  /// tile's diagonal), and the L2 holds them for all. (Starting each CTA at
  /// its own diagonal tile spread the CTAs over a KV head's whole Q and dO,
  /// 16 MiB at sequence 4096, and most copies missed the L2.)
  struct Walk {
    Value kvHead, first, end, steps;
  };
  Value headOf(const Walk &w, Value it) {
    return add(mul(w.kvHead, idx(f.heads / f.kvHeads)),
               rem(it, f.heads / f.kvHeads));
  }
  Value firstQuery(const Walk &w, Value it) {
    return mul(arith::SubIOp::create(b, loc, add(w.end, idx(-1)),
                                     div(it, f.heads / f.kvHeads)),
               idx(flash::Tile));
  }
  std::pair<Value, Value> stageOf(Value it) {
    return {rem(it, Stages), rem(div(it, Stages), 2)};
  }

  void emit(gpu::LaunchOp launch) {
    setUpThread(launch);
    int64_t tiles = tilesOf(f.seq, flash::Tile);
    // Longest (causal: the first keys) first.
    std::array<Value, 3> place = rankHeadBatch(launch, f.kvHeads, Keys);
    Walk w;
    w.kvHead = place[1];
    Value bb = place[2];
    batch = bb;
    // The consumers' key tiles kt0 and kt0 + 1 (past S with an odd number
    // of tiles: its keys read zeros, nothing is stored).
    Value kt0 = mul(place[0], idx(Consumers));
    w.first = f.causal ? kt0 : idx(0);
    w.end = idx(tiles);
    if (documents) {
      Value kt1 = minS(add(kt0, idx(1)), idx(tiles - 1));
      auto [first0, end0] = tilesSharing(kt0, w.first, w.end, scratchAt(f));
      auto [first1, end1] = tilesSharing(kt1, w.first, w.end, scratchAt(f));
      w.first = minS(first0, first1);
      w.end = maxS(end0, end1);
    }
    w.steps = mul(arith::SubIOp::create(b, loc, w.end, w.first),
                  idx(f.heads / f.kvHeads));
    ifThen(cmp(P::eq, tid, idx(0)), [&] {
      NVVM::MBarrierInitOp::create(b, loc, kvFull(), int32(1), Value());
      for (int64_t s = 0; s < Stages; ++s) {
        NVVM::MBarrierInitOp::create(b, loc, full(idx(s)), int32(1), Value());
        NVVM::MBarrierInitOp::create(
            b, loc, empty(idx(s)), int32(Consumers * flash::Threads), Value());
      }
    });
    barrier();
    warpSpecialize(
        ProducerRegs, ConsumerRegs, [&] { produce(w, bb, kt0); },
        [&](Value c) { consume(w, c, bb, kt0); });
  }

  void produce(const Walk &w, Value bb, Value kt0) {
    expectBytes(kvFull(), Consumers * 2 * tileBytes());
    for (int64_t c = 0; c < Consumers; ++c) {
      Value key0 = mul(add(kt0, idx(c)), idx(flash::Tile));
      tmaTile(kTile(idx(c)), mapK, w.kvHead, key0, bb, kvFull());
      tmaTile(vTile(idx(c)), mapV, w.kvHead, key0, bb, kvFull());
    }
    forLoop(0, w.steps, {}, [&](Value it, ValueRange) {
      auto [s, parity] = stageOf(it);
      // Its previous use done (the first use waits for nothing).
      wait(empty(s), arith::SubIOp::create(b, loc, idx(1), parity));
      Value head = headOf(w, it), q0 = firstQuery(w, it);
      expectBytes(full(s), 2 * tileBytes());
      tmaTile(qTile(s), mapQ, head, q0, bb, full(s));
      tmaTile(doTile(s), mapDO, head, q0, bb, full(s));
      return SmallVector<Value>{};
    });
  }

  void consume(const Walk &w, Value c, Value bb, Value kt0) {
    Value key0 = mul(add(kt0, c), idx(flash::Tile));
    // The lse and delta of the 64 query columns of step `it`: lane l of
    // every warp loads columns l and l + 32 (two coalesced loads each, a
    // step ahead of their use), and a thread takes the values of its 16
    // columns from the lanes holding them by shuffles. (Each thread loading
    // its 16 columns' values after the S^T MMA put 32 loads' latency on
    // every step: the step of this kernel took 2.3x that of the dQ kernel
    // for the same MMAs.) `it` is clamped into [0, steps): the step after
    // the last, and step 0 of a CTA without steps, load in bounds.
    Value lastStep =
        maxS(arith::SubIOp::create(b, loc, w.steps, idx(1)), idx(0));
    auto statsOf = [&](Value it) -> SmallVector<Value> {
      it = minS(it, lastStep);
      Value head = headOf(w, it), q0 = maxS(firstQuery(w, it), idx(0));
      SmallVector<Value> v;
      for (Value stat : {lse, delta})
        for (int64_t half = 0; half < 2; ++half)
          v.push_back(
              loadStat(stat, bb, head, add(q0, add(lane, idx(32 * half)))));
      return v;
    };
    // Column 8 j + 2 (l % 4) + c's value (`stats` from statsOf): its lse,
    // or its delta with `ofDelta`.
    auto statAt = [&](ArrayRef<Value> stats, bool ofDelta, int64_t j,
                      int64_t c) {
      Value col = add(mul(rem(lane, 4), idx(2)), idx(8 * j + c));
      Value held = stats[(ofDelta ? 2 : 0) + (j < 4 ? 0 : 1)];
      Value from = arith::IndexCastOp::create(b, loc, b.getI32Type(),
                                              j < 4 ? col : add(col, idx(-32)));
      return gpu::ShuffleOp::create(b, loc, held, from, int32(32),
                                    gpu::ShuffleMode::IDX)
          .getShuffleResult();
    };

    Value scale2 = f32c(f.scale / std::log(2.0));
    Value zero = f32c(0.0);
    SmallVector<Value> keys = {add(key0, rowOf(0)), add(key0, rowOf(1))};
    SmallVector<Value> keyDocument = {documentOf(keys[0]), documentOf(keys[1])};
    Value kT = kTile(c), vT = vTile(c);
    wait(kvFull(), idx(0));

    SmallVector<Value> inits = {zeroAcc(f.dim), zeroAcc(f.dim)};
    llvm::append_range(inits, statsOf(idx(0)));
    SmallVector<Value> result = forLoop(
        0, w.steps, inits,
        [&](Value it, ValueRange carried) -> SmallVector<Value> {
          auto [s, parity] = stageOf(it);
          Value q0 = firstQuery(w, it);
          SmallVector<Value> stats(carried.drop_front(2));
          SmallVector<Value> nextStats = statsOf(add(it, idx(1)));
          Value qT = qTile(s), doT = doTile(s);
          wait(full(s), parity);

          NVVM::WgmmaFenceAlignedOp::create(b, loc);
          // S^T = K Q^T and dP^T = V dO^T (rows: keys; columns:
          // queries).
          Value st =
              mmaFresh(flash::Tile, kT, qT, /*bKMajor=*/true, f.dim / 16);
          if (f.overlapDkv)
            NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
          Value dpt =
              mmaFresh(flash::Tile, vT, doT, /*bKMajor=*/true, f.dim / 16);
          // Overlapped: S^T's group done, dP^T's still running.
          commitAndWaitFor(f.overlapDkv ? 1 : 0);
          SmallVector<Value> sv = values(st);
          SmallVector<Value> dsv(sv.size()), lseOf;
          for (int64_t j = 0; j < 8; ++j)
            for (int64_t c = 0; c < 2; ++c)
              lseOf.push_back(statAt(stats, /*ofDelta=*/false, j, c));
          // P^T, hidden pairs 0.
          SmallVector<Value> pv = maskedFragment(
              q0, key0, /*queries=*/true, /*transposed=*/true, keys,
              keyDocument, [&](int64_t i, int64_t, Value hide) {
                Value p =
                    exp2(fsub(fmul(sv[i], scale2), lseOf[2 * (i / 4) + i % 2]));
                return hide ? select(hide, zero, p) : p;
              });
          // dS^T = P^T (dP^T - delta), once dP^T is there.
          auto gradients = [&] {
            SmallVector<Value> dv = values(dpt);
            for (int64_t j = 0; j < 8; ++j)
              for (int64_t c = 0; c < 2; ++c) {
                Value d = statAt(stats, /*ofDelta=*/true, j, c);
                for (int64_t h = 0; h < 2; ++h) {
                  int64_t i = 4 * j + 2 * h + c;
                  dsv[i] = fmul(pv[i], fsub(dv[i], d));
                }
              }
          };
          // dV += P^T dO, dK += dS^T Q: P^T and dS^T in registers as
          // the A operands (rows: keys), B MN-major (rows: queries).
          Value accV, accK;
          if (f.overlapDkv) {
            // dV's MMAs run while dS^T is computed.
            SmallVector<Value> pa = fragmentA(pv);
            NVVM::WgmmaFenceAlignedOp::create(b, loc);
            accV = mmaRegA(carried[1], pa, doT, flash::Tile / 16);
            // dP^T's group done, dV's still running.
            commitAndWaitFor(1);
            gradients();
            SmallVector<Value> dsa = fragmentA(dsv);
            NVVM::WgmmaFenceAlignedOp::create(b, loc);
            accK = mmaRegA(carried[0], dsa, qT, flash::Tile / 16);
            commitAndWait();
          } else {
            gradients();
            SmallVector<Value> pa = fragmentA(pv), dsa = fragmentA(dsv);
            NVVM::WgmmaFenceAlignedOp::create(b, loc);
            accV = mmaRegA(carried[1], pa, doT, flash::Tile / 16);
            accK = mmaRegA(carried[0], dsa, qT, flash::Tile / 16);
            commitAndWait();
          }
          // The stage is free once both consumers are done with it.
          NVVM::MBarrierArriveOp::create(b, loc, Type(), empty(s), Value());
          SmallVector<Value> out = {accK, accV};
          llvm::append_range(out, nextStats);
          return out;
        });
    Value sc = f32c(f.scale);
    storeRows(values(result[0]), {sc, sc}, baseAddress(results[0]), f.kvHeads,
              bb, key0, w.kvHead);
    storeRows(values(result[1]), {Value(), Value()}, baseAddress(results[1]),
              f.kvHeads, bb, key0, w.kvHead);
  }
};

int64_t smemOf(int64_t bytes) { return bytes + 1024; }

/// The TMA tensor map (host side, before the launch) of a bf16
/// [B, S, heads, D] tensor seen as [B][S][heads x D], in boxes of 64 rows x
/// 64 columns (128 bytes: the panels' swizzle); rows past S read zeros.
Value tensorMap3D(OpBuilder &hb, Location loc, const FlashAttention &f,
                  func::FuncOp encode, Value array, int64_t heads) {
  KernelBuilder h{hb, loc};
  int64_t row = heads * f.dim * 2;
  SmallVector<Value> a = {
      h.baseAddress(array), h.int64(2),       h.int64(heads * f.dim),
      h.int64(f.seq),       h.int64(f.batch), h.int64(row),
      h.int64(row * f.seq), h.int64(64),      h.int64(flash::Tile)};
  return func::CallOp::create(hb, loc, encode, a).getResult(0);
}

} // namespace

std::pair<Value, Value> createFlashForward(OpBuilder &b, Location loc,
                                           const FlashAttention &f, Value q,
                                           Value k, Value v, Value documents,
                                           Value ranges, ModuleOp module,
                                           SymbolTable &symbols) {
  MLIRContext *ctx = b.getContext();
  auto outType = RankedTensorType::get(
      cast<RankedTensorType>(q.getType()).getShape(), Float32Type::get(ctx));
  SmallVector<Value> args = {q, k, v};
  if (documents)
    args.append({documents, ranges});
  func::FuncOp encode = getOrCreateTensorMap3DDecl(module, symbols);
  Value mapQ, mapK, mapV;
  func::FuncOp fn = getOrCreateKernelCall(
      module, symbols, f.name("fwd"),
      "flash attention forward (TMA, warp-specialized wgmma bf16)",
      SmallVector<Type>(ValueRange(args).getTypes()),
      {outType, f.statType(ctx)}, loc,
      {tilesOf(f.seq, ForwardEmitter::Rows), f.heads, f.batch,
       ForwardEmitter::ctaThreads(), smemOf(ForwardEmitter::smemBytes(f))},
      [&](OpBuilder &kb, gpu::LaunchOp launch, ArrayRef<Value> buf,
          ArrayRef<Value> outs) {
        ForwardEmitter(kb, loc, f, buf, outs, mapQ, mapK, mapV).emit(launch);
      },
      [&](OpBuilder &hb, ArrayRef<Value> buf, ArrayRef<Value>) {
        mapQ = tensorMap3D(hb, loc, f, encode, buf[0], f.heads);
        mapK = tensorMap3D(hb, loc, f, encode, buf[1], f.kvHeads);
        mapV = tensorMap3D(hb, loc, f, encode, buf[2], f.kvHeads);
      });
  auto call = func::CallOp::create(b, loc, fn, args);
  return {call.getResult(0), call.getResult(1)};
}

std::array<Value, 3> createFlashBackward(OpBuilder &b, Location loc,
                                         const FlashAttention &f, Value q,
                                         Value k, Value v, Value dout,
                                         Value out, Value lse, Value documents,
                                         Value ranges, ModuleOp module,
                                         SymbolTable &symbols) {
  MLIRContext *ctx = b.getContext();
  auto f32Like = [&](Value x) {
    return RankedTensorType::get(cast<RankedTensorType>(x.getType()).getShape(),
                                 Float32Type::get(ctx));
  };
  Value delta = createFlashDelta(b, loc, f, dout, out, module, symbols);
  SmallVector<Value> args = {q, k, v, dout, lse, delta};
  if (documents)
    args.append({documents, ranges});
  SmallVector<Type> argTypes(ValueRange(args).getTypes());
  int64_t tile = flash::tileBytes(f.dim);
  func::FuncOp dqFn = getOrCreateKernelCall(
      module, symbols, f.name("dq"), "flash attention dQ (wgmma bf16)",
      argTypes, {f32Like(q)}, loc,
      {tilesOf(f.seq, flash::Tile), f.heads, f.batch, flash::Threads,
       smemOf(tile * 6 + flash::ScratchBytes)},
      [&](OpBuilder &kb, gpu::LaunchOp launch, ArrayRef<Value> buf,
          ArrayRef<Value> outs) {
        DqEmitter(kb, loc, f, buf, outs).emit(launch);
      });
  func::FuncOp encode = getOrCreateTensorMap3DDecl(module, symbols);
  Value mapQ, mapDO, mapK, mapV;
  func::FuncOp dkvFn = getOrCreateKernelCall(
      module, symbols, f.name("dkv"),
      "flash attention dK dV (TMA, warp-specialized wgmma bf16)", argTypes,
      {f32Like(k), f32Like(v)}, loc,
      {tilesOf(f.seq, KeyTileEmitter::Keys), f.kvHeads, f.batch,
       KeyTileEmitter::ctaThreads(), smemOf(KeyTileEmitter::smemBytes(f))},
      [&](OpBuilder &kb, gpu::LaunchOp launch, ArrayRef<Value> buf,
          ArrayRef<Value> outs) {
        KeyTileEmitter(kb, loc, f, buf, outs, mapQ, mapDO, mapK, mapV)
            .emit(launch);
      },
      [&](OpBuilder &hb, ArrayRef<Value> buf, ArrayRef<Value>) {
        mapQ = tensorMap3D(hb, loc, f, encode, buf[0], f.heads);
        mapK = tensorMap3D(hb, loc, f, encode, buf[1], f.kvHeads);
        mapV = tensorMap3D(hb, loc, f, encode, buf[2], f.kvHeads);
        mapDO = tensorMap3D(hb, loc, f, encode, buf[3], f.heads);
      });
  auto dq = func::CallOp::create(b, loc, dqFn, args);
  auto dkv = func::CallOp::create(b, loc, dkvFn, args);
  return {dq.getResult(0), dkv.getResult(0), dkv.getResult(1)};
}

} // namespace mlir::moe::kernels
