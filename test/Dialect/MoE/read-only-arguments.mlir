// RUN: moe-opt %s -moe-read-only-arguments | FileCheck %s

// Tensor arguments of defined functions become read-only for bufferization;
// declarations and non-tensor arguments are left alone.
// CHECK-LABEL: func.func @step
// CHECK-SAME: (%{{.*}}: tensor<4xf32> {bufferization.writable = false}, %{{.*}}: index)
func.func @step(%x: tensor<4xf32>, %i: index) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
// CHECK: func.func private @external(tensor<4xf32>)
// CHECK-NOT: writable
func.func private @external(tensor<4xf32>)

// An argument a result updates (moe.updates) is writable, the others not.
// CHECK-LABEL: func.func @update
// CHECK-SAME: (%{{.*}}: tensor<4xf32> {bufferization.writable = true}, %{{.*}}: tensor<4xf32> {bufferization.writable = false})
func.func @update(%p: tensor<4xf32>, %g: tensor<4xf32>)
    -> (tensor<4xf32> {moe.updates = 0 : i64}) {
  %n = arith.subf %p, %g : tensor<4xf32>
  return %n : tensor<4xf32>
}
