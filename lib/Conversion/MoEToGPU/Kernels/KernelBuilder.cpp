//===- KernelBuilder.cpp - the kernel-builder library ---------------------===//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"

#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"
#include "moe/Dialect/MoE/Utils/LiveRows.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

std::string elementName(Type t) {
  if (isa<Float8E4M3FNType>(t))
    return "e4m3";
  if (isa<Float8E5M2Type>(t))
    return "e5m2";
  std::string s;
  llvm::raw_string_ostream os(s);
  t.print(os);
  return s;
}

/// An op's name and result types, as the report names it.
static std::string describe(Operation *op) {
  std::string s = op->getName().getStringRef().str() + " (";
  llvm::raw_string_ostream os(s);
  llvm::interleaveComma(op->getResultTypes(), os);
  return s + ")";
}

void KernelReport::generic(Operation *op, StringRef why) {
  if (why.empty())
    return; // refused without a reason: the generic kernels are as good
  ++genericOps;
  // At the op's location, without the op printed after it.
  emitRemark(op->getLoc()) << describe(op) << ": generic kernels on " << chip
                           << ": " << why;
}

void KernelReport::slower(Operation *op, StringRef kernel, StringRef why) {
  if (op != lastSlower)
    ++slowerOps;
  lastSlower = op;
  emitRemark(op->getLoc()) << describe(op) << ": " << kernel << ": " << why;
}

/// A gpu.launch of `shape` (its body empty but for the terminator) that
/// outlining turns into the kernel `name` wherever the function holding it
/// is inlined.
gpu::LaunchOp createNamedLaunch(OpBuilder &b, Location loc,
                                const LaunchShape &shape, StringRef name) {
  auto c = [&](int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); };
  Value one = c(1);
  auto launch = gpu::LaunchOp::create(
      b, loc, c(shape.gridX), c(shape.gridY), c(shape.gridZ), c(shape.threads),
      one, one, arith::ConstantIntOp::create(b, loc, shape.smemBytes, 32));
  auto kernelName = FlatSymbolRefAttr::get(b.getContext(), name);
  launch.setModuleAttr(kernelName);
  launch.setFunctionAttr(kernelName);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(&launch.getBody().front());
  gpu::TerminatorOp::create(b, loc);
  return launch;
}

func::FuncOp getOrCreateKernelCall(
    ModuleOp module, SymbolTable &symbols, StringRef name, StringRef what,
    ArrayRef<Type> argTypes, ArrayRef<RankedTensorType> resultTypes,
    Location loc, LaunchShape shape,
    function_ref<void(OpBuilder &, gpu::LaunchOp, ArrayRef<Value>,
                      ArrayRef<Value>)>
        emit,
    function_ref<void(OpBuilder &, ArrayRef<Value>, ArrayRef<Value>)> host) {
  MLIRContext *ctx = module.getContext();
  SmallVector<Type> results(resultTypes.begin(), resultTypes.end());
  auto type = FunctionType::get(ctx, argTypes, results);
  if (auto existing = symbols.lookup<func::FuncOp>(name))
    if (existing.getFunctionType() == type &&
        existing->hasAttr("moe.dedicated_kernel"))
      return existing;

  auto func = func::FuncOp::create(loc, name, type);
  func.setPrivate();
  func->setAttr("moe.dedicated_kernel", StringAttr::get(ctx, what));
  symbols.insert(func); // renamed if the name is taken
  OpBuilder b = OpBuilder::atBlockBegin(func.addEntryBlock());
  SmallVector<Value> buffers;
  for (BlockArgument arg : func.getArguments()) {
    auto t = cast<RankedTensorType>(arg.getType());
    buffers.push_back(bufferization::ToBufferOp::create(
        b, loc, MemRefType::get(t.getShape(), t.getElementType()), arg,
        /*read_only=*/true));
  }
  SmallVector<Value> outs;
  for (RankedTensorType t : resultTypes)
    outs.push_back(memref::AllocOp::create(
        b, loc, MemRefType::get(t.getShape(), t.getElementType())));
  if (host)
    host(b, buffers, outs);
  auto launch = createNamedLaunch(b, loc, shape, (name + "_kernel").str());
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(launch.getBody().front().getTerminator());
    emit(b, launch, buffers, outs);
  }
  SmallVector<Value> tensors;
  for (auto [t, out] : llvm::zip(resultTypes, outs))
    tensors.push_back(bufferization::ToTensorOp::create(
        b, loc, t, out, /*restrict=*/true, /*writable=*/true));
  func::ReturnOp::create(b, loc, tensors);
  return func;
}

func::FuncOp getOrCreateKernelCall(
    ModuleOp module, SymbolTable &symbols, StringRef name, StringRef what,
    ArrayRef<Type> argTypes, RankedTensorType resultType, Location loc,
    LaunchShape shape,
    function_ref<void(OpBuilder &, gpu::LaunchOp, ArrayRef<Value>, Value)> emit,
    function_ref<void(OpBuilder &, ArrayRef<Value>, ArrayRef<Value>)> host) {
  return getOrCreateKernelCall(
      module, symbols, name, what, argTypes, ArrayRef(resultType), loc, shape,
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buffers,
          ArrayRef<Value> outs) { emit(b, launch, buffers, outs[0]); },
      host);
}

func::FuncOp withGroupedArgs(func::FuncOp kernel, ArrayRef<unsigned> rows,
                             unsigned offsets) {
  UnitAttr unit = UnitAttr::get(kernel.getContext());
  for (unsigned a : rows)
    kernel.setArgAttr(a, kGroupRowsAttr, unit);
  kernel.setArgAttr(offsets, kGroupOffsetsAttr, unit);
  return kernel;
}

std::pair<RankedTensorType, RankedTensorType> blockScaledParts(Type type) {
  if (auto scaled = dyn_cast<BlockScaledType>(type))
    return {scaled.getDataType(), scaled.getScalesType()};
  return {};
}

SmallVector<Type> mxGemmArgTypes(GroupedMatmulOp op) {
  auto [lhsData, lhsScales] = blockScaledParts(op.getLhs().getType());
  auto [rhsData, rhsScales] = blockScaledParts(op.getRhs().getType());
  return {lhsData, lhsScales, rhsData, rhsScales, op.getOffsets().getType()};
}

void replaceByMXGemmCall(GroupedMatmulOp op, func::FuncOp kernel) {
  auto [lhsData, lhsScales] = blockScaledParts(op.getLhs().getType());
  auto [rhsData, rhsScales] = blockScaledParts(op.getRhs().getType());
  OpBuilder b(op);
  Location loc = op.getLoc();
  auto lhsParts = MXUnpackOp::create(b, loc, lhsData, lhsScales, op.getLhs());
  auto rhsParts = MXUnpackOp::create(b, loc, rhsData, rhsScales, op.getRhs());
  auto call = func::CallOp::create(
      b, loc, kernel,
      ValueRange{lhsParts.getData(), lhsParts.getScales(), rhsParts.getData(),
                 rhsParts.getScales(), op.getOffsets()});
  op.getResult().replaceAllUsesWith(call.getResult(0));
  op.erase();
}

void replaceByGemmCall(GroupedMatmulOp op, func::FuncOp kernel) {
  OpBuilder b(op);
  auto call = func::CallOp::create(
      b, op.getLoc(), kernel,
      ValueRange{op.getLhs(), op.getRhs(), op.getOffsets()});
  op.getResult().replaceAllUsesWith(call.getResult(0));
  op.erase();
}

namespace {
//===----------------------------------------------------------------------===//
// Memory effects of the NVVM ops the kernels use
//===----------------------------------------------------------------------===//

// Upstream NVVM declares no memory effects for the tcgen05, mbarrier, fence
// and barrier ops. The ownership-based buffer deallocation, which runs over
// the generated functions (gpu.launch and all), rejects ops with unknown
// effects; these models declare what the ops do (they read and write shared
// or tensor memory; the descriptor and conversion ops compute values only).
// Attached through this pass's dependent-dialect registry, only where upstream
// has no interface of its own.
template <typename OpTy>
struct ReadsAndWritesMemory
    : MemoryEffectOpInterface::ExternalModel<ReadsAndWritesMemory<OpTy>, OpTy> {
  void
  getEffects(Operation *,
             SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>>
                 &effects) const {
    effects.emplace_back(MemoryEffects::Read::get());
    effects.emplace_back(MemoryEffects::Write::get());
  }
};

template <typename OpTy>
struct NoMemoryEffects
    : MemoryEffectOpInterface::ExternalModel<NoMemoryEffects<OpTy>, OpTy> {
  void
  getEffects(Operation *,
             SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>>
                 &) const {}
};

template <template <typename> class Model, typename... Ops>
void attachWhereMissing(MLIRContext *ctx) {
  auto attach = [&](auto tag) {
    using OpTy = typename decltype(tag)::type;
    std::optional<RegisteredOperationName> name =
        RegisteredOperationName::lookup(TypeID::get<OpTy>(), ctx);
    if (name && !name->hasInterface<MemoryEffectOpInterface>())
      OpTy::template attachInterface<Model<OpTy>>(*ctx);
  };
  (attach(llvm::type_identity<Ops>{}), ...);
}

void attachNVVMMemoryEffects(MLIRContext *ctx, NVVM::NVVMDialect *) {
  attachWhereMissing<
      ReadsAndWritesMemory, NVVM::Tcgen05AllocOp, NVVM::Tcgen05DeallocOp,
      NVVM::Tcgen05RelinquishAllocPermitOp, NVVM::Tcgen05FenceOp,
      NVVM::Tcgen05WaitOp, NVVM::Tcgen05CommitOp, NVVM::Tcgen05CpOp,
      NVVM::Tcgen05LdOp, NVVM::Tcgen05MMABlockScaleOp, NVVM::MBarrierInitOp,
      NVVM::MBarrierTryWaitParityOp, NVVM::Barrier0Op, NVVM::FenceProxyOp,
      NVVM::CpAsyncOp, NVVM::CpAsyncCommitGroupOp, NVVM::CpAsyncWaitGroupOp,
      NVVM::WgmmaFenceAlignedOp, NVVM::WgmmaGroupSyncAlignedOp,
      NVVM::WgmmaWaitGroupSyncOp, NVVM::WgmmaMmaAsyncOp, NVVM::MBarrierArriveOp,
      NVVM::MBarrierArriveExpectTxOp,
      NVVM::CpAsyncBulkTensorGlobalToSharedClusterOp,
      NVVM::CpAsyncBulkTensorSharedCTAToGlobalOp,
      NVVM::CpAsyncBulkCommitGroupOp, NVVM::CpAsyncBulkWaitGroupOp,
      NVVM::BarrierOp, NVVM::BarrierArriveOp, NVVM::SetMaxRegisterOp,
      NVVM::SyncWarpOp>(ctx);
  attachWhereMissing<NoMemoryEffects, NVVM::Tcgen05MmaSmemDescOp,
                     NVVM::ConvertF32x2ToF8x2Op, NVVM::ConvertF8x2ToF16x2Op>(
      ctx);
}
} // namespace

void registerNVVMMemoryEffects(DialectRegistry &registry) {
  registry.addExtension(attachNVVMMemoryEffects);
}

/// Replaces the bf16 roundings of `v` (onlyRoundedToBF16) by `rounded`, the
/// same values in bf16, reshaped as the roundings' inputs were.
void replaceRoundings(Value v, Value rounded) {
  for (Operation *user : llvm::make_early_inc_range(v.getUsers())) {
    if (isa<tensor::ExpandShapeOp, tensor::CollapseShapeOp>(user)) {
      OpBuilder b(user);
      auto type = cast<RankedTensorType>(user->getResult(0).getType())
                      .clone(b.getBF16Type());
      Operation *copy = b.clone(*user);
      copy->setOperand(0, rounded);
      copy->getResult(0).setType(type);
      replaceRoundings(user->getResult(0), copy->getResult(0));
      user->erase();
      continue;
    }
    user->getResult(0).replaceAllUsesWith(rounded);
    user->erase();
  }
}

} // namespace mlir::moe::kernels
