//===- DeviceBuffers.cpp - every host buffer in GPU memory ----------------===//

#include "SingleThread.h"

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "mlir/Transforms/RegionUtils.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUDEVICEBUFFERS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

bool inKernel(Operation *op) {
  return op->getParentOfType<gpu::LaunchOp>() ||
         op->getParentOfType<gpu::GPUModuleOp>();
}

/// Whether `op` (or something inside it) reads or writes a buffer.
bool touchesMemory(Operation *op) {
  WalkResult r = op->walk([](Operation *inner) {
    if (isa<memref::LoadOp, memref::StoreOp, memref::AtomicRMWOp>(inner))
      return WalkResult::interrupt();
    return WalkResult::advance();
  });
  return r.wasInterrupted();
}

/// Whether `buffer`, or a view of it, may outlive its block: a terminator
/// (return, yield) takes it, or a call may return it (the generated kernel
/// functions are inlined before this pass; calls left are the program's).
bool escapesBlock(Value buffer) {
  SmallVector<Value> worklist = {buffer};
  while (!worklist.empty()) {
    Value v = worklist.pop_back_val();
    for (Operation *user : v.getUsers()) {
      if (user->hasTrait<OpTrait::IsTerminator>())
        return true;
      if (auto view = dyn_cast<ViewLikeOpInterface>(user)) {
        if (view.getViewSource() == v)
          llvm::append_range(worklist, user->getResults());
        continue;
      }
      if (isa<func::CallOp>(user))
        return true;
    }
  }
  return false;
}

/// The buffer deallocation's bookkeeping (its "generic case" for many
/// buffers): the helper function it generates, and the index / i1 arrays of
/// pointers and ownership flags it fills, hands to the helper and reads, all
/// on the host. They stay host memory and host code.
bool isDeallocHelper(func::FuncOp f) {
  return f.getSymName().starts_with("dealloc_helper");
}

bool isBookkeeping(memref::AllocOp alloc) {
  Type elt = alloc.getType().getElementType();
  if (!elt.isIndex() && !elt.isInteger(1))
    return false;
  SmallVector<Value> worklist = {alloc.getResult()};
  while (!worklist.empty()) {
    Value v = worklist.pop_back_val();
    for (Operation *user : v.getUsers()) {
      if (inKernel(user))
        return false;
      if (auto cast = dyn_cast<memref::CastOp>(user)) {
        worklist.push_back(cast.getResult());
        continue;
      }
      if (auto call = dyn_cast<func::CallOp>(user)) {
        if (!call.getCallee().starts_with("dealloc_helper"))
          return false;
        continue;
      }
      if (!isa<memref::LoadOp, memref::StoreOp, memref::DeallocOp>(user))
        return false;
    }
  }
  return true;
}

/// Whether `memref` is (a cast of) one of `host`'s buffers.
bool isHostBuffer(Value memref, const llvm::DenseSet<Value> &host) {
  while (auto cast = memref.getDefiningOp<memref::CastOp>())
    memref = cast.getSource();
  return host.contains(memref);
}

struct MoEGPUDeviceBuffersPass
    : moe::impl::MoEGPUDeviceBuffersBase<MoEGPUDeviceBuffersPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    IRRewriter rewriter(&getContext());
    bool failed = false;

    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal() || isDeallocHelper(func))
        continue;
      llvm::DenseSet<Value> host;
      func.walk([&](memref::AllocOp alloc) {
        if (isBookkeeping(alloc))
          host.insert(alloc.getResult());
      });
      // Host loops and stores still touching buffers: one-thread kernels.
      SmallVector<Operation *> sequential;
      for (Block &block : func.getBody())
        for (Operation &op : block)
          if (!isa<gpu::LaunchOp>(op) && op.getNumRegions() &&
              touchesMemory(&op))
            sequential.push_back(&op);
      func.walk([&](memref::StoreOp op) {
        if (!inKernel(op) && op->getParentOp() == func &&
            !isHostBuffer(op.getMemRef(), host))
          sequential.push_back(op);
      });
      for (Operation *op : sequential) {
        if (isa<scf::ParallelOp>(op)) {
          op->emitError("parallel loop was not mapped to GPU blocks and "
                        "threads (run -moe-gpu-map-loops, "
                        "-gpu-map-parallel-loops and "
                        "-convert-parallel-loops-to-gpu first)");
          failed = true;
          continue;
        }
        if (op->getNumResults()) {
          op->emitError("computes a value on the host from device buffers; "
                        "keep such results in tensors the program returns");
          failed = true;
          continue;
        }
        // Host calls (libmoert's collectives, which take device buffers)
        // cannot move into a kernel with the loop around them.
        if (op->walk([](func::CallOp) {
                return WalkResult::interrupt();
              }).wasInterrupted()) {
          op->emitError("calls a host function inside a host loop that reads "
                        "or writes device buffers; the loop would have to run "
                        "in a GPU kernel, the call cannot");
          failed = true;
          continue;
        }
        moe::detail::wrapInSingleThreadKernel(rewriter, op);
      }
      // Values kernels use that the host would read from device memory (a
      // group's end, read once for several kernels after CSE): computed
      // again inside each kernel, where that memory is readable.
      for (Block &block : func.getBody())
        for (auto launch : block.getOps<gpu::LaunchOp>()) {
          llvm::SetVector<Value> captured;
          getUsedValuesDefinedAbove(launch.getBody(), captured);
          for (Value v : captured) {
            SetVector<Operation *> slice =
                moe::detail::computationOf(v, launch, /*clonable=*/true);
            bool readsDevice = llvm::any_of(slice, [&](Operation *op) {
              auto load = dyn_cast<memref::LoadOp>(op);
              return load && !isHostBuffer(load.getMemRef(), host);
            });
            if (!readsDevice ||
                (v.getDefiningOp() && !slice.contains(v.getDefiningOp())))
              continue;
            Value inside = moe::detail::recomputeInside(
                rewriter, v, launch, &launch.getBody().front());
            replaceAllUsesInRegionWith(v, inside, launch.getBody());
          }
        }
      // Host computations left without users (in reverse, chains whole).
      for (Block &block : func.getBody())
        for (Operation &op : llvm::make_early_inc_range(llvm::reverse(block)))
          if (isOpTriviallyDead(&op))
            op.erase();
      func.walk([&](memref::LoadOp op) {
        if (!inKernel(op) && !isHostBuffer(op.getMemRef(), host)) {
          op.emitError("reads a device buffer on the host; return the tensor "
                       "instead of using its elements in host code");
          failed = true;
        }
      });

      func.walk([&](Operation *op) {
        if (inKernel(op))
          return;
        rewriter.setInsertionPoint(op);
        if (auto alloc = dyn_cast<memref::AllocOp>(op)) {
          if (host.contains(alloc.getResult()))
            return;
          rewriter.replaceOpWithNewOp<gpu::AllocOp>(
              alloc, alloc.getType(), /*asyncToken=*/Type(),
              /*asyncDependencies=*/ValueRange{}, alloc.getDynamicSizes(),
              alloc.getSymbolOperands(), /*hostShared=*/false);
        } else if (auto alloca = dyn_cast<memref::AllocaOp>(op)) {
          rewriter.replaceOpWithNewOp<gpu::AllocOp>(
              alloca, alloca.getType(), Type(), ValueRange{},
              alloca.getDynamicSizes(), alloca.getSymbolOperands(), false);
        } else if (auto dealloc = dyn_cast<memref::DeallocOp>(op)) {
          if (isHostBuffer(dealloc.getMemref(), host))
            return;
          rewriter.replaceOpWithNewOp<gpu::DeallocOp>(
              dealloc, /*asyncToken=*/Type(), ValueRange{},
              dealloc.getMemref());
        } else if (auto global = dyn_cast<memref::GetGlobalOp>(op)) {
          // Constants: a device copy of the host global.
          rewriter.setInsertionPointAfter(global);
          auto device = gpu::AllocOp::create(
              rewriter, global.getLoc(), global.getType(), Type(), ValueRange{},
              ValueRange{}, ValueRange{}, false);
          auto copy = gpu::MemcpyOp::create(rewriter, global.getLoc(), Type(),
                                            ValueRange{}, device.getMemref(),
                                            global.getResult());
          rewriter.replaceAllUsesExcept(global.getResult(), device.getMemref(),
                                        copy);
          // Freed at the end of its block (the deallocation pipeline, which
          // ran before, leaves globals alone); every call would leak it
          // otherwise. A copy that may outlive the block stays.
          if (!escapesBlock(device.getMemref())) {
            rewriter.setInsertionPoint(global->getBlock()->getTerminator());
            gpu::DeallocOp::create(rewriter, global.getLoc(), Type(),
                                   ValueRange{}, device.getMemref());
          }
        }
      });
    }
    if (failed)
      signalPassFailure();
  }
};
} // namespace
