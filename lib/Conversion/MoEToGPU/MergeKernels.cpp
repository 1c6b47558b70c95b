//===- MergeKernels.cpp - one kernel module per distinct kernel -----------===//
//
// A model's decoder layers of one shape lower to the same generic kernels,
// one outlined gpu.module per launch: a 48-layer train step carries each of
// them 48 times, and the NVVM lowering, the PTX backend and ptxas then pay
// for every copy. This pass keeps the first of each set of kernel modules
// that differ only in their names (the module's and its kernels') and points
// the launches of the others at it, so code generation follows the number of
// distinct kernels, not the depth. Modules are compared by their printed
// form with those names fixed (no locations), so two modules merge only when
// their bodies are the same text.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUMERGEKERNELS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// The printed form of `module` with its name and its functions' names
/// replaced by fixed ones (restored before returning).
std::string canonicalText(gpu::GPUModuleOp module) {
  StringAttr moduleName = module.getSymNameAttr();
  SmallVector<std::pair<Operation *, StringAttr>> renamed;
  MLIRContext *ctx = module.getContext();
  unsigned i = 0;
  for (Operation &op : module.getBody()->getOperations()) {
    auto name = op.getAttrOfType<StringAttr>(SymbolTable::getSymbolAttrName());
    if (!name)
      continue;
    renamed.push_back({&op, name});
    SymbolTable::setSymbolName(&op, StringAttr::get(ctx, "s" + Twine(i++)));
  }
  module.setSymName("m");
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os, OpPrintingFlags().useLocalScope());
  module.setSymName(moduleName);
  for (auto [op, name] : renamed)
    SymbolTable::setSymbolName(op, name);
  return text;
}

struct MoEGPUMergeKernelsPass
    : moe::impl::MoEGPUMergeKernelsBase<MoEGPUMergeKernelsPass> {
  void runOnOperation() override {
    ModuleOp top = getOperation();
    llvm::StringMap<gpu::GPUModuleOp> first;
    // A merged module's name -> the one that stays.
    DenseMap<StringAttr, gpu::GPUModuleOp> replacement;
    SmallVector<gpu::GPUModuleOp> merged;
    for (auto module : top.getOps<gpu::GPUModuleOp>()) {
      auto [it, inserted] = first.try_emplace(canonicalText(module), module);
      if (inserted)
        continue;
      replacement[module.getSymNameAttr()] = it->second;
      merged.push_back(module);
    }
    if (merged.empty())
      return;
    WalkResult result = top.walk([&](gpu::LaunchFuncOp launch) {
      SymbolRefAttr kernel = launch.getKernel();
      auto it = replacement.find(kernel.getRootReference());
      if (it == replacement.end())
        return WalkResult::advance();
      // The same function, by position, in the module that stays.
      auto from = SymbolTable::lookupNearestSymbolFrom<gpu::GPUModuleOp>(
          top, kernel.getRootReference());
      int index = -1, i = 0;
      for (Operation &op : from.getBody()->getOperations()) {
        auto name =
            op.getAttrOfType<StringAttr>(SymbolTable::getSymbolAttrName());
        if (!name)
          continue;
        if (name == kernel.getLeafReference())
          index = i;
        ++i;
      }
      Operation *target = nullptr;
      i = 0;
      for (Operation &op : it->second.getBody()->getOperations()) {
        if (!op.getAttrOfType<StringAttr>(SymbolTable::getSymbolAttrName()))
          continue;
        if (i++ == index)
          target = &op;
      }
      if (!target) {
        launch.emitOpError("-moe-gpu-merge-kernels: kernel ")
            << kernel << " not found";
        return WalkResult::interrupt();
      }
      launch.setKernelAttr(SymbolRefAttr::get(
          it->second.getSymNameAttr(),
          {FlatSymbolRefAttr::get(SymbolTable::getSymbolName(target))}));
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      return signalPassFailure();
    for (gpu::GPUModuleOp module : merged)
      module.erase();
  }
};

} // namespace
