// RUN: moe-opt %s -split-input-file -moe-read-only-arguments -one-shot-bufferize="bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map" -moe-update-arguments-in-place -verify-diagnostics | FileCheck %s

// The new value is computed in the argument's own buffer: the result leaves
// the signature, nothing is copied; the other results stay.
// CHECK-LABEL: func.func @step(
// CHECK-SAME: %[[P:.*]]: memref<8xf32>, %[[G:.*]]: memref<8xf32>) -> memref<f32>
// CHECK-NOT: memref.copy
// CHECK: linalg.generic {{.*}} ins(%[[G]] : memref<8xf32>) outs(%[[P]] : memref<8xf32>)
// CHECK-NOT: memref.copy
// CHECK: return %{{.*}} : memref<f32>
#id = affine_map<(d0) -> (d0)>
func.func @step(%p: tensor<8xf32>, %g: tensor<8xf32>)
    -> (tensor<f32>, tensor<8xf32> {moe.updates = 0 : i64}) {
  %new = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
      ins(%g : tensor<8xf32>) outs(%p : tensor<8xf32>) {
  ^bb0(%a: f32, %b: f32):
    %d = arith.subf %b, %a : f32
    linalg.yield %d : f32
  } -> tensor<8xf32>
  %c = arith.constant dense<1.0> : tensor<f32>
  return %c, %new : tensor<f32>, tensor<8xf32>
}

// -----

// The old value is still read after the new one is made (returned too):
// bufferization computes the new value elsewhere, and it is copied into the
// argument before the return.
// CHECK-LABEL: func.func @late_read(
// CHECK-SAME: %[[P:.*]]: memref<8xf32>) -> memref<8xf32>
// CHECK: %[[NEW:.*]] = memref.alloc
// CHECK: memref.copy %[[NEW]], %[[P]]
// CHECK: return
#id = affine_map<(d0) -> (d0)>
func.func @late_read(%p: tensor<8xf32>)
    -> (tensor<8xf32>, tensor<8xf32> {moe.updates = 0 : i64}) {
  %new = linalg.generic {indexing_maps = [#id], iterator_types = ["parallel"]}
      outs(%p : tensor<8xf32>) {
  ^bb0(%b: f32):
    %d = arith.addf %b, %b : f32
    linalg.yield %d : f32
  } -> tensor<8xf32>
  %e = tensor.empty() : tensor<8xf32>
  %sq = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
      ins(%p : tensor<8xf32>) outs(%e : tensor<8xf32>) {
  ^bb0(%a: f32, %b: f32):
    %d = arith.mulf %a, %a : f32
    linalg.yield %d : f32
  } -> tensor<8xf32>
  return %sq, %new : tensor<8xf32>, tensor<8xf32>
}

// -----

// A function with callers cannot change its signature.
// expected-error@+1 {{must have no callers}}
func.func @callee(%p: tensor<8xf32>) -> (tensor<8xf32> {moe.updates = 0 : i64}) {
  return %p : tensor<8xf32>
}
func.func @caller(%p: tensor<8xf32>) -> tensor<8xf32> {
  %r = func.call @callee(%p) : (tensor<8xf32>) -> tensor<8xf32>
  return %r : tensor<8xf32>
}
