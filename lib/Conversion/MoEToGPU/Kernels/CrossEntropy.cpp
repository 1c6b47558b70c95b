//===- CrossEntropy.cpp - cross-entropy over the vocabulary ---------------===//
//
// moe.cross_entropy and moe.cross_entropy_grad of logits [N, V] (static,
// f32, bf16 or f16) and labels [N] (i32 or i64), both chips. The generic
// lowering runs a row's reductions in one thread, so that at a language
// model's vocabulary (V ~ 150k) a few thousand threads walk 600 KB rows each;
// these kernels give every row a CTA and read it coalesced, near the copy
// rate:
//
//   lse    one CTA a row: each thread keeps a running (max, sum of exp)
//          over vector loads of the row (W = 4, 2 or 1 elements, the
//          largest dividing V; unaligned buffers take scalar loads), the
//          pairs merged over the warp and then the CTA; writes
//          lse[n] = max + log(sum) (f32 [N]).
//   loss   one CTA of 1024 threads: sum over the counted rows (label in
//          [0, V)) of lse[n] - logits[n, label], and their count, each
//          thread a strided share of the rows, summed in a fixed tree
//          (deterministic); loss = sum / count, 0 without counted rows.
//   scale  one CTA of 1024 threads: grad / count (0 without counted rows).
//   grad   one CTA a row: (exp(x - lse[n]) - (v == label)) * scale for a
//          counted row, 0 for an ignored one, in the op's result type, or
//          in bf16 when every user of the gradient rounds it to bf16 (the
//          recipes' GEMM operand): those roundings are replaced by the
//          kernel's result (the same f32 value rounded once, as they would).
//
// A gradient of logits whose loss is computed in its block reuses that
// loss's lse. Results agree with the generic lowering up to the
// order of the sums and exp/log rounding.
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"
#include "Kernels.h"
#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace {

/// Threads of the one-CTA reductions over the rows.
constexpr int64_t RowsThreads = 1024;
/// Most threads of a row's CTA.
constexpr int64_t RowThreads = 512;

/// One cross-entropy shape the kernels handle.
struct CrossEntropy {
  int64_t rows, vocab;
  Type logitElt, labelElt;

  std::string name(StringRef kind, Type outElt = {}) const {
    return llvm::formatv("moe_xent_{0}_{1}x{2}_{3}_{4}{5}", kind, rows, vocab,
                         elementName(logitElt), elementName(labelElt),
                         outElt ? "_to_" + elementName(outElt) : "")
        .str();
  }
  /// Elements a vector load of a row takes: the largest of 4, 2, 1 dividing
  /// V (rows then start aligned wherever the buffer does).
  int64_t width() const {
    for (int64_t w : {4, 2})
      if (vocab % w == 0)
        return w;
    return 1;
  }
  /// Threads of a row's CTA: enough for one vector a thread, whole warps.
  int64_t rowThreads() const {
    int64_t vectors = tilesOf(vocab, width());
    return std::clamp<int64_t>(tilesOf(vectors, 32) * 32, 32, RowThreads);
  }
};

bool isLogitElt(Type t) { return t.isF32() || t.isBF16() || t.isF16(); }

std::optional<CrossEntropy> match(Value logits, Value labels, WhyNot why) {
  auto l = dyn_cast<RankedTensorType>(logits.getType());
  auto y = dyn_cast<RankedTensorType>(labels.getType());
  if (!l || !y || !l.hasStaticShape() || !y.hasStaticShape())
    return noKernel(why, "a dynamic shape (the kernels are generated for "
                         "static shapes)");
  if (l.getRank() != 2 || l.getNumElements() == 0 ||
      !isLogitElt(l.getElementType()) ||
      !(y.getElementType().isInteger(32) || y.getElementType().isInteger(64)))
    return noKernel(why,
                    "logits {0} and labels {1}: the kernels take "
                    "non-empty [N, V] f32, bf16 or f16 logits and i32 "
                    "or i64 labels",
                    l, y);
  return CrossEntropy{l.getDimSize(0), l.getDimSize(1), l.getElementType(),
                      y.getElementType()};
}

/// What the emitters share: f32 arithmetic, the row's label, and the
/// reductions over a warp and a CTA.
struct XentBuilder : KernelBuilder {
  const CrossEntropy &c;
  XentBuilder(OpBuilder &b, Location loc, const CrossEntropy &c)
      : KernelBuilder{b, loc}, c(c) {}

  Value f32(float v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
  }
  Value fadd(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value fsub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }
  Value fmul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value fmax(Value x, Value y) {
    return arith::MaximumFOp::create(b, loc, x, y);
  }
  Value exp(Value x) { return math::ExpOp::create(b, loc, x); }
  Value xorShuffle(Value v, int64_t d) {
    return gpu::ShuffleOp::create(b, loc, v, int32(d), int32(32),
                                  gpu::ShuffleMode::XOR)
        .getShuffleResult();
  }
  /// The lowest finite f32: a running max's start (exp(start - m) is 0 for
  /// any finite m, and 1, times a sum of 0, when nothing was seen).
  Value lowest() { return f32(std::numeric_limits<float>::lowest()); }

  /// Row n's label as an index and whether it is counted (in [0, V)).
  std::pair<Value, Value> labelOf(Value labels, Value n) {
    Value l = toIndex(memref::LoadOp::create(b, loc, labels, n));
    Value ok = land(cmp(P::sge, l, idx(0)), cmp(P::slt, l, idx(c.vocab)));
    return {ok, select(ok, l, idx(0))};
  }

  /// Two running (max, sum of exp(x - max)) merged.
  std::pair<Value, Value> mergeStats(Value m1, Value s1, Value m2, Value s2) {
    Value m = fmax(m1, m2);
    Value s = fadd(fmul(s1, exp(fsub(m1, m))), fmul(s2, exp(fsub(m2, m))));
    return {m, s};
  }

  /// `values` (one f32 a thread) reduced over the CTA of `threads` with
  /// `merge` (butterflies over each warp, then the warps' values through
  /// shared memory, then warp 0); the result is valid in thread 0. `empty`
  /// fills the lanes past the warps. Uses shared memory from offset 0.
  SmallVector<Value>
  reduceCTA(Value tid, int64_t threads, SmallVector<Value> values,
            ArrayRef<float> empty,
            function_ref<SmallVector<Value>(ValueRange, ValueRange)> merge) {
    auto warpReduce = [&](SmallVector<Value> v) {
      for (int64_t d : {16, 8, 4, 2, 1}) {
        SmallVector<Value> other;
        for (Value x : v)
          other.push_back(xorShuffle(x, d));
        v = merge(v, other);
      }
      return v;
    };
    values = warpReduce(values);
    int64_t warps = threads / 32, n = values.size();
    if (warps == 1)
      return values;
    Value lane = rem(tid, 32), warp = div(tid, 32);
    auto slot = [&](int64_t k, Value w) {
      return sharedPtrAt(mul(add(mul(idx(k), idx(warps)), w), idx(4)));
    };
    ifThen(cmp(P::eq, lane, idx(0)), [&] {
      for (int64_t k = 0; k < n; ++k)
        LLVM::StoreOp::create(b, loc, values[k], slot(k, warp), 4);
    });
    NVVM::Barrier0Op::create(b, loc);
    SmallVector<Type> types(n, b.getF32Type());
    SmallVector<Value> partial = ifElse(
        types, cmp(P::slt, tid, idx(warps)),
        [&] {
          SmallVector<Value> v;
          for (int64_t k = 0; k < n; ++k)
            v.push_back(
                LLVM::LoadOp::create(b, loc, b.getF32Type(), slot(k, tid), 4));
          return v;
        },
        [&] {
          SmallVector<Value> v;
          for (float e : empty)
            v.push_back(f32(e));
          return v;
        });
    return warpReduce(partial);
  }

  /// A strided walk over one row of `rowBuffer` (flat) from element `first`:
  /// `body(column, values, carried)` for each vector of W (`width`) values
  /// as f32 starting at `column`, thread `tid` of `threads` taking vectors
  /// tid, tid + threads, ...; vector loads when `aligned`, else scalar ones.
  SmallVector<Value>
  walkRow(Value rowBuffer, Value first, Value tid, int64_t threads,
          Value aligned, ValueRange inits,
          function_ref<SmallVector<Value>(Value, ArrayRef<Value>, ValueRange)>
              body) {
    Type elt = c.logitElt;
    int64_t bytes = elt.getIntOrFloatBitWidth() / 8;
    Value base = baseAddress(rowBuffer);
    auto loop = [&](int64_t w) {
      auto op = scf::ForOp::create(b, loc, tid, idx(c.vocab / w), idx(threads),
                                   inits);
      OpBuilder::InsertionGuard guard(b);
      if (inits.empty())
        b.setInsertionPoint(op.getBody()->getTerminator());
      else
        b.setInsertionPointToStart(op.getBody());
      Value column = mul(op.getInductionVar(), idx(w));
      Value at = add(first, column);
      SmallVector<Value> values;
      if (w == 1)
        values.push_back(memref::LoadOp::create(b, loc, rowBuffer, at));
      else
        values =
            loadVector(elt, w, globalPtr(base, mul(at, idx(bytes))), w * bytes);
      for (Value &v : values)
        v = toF32(v);
      SmallVector<Value> yielded = body(column, values, op.getRegionIterArgs());
      if (!inits.empty())
        scf::YieldOp::create(b, loc, yielded);
      return SmallVector<Value>(op.getResults());
    };
    int64_t w = c.width();
    if (w == 1)
      return loop(1);
    if (inits.empty()) {
      ifElseVoid(aligned, [&] { loop(w); }, [&] { loop(1); });
      return {};
    }
    SmallVector<Type> types;
    for (Value v : inits)
      types.push_back(v.getType());
    // A vocabulary not a multiple of W takes the scalar loop (w == 1 above).
    return ifElse(
        types, aligned, [&] { return loop(w); }, [&] { return loop(1); });
  }

  /// Whether every buffer's address is a multiple of W elements' bytes.
  Value alignedAll(ArrayRef<std::pair<Value, int64_t>> buffers) {
    Value mask = int64(0);
    for (auto [buffer, eltBytes] : buffers)
      mask = arith::OrIOp::create(
          b, loc, mask,
          arith::AndIOp::create(b, loc, baseAddress(buffer),
                                int64(c.width() * eltBytes - 1)));
    return cmp(P::eq, mask, int64(0));
  }
};

/// lse[n] = log(sum_v exp(logits[n, v])), one CTA a row.
struct LseEmitter : XentBuilder {
  using XentBuilder::XentBuilder;
  void emit(gpu::LaunchOp launch, Value logits, Value lse) {
    setUpSharedMemory();
    Value row = launch.getBlockIds().x, tid = launch.getThreadIds().x;
    Value flatLogits = flat(logits);
    int64_t bytes = c.logitElt.getIntOrFloatBitWidth() / 8;
    Value aligned = alignedAll({{flatLogits, bytes}});
    SmallVector<Value> stats = walkRow(
        flatLogits, mul(row, idx(c.vocab)), tid, c.rowThreads(), aligned,
        {lowest(), f32(0)},
        [&](Value, ArrayRef<Value> x, ValueRange ms) -> SmallVector<Value> {
          Value top = x[0];
          for (Value v : x.drop_front())
            top = fmax(top, v);
          Value m = fmax(ms[0], top);
          Value s = fmul(ms[1], exp(fsub(ms[0], m)));
          for (Value v : x)
            s = fadd(s, exp(fsub(v, m)));
          return {m, s};
        });
    stats = reduceCTA(tid, c.rowThreads(), stats,
                      {std::numeric_limits<float>::lowest(), 0.0f},
                      [&](ValueRange a, ValueRange o) -> SmallVector<Value> {
                        auto [m, s] = mergeStats(a[0], a[1], o[0], o[1]);
                        return {m, s};
                      });
    ifThen(cmp(P::eq, tid, idx(0)), [&] {
      Value l = fadd(stats[0], math::LogOp::create(b, loc, stats[1]));
      memref::StoreOp::create(b, loc, l, lse, ValueRange{row});
    });
  }
};

/// The counted rows' loss sum and count (with logits and lse), or only the
/// count; then loss = sum / count, or scale = grad / count; one CTA.
struct RowsEmitter : XentBuilder {
  using XentBuilder::XentBuilder;
  /// logits and lse null: scale = grad[] / count.
  void emit(gpu::LaunchOp launch, Value logits, Value labels, Value lse,
            Value grad, Value out) {
    setUpSharedMemory();
    Value tid = launch.getThreadIds().x;
    bool loss = bool(logits);
    auto op = scf::ForOp::create(b, loc, tid, idx(c.rows), idx(RowsThreads),
                                 ValueRange{f32(0), f32(0)});
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(op.getBody());
      Value n = op.getInductionVar();
      auto [ok, l] = labelOf(labels, n);
      ValueRange acc = op.getRegionIterArgs();
      Value sum = acc[0];
      if (loss) {
        Value x =
            toF32(memref::LoadOp::create(b, loc, logits, ValueRange{n, l}));
        Value rowLoss =
            fsub(memref::LoadOp::create(b, loc, lse, ValueRange{n}), x);
        sum = select(ok, fadd(sum, rowLoss), sum);
      }
      Value count = select(ok, fadd(acc[1], f32(1)), acc[1]);
      scf::YieldOp::create(b, loc, ValueRange{sum, count});
    }
    SmallVector<Value> totals = reduceCTA(
        tid, RowsThreads, SmallVector<Value>(op.getResults()), {0.0f, 0.0f},
        [&](ValueRange a, ValueRange o) -> SmallVector<Value> {
          return {fadd(a[0], o[0]), fadd(a[1], o[1])};
        });
    ifThen(cmp(P::eq, tid, idx(0)), [&] {
      Value any = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT,
                                        totals[1], f32(0));
      Value numerator =
          loss ? totals[0] : memref::LoadOp::create(b, loc, grad, ValueRange{});
      Value v = select(any, arith::DivFOp::create(b, loc, numerator, totals[1]),
                       f32(0));
      memref::StoreOp::create(b, loc, v, out, ValueRange{idx(0)});
    });
  }
};

/// result[n, v] = (exp(logits[n, v] - lse[n]) - (v == label)) * scale for
/// counted rows, 0 for ignored ones; one CTA a row.
struct GradEmitter : XentBuilder {
  using XentBuilder::XentBuilder;
  void emit(gpu::LaunchOp launch, Value logits, Value labels, Value lse,
            Value scale, Value out) {
    Value row = launch.getBlockIds().x, tid = launch.getThreadIds().x;
    Value flatLogits = flat(logits), flatOut = flat(out);
    Type outElt = cast<MemRefType>(out.getType()).getElementType();
    int64_t inBytes = c.logitElt.getIntOrFloatBitWidth() / 8,
            outBytes = outElt.getIntOrFloatBitWidth() / 8;
    Value aligned = alignedAll({{flatLogits, inBytes}, {flatOut, outBytes}});
    Value ok, label;
    std::tie(ok, label) = labelOf(labels, row);
    Value g = select(ok, memref::LoadOp::create(b, loc, scale, idx(0)), f32(0));
    Value rowLse = memref::LoadOp::create(b, loc, lse, ValueRange{row});
    Value first = mul(row, idx(c.vocab)), outBase = baseAddress(flatOut);
    walkRow(
        flatLogits, first, tid, c.rowThreads(), aligned, {},
        [&](Value column, ArrayRef<Value> x, ValueRange) {
          SmallVector<Value> values;
          for (auto [j, v] : llvm::enumerate(x)) {
            Value hit = cmp(P::eq, add(column, idx(j)), label);
            Value t = fsub(exp(fsub(v, rowLse)), select(hit, f32(1), f32(0)));
            Value r = select(ok, fmul(t, g), f32(0));
            values.push_back(
                outElt.isF32()
                    ? r
                    : arith::TruncFOp::create(b, loc, outElt, r).getResult());
          }
          Value at = add(first, column);
          if (values.size() == 1)
            memref::StoreOp::create(b, loc, values[0], flatOut, at);
          else
            LLVM::StoreOp::create(b, loc, vectorOf(values),
                                  globalPtr(outBase, mul(at, idx(outBytes))),
                                  values.size() * outBytes);
          return SmallVector<Value>{};
        });
  }
};

RankedTensorType f32Tensor(MLIRContext *ctx, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, Float32Type::get(ctx));
}

Value callLse(OpBuilder &b, Location loc, const CrossEntropy &c, Value logits,
              ModuleOp module, SymbolTable &symbols) {
  func::FuncOp fn = getOrCreateKernelCall(
      module, symbols, c.name("lse"), "cross-entropy row logsumexp",
      {logits.getType()}, f32Tensor(b.getContext(), {c.rows}), loc,
      {c.rows, 1, 1, c.rowThreads(), 2 * 4 * (c.rowThreads() / 32)},
      [&](OpBuilder &kb, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        LseEmitter(kb, loc, c).emit(launch, buf[0], out);
      });
  return func::CallOp::create(b, loc, fn, logits).getResult(0);
}

/// One of the one-CTA kernels: the loss (given logits and lse) or the
/// gradient's scale (given grad), as f32 [1].
Value callRows(OpBuilder &b, Location loc, const CrossEntropy &c,
               SmallVector<Value> args, bool loss, ModuleOp module,
               SymbolTable &symbols) {
  SmallVector<Type> types;
  for (Value a : args)
    types.push_back(a.getType());
  func::FuncOp fn = getOrCreateKernelCall(
      module, symbols, c.name(loss ? "loss" : "scale"),
      loss ? "cross-entropy loss over the rows" : "cross-entropy grad / count",
      types, f32Tensor(b.getContext(), {1}), loc,
      {1, 1, 1, RowsThreads, 2 * 4 * (RowsThreads / 32)},
      [&](OpBuilder &kb, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        RowsEmitter e(kb, loc, c);
        if (loss)
          e.emit(launch, buf[0], buf[1], buf[2], {}, out);
        else
          e.emit(launch, {}, buf[0], {}, buf[1], out);
      });
  return func::CallOp::create(b, loc, fn, args).getResult(0);
}

} // namespace

void lowerCrossEntropy(ModuleOp module, SymbolTable &symbols,
                       KernelReport *report) {
  std::string why;
  WhyNot whyNot = report ? &why : nullptr;
  SmallVector<CrossEntropyOp> forwards;
  SmallVector<CrossEntropyGradOp> grads;
  for (auto func : module.getOps<func::FuncOp>())
    if (!func->hasAttr("moe.dedicated_kernel"))
      func.walk([&](Operation *op) {
        if (auto f = dyn_cast<CrossEntropyOp>(op))
          forwards.push_back(f);
        else if (auto g = dyn_cast<CrossEntropyGradOp>(op))
          grads.push_back(g);
      });
  struct Lowered {
    Value logits, lse;
  };
  SmallVector<Lowered> lowered;
  for (CrossEntropyOp op : forwards) {
    std::optional<CrossEntropy> c =
        match(op.getLogits(), op.getLabels(), whyNot);
    if (!c) {
      if (report)
        report->generic(op, why);
      continue;
    }
    OpBuilder b(op);
    Location loc = op.getLoc();
    Value lse = callLse(b, loc, *c, op.getLogits(), module, symbols);
    Value one = callRows(b, loc, *c, {op.getLogits(), op.getLabels(), lse},
                         /*loss=*/true, module, symbols);
    Value loss = tensor::CollapseShapeOp::create(
        b, loc, op.getType(), one, SmallVector<ReassociationIndices>{});
    lowered.push_back({op.getLogits(), lse});
    op.getResult().replaceAllUsesWith(loss);
    op.erase();
  }
  for (CrossEntropyGradOp op : grads) {
    std::optional<CrossEntropy> c =
        match(op.getLogits(), op.getLabels(), whyNot);
    Type resultElt = op.getType().getElementType();
    if (c && !isLogitElt(resultElt))
      c = noKernel(whyNot,
                   "a {0} gradient: the kernel writes f32, bf16 or "
                   "f16",
                   resultElt);
    if (!c) {
      if (report)
        report->generic(op, why);
      continue;
    }
    OpBuilder b(op);
    Location loc = op.getLoc();
    Value lse;
    for (const Lowered &l : lowered) {
      Operation *call = l.lse.getDefiningOp();
      if (l.logits == op.getLogits() && call->getBlock() == op->getBlock() &&
          call->isBeforeInBlock(op))
        lse = l.lse;
    }
    if (!lse)
      lse = callLse(b, loc, *c, op.getLogits(), module, symbols);
    Value scale = callRows(b, loc, *c, {op.getLabels(), op.getGrad()},
                           /*loss=*/false, module, symbols);
    bool toBF16 = resultElt.isF32() && onlyRoundedToBF16(op.getResult());
    Type outElt = toBF16 ? b.getBF16Type() : resultElt;
    auto outType = op.getType().clone(outElt);
    SmallVector<Type> types = {op.getLogits().getType(),
                               op.getLabels().getType(), lse.getType(),
                               scale.getType()};
    func::FuncOp fn = getOrCreateKernelCall(
        module, symbols, c->name("grad", outElt),
        "cross-entropy gradient of the logits", types, outType, loc,
        {c->rows, 1, 1, c->rowThreads(), 0},
        [&](OpBuilder &kb, gpu::LaunchOp launch, ArrayRef<Value> buf,
            Value out) {
          GradEmitter(kb, loc, *c)
              .emit(launch, buf[0], buf[1], buf[2], buf[3], out);
        });
    Value grad =
        func::CallOp::create(
            b, loc, fn, ValueRange{op.getLogits(), op.getLabels(), lse, scale})
            .getResult(0);
    if (toBF16)
      replaceRoundings(op.getResult(), grad);
    else
      op.getResult().replaceAllUsesWith(grad);
    op.erase();
  }
}

} // namespace mlir::moe::kernels
