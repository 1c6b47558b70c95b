//===- ByteTranspose.cpp - transposes of 8-bit arrays ---------------------===//
//
// The last two dimensions of an 8-bit array [P, A, B] swapped: [P, B, A].
// FP8 wgmma reads both operands K-major only, so a blockwise FP8 GEMM whose
// rhs is [E, K, N] (the forward) reads a transposed copy of its elements,
// [E, N, K] (see TmaGemm::blockLhs). The scales stay as they are.
//
// Tiles of 64 x 64 bytes, 256 threads, grid (B / 64, A / 64, P); A and B
// multiples of 64. Thread t loads 16 bytes of input row t / 4 (a warp reads
// 8 rows of 64 contiguous bytes) and stores them as four 32-bit words into
// shared memory, rows 68 bytes apart. After the barrier it reads the words
// of input rows 4 (t % 16) .. + 3 at bytes 4 (t / 16) .. + 3, transposes
// the 4 x 4 bytes in registers and stores four 32-bit words, one in each of
// output rows 4 (t / 16) .. + 3 (16 lanes cover 64 contiguous bytes of an
// output row). The shared rows' 68-byte stride leaves those reads two-way
// bank conflicted at most.
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"
#include "Kernels.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace {

constexpr int64_t Tile = 64, Threads = 256, RowBytes = Tile + 4;
constexpr StringLiteral TransposeKind = "8-bit transpose";

struct TransposeEmitter : KernelBuilder {
  int64_t planes, a, bCols;
  Value in, out;

  void emit(gpu::LaunchOp launch) {
    setUpSharedMemory();
    Value tid = launch.getThreadIds().x;
    Value b0 = mul(launch.getBlockIds().x, idx(Tile));
    Value a0 = mul(launch.getBlockIds().y, idx(Tile));
    Value p = launch.getBlockIds().z;
    Value inBase = baseAddress(in), outBase = baseAddress(out);
    // Row t / 4, bytes 16 (t % 4) .. + 15.
    {
      Value r = div(tid, 4), q = rem(tid, 4);
      Value at = add(mul(add(mul(p, idx(a)), add(a0, r)), idx(bCols)),
                     add(b0, mul(q, idx(16))));
      Value v = LLVM::LoadOp::create(b, loc, VectorType::get({4}, i32()),
                                     globalPtr(inBase, at), /*alignment=*/16);
      for (int64_t w = 0; w < 4; ++w)
        LLVM::StoreOp::create(
            b, loc, LLVM::ExtractElementOp::create(b, loc, v, int32(w)),
            sharedPtrAt(
                add(mul(r, idx(RowBytes)), add(mul(q, idx(16)), idx(4 * w)))),
            /*alignment=*/4);
    }
    NVVM::Barrier0Op::create(b, loc);
    Value ra = mul(rem(tid, 16), idx(4)), cb = mul(div(tid, 16), idx(4));
    SmallVector<Value> words;
    for (int64_t i = 0; i < 4; ++i)
      words.push_back(LLVM::LoadOp::create(
          b, loc, i32(),
          sharedPtrAt(add(mul(add(ra, idx(i)), idx(RowBytes)), cb)),
          /*alignment=*/4));
    // Word j: bytes ra .. ra + 3 of output row cb + j.
    SmallVector<Value> out = transposeBytes4x4(words);
    for (int64_t j = 0; j < 4; ++j) {
      Value row = add(mul(p, idx(bCols)), add(b0, add(cb, idx(j))));
      Value at = add(mul(row, idx(a)), add(a0, ra));
      LLVM::StoreOp::create(b, loc, out[j], globalPtr(outBase, at),
                            /*alignment=*/4);
    }
  }
};

} // namespace

bool isTransposeBytes(func::CallOp call) {
  auto callee = call->getParentOfType<ModuleOp>().lookupSymbol<func::FuncOp>(
      call.getCallee());
  auto what = callee ? callee->getAttrOfType<StringAttr>("moe.dedicated_kernel")
                     : StringAttr();
  return what && what.getValue() == TransposeKind;
}

bool transposesBytes(RankedTensorType type) {
  if (type.getRank() != 3 || !type.hasStaticShape() ||
      type.getElementTypeBitWidth() != 8)
    return false;
  ArrayRef<int64_t> s = type.getShape();
  return s[0] >= 1 && s[0] <= 65535 && s[1] % Tile == 0 && s[2] % Tile == 0 &&
         s[1] > 0 && s[2] > 0 && s[1] / Tile <= 65535;
}

Value transposeBytes(OpBuilder &b, Location loc, Value data, ModuleOp module,
                     SymbolTable &symbols) {
  auto type = cast<RankedTensorType>(data.getType());
  assert(transposesBytes(type) && "transposeBytes: unsupported shape");
  ArrayRef<int64_t> s = type.getShape();
  auto resultType =
      RankedTensorType::get({s[0], s[2], s[1]}, type.getElementType());
  std::string name = llvm::formatv("moe_transpose8_{0}x{1}x{2}_{3}", s[0], s[1],
                                   s[2], elementName(type.getElementType()))
                         .str();
  func::FuncOp kernel = getOrCreateKernelCall(
      module, symbols, name, TransposeKind, {type}, resultType, loc,
      {s[2] / Tile, s[1] / Tile, s[0], Threads, Tile * RowBytes},
      [&](OpBuilder &kb, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        TransposeEmitter k{{kb, loc}, s[0], s[1], s[2], buf[0], out};
        k.emit(launch);
      });
  return func::CallOp::create(b, loc, kernel, ValueRange{data}).getResult(0);
}

} // namespace mlir::moe::kernels
