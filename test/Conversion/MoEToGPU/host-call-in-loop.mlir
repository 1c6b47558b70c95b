// RUN: not moe-opt %s --moe-gpu-device-buffers 2>&1 | FileCheck %s

// Host loops that touch device buffers run as one-thread kernels; a call to
// a host function (a libmoert collective) inside one cannot, and is reported.
func.func private @moert_comm_barrier()
func.func @loop(%m: memref<4xf32>, %v: f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  // CHECK: host-call-in-loop.mlir:[[@LINE+1]]:3: error: calls a host function inside a host loop that reads or writes device buffers
  scf.for %i = %c0 to %c4 step %c1 {
    memref.store %v, %m[%i] : memref<4xf32>
    func.call @moert_comm_barrier() : () -> ()
  }
  return
}
