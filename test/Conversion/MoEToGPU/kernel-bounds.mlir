// A kernel that resizes its warpgroups' registers (nvvm.setmaxregister)
// gets one CTA an SM as its bound, so that ptxas knows the register count at
// entry and applies the resizes; other kernels and host functions are left
// as they are, and a bound already set stays.
// RUN: moe-opt %s -moe-gpu-kernel-bounds | FileCheck %s

// CHECK-LABEL: gpu.func @resizes
// CHECK-SAME: nvvm.minctasm = 1 : i32
// CHECK-LABEL: gpu.func @plain
// CHECK-NOT: nvvm.minctasm
// CHECK-LABEL: gpu.func @bound_given
// CHECK-SAME: nvvm.minctasm = 2 : i32
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @resizes() kernel attributes {known_block_size = array<i32: 384, 1, 1>} {
      %w = gpu.thread_id x
      %c128 = arith.constant 128 : index
      %p = arith.cmpi ult, %w, %c128 : index
      scf.if %p {
        nvvm.setmaxregister decrease 24
      } else {
        nvvm.setmaxregister increase 240
      }
      gpu.return
    }
    gpu.func @plain() kernel {
      gpu.return
    }
    gpu.func @bound_given() kernel attributes {nvvm.minctasm = 2 : i32} {
      nvvm.setmaxregister increase 240
      gpu.return
    }
  }
}
