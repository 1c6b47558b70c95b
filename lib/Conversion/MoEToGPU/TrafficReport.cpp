//===- TrafficReport.cpp - the memory each generic kernel moves -----------===//
//
// A remark for every outlined generic kernel: the bytes of the buffers it
// reads and of those it writes, each buffer counted whole and once. With a
// profile's time per launch this gives the kernel's memory rate against the
// chip's (bench/kernel_traffic.py). Whole buffers: a kernel that reads only
// the live rows of a buffer sized for the worst case is counted at the
// worst case, and a gather that reads a row several times counts it once.
// Kernels that also use LLVM or NVVM ops (the dedicated kernels: TMA,
// cp.async, loads through pointers) are not reported.
//
//===----------------------------------------------------------------------===//

#include "BufferAccesses.h"

#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/Utils/TensorLiveness.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/BuiltinOps.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUTRAFFICREPORT
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

struct MoEGPUTrafficReportPass
    : moe::impl::MoEGPUTrafficReportBase<MoEGPUTrafficReportPass> {
  void runOnOperation() override {
    getOperation().walk([&](gpu::GPUFuncOp func) {
      if (!func.isKernel())
        return;
      // A kernel that also reaches memory through LLVM or NVVM ops (a
      // dedicated kernel: TMA, cp.async, loads through pointers) is not
      // counted by its memref accesses.
      Dialect *llvm = getContext().getLoadedDialect<LLVM::LLVMDialect>();
      Dialect *nvvm = getContext().getLoadedDialect<NVVM::NVVMDialect>();
      if (func.walk([&](Operation *op) {
                Dialect *d = op->getDialect();
                return d && (d == llvm || d == nvvm) ? WalkResult::interrupt()
                                                     : WalkResult::advance();
              })
              .wasInterrupted())
        return;
      // The buffer (a kernel argument, or a view of one) each access
      // reads or writes.
      llvm::SetVector<Value> read, written;
      func.walk([&](Operation *op) {
        if (std::optional<moe::detail::BufferAccess> access =
                moe::detail::bufferAccess(op)) {
          Value buffer = moe::detail::viewRoot(access->memref);
          if (access->reads)
            read.insert(buffer);
          if (access->writes)
            written.insert(buffer);
        }
      });
      if (read.empty() && written.empty())
        return;
      auto total =
          [](const llvm::SetVector<Value> &buffers) -> std::optional<int64_t> {
        int64_t sum = 0;
        for (Value buffer : buffers) {
          std::optional<int64_t> bytes =
              moe::shapedBytes(dyn_cast<ShapedType>(buffer.getType()));
          if (!bytes)
            return std::nullopt;
          sum += *bytes;
        }
        return sum;
      };
      std::optional<int64_t> r = total(read), w = total(written);
      auto text = [](std::optional<int64_t> bytes) {
        return bytes ? std::to_string(*bytes) : std::string("?");
      };
      func.emitRemark() << "generic kernel " << func.getName() << ": reads "
                        << text(r) << " bytes, writes " << text(w)
                        << " bytes (whole buffers)";
    });
  }
};

} // namespace
