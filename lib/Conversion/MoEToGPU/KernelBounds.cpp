//===- KernelBounds.cpp - launch bounds for setmaxnreg kernels ------------===//
//
// A warp-specialized kernel lowers its producer warpgroup's registers and
// raises its consumers' with setmaxnreg. ptxas applies those only when it can
// tell the register count at the kernel's entry, from the threads per CTA
// (the launch's known block size, `.reqntid`) and the CTAs per SM
// (`.minnctapersm`). Without the latter it may drop every setmaxnreg of the
// kernel, with only an informational message, and the consumers then run on
// the entry count. Outlining does not carry a gpu.launch's attributes to the
// kernel it makes, so the bound is set here, on the outlined kernels.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/BuiltinOps.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUKERNELBOUNDS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

struct MoEGPUKernelBoundsPass
    : moe::impl::MoEGPUKernelBoundsBase<MoEGPUKernelBoundsPass> {
  void runOnOperation() override {
    Builder b(&getContext());
    StringAttr name = b.getStringAttr(NVVM::NVVMDialect::getMinctasmAttrName());
    getOperation().walk([&](gpu::GPUFuncOp func) {
      if (!func.isKernel() || func->hasAttr(name))
        return;
      bool resizes = func.walk([](NVVM::SetMaxRegisterOp) {
                           return WalkResult::interrupt();
                         })
                         .wasInterrupted();
      // One CTA an SM: every launch of a kernel that fits the SM meets it,
      // and it is what lets ptxas count the registers at entry.
      if (resizes)
        func->setAttr(name, b.getI32IntegerAttr(1));
    });
  }
};

} // namespace
