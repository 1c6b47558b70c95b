//===- ElideHostSyncs.cpp - no host waits around host-only calls ----------===//
//
// -gpu-async-region threads one async token (one stream) through a block's
// GPU ops and, before any other op with side effects, inserts a host
// synchronization (`gpu.wait [%t]`); the next GPU op then starts a new
// stream (`gpu.wait async` without dependencies). A call of a host-only
// function (`moe.host_only`: libmoert's tensor-map encoder, which the TMA
// kernels' launches need as arguments) needs no such wait: the host only
// computes a value. Each wait drains the GPU, so a train step with one per
// GEMM spent milliseconds idle. This pass turns
//
//   gpu.wait [%t]
//   %m = func.call @host_only(...)        (and ops without side effects)
//   %t2 = gpu.wait async
//
// back into one stream: the wait is erased and %t2 is %t.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUELIDEHOSTSYNCS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// A call of a function marked moe.host_only.
bool isHostOnlyCall(Operation *op) {
  auto call = dyn_cast<func::CallOp>(op);
  if (!call)
    return false;
  auto callee = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(
      call, call.getCalleeAttr());
  return callee && callee->hasAttr("moe.host_only");
}

struct MoEGPUElideHostSyncsPass
    : moe::impl::MoEGPUElideHostSyncsBase<MoEGPUElideHostSyncsPass> {
  void runOnOperation() override {
    SmallVector<gpu::WaitOp> syncs;
    getOperation().walk([&](gpu::WaitOp wait) {
      if (!wait.getAsyncToken() && wait.getAsyncDependencies().size() == 1)
        syncs.push_back(wait);
    });
    for (gpu::WaitOp sync : syncs) {
      // Host-only calls (at least one) and pure ops up to a new stream.
      bool sawCall = false;
      gpu::WaitOp restart;
      for (Operation *op = sync->getNextNode(); op; op = op->getNextNode()) {
        if (auto wait = dyn_cast<gpu::WaitOp>(op)) {
          if (wait.getAsyncToken() && wait.getAsyncDependencies().empty())
            restart = wait;
          break;
        }
        if (isHostOnlyCall(op)) {
          sawCall = true;
          continue;
        }
        if (!isMemoryEffectFree(op) || op->hasTrait<OpTrait::IsTerminator>())
          break;
      }
      if (!sawCall || !restart)
        continue;
      Value token = sync.getAsyncDependencies()[0];
      restart.getAsyncToken().replaceAllUsesWith(token);
      restart.erase();
      sync.erase();
    }
  }
};

} // namespace
