// RUN: not moe-opt %s --moe-gpu-pipeline 2>&1 | FileCheck %s

// On the GPU every buffer is device memory: host code that uses an element
// of one is reported, not compiled into a crash.
func.func @host_read(%x: tensor<4xf32>) -> f32 {
  %c0 = arith.constant 0 : index
  // CHECK: host-read.mlir:[[@LINE+1]]:{{[0-9]+}}: error: reads a device buffer on the host
  %v = tensor.extract %x[%c0] : tensor<4xf32>
  return %v : f32
}
