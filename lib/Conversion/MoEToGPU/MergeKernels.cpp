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
// The dedicated kernels are functions that launch; inlined at each call,
// every call outlines its own copy of the kernel into the same module
// (`..._kernel_0`, `..._kernel_1`, ...). Within each kept module, kernel
// functions that print the same but for their own name are merged the same
// way.
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

/// The ops of `module` that define a symbol, in order.
SmallVector<Operation *> symbolOps(gpu::GPUModuleOp module) {
  SmallVector<Operation *> ops;
  for (Operation &op : module.getBody()->getOperations())
    if (op.getAttrOfType<StringAttr>(SymbolTable::getSymbolAttrName()))
      ops.push_back(&op);
  return ops;
}

/// The printed form of `module` with its name and its symbols' names
/// replaced by fixed ones (restored before returning).
std::string canonicalText(gpu::GPUModuleOp module,
                          ArrayRef<Operation *> symbols) {
  MLIRContext *ctx = module.getContext();
  StringAttr moduleName = module.getSymNameAttr();
  SmallVector<StringAttr> names;
  for (auto [i, op] : llvm::enumerate(symbols)) {
    names.push_back(SymbolTable::getSymbolName(op));
    SymbolTable::setSymbolName(op, StringAttr::get(ctx, "s" + Twine(i)));
  }
  module.setSymName("m");
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os, OpPrintingFlags().useLocalScope());
  module.setSymName(moduleName);
  for (auto [op, name] : llvm::zip_equal(symbols, names))
    SymbolTable::setSymbolName(op, name);
  return text;
}

/// The printed form of kernel `func` with its name fixed (restored before
/// returning).
std::string canonicalText(gpu::GPUFuncOp func) {
  StringAttr name = func.getNameAttr();
  SymbolTable::setSymbolName(func, "k");
  std::string text;
  llvm::raw_string_ostream os(text);
  func->print(os, OpPrintingFlags().useLocalScope());
  SymbolTable::setSymbolName(func, name);
  return text;
}

struct MoEGPUMergeKernelsPass
    : moe::impl::MoEGPUMergeKernelsBase<MoEGPUMergeKernelsPass> {
  void runOnOperation() override {
    ModuleOp top = getOperation();
    // The first module of each text, with its symbols.
    llvm::StringMap<std::pair<gpu::GPUModuleOp, SmallVector<Operation *>>>
        first;
    // A merged kernel's reference -> the same symbol, by position, in the
    // module that stays (the texts match, so the positions do).
    DenseMap<SymbolRefAttr, SymbolRefAttr> replacement;
    SmallVector<gpu::GPUModuleOp> merged;
    for (auto module : top.getOps<gpu::GPUModuleOp>()) {
      SmallVector<Operation *> symbols = symbolOps(module);
      auto [it, inserted] =
          first.try_emplace(canonicalText(module, symbols), module, symbols);
      if (inserted)
        continue;
      auto &[kept, keptSymbols] = it->second;
      for (auto [from, to] : llvm::zip_equal(symbols, keptSymbols))
        replacement[SymbolRefAttr::get(
            module.getSymNameAttr(),
            {FlatSymbolRefAttr::get(SymbolTable::getSymbolName(from))})] =
            SymbolRefAttr::get(
                kept.getSymNameAttr(),
                {FlatSymbolRefAttr::get(SymbolTable::getSymbolName(to))});
      merged.push_back(module);
    }
    // Copies of one kernel inside a module that stays.
    SmallVector<gpu::GPUFuncOp> copies;
    for (auto module : top.getOps<gpu::GPUModuleOp>()) {
      if (llvm::is_contained(merged, module))
        continue;
      llvm::StringMap<gpu::GPUFuncOp> firstKernel;
      for (auto func : module.getOps<gpu::GPUFuncOp>()) {
        if (!func.isKernel())
          continue;
        auto [it, inserted] =
            firstKernel.try_emplace(canonicalText(func), func);
        if (inserted)
          continue;
        replacement[SymbolRefAttr::get(module.getSymNameAttr(),
                                       {FlatSymbolRefAttr::get(func)})] =
            SymbolRefAttr::get(module.getSymNameAttr(),
                               {FlatSymbolRefAttr::get(it->second)});
        copies.push_back(func);
      }
    }
    if (replacement.empty())
      return;
    // (A launch of a merged module's copy goes to the kept module's copy,
    // and from there to the first copy: follow the chain.)
    top.walk([&](gpu::LaunchFuncOp launch) {
      SymbolRefAttr kernel = launch.getKernel();
      while (SymbolRefAttr to = replacement.lookup(kernel))
        kernel = to;
      if (kernel != launch.getKernel())
        launch.setKernelAttr(kernel);
    });
    for (gpu::GPUFuncOp func : copies)
      func.erase();
    for (gpu::GPUModuleOp module : merged)
      module.erase();
  }
};

} // namespace
