//===- NameKernels.cpp - generic kernels named for what they compute ------===//
//
// Outlining names a launch without a name `<function>_kernel`: a train step
// of hundreds of generic kernels then profiles as one name. Ops built with a
// name location (moe-model's `model.layers.3.mlp`, `lm_head`, `loss`;
// -moe-adamw's `optimizer`) keep it through lowering, and this pass gives
// each unnamed gpu.launch the name of the first such location it carries:
// `<function>_<name>_kernel`, non-identifier characters as `_`
// (`loss_step_model_layers_3_mlp_kernel`). Launches without one, and those
// already named (the dedicated kernels), keep theirs.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUNAMEKERNELS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// The first name location in `loc` (depth first: a call site's callee
/// before its caller, a fusion's parts in order).
std::optional<StringRef> firstName(Location loc) {
  if (auto name = dyn_cast<NameLoc>(loc))
    return name.getName().getValue();
  if (auto call = dyn_cast<CallSiteLoc>(loc)) {
    if (auto n = firstName(call.getCallee()))
      return n;
    return firstName(call.getCaller());
  }
  if (auto fused = dyn_cast<FusedLoc>(loc))
    for (Location part : fused.getLocations())
      if (auto n = firstName(part))
        return n;
  return std::nullopt;
}

std::string identifier(StringRef s) {
  std::string id;
  for (char c : s)
    id.push_back(llvm::isAlnum(c) ? c : '_');
  return id;
}

struct MoEGPUNameKernelsPass
    : moe::impl::MoEGPUNameKernelsBase<MoEGPUNameKernelsPass> {
  void runOnOperation() override {
    func::FuncOp func = getOperation();
    func.walk([&](gpu::LaunchOp launch) {
      if (launch.getFunctionAttr())
        return;
      std::optional<StringRef> name = firstName(launch.getLoc());
      if (!name || name->empty())
        return;
      auto attr = FlatSymbolRefAttr::get(&getContext(),
                                         identifier(func.getSymName()) + "_" +
                                             identifier(*name) + "_kernel");
      launch.setFunctionAttr(attr);
      launch.setModuleAttr(attr);
    });
  }
};

} // namespace
