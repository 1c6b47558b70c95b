//===- Kernels.h - the kernel families' entry points ------------*- C++ -*-===//
//
// One section per kernel family: what it handles (its descriptor), how an op
// is matched, and how it is lowered to a call of the generated kernel. Each
// family lives in its own file, named for it:
//
//   Tcgen05BlockScaledGemm.cpp  Blackwell: MXFP8 grouped GEMM on tcgen05
//   WgmmaGemm.cpp               Hopper: bf16 grouped GEMM, cp.async + wgmma
//   TmaGemmMainloop.cpp         Hopper: bf16 and blockwise FP8 grouped
//   TmaGemmEpilogues.cpp          GEMMs, TMA + warp-specialized wgmma
//                                 (mainloop; epilogues)
//   WgmmaWgrad.cpp              Hopper: grouped weight gradients
//   WgmmaFp8Gemm.cpp            Hopper: MXFP8 grouped GEMM on FP8 wgmma
//   ByteTranspose.cpp           8-bit transposes (K-major FP8 operands)
//   FlashAttention.cpp          Hopper: flash attention forward, dQ, dK/dV
//   FlashAttentionRows.cpp      its row kernels: delta, document ranges
//   CrossEntropy.cpp            cross-entropy over the vocabulary, a CTA a row
//   SimtMatmul.cpp              f32 dense matmul on CUDA cores
//   MatrixVector.cpp            grouped matrix-vector products, CUDA cores
//   MXRoundTrip.cpp             MX round trip (quantize + dequantize)
//   MXRoundTripPair.cpp         both blockings of a matrix in one pass
//   MXDequantize.cpp            MX data and scales to floats
//   FP8BlockRoundTrip.cpp       blockwise FP8 round trip and quantize
//
// The builders they share are KernelBuilder.h and HopperBuilder.h; which
// family runs on which chip is -moe-gpu-dedicated-kernels' table
// (DedicatedKernels.cpp); the memory-driven choices are MemoryPolicy.h's.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_CONVERSION_MOETOGPU_KERNELS_KERNELS_H
#define MOE_CONVERSION_MOETOGPU_KERNELS_KERNELS_H

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Utils/MXNumerics.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/Support/FormatVariadic.h"

#include <optional>
#include <string>

namespace mlir::moe::kernels {

/// A type's short name in kernel names: e4m3, e5m2, or the type as printed.
std::string elementName(Type t);

/// Where a matcher says why it refuses an op (the kernel report of
/// -moe-gpu-dedicated-kernels): the first unmet condition, in words. Null
/// when nobody asks.
using WhyNot = std::string *;

/// Records the reason (`fmt` with `args`, as llvm::formatv) when asked;
/// returns std::nullopt, for the matcher to return.
template <typename... Ts>
std::nullopt_t noKernel(WhyNot why, const char *fmt, Ts &&...args) {
  if (why)
    *why = llvm::formatv(fmt, std::forward<Ts>(args)...).str();
  return std::nullopt;
}

/// Whether a GEMM contracting `k` values into `n` columns is a matrix-vector
/// or outer product (either under the MMA's K step of 16): memory-bound, no
/// tensor-core tile's work. The tile GEMMs' matchers refuse it without a
/// reason: matrix-vector products (K of 16 or more) take the matrix-vector
/// kernel (MatrixVector.cpp), outer products the generic kernels'
/// elementwise product, which reads and writes each element once.
inline bool isMatrixVector(int64_t k, int64_t n) { return k < 16 || n < 16; }

/// What -moe-gpu-dedicated-kernels{report} says, as remarks at the ops: an
/// op a family leaves to the generic kernels, or computes on a slower kernel
/// than its best, and why. Families take a null report when nobody asks.
class KernelReport {
public:
  explicit KernelReport(StringRef chip) : chip(chip.str()) {}
  /// `op` stays on the generic kernels because of `why` (nothing is said
  /// when `why` is empty: a matcher refused it as no fallback, as a
  /// matrix-vector product, see isMatrixVector).
  void generic(Operation *op, StringRef why);
  /// `op` runs on `kernel`, not the family's fastest, because of `why` (an
  /// op told several such reasons in a row counts once).
  void slower(Operation *op, StringRef kernel, StringRef why);
  int64_t genericOps = 0, slowerOps = 0;

private:
  std::string chip;
  Operation *lastSlower = nullptr;
};

/// Whether `t` is an MXFP8 element type (E4M3 or E5M2).
inline bool isMXFP8(Type t) { return isa<Float8E4M3FNType, Float8E5M2Type>(t); }

//===----------------------------------------------------------------------===//
// Blackwell (sm_100a): MXFP8 grouped GEMM on tcgen05 block-scaled MMA
//===----------------------------------------------------------------------===//

/// One block-scaled grouped GEMM shape the kernel handles.
struct BlockScaledGemm {
  int64_t rows, k, n, experts;
  Type lhsElt, rhsElt, offsetElt;

  std::string name() const {
    return llvm::formatv("moe_bs_gmm_{0}x{1}x{2}_e{3}_{4}_{5}_{6}", rows, k, n,
                         experts, elementName(lhsElt), elementName(rhsElt),
                         elementName(offsetElt))
        .str();
  }
  /// The MMA's element format code (instruction descriptor bits 7-9/10-12).
  static uint32_t format(Type t) { return isa<Float8E5M2Type>(t) ? 1 : 0; }
};

/// The shape of `op` if the block-scaled kernel computes it exactly as the op
/// defines; nothing otherwise.
std::optional<BlockScaledGemm> matchBlockScaledGemm(GroupedMatmulOp op,
                                                    WhyNot why = nullptr);

/// Replaces `op` (matched as `g`) by a call of the block-scaled kernel on
/// its operands' MX data and scales.
void lowerBlockScaledGemm(GroupedMatmulOp op, const BlockScaledGemm &g,
                          ModuleOp module, SymbolTable &symbols);

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): bf16 grouped GEMM on wgmma (cp.async or TMA kernel)
//===----------------------------------------------------------------------===//

struct WgmmaGemm {
  int64_t rows, k, n, experts;
  Type offsetElt;
  /// The rhs is stored [E, N, K] (transpose_rhs: a data gradient's weights).
  bool rhsTransposed = false;
  /// Nothing reads the result's rows at or past offsets[E] (LiveRows.h): they
  /// are left unwritten instead of zeroed.
  bool liveRowsOnly = false;
  /// The TMA, warp-specialized kernel (N % 256 == 0 or N > 256, R >= 128;
  /// or partial tiles: K % 64 or N % 128), else the cp.async one.
  bool tma = false;
  /// Why the cp.async kernel (for the report).
  std::string whyNotTma() const;
  std::string name() const {
    return llvm::formatv("moe_wgmma_gmm_{0}x{1}x{2}_e{3}_bf16{5}_{4}{6}{7}",
                         rows, k, n, experts, elementName(offsetElt),
                         rhsTransposed ? "_rhsT" : "",
                         liveRowsOnly ? "_live" : "", tma ? "_tma" : "")
        .str();
  }
};

/// The shape of `op` if a bf16 wgmma kernel computes it; nothing otherwise
/// (and `why`).
std::optional<WgmmaGemm> matchWgmmaGemm(GroupedMatmulOp op,
                                        WhyNot why = nullptr);

/// Whether the TMA kernel takes a GEMM of `rows` rows (at least `minRows`)
/// and N columns (whose column tiles are 256 wide); if not, says why.
bool tmaKernelTakes(int64_t rows, int64_t n, int64_t minRows,
                    WhyNot why = nullptr);

/// Brings a grouped GEMM with MX operands, or K or N not a multiple of 8, to
/// the form the bf16 wgmma kernel takes (operands dequantized exactly to
/// bf16, padded with zeros to multiples of 8) when the result fits the
/// kernel; returns the new op, or nullopt (nothing changed; and, for an op
/// that needed the rewrite, `why`).
std::optional<GroupedMatmulOp> rewriteForWgmma(GroupedMatmulOp op,
                                               WhyNot why = nullptr);

/// Replaces `op` (matched as `g`) by a call of its wgmma kernel.
void lowerWgmmaGemm(GroupedMatmulOp op, const WgmmaGemm &g, ModuleOp module,
                    SymbolTable &symbols);

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): the TMA, warp-specialized kernel and its epilogues
//===----------------------------------------------------------------------===//

/// A SwiGLU epilogue, forward or backward, for w1's split layout (gate
/// columns [0, F), up columns [F, 2F)); blocks of 32 along the rows, element
/// type `f8`, scale rule `mode`.
/// - Forward, of h = x @ w1 ([R, 2F]): the kernel's first result is the MX
///   rounding of a = swiglu(h) as bf16 [R, F] (the next GEMM's exact
///   operand); optionally also h (f32 [R, 2F], `keepH`) and a (f32 [R, F],
///   `keepF32`), in that order, for other users, then, with `col`, a's
///   columnwise MX rounding as bf16 [R, F] (blocks of 32 rows, the second
///   GEMM's weight-gradient operand; as the backward's below). With `mx`,
///   the first result is instead the MX encoding itself, as two results:
///   its elements [R, F] (type `f8`) and E8M0 scales [R, F / 32], for GEMMs
///   that read the 8-bit operand (TmaGemm::lhsF8); the backward's likewise
///   ([R, 2F], [R, 2F / 32]).
/// - Backward (`grad`), of da = dy @ w2^T ([R, F], transpose_rhs), given h as
///   the kernel's fourth argument: the first result is the MX rounding of
///   dh = swiglu_grad(h, da) as bf16 [R, 2F] (the data gradient's exact
///   operand); optionally also dh (f32, `keepF32`), then dh's MX rounding
///   with blocks of 32 rows (`col`: format `colF8`, rule `colMode`; the
///   weight gradient's exact operand) as bf16 [R, 2F]. The columnwise blocks
///   are the whole array's (rows 32 q .. 32 q + 31), which the tiles hold
///   whole only when every group starts at a multiple of 32: the caller
///   proves that (a dispatch's pad_to).
/// Without `f8` (the bf16 recipe's), the first result is the plain bf16
/// rounding (to nearest even) of a, or of dh, instead of the MX rounding:
/// no blocks, no `mx`, no `col`.
struct SwigluEpilogue {
  bool grad = false;
  Type f8;
  ScaleMode mode;
  bool keepH = false, keepF32 = false;
  bool mx = false;
  bool col = false;
  Type colF8;
  ScaleMode colMode = ScaleMode::rceil;
  std::string name() const {
    std::string colName =
        col ? llvm::formatv("_col_{0}_{1}", elementName(colF8),
                            stringifyScaleMode(colMode))
                  .str()
            : "";
    std::string rounding =
        f8 ? llvm::formatv("{0}_{1}", elementName(f8), stringifyScaleMode(mode))
                 .str()
           : "bf16";
    return llvm::formatv("_{0}_{1}{2}{3}{4}{5}",
                         grad ? "swiglu_grad" : "swiglu", rounding,
                         mx ? "_mx" : "", keepH ? "_h" : "",
                         keepF32 ? (grad ? "_dh" : "_a") : "", colName)
        .str();
  }
};

/// What the TMA kernel computes: a grouped GEMM (forward or data gradient)
/// or a grouped weight gradient, and its shape.
struct TmaGemm {
  int64_t rows, k, n, experts;
  bool rhsTransposed = false, liveRowsOnly = false;
  /// result[e] = lhs[lo:hi]^T @ rhs[lo:hi] ([E, K, N], contraction over the
  /// group's rows) instead of result[r] = lhs[r] @ rhs[e].
  bool wgrad = false;
  /// Forward with rhs [E, K, N], or backward with transpose_rhs.
  std::optional<SwigluEpilogue> swiglu;
  /// The lhs is an MX operand with blocks of 32 along K (forward and data
  /// gradient kernels without an epilogue): its elements of this type and
  /// its E8M0 scales, dequantized to bf16 in shared memory (see
  /// TmaGemmEmitter::converter, TmaGemmMainloop.cpp); null for a bf16 lhs.
  Type lhsF8{};
  /// The staged result is stored in bf16 (rounded once from the f32
  /// accumulators) instead of f32: a weight gradient whose every user
  /// rounds it to bf16.
  bool outBf16 = false;
  /// Blockwise FP8 operands (forward or data gradient, no epilogue): the
  /// lhs's and rhs's element types (E4M3 or E5M2), their f32 scales per
  /// 1 x 128 lhs tile and 128 x 128 rhs tile; FP8 wgmma with the partial
  /// sums promoted to f32 every 128 of K (see "Blockwise FP8" in
  /// TmaGemmMainloop.cpp). The rhs data argument is K-major, [E, N, K]:
  /// the transposed rhs itself, or the untransposed rhs's elements
  /// transposed before the call; its scales are the operand's own.
  /// Null for other GEMMs.
  Type blockLhs{}, blockRhs{};
  /// The arguments: lhs (elements, scales with lhsF8 or blockwise), rhs
  /// (elements, scales when blockwise), offsets[, h].
  unsigned rhsArg() const { return lhsF8 || blockLhs ? 2 : 1; }
  unsigned offsetsArg() const { return rhsArg() + (blockLhs ? 2 : 1); }
  /// Columns of an output tile: 256, or 128 for blockwise FP8 (whose
  /// consumers hold a partial sum beside the accumulators).
  int64_t tileN() const { return blockLhs ? 128 : 256; }
  /// Column tiles of tileN() covering N, the last one partial when N %
  /// tileN(): it stores nothing past N (and, with the forward SwiGLU
  /// epilogue, whose tiles hold 128 outputs, nothing past F = N / 2).
  int64_t columnTiles() const { return (n + tileN() - 1) / tileN(); }
};

/// Whether the kernel stores its f32 result [rows, N] through the copy engine
/// (the staging boxes): the plain GEMMs and weight gradients. (The forward
/// SwiGLU epilogue's h through them measured 3% slower: its other stores
/// stay direct, and the boxes' barriers come on top.)
inline bool stagesF32(const TmaGemm &g) { return !g.swiglu; }

/// Emits the body of the TMA grouped GEMM's gpu.launch.

/// The TMA kernel computing `t` (TmaGemmMainloop.cpp), named `name`: the
/// host encodes the tensor maps before the launch.
func::FuncOp getOrCreateWgmmaTmaFunction(ModuleOp module, SymbolTable &symbols,
                                         const TmaGemm &t, StringRef name,
                                         ArrayRef<Type> argTypes,
                                         ArrayRef<RankedTensorType> resultTypes,
                                         Location loc);

/// A GEMM followed by SwiGLU (or its gradient) and the MX round trip of the
/// next GEMM's operand, which the TMA kernel's SwiGLU epilogue computes in
/// one pass (see SwigluEpilogue):
/// - forward: h = gemm(x, w1), a = moe.swiglu(h), r = bf16 round trip of a;
/// - backward: da = gemm(dy, w2) transpose_rhs, dh = moe.swiglu_grad(h, da),
///   r = bf16 round trip of dh (da read by nothing else).
/// Split layout, f32 values, rowwise MX blocks of 32.
/// Backward, when every group starts at a multiple of 32: also dh's
/// columnwise round trip (blocks of 32 rows, bf16), if dh has one.
struct SwigluFusion {
  Operation *activation; // moe.swiglu or moe.swiglu_grad
  QuantizeOp quantize;   // null for the bf16 rounding (SwigluEpilogue::f8)
  SmallVector<DequantizeOp> roundTrips; // the bf16 dequantizes of `quantize`
  SwigluEpilogue epilogue;
  QuantizeOp colQuantize{};                // backward, blocks along the rows
  SmallVector<DequantizeOp> colRoundTrips; // its bf16 dequantizes
};

/// Replaces `op` (the GEMM of `fusion`) and the SwiGLU (or its gradient) and
/// round trips after it by one call of the TMA kernel with the SwiGLU
/// epilogue.
void lowerSwigluFusion(GroupedMatmulOp op, WgmmaGemm g, SwigluFusion &fusion,
                       ModuleOp module, SymbolTable &symbols);

/// Replaces `op`, whose lhs `dq` dequantizes the MX value `pack`, by the TMA
/// kernel reading the elements and scales (TmaGemm::lhsF8).
void lowerF8LhsGemm(GroupedMatmulOp op, const WgmmaGemm &g, DequantizeOp dq,
                    MXPackOp pack, ModuleOp module, SymbolTable &symbols);

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): grouped weight gradients on wgmma
//===----------------------------------------------------------------------===//

/// A weight gradient (bf16, or MX blocked along the rows) as a call of its
/// wgmma kernel; with `fp8Wgmma`, blockwise FP8 operands that
/// lowerBlockwiseTmaWgrad takes run on FP8 wgmma (else they are
/// dequantized to bf16); returns the call, or nullptr (nothing changed).
Operation *lowerWgradToWgmma(GroupedMatmulWgradOp op, ModuleOp module,
                             SymbolTable &symbols, bool fp8Wgmma,
                             KernelReport *report = nullptr);

/// A weight gradient of blockwise FP8 operands in 128 x 1 tiles (quantizes
/// of float tensors the blockwise FP8 kernel takes, rows a multiple of 128,
/// K and N multiples of 128, every group provably starting and ending at a
/// multiple of 128 rows: groupsAlignedTo) as a call of the TMA kernel on
/// FP8 wgmma (TmaGemm::blockLhs with wgrad), its operands quantized
/// transposed (quantizeTransposed: the group rows are the MMAs' K, which
/// FP8 wgmma reads K-major); returns the call, or nullptr (nothing
/// changed).
Operation *lowerBlockwiseTmaWgrad(GroupedMatmulWgradOp op, ModuleOp module,
                                  SymbolTable &symbols, WhyNot why = nullptr);

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): block-scaled grouped GEMMs on FP8 wgmma with promotion
//===----------------------------------------------------------------------===//

/// The kernel report's name for where a blockwise FP8 GEMM or weight
/// gradient the FP8 wgmma kernels refuse runs instead.
constexpr llvm::StringLiteral kOffFp8Wgmma =
    "the bf16 wgmma kernels (operands rounded to bf16 exactly), not the FP8 "
    "wgmma kernel";

/// Whether the FP8 wgmma kernel takes `op` (MXFP8 operands, or blockwise
/// FP8 ones in 1 x 128 and 128 x 128 tiles); else `why`.
bool fitsFp8Wgmma(GroupedMatmulOp op, WhyNot why = nullptr);

/// `op` as a call of the FP8 wgmma kernel if it handles the shape; returns
/// whether it did. Blockwise FP8 GEMMs take the TMA kernel
/// (lowerBlockwiseTmaGemm).
bool lowerToFp8Wgmma(GroupedMatmulOp op, ModuleOp module, SymbolTable &symbols);

/// Replaces `op`, a grouped GEMM of blockwise FP8 operands (1 x 128 lhs
/// tiles, 128 x 128 rhs tiles, K and N multiples of 128, static shapes,
/// f32 result), by the TMA kernel on FP8 wgmma (TmaGemm::blockLhs); an
/// untransposed rhs's elements are transposed first (transposeBytes).
void lowerBlockwiseTmaGemm(GroupedMatmulOp op, ModuleOp module,
                           SymbolTable &symbols);

/// For a quantize `q` to blockwise FP8 in tiles of 128 rows (128 x 128 or
/// 128 x 1) whose columns are a multiple of the kernel's region width (128
/// or 32): a call of the blockwise FP8 quantize kernel writing the data
/// with its last two dims swapped, rows rounded up to a multiple of 128
/// (codes 0 past them), and the scales (as they are), at `b`'s insertion
/// point; nullopt (nothing created) if the kernel does not take `q`. With
/// `liveEnd`, offsets whose last entry bounds the rows anything reads (a
/// multiple of 128), only the rows before it are computed (`_live_`).
std::optional<std::pair<Value, Value>>
quantizeTransposed(OpBuilder &b, QuantizeOp q, ModuleOp module,
                   SymbolTable &symbols, Value liveEnd = Value());
/// Whether quantizeTransposed takes `q`.
bool quantizeTransposedTakes(QuantizeOp q);

/// For quantizes `rows` (1 x 128 tiles) and `cols` (128 x 1 tiles) of the
/// same 2-d float input to blockwise FP8 (columns a multiple of 128): one
/// call of the blockwise FP8 quantize kernel computing both in one pass,
/// at `b`'s insertion point: the rowwise data and scales, then the
/// columnwise data transposed (as quantizeTransposed's) and scales; nullopt
/// (nothing created) if the kernel does not take them. `liveEnd` as
/// quantizeTransposed's.
std::optional<std::array<Value, 4>>
quantizePair(OpBuilder &b, QuantizeOp rows, QuantizeOp cols, ModuleOp module,
             SymbolTable &symbols, Value liveEnd = Value());

/// The rows a pair kernel reads through a dispatch's gather: row r of its
/// input is row source[r] of `sourceRows` token rows, scaled by
/// scale[s] (`scaled`; [sourceRows] f32, s = source[r], a token's `perRow`
/// copies) with the product's operand order `scaleFirst`.
struct GatheredRows {
  int64_t sourceRows;
  bool scaled = false;
  int64_t perRow = 1;
  bool scaleFirst = true;

  /// What a kernel's name gains: _gather_<sourceRows>, then for scaled
  /// rows _scaled_<perRow>_sx (or _xs: the product's operand order is part
  /// of the kernel).
  std::string suffix() const {
    std::string s = "_gather_" + std::to_string(sourceRows);
    if (scaled)
      s += "_scaled_" + std::to_string(perRow) + (scaleFirst ? "_sx" : "_xs");
    return s;
  }
};

/// Whether `func` is a blockwise FP8 pair kernel's (quantizePair).
bool isFP8BlockPair(func::FuncOp func);

/// `pair`, a call of a quantizePair kernel on a dispatch's gathered rows
/// (x[, offsets]), as the same kernel reading those rows from the tokens
/// through the gather's `source` indices (and computing a combine
/// gradient's scaled copies with `scale`: `rows`): a call (tokens, source
/// [, scale][, offsets]) with the same results at `b`'s insertion point;
/// null (nothing created) if `pair` is not such a call.
func::CallOp fp8BlockPairGather(OpBuilder &b, func::CallOp pair,
                                ModuleOp module, SymbolTable &symbols,
                                Value tokens, Value source, Value scale,
                                const GatheredRows &rows);

/// Whether `call` calls a transpose kernel (transposeBytes).
bool isTransposeBytes(func::CallOp call);

/// Whether transposeBytes takes an array of `type`: 8-bit [P, A, B], static,
/// A and B multiples of 64.
bool transposesBytes(RankedTensorType type);

/// `data` (8-bit [P, A, B], transposesBytes) with its last two dimensions
/// swapped, [P, B, A]: a call of the transpose kernel (ByteTranspose.cpp)
/// at `b`'s insertion point.
Value transposeBytes(OpBuilder &b, Location loc, Value data, ModuleOp module,
                     SymbolTable &symbols);

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): flash attention, forward and backward, on wgmma
//===----------------------------------------------------------------------===//

/// One attention shape the flash kernels handle: bf16 query [B, S, N, D],
/// key and value [B, S, M, D], D of 64 or 128, static shapes.
struct FlashAttention {
  /// Queries or keys per tile (the MMAs' M; the documents' ranges).
  static constexpr int64_t Tile = 64;
  int64_t batch, seq, heads, kvHeads, dim;
  bool causal;
  double scale;
  /// The element type of the documents operand (i32 or i64), null without
  /// one: the kernels then take it after their other inputs.
  Type documents;
  /// The dK/dV kernel overlaps its MMAs with the softmax gradient (see
  /// -moe-gpu-dedicated-kernels{flash-dkv-overlap}).
  bool overlapDkv = false;
  /// The kernel `kind` (fwd, dq, dkv) of this shape.
  std::string name(StringRef kind) const;
  /// The per-row statistics' type (lse, delta): f32 [B, N, S].
  RankedTensorType statType(MLIRContext *ctx) const;
};

/// The shape of `op` (moe.attention or moe.attention_grad) if the flash
/// kernels compute it: bf16 inputs, f32 results.
std::optional<FlashAttention> matchFlashAttention(Operation *op,
                                                  WhyNot why = nullptr);

/// A call of the forward kernel on q, k, v: the result (f32 [B, S, N, D])
/// and the base-2 logsumexp of scale * q.k per query row (f32 [B, N, S]).
/// (`documents`: the op's, or null; `ranges`: then their
/// createDocumentRanges.)
std::pair<Value, Value> createFlashForward(OpBuilder &b, Location loc,
                                           const FlashAttention &f, Value q,
                                           Value k, Value v, Value documents,
                                           Value ranges, ModuleOp module,
                                           SymbolTable &symbols);

/// A call of the kernel that finds the least and greatest document id of
/// each 64-row tile ([B, tiles, 2]), which the flash kernels take after the
/// documents.
Value createDocumentRanges(OpBuilder &b, Location loc, const FlashAttention &f,
                           Value documents, ModuleOp module,
                           SymbolTable &symbols);

/// A call of the kernel delta = rowsum(dout * out) (f32 [B, N, S]), which
/// the backward kernels read (FlashAttentionRows.cpp).
Value createFlashDelta(OpBuilder &b, Location loc, const FlashAttention &f,
                       Value dout, Value out, ModuleOp module,
                       SymbolTable &symbols);

/// Calls of the backward kernels: delta (createFlashDelta), then dQ, dK,
/// dV (f32), given the result's gradient `dout` (bf16) and the forward's
/// result `out` and `lse`.
std::array<Value, 3> createFlashBackward(OpBuilder &b, Location loc,
                                         const FlashAttention &f, Value q,
                                         Value k, Value v, Value dout,
                                         Value out, Value lse, Value documents,
                                         Value ranges, ModuleOp module,
                                         SymbolTable &symbols);

/// Replaces the bf16 roundings of `v` (onlyRoundedToBF16) by `rounded`, the
/// same values in bf16, reshaped as the roundings' inputs were.
void replaceRoundings(Value v, Value rounded);

//===----------------------------------------------------------------------===//
// Both chips: cross-entropy over the vocabulary
//===----------------------------------------------------------------------===//

/// Every moe.cross_entropy and moe.cross_entropy_grad of static logits
/// [N, V] (f32, bf16 or f16) and labels [N] (i32 or i64) becomes calls of
/// the cross-entropy kernels (a CTA a row); a gradient whose every user
/// rounds it to bf16 is computed in bf16 and replaces those roundings.
void lowerCrossEntropy(ModuleOp module, SymbolTable &symbols,
                       KernelReport *report = nullptr);

//===----------------------------------------------------------------------===//
// f32 dense matmul on CUDA cores
//===----------------------------------------------------------------------===//

/// `op` (f32 linalg.matmul) as a call of the CUDA-core kernel if it handles
/// the shape; returns whether it did.
bool lowerToSimtMatmul(linalg::MatmulOp op, ModuleOp module,
                       SymbolTable &symbols, KernelReport *report = nullptr);

//===----------------------------------------------------------------------===//
// MX round trips, pairs of them, dequantize
//===----------------------------------------------------------------------===//

namespace roundtrip {
constexpr int64_t MaxBlocks = 2048;
constexpr int64_t Block = 32;
constexpr int64_t PairWarps = 8;               // a CTA
constexpr int64_t PairSlabBytes = 32 * 33 * 4; // a warp's tile
} // namespace roundtrip

/// Elements of an MX tensor.
int64_t mxElements(MXTensorType mx);
/// Elements between consecutive values of one block (1 when the blocks run
/// along the innermost dim).
int64_t mxInner(MXTensorType mx);
/// An MX tensor's shape and axis in kernel names.
std::string mxShapeName(MXTensorType mx);
/// Whether the round-trip kernels take `t` as input or result.
bool isRoundTripFloat(Type t);

/// One MX round trip shape the kernel handles.
struct MXRoundTrip {
  MXTensorType mx;
  Type inElt, outElt;
  ScaleMode mode;
  /// The offsets' element type when the kernel computes only the rows before
  /// their last entry; null otherwise.
  Type offsetElt;

  int64_t elements() const { return mxElements(mx); }
  /// Elements between consecutive values of one block.
  int64_t inner() const { return mxInner(mx); }
  std::string name() const {
    return llvm::formatv(
               "moe_mx_round_trip_{0}_{1}_{2}_{3}_to_{4}{5}", mxShapeName(mx),
               elementName(mx.getElementType()), stringifyScaleMode(mode),
               elementName(inElt), elementName(outElt),
               offsetElt ? "_live_" + elementName(offsetElt) : std::string())
        .str();
  }
  int64_t units() const { return elements() / roundtrip::Block; }
  /// Threads a CTA.
  int64_t ctaThreads() const { return inner() == 1 ? 256 : 128; }
  /// Threads one pass over all units takes.
  int64_t threads() const { return inner() == 1 ? units() * 8 : units(); }
};

/// The round trip `dq` computes, if the kernel handles it.
std::optional<MXRoundTrip> matchRoundTrip(DequantizeOp dq);

/// Every `moe.dequantize (moe.quantize x)` the round-trip kernel handles
/// becomes a call of it; quantizes left without uses are erased.
void lowerRoundTrips(ModuleOp module, SymbolTable &symbols);

/// `offsets` (a live-rows bound's, LiveRows.h) if a kernel can take it as an
/// argument (a static, non-empty 1-D integer tensor), else null.
Value kernelOffsets(Value offsets);

/// Runs `call` (a round trip of one input to a narrower type, the input's
/// only reader) right after its input is computed, so that the narrow result
/// is what waits for the reader.
void runNarrowingRoundTripEarly(func::CallOp call);

//===----------------------------------------------------------------------===//
// Blockwise FP8 round trips and quantizes
//===----------------------------------------------------------------------===//

/// Whether the blockwise FP8 kernel computes `dq` as a round trip (its input
/// a moe.quantize in tiles it takes); says why not in `why`.
bool isFP8BlockRoundTrip(DequantizeOp dq, WhyNot why);

/// Every `moe.dequantize (moe.quantize x)` through a blockwise FP8 type the
/// kernel takes becomes a call of its round trip (one per quantize, result
/// type and block); every other such quantize becomes a call writing its
/// data and scales. Quantizes left without uses are erased.
void lowerFP8BlockConversions(ModuleOp module, SymbolTable &symbols);

/// One pair of round trips of x: `alongK` with blocks along dim rank - 2,
/// `alongN` along rank - 1.
struct MXRoundTripPair {
  MXRoundTrip alongK, alongN;
  /// Which results the kernel computes (both, unless the pair was split to
  /// hold less memory: see lowerRoundTripPairs).
  bool withK = true, withN = true;
  int64_t matrices() const {
    int64_t n = 1;
    for (int64_t d : alongK.mx.getShape().drop_back(2))
      n *= d;
    return n;
  }
  int64_t rows() const { return alongK.mx.getShape().drop_back().back(); }
  int64_t cols() const { return alongK.mx.getShape().back(); }
  int64_t tiles() const { return matrices() * rows() / 32 * (cols() / 32); }
  std::string name() const {
    std::string shape = mxShapeName(alongK.mx);
    return llvm::formatv(
               "moe_mx_round_trip_pair_{0}_{1}_{2}_{3}_{4}_{5}_to_{6}_{7}",
               shape.substr(0, shape.rfind('_')),
               elementName(alongK.mx.getElementType()),
               stringifyScaleMode(alongK.mode),
               elementName(alongN.mx.getElementType()),
               stringifyScaleMode(alongN.mode), elementName(alongK.inElt),
               elementName(alongK.outElt), elementName(alongN.outElt))
               .str() +
           (withK && withN ? ""
            : withK        ? "_k_only"
                           : "_n_only");
  }
};

/// Every pair of round trips of one x along its last two dims in one block
/// becomes one call, placed before the first of them; with `withinPeak`,
/// pairs that would raise their block's peak of live tensors are split
/// (MemoryPolicy.h).
void lowerRoundTripPairs(ModuleOp module, SymbolTable &symbols,
                         bool withinPeak);

/// The pair a pair kernel's function computes (recorded on it), if it is one.
std::optional<MXRoundTripPair> roundTripPairOf(func::FuncOp func);

/// The pair kernel of `g` reading gathered rows: (tokens, source[, scale])
/// -> its results.
func::FuncOp
getOrCreateRoundTripPairGather(ModuleOp module, SymbolTable &symbols,
                               const MXRoundTripPair &g, StringRef name,
                               ArrayRef<Type> argTypes,
                               ArrayRef<RankedTensorType> resultTypes,
                               Location loc, const GatheredRows &rows);

//===----------------------------------------------------------------------===//
// Grouped matrix-vector products
//===----------------------------------------------------------------------===//

/// Every moe.grouped_matmul with N under 16 and K of 16 or more
/// (isMatrixVector) of static f32 or bf16 operands becomes a call of the
/// matrix-vector kernel (a warp or a CTA a row); `report` hears why one is not.
void lowerMatrixVectors(ModuleOp module, SymbolTable &symbols,
                        KernelReport *report);

/// Whether `op` is a matrix-vector product of static K and N (N under 16, K
/// of 16 or more): the matrix-vector kernel's, whatever its element types.
bool isMatrixVectorGemm(GroupedMatmulOp op);

/// Every moe.dequantize the dequantize kernel handles (after the round
/// trips) becomes a call of it on the MX value's data and scales.
void lowerDequantizes(ModuleOp module, SymbolTable &symbols,
                      KernelReport *report = nullptr);

} // namespace mlir::moe::kernels

#endif
